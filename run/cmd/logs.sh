# ---- run/cmd/logs.sh: `logs [-f] SERVICE` --------------------------------------------------------

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
    detect_runtime --images-only  # (the runtime's listing is all it asks)
    if [ -n "${REPLICAS[$name]:-}" ]; then  # each replica's lines, prefixed with its name, as Compose does
        local replica pids=() flag=()
        [ "$follow" = 1 ] && flag=(-f)
        expand_replicas "$name"
        for replica in "${EXPANDED[@]}"; do
            (cmd_logs "${flag[@]}" "$replica" | sed -u "s/^/$replica | /") &
            pids+=($!)
        done
        wait "${pids[@]}"
        return 0
    fi
    load_service "$name"
    # a service that has not started since `up` has no output of this run: the runtime's log files
    # then hold an earlier run's (it keeps them after `down`)
    if [ ! -e "$RUNDIR/$name.logs" ] && { [ "$S_ONESHOT" = 1 ] || ! service_running; }; then
        die "$name has not run since \`up\`"
    fi
    if [ "$S_ONESHOT" = 1 ]; then
        files=("$STATE/logs/$name.log")
    else
        log_paths
        for f in "${LOG_PATHS[@]}"; do [ -n "$f" ] && [ -e "$f" ] && files+=("$f"); done
    fi
    [ ${#files[@]} -gt 0 ] || die "no logs for $name yet"
    if [ "$follow" = 1 ]; then tail -n +1 -F "${files[@]}"; else cat "${files[@]}"; fi
}
