# ---- run/lib/health.sh: healthcheck probes, their schedule, and the result `ps` shows ----------

# Where the user owns the instance's namespaces (an unprivileged runtime: every namespace of an
# instance is the user's own), a probe enters them with nsenter, as `exec instance://` does, with
# the service's environment (its start script's) and working directory (the container's sh
# changes to it: nsenter would look for it on the host): about 10 ms of CPU against 50-300 ms
# for a runtime start, which is what lets the supervisor probe every service on its interval.
# Elsewhere (a setuid runtime, a probe with an env file of its own, no nsenter), or when nsenter
# cannot enter or run it (no sh for a working directory), the runtime runs the probe.
# ENTERED=1 when this ran the probe.
NSENTER="" TIMEOUT="" ENTERED=0 EXPORTED=()
probe_tools() {
    [ -z "$NSENTER" ] || return 0
    NSENTER=none
    # (hash finds them on PATH as `command -v` does, and BASH_CMDS keeps where, without a subshell)
    if runtime_mode && [ "$RT_MODE" != setuid ] && hash nsenter timeout 2>/dev/null; then
        NSENTER=${BASH_CMDS[nsenter]} TIMEOUT=${BASH_CMDS[timeout]}
    fi
    mapfile -t EXPORTED < <(compgen -e)  # what a probe's environment drops
}

probe_entering() {
    local name v
    ENTERED=0
    probe_tools
    [ "$NSENTER" != none ] && [ ! -f "${S_ENV%.env}.health$ENV_SUFFIX" ] || return 0
    child_of "$IPID" && [ ! /proc/"$CHILD"/ns/user -ef /proc/$$/ns/user ] || return 0
    local ns=() flag
    for v in user:-U mnt:-m pid:-p ipc:-i uts:-u cgroup:-C; do
        name=${v%:*} flag=${v#*:}
        [ -e "/proc/$CHILD/ns/$name" ] && [ ! "/proc/$CHILD/ns/$name" -ef "/proc/$$/ns/$name" ] && ns+=("$flag")
    done
    (
        unset "${EXPORTED[@]}" 2>/dev/null
        while IFS= read -r -d '' v; do export "${v?}" 2>/dev/null; done <"/proc/$CHILD/environ"
        exec "$TIMEOUT" -k 2 "$S_HEALTH_TIMEOUT" "$NSENTER" -t "$CHILD" "${ns[@]}" --preserve-credentials -- "$@"
    ) >/dev/null 2>"$RUNDIR/$S_NAME.probe.err"
    v=$?
    ENTERED=1
    if [ "$v" != 0 ]; then
        { IFS= read -r name || true; } 2>/dev/null <"$RUNDIR/$S_NAME.probe.err"
        case "$name" in nsenter:*) ENTERED=0 ;; esac  # it could not enter: the runtime probes
    fi
    return "$v"
}

# The probe's words reach the instance's sh on standard input (a here-string: a pipe or a private
# temporary file), never on a command line: on a shared node every user reads /proc/PID/cmdline,
# and a healthcheck often carries a password. CMD's words are quoted for that sh by construction.
# shellcheck disable=SC2016  # $1 and $(cat) are the probe's sh's own
PROBE_SH='cd "$1" 2>/dev/null; eval "$(cat)"'
health_once() {
    local script word rc
    case "${S_HEALTH[0]:-NONE}" in
        CMD) script="exec"
             for word in "${S_HEALTH[@]:1}"; do script+=" '${word//\'/\'\\\'\'}'"; done ;;
        CMD-SHELL) script=${S_HEALTH[1]} ;;
        *) return 0 ;;
    esac
    traced /bin/sh -c "$PROBE_SH" sh "${S_WORKDIR:-.}"  # under the tracer in intercept mode (run/lib/isolation.sh)
    probe_entering "${TRACED[@]}" <<<"$script"
    rc=$?
    [ "$ENTERED" = 1 ] && return "$rc"
    env_flags
    # a password taken off the probe's command line is in its own env file (render.health_secret)
    [ -f "${S_ENV%.env}.health$ENV_SUFFIX" ] && env_flags "${S_ENV%.env}.health.env"
    [ -n "$S_WORKDIR" ] && ENV_FLAGS+=(--pwd "$S_WORKDIR")
    timeout -k 2 "$S_HEALTH_TIMEOUT" "$RT" exec "${ENV_FLAGS[@]}" "instance://$S_INSTANCE" \
        "${TRACED[@]}" <<<"$script" >/dev/null 2>&1
}

# The last probe's result, for `ps`: "TIME INSTANCE-PID healthy|unhealthy|starting FAILURES"
# (FAILURES: consecutive failed probes).
record_health() {
    local t
    printf -v t '%(%s)T' -1
    printf '%s %s %s %s\n' "$t" "$IPID" "$1" "${2:-0}" >"$RUNDIR/$S_NAME.health" 2>/dev/null || true
}

# The recorded result, in HEALTH_NOW, while it is this instance's and fresh (as Compose reports
# the last probe's result).
HEALTH_NOW=""
recorded_health() {
    local t pid result age
    HEALTH_NOW=""
    { read -r t pid result _ || true; } 2>/dev/null <"$RUNDIR/$S_NAME.health"
    [ -n "$result" ] && [ "$pid" = "$IPID" ] || return 1
    printf -v age '%(%s)T' -1
    age=$((age - t))
    # fresh: younger than the probe interval and the supervisor's cycle (its next probe is due),
    # and never less than 5 s (a probe `ps` has just run must still count when the clock ticks
    # between probing and reading)
    ((age >= 0 && age < (${S_HEALTH_INTERVAL%.*} > 3 ? ${S_HEALTH_INTERVAL%.*} + 2 : 5))) || return 1
    HEALTH_NOW=$result
}

# The supervisor's probe of this running service, on Compose's schedule: one every interval
# after the last (the first: the one `up` waited for). A success makes it healthy; `retries`
# consecutive failures make it unhealthy, and until then it keeps its last state. In the
# background; PROBING holds the pid of a probe in flight, so that a slow one is never doubled.
declare -A PROBING=()
probe_when_due() {
    local t="" pid="" result="" failures="" now
    [ ${#S_HEALTH[@]} -gt 0 ] || return 0
    probe_tools  # once, here rather than in each probe's process
    [ -n "${PROBING[$S_NAME]:-}" ] && kill -0 "${PROBING[$S_NAME]}" 2>/dev/null && return 0
    { read -r t pid result failures || true; } 2>/dev/null <"$RUNDIR/$S_NAME.health"
    printf -v now '%(%s)T' -1
    if [ "$pid" != "$IPID" ]; then  # no probe of this instance yet
        result=starting failures=0
    elif ((now - t < ${S_HEALTH_INTERVAL%.*})); then
        return 0
    fi
    {
        if health_once; then
            record_health healthy 0
        else
            failures=$((${failures:-0} + 1))
            ((failures >= S_HEALTH_RETRIES)) && result=unhealthy
            record_health "$result" "$failures"
        fi
    } &
    PROBING[$S_NAME]=$!
}

# Compose's healthcheck schedule: during start_period, probes every start_interval and failures do
# not count; after it, `retries` consecutive failures make the service unhealthy. A probe cannot
# answer before the service listens, so the first one comes as soon as its required endpoints
# listen (within the time Compose gives it: the start period, then `retries` intervals).
wait_healthy() {
    local started=$SECONDS failures=0 period=${S_HEALTH_START_PERIOD%.*} window reason rc
    window=$((period + S_HEALTH_RETRIES * (${S_HEALTH_INTERVAL%.*} + ${S_HEALTH_TIMEOUT%.*})))
    # its required endpoints within the healthcheck's window (what it publishes is its healthcheck's to judge)
    reason=$(wait_listening "$window")
    rc=$?
    [ "$rc" = 1 ] && { echo "$reason"; return 1; }
    [ "$rc" = 2 ] && { echo "does not listen on ${reason#* } $window s after it started"; return 1; }
    while :; do
        if ! service_running; then
            exit_code
            echo "exited while its healthcheck was pending (exit code $EXIT_CODE)"
            return 1
        fi
        if health_once; then
            record_health healthy
            return 0
        fi
        if ((SECONDS - started < period)); then
            nap "$S_HEALTH_START_INTERVAL"
            continue
        fi
        failures=$((failures + 1))
        if ((failures >= S_HEALTH_RETRIES)); then
            echo "unhealthy: $S_HEALTH_RETRIES consecutive healthcheck failures"
            return 1
        fi
        nap "$S_HEALTH_INTERVAL"
    done
}
