# ---- run/main.sh: the command line, last in run.sh -----------------------------------------------

main() {
    local command=${1:-}
    shift || true
    check_sealed
    case "$command" in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        ps) cmd_ps "$@" ;;
        logs) cmd_logs "$@" ;;
        port) cmd_port "$@" ;;
        exec) cmd_exec "$@" ;;
        restart) cmd_restart "$@" ;;
        build) cmd_build "$@" ;;
        pull) cmd_pull "$@" ;;
        _storage) cmd_storage ;;
        _isolation) cmd_isolation ;;
        _supervise) cmd_supervise ;;
        -h | --help | help | "") sed -n '2,/^set -o/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
        *) die "unknown command $command (try: ./run.sh help)" ;;
    esac
}

# Run as a program (./run.sh, bash run.sh, sbatch run.sh), not when sourced: a test sources the
# files of run/ to call their functions.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
