# ---- run/lib/supervise.sh: restart policies and healthchecks while services run ------------------

# A supervisor keeps restart policies, probes healthchecks on their schedule (see probe_when_due),
# and watches a service that `up` found not listening yet (watch_late).
needs_supervisor() {
    local name
    while read -r name; do
        load_service "$name"
        [ "$S_ONESHOT" = 0 ] && { [ "$S_RESTART" != no ] || [ ${#S_HEALTH[@]} -gt 0 ] || [ -f "$RUNDIR/$name.late" ]; } &&
            return 0
    done <"$RUNDIR/supervised"
    return 1
}

# Restart policies: always / unless-stopped restart an ended service; on-failure[:N] restarts it
# when it exited with a non-zero code, at most N times. Running services are probed when their
# healthcheck is due. A cycle costs no fork while every instance lives and no probe is due: the
# runtime is asked again only when one has gone.
SUPERVISOR_PID_FILE=""  # set where this process is the supervisor: it ends when the file names another
supervise() {
    declare -A attempts=()
    local name rc max pid relist
    while :; do
        # a background supervisor that another `up` or `down` replaced ends here
        if [ -n "${SUPERVISOR_PID_FILE:-}" ]; then
            pid=""
            { read -r pid _ || true; } 2>/dev/null <"$SUPERVISOR_PID_FILE"
            [ "$pid" = "$BASHPID" ] || return 0
        fi
        relist=$((1 - INSTANCES_LISTED))
        while read -r name; do
            load_service "$name"
            pid=${INSTANCE_PIDS[$S_INSTANCE]:-}
            { [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; } || relist=1
        done <"$RUNDIR/supervised"
        [ "$relist" = 1 ] && list_instances
        while read -r name; do
            load_service "$name"
            [ "$S_ONESHOT" = 1 ] && continue
            [ -f "$RUNDIR/$name.stopped" ] && continue
            service_running && { probe_when_due; watch_late; continue; }
            exit_code
            rc=$EXIT_CODE
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
            # with the project lock, up to its instance's start (RELEASE_AFTER_START): never while
            # `restart` starts it too (both would start it: "instance ... already exists"), nor while
            # `up` or `down` works; its state is read again once the lock is ours
            take_project_lock --try supervisor || continue
            refresh_instance
            if [ -f "$RUNDIR/$name.stopped" ] || service_running; then
                release_project_lock
                continue
            fi
            attempts[$name]=$((${attempts[$name]:-0} + 1))
            note "$name ended (exit code ${rc:-unknown}); restarting (restart: $S_RESTART)"
            RELEASE_AFTER_START=1
            start_service "$name" restart || { get_status "$name"; note "$name: restart failed: $STATUS"; }
            RELEASE_AFTER_START=0
            release_project_lock
        done <"$RUNDIR/supervised"
        nap 1
    done
}
