# ---- run/lib/core.sh: messages, versions, safe deletes, JSON strings, naps --------------------
# (Every file of run/ only defines functions and their globals: nothing runs when it is sourced.
# compose2sif joins them into run.sh after the project's data; see run/README.md.)

# One line on stderr; die ends run.sh with status 1.
die() { echo "run.sh: $*" >&2; exit 1; }
note() { echo "[$PROJECT] $*" >&2; }

version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]; }

# rm -rf only what lies inside the output directory once its parent is resolved: a link planted
# there must not send a delete elsewhere (a link itself is removed, not followed).
rm_inside() {
    local path parent root
    root=$(cd "$HERE" && pwd -P)
    for path in "$@"; do
        [ -e "$path" ] || [ -L "$path" ] || continue
        parent=$(readlink -m -- "$(dirname -- "$path")") || die "cannot resolve $path"
        case "$parent/$(basename -- "$path")" in
            */. | */..) die "refusing to delete $path" ;;
            "$root"/?*) rm -rf -- "${parent:?}/$(basename -- "$path")" ;;
            *) die "refusing to delete $path: it lies in $parent, outside $root" ;;
        esac
    done
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

abs() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s' "$HERE/$1" ;; esac; }

# The first line of a file, read without a child process ("" when there is none).
first_line() { local line=""; { IFS= read -r line || true; } 2>/dev/null <"$1"; printf '%s' "$line"; }

# Sleep without a child process: read's timeout on a FIFO that nobody writes to (opened
# read-write, so the open does not block). Polling loops use this, so they cost no fork.
nap() {
    if [ -p "$RUNDIR/nap.fifo" ] || mkfifo -m 0600 "$RUNDIR/nap.fifo" 2>/dev/null; then
        read -r -t "$1" _ <>"$RUNDIR/nap.fifo" || true
    else
        sleep "$1"
    fi
}
