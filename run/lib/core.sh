# ---- run/lib/core.sh: messages, versions, safe deletes, JSON strings, naps --------------------
# (Every file of run/ only defines functions and their globals: nothing runs when it is sourced.
# compose2sif joins them into run.sh after the project's data; see run/README.md.)

# One line on stderr; die ends run.sh with status 1.
die() { echo "run.sh: $*" >&2; exit 1; }
note() { echo "[$PROJECT] $*" >&2; }

# FILE gets the lines LINE..., written beside it under a name of this process's own ($BASHPID: each
# subshell's, where $$ is the script's) and renamed into place: a reader sees all of it or the old file.
write_lines() {
    local file=$1
    shift
    printf '%s\n' "$@" >"$file.$BASHPID" && mv -f "$file.$BASHPID" "$file"
}

version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]; }

# rm -rf only what lies inside the output directory once its parent is resolved: a link planted
# there must not send a delete elsewhere (a link itself is removed, not followed).
ROOT_REAL=""
rm_inside() {
    local path parent
    for path in "$@"; do
        [ -e "$path" ] || [ -L "$path" ] || continue
        [ -n "$ROOT_REAL" ] || ROOT_REAL=$(cd "$HERE" && pwd -P)  # (once there is something to delete)
        split_path "$path"
        parent=$(readlink -m -- "$PATH_DIR") || die "cannot resolve $path"
        case "$parent/$PATH_BASE" in
            */. | */..) die "refusing to delete $path" ;;
            "$ROOT_REAL"/?*) rm -rf -- "${parent:?}/$PATH_BASE" ;;
            *) die "refusing to delete $path: it lies in $parent, outside $ROOT_REAL" ;;
        esac
    done
}

# dirname and basename of path $1 without a child process, in PATH_DIR and PATH_BASE.
PATH_DIR="" PATH_BASE=""
split_path() {
    local p=$1
    p=${p%"${p##*[!/]}"}  # its trailing slashes go
    if [ -z "$p" ]; then  # "/" (or "//..."), or ""
        if [ -n "$1" ]; then PATH_DIR=/ PATH_BASE=/; else PATH_DIR=. PATH_BASE=""; fi
        return 0
    fi
    PATH_BASE=${p##*/}
    case "$p" in
        */*)
            PATH_DIR=${p%/*}
            PATH_DIR=${PATH_DIR%"${PATH_DIR##*[!/]}"}
            [ -n "$PATH_DIR" ] || PATH_DIR=/
            ;;
        *) PATH_DIR=. ;;
    esac
}

# rm -f of the given paths, run only where one of them is there (most often none is: no child
# process then).
remove_files() {
    local path
    for path in "$@"; do
        if [ -e "$path" ] || [ -L "$path" ]; then
            rm -f "$@"
            return
        fi
    done
    return 0
}

# mkdir -p of the given directories, run only where one of them is not a directory yet.
make_dirs() {
    local dir
    for dir in "$@"; do
        if [ ! -d "$dir" ]; then
            mkdir -p "$@"
            return
        fi
    done
    return 0
}

# The directories run.sh writes in are real directories of the output dir, never planted links.
check_sealed() {
    local d
    for d in "$STATE" "$HERE/sif" "$HERE/definitions" "$HERE/env"; do
        [ -L "$d" ] && die "$d is a symbolic link; compose2sif does not follow links in its output directory (remove it)"
    done
    return 0
}

# A JSON string of $1 (control characters other than \n \t \r become `?`), in JSON_STR.
JSON_STR=""
json_str() {
    local s=$1
    s=${s//\\/\\\\} s=${s//\"/\\\"} s=${s//$'\n'/\\n} s=${s//$'\t'/\\t} s=${s//$'\r'/\\r}
    s=${s//[$'\001'-$'\037'$'\177']/?}
    JSON_STR="\"$s\""
}

# Path $1 of the output directory made absolute, in ABS.
ABS=""
abs() { case "$1" in /*) ABS=$1 ;; *) ABS=$HERE/$1 ;; esac; }

# The first line of file $1, read without a child process, in FIRST_LINE ("" when there is none).
FIRST_LINE=""
first_line() { FIRST_LINE=""; { IFS= read -r FIRST_LINE || true; } 2>/dev/null <"$1"; }

# The user's name (the runtime keeps an instance's logs under it), in USER_NAME: asked once,
# of /etc/passwd by bash itself, else (a directory service's user: LDAP, SSSD) of `id`.
USER_NAME=""
user_name() {
    local name uid
    [ -z "$USER_NAME" ] || return 0
    while IFS=: read -r name _ uid _; do
        [ "$uid" = "$EUID" ] && USER_NAME=$name && return 0
    done 2>/dev/null </etc/passwd
    USER_NAME=$(id -un)
}

# Sleep without a child process: read's timeout on a FIFO that nobody writes to (opened
# read-write, so the open does not block). Polling loops use this, so they cost no fork.
nap() {
    if [ -p "$RUNDIR/nap.fifo" ] || mkfifo -m 0600 "$RUNDIR/nap.fifo" 2>/dev/null; then
        read -r -t "$1" _ <>"$RUNDIR/nap.fifo" || true
    else
        sleep "$1"
    fi
}

# The services named by $@, a service of N replicas (deploy.replicas) as its NAME-1..NAME-N (the
# header's REPLICAS), in EXPANDED.
EXPANDED=()
expand_replicas() {
    local name more=()
    EXPANDED=()
    for name in "$@"; do
        if [ -n "${REPLICAS[$name]:-}" ]; then
            read -r -a more <<<"${REPLICAS[$name]}"
            EXPANDED+=("${more[@]}")
        else
            EXPANDED+=("$name")
        fi
    done
}
