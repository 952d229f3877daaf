# ---- run/cmd/restart.sh: `restart SERVICE...` ----------------------------------------------------

cmd_restart() {
    [ $# -ge 1 ] || die "restart: name a service"
    local name
    for name in "$@"; do load_service "$name"; done
    take_project_lock restart
    detect_runtime
    prepare_state
    for name in "$@"; do
        stop_service "$name"
        load_service "$name"
        start_service "$name" restart || { echo "run.sh: $name: $(get_status "$name")" >&2; return 1; }
    done
}
