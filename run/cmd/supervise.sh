# ---- run/cmd/supervise.sh: `_supervise`, the supervisor `up -d` starts ---------------------------

cmd_supervise() {
    detect_runtime
    trap 'exit 0' TERM INT
    SUPERVISOR_PID_FILE="$RUNDIR/supervisor.pid"
    local i pid
    for ((i = 0; i < 50; i++)); do  # `up` writes our pid just after starting us
        pid=""
        { read -r pid _ || true; } 2>/dev/null <"$SUPERVISOR_PID_FILE"
        [ "$pid" = "$BASHPID" ] && break
        nap 0.1
    done
    supervise
}
