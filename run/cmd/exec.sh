# ---- run/cmd/exec.sh: `exec [--index N] SERVICE COMMAND...` ----------------------------------------

# --index N: which replica of a service of several (deploy.replicas), 1 by default, as Compose's.
cmd_exec() {
    local index=""
    if [ "${1:-}" = --index ]; then
        index=${2:-}
        shift 2
    fi
    [ $# -ge 2 ] || die "exec: usage: exec [--index N] SERVICE COMMAND..."
    if [ -n "${REPLICAS[$1]:-}" ]; then
        [[ " ${REPLICAS[$1]} " == *" $1-${index:-1} "* ]] || die "exec: $1 has no replica ${index:-1} (${REPLICAS[$1]})"
        load_service "$1-${index:-1}"
    else
        [ -z "$index" ] || [ "$index" = 1 ] || die "exec: $1 has one container (--index $index)"
        load_service "$1"
    fi
    detect_runtime
    shift
    service_running || die "$S_NAME is not running"
    env_flags
    gpu_env_flags
    ENV_FLAGS+=("${GPU_ENV_FLAGS[@]}")
    [ -n "$S_WORKDIR" ] && ENV_FLAGS+=(--pwd "$S_WORKDIR")
    traced "$@"  # under the tracer in intercept mode, as the service's entry (run/lib/isolation.sh)
    exec "$RT" exec "${ENV_FLAGS[@]}" "instance://$S_INSTANCE" "${TRACED[@]}"
}
