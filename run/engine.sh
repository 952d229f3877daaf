die() { echo "run.sh: $*" >&2; exit 1; }
note() { echo "[$PROJECT] $*" >&2; }

# ---- the container runtime ------------------------------------------------------------------
RT="" RT_VERSION="" EVAL_FLAGS=() ENV_SUFFIX=.env
detect_runtime() {
    if [ -n "${C2S_RUNTIME:-}" ]; then
        RT=$C2S_RUNTIME
    elif command -v apptainer >/dev/null 2>&1; then
        RT=apptainer
    elif command -v singularity >/dev/null 2>&1; then
        RT=singularity
    else
        die "neither apptainer nor singularity is on PATH (try: module load apptainer)"
    fi
    local line
    line=$("$RT" --version 2>/dev/null) || die "$RT --version failed"
    RT_VERSION=$(printf '%s\n' "$line" | sed 's/^.*version //; s/[-+].*$//')
    case "$line" in
        apptainer*) ;;
        *) version_ge "$RT_VERSION" 3.6 || die "$line is too old: --env-file needs Singularity >= 3.6" ;;
    esac
    # With --no-eval (Apptainer >= 1.1) values and the image's CMD are taken literally, as Docker
    # does; without it the runtime evaluates them once more, so the escaped env files are used.
    if "$RT" exec --help 2>/dev/null | grep -q -- '--no-eval'; then
        EVAL_FLAGS=(--no-eval) ENV_SUFFIX=.env
    else
        EVAL_FLAGS=() ENV_SUFFIX=.eval.env
    fi
}

# The service's env file for this runtime (see detect_runtime).
env_file() { printf '%s' "${S_ENV%.env}$ENV_SUFFIX"; }

version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]; }

# ---- small helpers --------------------------------------------------------------------------
abs() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s' "$HERE/$1" ;; esac; }

status_file() { printf '%s' "$RUNDIR/$1.status"; }
set_status() {
    printf '%s\n' "$2" >"$(status_file "$1").tmp" && mv -f "$(status_file "$1").tmp" "$(status_file "$1")"
    printf '%s %s\n' "$(date +%s.%N)" "${2%% *}" >>"$RUNDIR/$1.timeline"
}
get_status() { cat "$(status_file "$1")" 2>/dev/null || true; }

# The pid of a running instance, from `instance list --json NAME` (no jq on most nodes).
instance_pid() {
    "$RT" instance list --json "$1" 2>/dev/null | tr -d ' \t\n' |
        sed -n "s/.*\"instance\":\"$1\",\"pid\":\([0-9]*\).*/\1/p"
}

# The pid of a child of process $1 (the instance's init runs the start script, which runs the service).
child_of() {
    local stat rest fields
    for stat in /proc/[0-9]*/stat; do
        rest=$(cat "$stat" 2>/dev/null) || continue
        read -r -a fields <<<"${rest##*) }"   # after "(comm) ": state ppid ...
        if [ "${fields[1]}" = "$1" ]; then
            stat=${stat#/proc/}
            echo "${stat%/stat}"
            return 0
        fi
    done
    return 1
}

has_children() { child_of "$1" >/dev/null; }

# running: the instance exists and its start script still runs; exited: the instance exists
# but the service ended (or was killed); absent: no instance.
service_state() {
    local pid
    pid=$(instance_pid "$S_INSTANCE")
    if [ -z "$pid" ]; then
        echo absent
    elif kill -0 "$pid" 2>/dev/null && has_children "$pid"; then
        echo running
    else
        echo exited
    fi
}

exit_code() { cat "$(tmp_dir)/.c2s-exit" 2>/dev/null || true; }
tmp_dir() { printf '%s' "$(abs "$S_TMP")"; }

port_listening() {
    local hex
    hex=$(printf '%04X' "$1")
    awk -v p="$hex" '$4 == "0A" { n = split($2, a, ":"); if (a[n] == p) found = 1 } END { exit !found }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

log_paths() {
    local json out err base
    json=$("$RT" instance list --json "$S_INSTANCE" 2>/dev/null | tr -d '\n')
    out=$(printf '%s' "$json" | sed -n 's/.*"logOutPath": *"\([^"]*\)".*/\1/p')
    err=$(printf '%s' "$json" | sed -n 's/.*"logErrPath": *"\([^"]*\)".*/\1/p')
    if [ -z "$out" ]; then
        for base in "${APPTAINER_CONFIGDIR:-$HOME/.apptainer}" "${SINGULARITY_CONFIGDIR:-$HOME/.singularity}"; do
            for out in "$base"/instances/logs/*/"$(id -un)"/"$S_INSTANCE".out; do
                [ -e "$out" ] && { err=${out%.out}.err; break 2; }
            done
            out=""
        done
    fi
    printf '%s\n%s\n' "$out" "$err"
}

# Apptainer appends to an instance's log files; a fresh start gets fresh logs.
clear_logs() {
    local base
    for base in "${APPTAINER_CONFIGDIR:-$HOME/.apptainer}" "${SINGULARITY_CONFIGDIR:-$HOME/.singularity}"; do
        rm -f "$base"/instances/logs/*/"$(id -un)"/"$S_INSTANCE".out "$base"/instances/logs/*/"$(id -un)"/"$S_INSTANCE".err
    done
}

log_tail() {
    local n=${1:-20} f
    if [ "$S_ONESHOT" = 1 ]; then
        tail -n "$n" "$STATE/logs/$S_NAME.log" 2>/dev/null
        return
    fi
    while IFS= read -r f; do
        [ -n "$f" ] && [ -e "$f" ] && tail -n "$n" "$f"
    done < <(log_paths)
}

# ---- state directory, hosts file --------------------------------------------------------------
prepare_state() {
    umask 077
    mkdir -p "$STATE" "$RUNDIR" "$STATE/logs" "$STATE/volumes" "$STATE/services"
    chmod 0700 "$STATE"
    # /etc/hosts in every instance: the node's own entries, then every service name on 127.0.0.1
    {
        cat /etc/hosts 2>/dev/null
        echo "# compose2sif: $PROJECT"
        cat "$HERE/hosts.names"
    } >"$STATE/hosts.tmp" && mv -f "$STATE/hosts.tmp" "$STATE/hosts"
    chmod 0644 "$STATE/hosts"
}

# ---- GPUs -------------------------------------------------------------------------------------
GPU_POOL=()
gpu_pool() {
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        IFS=, read -r -a GPU_POOL <<<"$CUDA_VISIBLE_DEVICES"
    elif command -v nvidia-smi >/dev/null 2>&1; then
        local n
        n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
        GPU_POOL=()
        for ((i = 0; i < n; i++)); do GPU_POOL+=("$i"); done
    fi
}

# Give each GPU service its devices, in start order, so that services get disjoint GPUs.
assign_gpus() {
    local name next=0 spec ids count i
    gpu_pool
    for name in "$@"; do
        load_service "$name"
        [ "$S_NV" = 1 ] || continue
        ids=""
        for spec in "${S_GPUS[@]}"; do
            case "$spec" in
                ids=*) ids=${ids:+$ids,}${spec#ids=} ;;
                count=-1) ids=$(IFS=,; echo "${GPU_POOL[*]}") ;;
                count=*)
                    count=${spec#count=}
                    if ((next + count > ${#GPU_POOL[@]})); then
                        die "service $name wants $count GPU(s) but only ${#GPU_POOL[@]} are visible and $next are taken"
                    fi
                    for ((i = 0; i < count; i++)); do ids=${ids:+$ids,}${GPU_POOL[next + i]}; done
                    next=$((next + count))
                    ;;
            esac
        done
        printf '%s\n' "$ids" >"$RUNDIR/$name.gpus"
    done
}

# ---- starting one service -----------------------------------------------------------------------
runtime_flags() {
    # (no --pwd: `instance start` has none; the start script changes to the working directory)
    FLAGS=(--cleanenv "${EVAL_FLAGS[@]}" --env-file "$(env_file)")
    FLAGS+=(--bind "$STATE/hosts:/etc/hosts:ro")
    local b src rest
    for b in "${S_BINDS[@]}"; do
        src=${b%%:*} rest=${b#*:}
        FLAGS+=(--bind "$(abs "$src"):$rest")
    done
    [ "$S_NV" = 1 ] && FLAGS+=(--nv)
    if [ "$S_NV" = 1 ] && [ -s "$RUNDIR/$S_NAME.gpus" ]; then
        FLAGS+=(--env "CUDA_VISIBLE_DEVICES=$(cat "$RUNDIR/$S_NAME.gpus")")
    fi
    [ "$S_WRITABLE_TMPFS" = 1 ] && FLAGS+=(--writable-tmpfs)
    mkdir -p "$STATE/services/$S_NAME/home"
    FLAGS+=(--home "$STATE/services/$S_NAME/home")
}

prepare_dirs() {
    local d
    for d in "${S_EMPTY[@]}"; do rm -rf "$(abs "$d")"; done
    for d in "${S_MKDIRS[@]}"; do [ -e "$(abs "$d")" ] || mkdir -p "$(abs "$d")"; done
}

# Wait until each dependency meets its condition. Fails if one fails.
wait_dependencies() {
    local dep name cond st
    for dep in "${S_DEPENDS[@]}"; do
        name=${dep%%:*} cond=${dep#*:}
        while :; do
            st=$(get_status "$name")
            case "$cond:$st" in
                service_started:started | service_started:healthy | service_started:completed\ 0) break ;;
                service_healthy:healthy) break ;;
                service_completed_successfully:completed\ 0) break ;;
                *:failed* | service_completed_successfully:completed\ *)
                    echo "dependency $name did not become ${cond#service_} ($st)"
                    return 1
                    ;;
            esac
            sleep 0.3
        done
    done
}

health_once() {
    local cmd=()
    case "${S_HEALTH[0]:-NONE}" in
        CMD) cmd=("${S_HEALTH[@]:1}") ;;
        CMD-SHELL) cmd=(/bin/sh -c "${S_HEALTH[1]}") ;;
        *) return 0 ;;
    esac
    local flags=(--cleanenv "${EVAL_FLAGS[@]}" --env-file "$(env_file)")
    [ -n "$S_WORKDIR" ] && flags+=(--pwd "$S_WORKDIR")
    timeout -k 2 "$S_HEALTH_TIMEOUT" "$RT" exec "${flags[@]}" "instance://$S_INSTANCE" "${cmd[@]}" >/dev/null 2>&1
}

# Compose's healthcheck schedule: during start_period, probes every start_interval and failures do
# not count; after it, `retries` consecutive failures make the service unhealthy.
wait_healthy() {
    local started=$SECONDS failures=0 period=${S_HEALTH_START_PERIOD%.*}
    sleep 1
    while :; do
        if [ "$(service_state)" != running ]; then
            echo "exited while its healthcheck was pending (exit code $(exit_code))"
            return 1
        fi
        health_once && return 0
        if ((SECONDS - started < period)); then
            sleep "$S_HEALTH_START_INTERVAL"
            continue
        fi
        failures=$((failures + 1))
        if ((failures >= S_HEALTH_RETRIES)); then
            echo "unhealthy: $S_HEALTH_RETRIES consecutive healthcheck failures"
            return 1
        fi
        sleep "$S_HEALTH_INTERVAL"
    done
}

start_service() {
    local name=$1 reason st p
    load_service "$name"
    if ! reason=$(wait_dependencies); then
        set_status "$name" "failed $reason"
        return 1
    fi
    set_status "$name" starting
    st=$(service_state)
    if [ "$st" = running ]; then
        note "$name: already running"
    else
        [ "$st" = exited ] && "$RT" instance stop "$S_INSTANCE" >/dev/null 2>&1
        [ -f "$S_SIF" ] || { set_status "$name" "failed image $S_SIF is missing (run: ./run.sh build)"; return 1; }
        for p in "${S_PORTS[@]}"; do
            if port_listening "$p"; then
                set_status "$name" "failed port $p is already in use on this node (convert again here to re-plan)"
                return 1
            fi
        done
        prepare_dirs
        clear_logs
        rm -f "$RUNDIR/$name.stopped"
        runtime_flags
        if [ "$S_ONESHOT" = 1 ]; then
            note "$name: running to completion"
            "$RT" exec "${FLAGS[@]}" "$S_SIF" /.singularity.d/startscript >"$STATE/logs/$name.log" 2>&1
            local rc=$?
            set_status "$name" "completed $rc"
            [ "$rc" = 0 ] || { set_status "$name" "failed exited with code $rc"; return 1; }
            return 0
        fi
        note "$name: starting instance $S_INSTANCE"
        if ! "$RT" instance start "${FLAGS[@]}" "$S_SIF" "$S_INSTANCE" >"$STATE/logs/$name.start.log" 2>&1; then
            set_status "$name" "failed instance start: $(grep -v '^INFO' "$STATE/logs/$name.start.log" | head -n 2 | tr '\n' ' ')"
            return 1
        fi
        sleep 0.5
        if [ "$(service_state)" != running ]; then
            sleep 1
            if [ "$(service_state)" != running ]; then
                set_status "$name" "failed exited right after start (exit code $(exit_code))"
                return 1
            fi
        fi
    fi
    set_status "$name" started
    if [ ${#S_HEALTH[@]} -gt 0 ]; then
        if ! reason=$(wait_healthy); then
            set_status "$name" "failed $reason"
            return 1
        fi
        set_status "$name" healthy
        note "$name: healthy"
    fi
    return 0
}

# The services to start: the ones asked for and everything they depend on, in start order.
closure() {
    local wanted=("$@") name dep changed=1 out=()
    [ ${#wanted[@]} -eq 0 ] && { printf '%s\n' "${SERVICES[@]}"; return; }
    declare -A in=()
    for name in "${wanted[@]}"; do load_service "$name"; in[$name]=1; done
    while [ $changed = 1 ]; do
        changed=0
        for name in "${!in[@]}"; do
            load_service "$name"
            for dep in "${S_DEPENDS[@]}"; do
                dep=${dep%%:*}
                [ -n "${in[$dep]:-}" ] || { in[$dep]=1; changed=1; }
            done
        done
    done
    for name in "${SERVICES[@]}"; do [ -n "${in[$name]:-}" ] && out+=("$name"); done
    printf '%s\n' "${out[@]}"
}

cmd_up() {
    local detach=0 names=() name failed=0 pids=() st
    while [ $# -gt 0 ]; do
        case "$1" in
            -d | --detach) detach=1 ;;
            -*) die "up: unknown option $1" ;;
            *) names+=("$1") ;;
        esac
        shift
    done
    for name in "${names[@]}"; do load_service "$name"; done  # unknown names end here, with a message
    detect_runtime
    prepare_state
    stop_supervisor  # one supervisor per project; a new one starts below
    mapfile -t names < <(closure "${names[@]}")
    for name in "${names[@]}"; do rm -f "$(status_file "$name")" "$RUNDIR/$name.timeline"; done
    assign_gpus "${names[@]}"
    for name in "${names[@]}"; do
        start_service "$name" &
        pids+=($!)
    done
    local pid
    for pid in "${pids[@]}"; do wait "$pid" || true; done
    for name in "${names[@]}"; do
        case "$(get_status "$name")" in failed*) sleep 1; break ;; esac  # let the runtime flush the logs
    done
    for name in "${names[@]}"; do
        st=$(get_status "$name")
        case "$st" in
            failed*)
                failed=1
                load_service "$name"
                echo "run.sh: service $name failed: ${st#failed }" >&2
                case "$st" in
                    *dependency*) ;;
                    *) echo "--- last 20 log lines of $name ---" >&2; log_tail 20 >&2; echo "---" >&2 ;;
                esac
                ;;
        esac
    done
    if [ "$failed" = 1 ]; then
        return 1
    fi
    note "up: ${names[*]}"
    printf '%s\n' "${names[@]}" >"$RUNDIR/supervised"
    if [ "$detach" = 1 ]; then
        if needs_supervisor; then
            nohup setsid "$HERE/run.sh" _supervise </dev/null >"$STATE/logs/supervisor.log" 2>&1 &
            echo $! >"$RUNDIR/supervisor.pid"
        fi
        return 0
    fi
    trap 'note "stopping (signal)"; cmd_down; exit 0' TERM INT HUP
    supervise
}

needs_supervisor() {
    local name
    while read -r name; do
        load_service "$name"
        [ "$S_RESTART" != no ] && [ "$S_ONESHOT" = 0 ] && return 0
    done <"$RUNDIR/supervised"
    return 1
}

# Restart policies: always / unless-stopped restart an ended service; on-failure[:N] restarts it
# when it exited with a non-zero code, at most N times.
supervise() {
    declare -A attempts=()
    local name rc max
    while :; do
        # a background supervisor that another `up` or `down` replaced ends here
        if [ -n "${SUPERVISOR_PID_FILE:-}" ] && [ "$(cat "$SUPERVISOR_PID_FILE" 2>/dev/null)" != "$BASHPID" ]; then
            return 0
        fi
        while read -r name; do
            load_service "$name"
            [ "$S_ONESHOT" = 1 ] && continue
            [ -f "$RUNDIR/$name.stopped" ] && continue
            [ "$(service_state)" = running ] && continue
            rc=$(exit_code)
            case "$S_RESTART" in
                always | unless-stopped) ;;
                on-failure*)
                    [ "${rc:-1}" != 0 ] || continue
                    max=${S_RESTART#on-failure}
                    max=${max#:}
                    if [ -n "$max" ] && ((${attempts[$name]:-0} >= max)); then continue; fi
                    ;;
                *) continue ;;
            esac
            attempts[$name]=$((${attempts[$name]:-0} + 1))
            note "$name ended (exit code ${rc:-unknown}); restarting (restart: $S_RESTART)"
            S_DEPENDS=()
            start_service "$name" || note "$name: restart failed: $(get_status "$name")"
        done <"$RUNDIR/supervised"
        sleep 3 &
        wait $! || true
    done
}

cmd_supervise() {
    detect_runtime
    trap 'exit 0' TERM INT
    SUPERVISOR_PID_FILE="$RUNDIR/supervisor.pid"
    local i
    for ((i = 0; i < 50; i++)); do  # `up` writes our pid just after starting us
        [ "$(cat "$SUPERVISOR_PID_FILE" 2>/dev/null)" = "$BASHPID" ] && break
        sleep 0.1
    done
    supervise
}

# Compose's stop: the stop signal to the service, up to stop_grace_period to end, then the instance
# goes (killing what is left). The signal goes to the start script, which passes it on: the
# instance's init does not forward `instance stop`'s signal to it.
stop_service() {
    local name=$1 pid script waited=0
    load_service "$name"
    touch "$RUNDIR/$name.stopped"
    pid=$(instance_pid "$S_INSTANCE")
    if [ -n "$pid" ]; then
        note "$name: stopping $S_INSTANCE"
        if script=$(child_of "$pid") && kill -s "${S_STOP_SIGNAL#SIG}" "$script" 2>/dev/null; then
            while kill -0 "$script" 2>/dev/null && ((waited < S_STOP_GRACE * 5)); do
                sleep 0.2
                waited=$((waited + 1))
            done
        fi
        "$RT" instance stop -t 1 "$S_INSTANCE" >/dev/null 2>&1 ||
            "$RT" instance stop -F "$S_INSTANCE" >/dev/null 2>&1 || true
    fi
    rm -f "$(status_file "$name")"
}

stop_supervisor() {
    if [ -f "$RUNDIR/supervisor.pid" ]; then
        kill "$(cat "$RUNDIR/supervisor.pid")" 2>/dev/null || true
        rm -f "$RUNDIR/supervisor.pid"
    fi
}

cmd_down() {
    local volumes=0 i pid
    [ "${1:-}" = -v ] || [ "${1:-}" = --volumes ] && volumes=1
    detect_runtime
    mkdir -p "$RUNDIR"
    stop_supervisor
    # reverse start order, one level at a time, the services of a level in parallel
    local level pids=()
    for ((level = MAX_LEVEL; level >= 0; level--)); do
        pids=()
        for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do
            [ "${LEVELS[i]}" = "$level" ] || continue
            stop_service "${SERVICES[i]}" &
            pids+=($!)
        done
        for pid in "${pids[@]}"; do wait "$pid"; done
    done
    if [ "$volumes" = 1 ]; then
        note "removing volumes in $STATE/volumes"
        rm -rf "$STATE/volumes"
    fi
}

cmd_ps() {
    local json=0 name st health rc first=1 ports
    [ "${1:-}" = --format ] && [ "${2:-}" = json ] && json=1
    detect_runtime
    [ "$json" = 1 ] && printf '['
    [ "$json" = 0 ] && printf '%-20s %-28s %-10s %-10s %s\n' SERVICE INSTANCE STATE HEALTH PORTS
    for name in "${SERVICES[@]}"; do
        load_service "$name"
        st=$(service_state)
        rc=$(exit_code)
        health=none
        if [ ${#S_HEALTH[@]} -gt 0 ] && [ "$st" = running ]; then
            if health_once; then health=healthy; else health=unhealthy; fi
        fi
        if [ "$S_ONESHOT" = 1 ]; then
            case "$(get_status "$name")" in
                completed*) st=exited rc=$(get_status "$name"); rc=${rc#completed } ;;
            esac
        fi
        if [ "$st" = absent ]; then
            # gone without `down`: it ended or was killed; otherwise it is simply not running
            case "$(get_status "$name")" in
                started | healthy) st=exited ;;
                *) st=stopped ;;
            esac
        fi
        ports=$(IFS=,; echo "${S_PORTS[*]}")
        if [ "$json" = 1 ]; then
            [ "$first" = 1 ] || printf ','
            first=0
            printf '{"service":"%s","instance":"%s","state":"%s","exit_code":%s,"health":"%s","ports":[%s]}' \
                "$name" "$S_INSTANCE" "$st" "${rc:-null}" "$health" "$ports"
        else
            [ "$st" = exited ] && st="exited($rc)"
            printf '%-20s %-28s %-10s %-10s %s\n' "$name" "$S_INSTANCE" "$st" "$health" "$ports"
        fi
    done
    [ "$json" = 1 ] && printf ']\n'
    return 0
}

cmd_logs() {
    local follow=0 name="" files=() f
    while [ $# -gt 0 ]; do
        case "$1" in
            -f | --follow) follow=1 ;;
            *) name=$1 ;;
        esac
        shift
    done
    [ -n "$name" ] || die "logs: name a service"
    detect_runtime
    load_service "$name"
    if [ "$S_ONESHOT" = 1 ]; then
        files=("$STATE/logs/$name.log")
    else
        while IFS= read -r f; do [ -n "$f" ] && [ -e "$f" ] && files+=("$f"); done < <(log_paths)
    fi
    [ ${#files[@]} -gt 0 ] || die "no logs for $name yet"
    if [ "$follow" = 1 ]; then tail -n +1 -F "${files[@]}"; else cat "${files[@]}"; fi
}

cmd_exec() {
    [ $# -ge 2 ] || die "exec: usage: exec SERVICE COMMAND..."
    detect_runtime
    load_service "$1"
    shift
    [ "$(service_state)" = running ] || die "$S_NAME is not running"
    local flags=(--cleanenv "${EVAL_FLAGS[@]}" --env-file "$(env_file)")
    [ -n "$S_WORKDIR" ] && flags+=(--pwd "$S_WORKDIR")
    exec "$RT" exec "${flags[@]}" "instance://$S_INSTANCE" "$@"
}

cmd_restart() {
    [ $# -ge 1 ] || die "restart: name a service"
    detect_runtime
    prepare_state
    local name
    for name in "$@"; do
        stop_service "$name"
        load_service "$name"
        S_DEPENDS=()
        start_service "$name" || { echo "run.sh: $name: $(get_status "$name")" >&2; return 1; }
    done
}

# SIFs are shared between projects by the sha256 of their definition, in the user's cache.
SIF_CACHE=${C2S_SIF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/compose2sif/sif}

build_one() {
    local key=$1 def="$HERE/definitions/$1.def" sif="$HERE/sif/$1.sif" digest log flags=()
    digest=$(sha256sum "$def" | cut -d' ' -f1)
    if [ -f "$sif" ] && [ "$(cat "$sif.digest" 2>/dev/null)" = "$digest" ] && [ "${C2S_FORCE_BUILD:-0}" != 1 ]; then
        note "image $key: up to date"
        return 0
    fi
    if [ -f "$SIF_CACHE/$digest.sif" ] && [ "${C2S_FORCE_BUILD:-0}" != 1 ]; then
        ln -f "$SIF_CACHE/$digest.sif" "$sif" 2>/dev/null || cp -f "$SIF_CACHE/$digest.sif" "$sif"
        printf '%s\n' "$digest" >"$sif.digest"
        note "image $key: taken from $SIF_CACHE"
        return 0
    fi
    if grep -q '^%post' "$def" && [ "$(id -u)" != 0 ]; then
        flags+=(--fakeroot)
    fi
    log="$STATE/logs/build-$key.log"
    note "image $key: building ${flags[*]}"
    if "$RT" build --force "${flags[@]}" "$sif.tmp" "$def" >"$log" 2>&1; then
        mv -f "$sif.tmp" "$sif"
        printf '%s\n' "$digest" >"$sif.digest"
        if (umask 077 && mkdir -p "$SIF_CACHE") && ! ln -f "$sif" "$SIF_CACHE/$digest.sif" 2>/dev/null; then
            cp -f "$sif" "$SIF_CACHE/$digest.sif.tmp" && mv -f "$SIF_CACHE/$digest.sif.tmp" "$SIF_CACHE/$digest.sif"
        fi
        note "image $key: built"
    else
        rm -f "$sif.tmp"
        return 1
    fi
}

cmd_build() {
    detect_runtime
    prepare_state
    mkdir -p "$HERE/sif"
    local key jobs=${C2S_BUILD_JOBS:-2} pids=() keys=() failed=() i
    for key in "${IMAGES[@]}"; do
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.3; done
        build_one "$key" &
        pids+=($!) keys+=("$key")
    done
    for i in "${!pids[@]}"; do wait "${pids[i]}" || failed+=("${keys[i]}"); done
    # Parallel builds can trip over each other in the runtime's layer cache: retry one at a time.
    for key in "${failed[@]}"; do
        note "image $key: build failed; retrying alone"
        if ! build_one "$key"; then
            echo "run.sh: building image $key failed; last lines of $STATE/logs/build-$key.log:" >&2
            tail -n 20 "$STATE/logs/build-$key.log" >&2
            return 1
        fi
    done
    return 0
}

main() {
    local command=${1:-}
    shift || true
    case "$command" in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        ps) cmd_ps "$@" ;;
        logs) cmd_logs "$@" ;;
        exec) cmd_exec "$@" ;;
        restart) cmd_restart "$@" ;;
        build) cmd_build "$@" ;;
        _supervise) cmd_supervise ;;
        -h | --help | help | "") sed -n '2,/^set -o/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
        *) die "unknown command $command (try: ./run.sh help)" ;;
    esac
}

main "$@"
