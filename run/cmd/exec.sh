# ---- run/cmd/exec.sh: `exec SERVICE COMMAND...` --------------------------------------------------

cmd_exec() {
    [ $# -ge 2 ] || die "exec: usage: exec SERVICE COMMAND..."
    detect_runtime
    load_service "$1"
    shift
    service_running || die "$S_NAME is not running"
    env_flags
    gpu_env_flags
    ENV_FLAGS+=("${GPU_ENV_FLAGS[@]}")
    [ -n "$S_WORKDIR" ] && ENV_FLAGS+=(--pwd "$S_WORKDIR")
    traced "$@"  # under the tracer in intercept mode, as the service's entry (run/lib/isolation.sh)
    exec "$RT" exec "${ENV_FLAGS[@]}" "instance://$S_INSTANCE" "${TRACED[@]}"
}
