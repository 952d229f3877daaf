# ---- run/cmd/restart.sh: `restart [SERVICE...]` --------------------------------------------------

# As `docker compose restart`: with no service named, every service `up` or `restart` started
# since the last `down` (those with a status), in start order. One that fails to start does not
# keep the next from its restart.
cmd_restart() {
    local name names=() failed=0
    expand_replicas "$@" && names=("${EXPANDED[@]}")  # a service of N replicas: each of them
    for name in "${names[@]}"; do load_service "$name"; done
    take_project_lock restart
    detect_runtime
    prepare_state
    if [ ${#names[@]} -eq 0 ]; then
        for name in "${SERVICES[@]}"; do
            [ -e "$RUNDIR/$name.status" ] && names+=("$name")
        done
        if [ ${#names[@]} -eq 0 ]; then
            note "restart: no service was started since \`down\` (up starts them)"
            return 0
        fi
    fi
    for name in "${names[@]}"; do
        stop_service "$name"
        load_service "$name"
        start_service "$name" restart || { get_status "$name"; echo "run.sh: $name: $STATUS" >&2; failed=1; }
    done
    return "$failed"
}
