# ---- run/cmd/down.sh: `down [-v]` ------------------------------------------------------------

# Compose's down, in reverse start order: the stop signal to every service of a level at once,
# up to each one's stop_grace_period for them to end, then their instances go and the next level
# starts while the runtime tears those down (run/lib/stop.sh: stop_services). Everything has ended
# when `down` returns.
cmd_down() {
    local volumes=0 level i names=() starters=() statuses=()
    [ "${1:-}" = -v ] || [ "${1:-}" = --volumes ] && volumes=1
    take_project_lock down
    detect_runtime --images-only  # (down runs no image: the rest of the probing is not needed)
    make_dirs "$RUNDIR"
    stop_supervisor
    list_instances
    clean_stale down
    for ((level = MAX_LEVEL; level >= 0; level--)); do
        names=()
        for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do
            [ "${LEVELS[i]}" = "$level" ] || continue
            # (with its status, the free ports its published ports got: kept until down)
            names+=("${SERVICES[i]}") statuses+=("$RUNDIR/${SERVICES[i]}.status" "$RUNDIR/${SERVICES[i]}.published")
        done
        stop_services "${names[@]}"
        starters+=("${ENDING[@]}")
        # a service that outlived its grace period is gone before the next level gets its signal
        if [ "$OUTLIVED" = 1 ]; then
            wait_ended "${starters[@]}"
            starters=()
        fi
    done
    stop_dns  # the project's DNS server (run/lib/dns.sh), once every service has gone
    wait_ended "${starters[@]}" "${DNS_ENDED[@]}"
    [ ${#starters[@]} -gt 0 ] && "$RT" instance list >/dev/null 2>&1  # it deletes the records of the instances killed
    remove_files "${statuses[@]}"
    # what the services wrote into their images (every overlay is one of this project's services)
    if [ -e "$STATE/overlay" ]; then
        chmod -R u+rwx "$STATE/overlay" 2>/dev/null
        rm_inside "$STATE/overlay"
    fi
    # anonymous volumes are renewed after `down`, as a later `up` of Docker Compose makes new containers
    rm_inside "$STATE/anonymous"
    rm_inside "$STATE/pre_start"  # and pre_start steps run again, for the new containers (run/lib/pre_start.sh)
    if [ "$volumes" = 1 ]; then
        note "removing volumes in $STATE/volumes"
        rm_inside "$STATE/volumes"
    fi
}
