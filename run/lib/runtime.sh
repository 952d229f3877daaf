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
    local line help
    line=$("$RT" --version 2>/dev/null) || die "$RT --version failed"
    RT_VERSION=${line##*version }  # "apptainer version 1.4.5-1.el9": 1.4.5
    RT_VERSION=${RT_VERSION%%[-+]*}
    case "$line" in
        apptainer*) ;;
        *) version_ge "$RT_VERSION" 3.6 || die "$line is too old: --env-file needs Singularity >= 3.6" ;;
    esac
    [ "${1:-}" = --images-only ] && return 0  # building needs neither
    # With --no-eval (Apptainer >= 1.1) values and the image's CMD are taken literally, as Docker
    # does; without it the runtime evaluates them once more, so the escaped env files are used.
    if help=$("$RT" exec --help 2>/dev/null) && [[ $help == *--no-eval* ]]; then
        EVAL_FLAGS=(--no-eval) ENV_SUFFIX=.env
    else
        EVAL_FLAGS=() ENV_SUFFIX=.eval.env
    fi
    writable_root_mode
}

# The image's root filesystem is writable, as under Docker (entrypoints that copy a script to /,
# logs in /var/log, schedule files in the app directory), and its changes go when the service
# stops: a directory overlay where the runtime runs unprivileged with fuse-overlayfs, or is
# Apptainer installed setuid (the starter mounts it with the kernel's overlayfs; on disk, no size
# cap), else --writable-tmpfs (in memory, capped by the runtime's "sessiondir max size";
# SingularityCE refuses directory overlays to users in setuid mode). C2S_WRITABLE_ROOT=
# overlay|tmpfs|none overrides. Measured in docs/writable-paths.md.
# (overlayfs leaves its work directory mode 000: make it removable first)
remove_overlay() {
    [ -e "$STATE/overlay/$1" ] || return 0
    chmod -R u+rwx "$STATE/overlay/$1" 2>/dev/null
    rm_inside "$STATE/overlay/$1"
}

WRITABLE_ROOT=""
writable_root_mode() {
    if [ -n "${C2S_WRITABLE_ROOT:-}" ]; then
        WRITABLE_ROOT=$C2S_WRITABLE_ROOT
        return
    fi
    runtime_mode
    if [ "$RT_MODE" = setuid ] && [ "$RT_FLAVOUR" = apptainer ]; then
        WRITABLE_ROOT=overlay
    elif [ "$RT_MODE" != setuid ] && command -v fuse-overlayfs >/dev/null 2>&1; then
        WRITABLE_ROOT=overlay
    else
        WRITABLE_ROOT=tmpfs
    fi
}

# How the runtime runs containers for this user, as it says itself, in RT_MODE: root, setuid
# (mounts in the kernel, keeps the user out of an instance's namespaces) or unprivileged (user
# namespaces). Never guessed from where its binary lies: Debian puts libexec under
# /usr/lib/TRIPLET. `buildcfg` says how it was built (APPTAINER_SUID_INSTALL in Apptainer >= 1.0,
# SINGULARITY_SUID_INSTALL in SingularityCE and Singularity 3.x; `singularity` may be Apptainer's
# link, so the keys say which), LIBEXECDIR (its starter-suid must be root-owned and setuid) and
# SYSCONFDIR (`allow setuid = no` in its config turns setuid off). compose2sif doctor decides the
# same way (doctor.runtime_mode). buildcfg's answer is kept in RUNDIR, asked again when the
# runtime's binary is newer than it.
RT_MODE="" RT_FLAVOUR=""
runtime_mode() {
    [ -n "$RT_MODE" ] && return 0
    if [ "$EUID" = 0 ]; then
        RT_MODE=root
        return 0
    fi
    local bin cache="$RUNDIR/runtime.buildcfg" cfg="" key value flavour="" suid="" libexec=/usr/libexec sysconf=/etc
    local starter allow=yes line lines=()
    bin=$RT
    [[ $RT == */* ]] || { hash "$RT" 2>/dev/null && bin=${BASH_CMDS[$RT]}; }  # (command -v's answer, no subshell)
    bin=$(readlink -f -- "$bin")
    if [ -f "$cache" ] && [ "$cache" -nt "$bin" ] && first_line "$cache" && [ "$FIRST_LINE" = "$bin" ]; then
        mapfile -t -s 1 lines <"$cache"  # (past its first line, the binary's path)
        printf -v cfg '%s\n' "${lines[@]}"
    else
        cfg=$("$RT" buildcfg 2>/dev/null) || cfg=""
        if [ -d "$RUNDIR" ]; then
            write_lines "$cache" "$bin" "$cfg"
        fi
    fi
    while IFS='=' read -r key value; do
        case "$key" in
            APPTAINER_SUID_INSTALL) flavour=apptainer suid=$value ;;
            SINGULARITY_SUID_INSTALL) [ "$flavour" = apptainer ] || flavour=singularity suid=$value ;;
            LIBEXECDIR) libexec=$value ;;
            SYSCONFDIR) sysconf=$value ;;
        esac
    done <<<"$cfg"
    [ -n "$flavour" ] || flavour=singularity
    RT_FLAVOUR=$flavour
    starter="$libexec/$flavour/bin/starter-suid"
    while IFS= read -r line; do  # the last `allow setuid` line counts, as for the runtime
        line=${line//[[:space:]]/}
        case "$line" in allowsetuid=*) allow=${line#*=} ;; esac
    done 2>/dev/null <"$sysconf/$flavour/$flavour.conf" || true
    if [ "$suid" = 1 ] && [ -u "$starter" ] && [ "$(stat -c %u "$starter" 2>/dev/null)" = 0 ] &&
        [ "${allow,,}" != no ]; then
        RT_MODE=setuid
    else
        RT_MODE=unprivileged
    fi
}

# The flags that give a command of the runtime the service's environment and nothing else, in
# ENV_FLAGS: the env file for this runtime (see detect_runtime), or the one $1 names (its
# evaluated form where the runtime evaluates values). Docker sets HOSTNAME in every container to
# its host name, and programs read it (Airflow's worker healthcheck pings `celery@$HOSTNAME`):
# here the node's, which the service's gethostname() returns (its UTS namespace is the node's),
# where the plan found that neither compose nor the image's ENV names it (S_HOSTNAME_ENV).
ENV_FLAGS=() NODE_HOSTNAME=""
env_flags() {
    local file=${1:-$S_ENV}
    file="${file%.env}$ENV_SUFFIX"
    ENV_FLAGS=(--cleanenv "${EVAL_FLAGS[@]}" --env-file "$file")
    [ -n "$NODE_HOSTNAME" ] || read -r NODE_HOSTNAME 2>/dev/null </proc/sys/kernel/hostname || NODE_HOSTNAME=$(uname -n)
    [ "${S_HOSTNAME_ENV:-0}" = 1 ] && ENV_FLAGS+=(--env "HOSTNAME=$NODE_HOSTNAME")
    return 0
}

# In setuid mode the service runs as the user, without fakeroot, and the kernel's overlayfs checks
# the user's rights: the image's directories (root's, or another user's) stay unwritable under a
# directory overlay, where Docker's root writes anywhere (an entrypoint's initdb into
# /var/lib/..., a pid file in /run/...). A directory in the overlay's upper layer gives its merged
# directory its owner and mode, and the image's files still show through it: each directory of the
# image that the user cannot write is made in overlay $1's upper layer, owned by the user, so the
# user can create and remove files anywhere, as root could; the image's own files stay read-only.
# The list comes from the image (its `find`; none where it has no find) once per SIF, kept in
# RUNDIR/KEY.sif.dirs.
shadow_image_dirs() {
    [ "$RT_MODE" = setuid ] || return 0
    local list="$RUNDIR/${S_SIF##*/}.dirs" partial
    if ! [ -f "$list" ] || [ "$S_SIF" -nt "$list" ]; then
        partial="$list.$BASHPID"  # (named here: the redirection of a program is made in its child, another BASHPID)
        "$RT" exec "$S_SIF" find / -xdev -type d ! -perm -0002 ! -user "$EUID" -print0 >"$partial" 2>/dev/null
        mv -f "$partial" "$list"
    fi
    mkdir -p "$1/upper" "$1/work" || return 0
    (cd "$1/upper" && sed -z 's|^/|./|' "$list" | xargs -0 -r mkdir -p 2>/dev/null)
    return 0
}
