# ---- run/lib/runtime.sh: which runtime, what it can do, the flags that give a service its env ----

RT="" RT_VERSION="" EVAL_FLAGS=() ENV_SUFFIX=.env
detect_runtime() {
    if [ -n "${C2S_RUNTIME:-}" ]; then
        RT=$C2S_RUNTIME
    elif command -v apptainer >/dev/null 2>&1; then
        RT=apptainer
    elif command -v singularity >/dev/null 2>&1; then
        RT=singularity
    else
        die "neither apptainer nor singularity is on PATH (try: module load apptainer)"
    fi
    local line
    line=$("$RT" --version 2>/dev/null) || die "$RT --version failed"
    RT_VERSION=$(printf '%s\n' "$line" | sed 's/^.*version //; s/[-+].*$//')
    case "$line" in
        apptainer*) ;;
        *) version_ge "$RT_VERSION" 3.6 || die "$line is too old: --env-file needs Singularity >= 3.6" ;;
    esac
    [ "${1:-}" = --images-only ] && return 0  # building needs neither
    # With --no-eval (Apptainer >= 1.1) values and the image's CMD are taken literally, as Docker
    # does; without it the runtime evaluates them once more, so the escaped env files are used.
    if "$RT" exec --help 2>/dev/null | grep -- --no-eval >/dev/null; then  # not -q: with pipefail, a SIGPIPE would fail it
        EVAL_FLAGS=(--no-eval) ENV_SUFFIX=.env
    else
        EVAL_FLAGS=() ENV_SUFFIX=.eval.env
    fi
    WRITABLE_ROOT=$(writable_root_mode)
}

# The image's root filesystem is writable, as under Docker (entrypoints that copy a script to /,
# logs in /var/log, schedule files in the app directory), and its changes go when the service
# stops: a directory overlay where the runtime runs unprivileged with fuse-overlayfs (on disk, no
# size cap), else --writable-tmpfs (in memory, capped by the runtime's "sessiondir max size").
# Setuid installs refuse directory overlays to users. C2S_WRITABLE_ROOT=overlay|tmpfs|none
# overrides. Measured in docs/writable-paths.md.
# (overlayfs leaves its work directory mode 000: make it removable first)
remove_overlay() {
    [ -e "$STATE/overlay/$1" ] || return 0
    chmod -R u+rwx "$STATE/overlay/$1" 2>/dev/null
    rm_inside "$STATE/overlay/$1"
}

WRITABLE_ROOT=""
writable_root_mode() {
    if [ -n "${C2S_WRITABLE_ROOT:-}" ]; then
        printf '%s' "$C2S_WRITABLE_ROOT"
        return
    fi
    if ! runtime_is_setuid && command -v fuse-overlayfs >/dev/null 2>&1; then
        printf overlay
    else
        printf tmpfs
    fi
}

# Whether the runtime is a setuid install: its starter-suid, beside the runtime's binary, has the
# setuid bit. Such a runtime mounts in the kernel, refuses directory overlays to users, and keeps
# the user out of an instance's namespaces.
runtime_is_setuid() {
    [ -u "$(dirname "$(readlink -f "$(command -v "$RT")")")/../libexec/$RT/bin/starter-suid" ]
}

# The flags that give a command of the runtime the service's environment and nothing else, in
# ENV_FLAGS: the env file for this runtime (see detect_runtime), or the one $1 names (its
# evaluated form where the runtime evaluates values).
ENV_FLAGS=()
env_flags() {
    local file=${1:-$S_ENV}
    ENV_FLAGS=(--cleanenv "${EVAL_FLAGS[@]}" --env-file "${file%.env}$ENV_SUFFIX")
}
