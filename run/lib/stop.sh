# ---- run/lib/stop.sh: how a service stops and its instance goes; the supervisor's stop ----------

# This service's instance (pid IPID) goes, with whatever still runs in it. `instance stop -t 0`
# would SIGKILL the instance's init and leave its starter (the init's parent) to stop the image's
# FUSE drivers and exit: a runtime start and a cleanup that cost 10-20 ms of CPU per instance.
# Here kill_instance collects the init (and its starter), and end_starters SIGKILLs the inits
# collected, their starters and the starters' FUSE drivers (their other children) together: the
# kernel tears down the mounts with the last process of their mount namespaces, and the runtime
# deletes the records of instances whose starter is gone at its next listing. The init is
# signalled only when its parent is this instance's starter (else the runtime stops it). ENDING
# collects every process that is ending, for wait_ended; STARTER is this instance's starter.
STARTER="" ENDING=() KILLED=() INITS=()
kill_instance() {
    local argv0=""
    STARTER=""
    parent_of "$IPID" && { read -r -d '' argv0 || true; } 2>/dev/null <"/proc/$PARENT/cmdline"
    case "$argv0" in
        *" instance: "*"[$S_INSTANCE]")
            STARTER=$PARENT
            kill -0 "$IPID" 2>/dev/null && { INITS+=("$IPID") KILLED+=("$STARTER"); return 0; }
            ENDING+=("$STARTER")  # (a setuid runtime's starter: it ends when the runtime stops it)
            ;;
    esac
    "$RT" instance stop -t 0 -- "$S_INSTANCE" >/dev/null 2>&1 || true
}

# One SIGKILL, in one `kill`, of every init kill_instance collected, their starters and the
# starters' other children (the FUSE drivers): the kernel tears them all down at once.
end_starters() {
    local s f k=() kids=()
    [ ${#KILLED[@]} -gt 0 ] || return 0
    for s in "${KILLED[@]}"; do
        for f in /proc/"$s"/task/*/children; do
            { read -r -a k || true; } 2>/dev/null <"$f"
            kids+=("${k[@]}")
        done
    done
    kill -KILL "${INITS[@]}" "${KILLED[@]}" "${kids[@]}" 2>/dev/null
    ENDING+=("${KILLED[@]}" "${kids[@]}")
    KILLED=() INITS=()
}

# The loaded service's instance goes at once (kill_instance, end_starters); its starter in STARTER.
remove_instance() {
    ENDING=()
    kill_instance
    end_starters
}

# Compose's stop, for the services given at once (a level of `down`, or the one of `restart`):
# the stop signal to each one's start script, which passes it on (the instance's init does not
# forward `instance stop`'s signal to it), up to each one's stop_grace_period for them to end,
# then their instances go together (see kill_instance), killing what is left. Each is marked
# stopped, for the supervisor. The processes that are ending are left in ENDING (for wait_ended);
# OUTLIVED=1 when a service outlived its grace period. Its forwarders (published ports) end first.
OUTLIVED=0
stop_services() {
    local name i t alive scripts=() graces=() instances=() ipids=() forwarders=()
    OUTLIVED=0
    for name in "$@"; do
        load_service "$name"
        : >"$RUNDIR/$name.stopped"
        stop_forwarders "$name"  # (also where its instance is gone)
        remove_files "$RUNDIR/$name.truth" "$RUNDIR/$name.late"
        forwarders+=("${FORWARDERS_ENDED[@]}")
        instance_pid
        [ -n "$IPID" ] || continue
        note "$name: stopping $S_INSTANCE"
        instances+=("$S_INSTANCE") ipids+=("$IPID")
        if child_of "$IPID" && kill -s "${S_STOP_SIGNAL#SIG}" "$CHILD" 2>/dev/null; then
            scripts+=("$CHILD") graces+=($((S_STOP_GRACE * 100)))
        fi
    done
    # t in hundredths of a second: steps of 0.01 s while a prompt end is likely, then of 0.05 s
    for ((t = 0; ; t += (t < 20 ? 1 : 5))); do
        alive=0
        for i in "${!scripts[@]}"; do
            ((t < graces[i])) && kill -0 "${scripts[i]}" 2>/dev/null && alive=1
        done
        [ "$alive" = 0 ] && break
        if ((t < 20)); then nap 0.01; else nap 0.05; fi
    done
    for i in "${!scripts[@]}"; do kill -0 "${scripts[i]}" 2>/dev/null && OUTLIVED=1; done
    ENDING=("${forwarders[@]}")
    for i in "${!instances[@]}"; do
        S_INSTANCE=${instances[i]} IPID=${ipids[i]}
        kill_instance
    done
    end_starters
}

# `restart`'s stop of service $1: gone when this returns, with what it wrote into its image (as
# under Docker) and its status.
stop_service() {
    stop_services "$1"
    wait_ended "${ENDING[@]}"
    remove_overlay "$1"
    remove_files "$RUNDIR/$1.status"
}

# The supervisor and whatever it runs (a restart in progress): its process group (setsid made a
# background one a group leader), once it is sure to be ours: supervisor.pid holds its pid and
# start time, and a pid alone may name another process by now.
stop_supervisor() {
    local pid="" start="" i
    { read -r pid start || true; } 2>/dev/null <"$RUNDIR/supervisor.pid"
    same_process "$pid" "$start" || return 0  # (tell_stale tells of it)
    rm -f "$RUNDIR/supervisor.pid"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 200; i++)); do
        parent_of "$pid" || return 0  # gone, or a zombie
        nap 0.01
    done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
}
