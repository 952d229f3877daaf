# ---- run/lib/progress.sh: what `up` and `build` show while they work -------------------------

# A block of lines (one per service or image) drawn on stderr, a terminal, over the block drawn
# before it: the cursor goes up over that one, and each line is cut to the terminal's width so
# that none wraps (a wrapped line would throw the count off). One printf, no fork after the first
# call, which asks the terminal's width (BLOCK_WIDTH). BLOCK_LINES: the lines drawn last.
BLOCK_LINES=0 BLOCK_WIDTH=""
draw_block() {
    local line block=""
    if [ -z "$BLOCK_WIDTH" ]; then
        BLOCK_WIDTH=$(stty size 0<&2 2>/dev/null) BLOCK_WIDTH=${BLOCK_WIDTH#* }  # "ROWS COLUMNS" of stderr's terminal
        [ "$BLOCK_WIDTH" -gt 0 ] 2>/dev/null || BLOCK_WIDTH=80  # (a terminal of no known size says 0)
    fi
    ((BLOCK_LINES > 0)) && printf -v block '\e[%dA' "$BLOCK_LINES"
    for line in "$@"; do block+=$'\r\e[K'"${line:0:BLOCK_WIDTH-1}"$'\n'; done
    printf '%s' "$block" >&2
    BLOCK_LINES=$#
}

# Each service's state as it changes: waiting for its dependencies, starting, waiting for health,
# healthy or running, already running, failed (with the reason). On a terminal `up` redraws one
# block, a line per service, in place; otherwise (a batch job's log) each change is one line
# "[project] service: state". The services write their state to RUNDIR/NAME.progress for the block.
PROGRESS_TTY=0
progress() {
    if [ "$PROGRESS_TTY" = 1 ]; then
        printf '%(%s)T %s\n' -1 "$2" >"$RUNDIR/$1.progress.$BASHPID" && mv -f "$RUNDIR/$1.progress.$BASHPID" "$RUNDIR/$1.progress"
    else
        note "$1: $2"
    fi
}

# This service's dependencies as words: "db (healthy), init (completed successfully)".
depends_text() {
    local dep cond out=""
    for dep in "${S_DEPENDS[@]}"; do
        cond=${dep#*:} cond=${cond#service_}
        out+=${out:+, }"${dep%%:*} (${cond//_/ })"
    done
    printf '%s' "$out"
}

# Redraw the block for the services in $1.. ("--" then the pids of their start jobs) until the
# jobs have ended: once per change (a running clock changes it once a second), no fork.
watch_progress() {
    local names=() pids=() lines=() name pid t text now last="" alive
    while [ "$1" != -- ]; do names+=("$1"); shift; done
    shift
    pids=("$@")
    while :; do
        alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        printf -v now '%(%s)T' -1
        lines=()
        for name in "${names[@]}"; do
            t="" text=""
            { read -r t text || true; } 2>/dev/null <"$RUNDIR/$name.progress"
            case "$text" in
                "" ) text=waiting ;;
                healthy | running | completed | "already running" | failed*) ;;
                *) [ -n "$t" ] && text+=" ($((now - t)) s)" ;;
            esac
            lines+=("[$PROJECT] $name: $text")
        done
        if [ "${lines[*]}" != "$last" ]; then
            draw_block "${lines[@]}"
            last=${lines[*]}
        fi
        [ "$alive" = 1 ] || return 0
        nap 0.2
    done
}

# What `build` reports of each image: a line each (plain), or a block redrawn in place on a
# terminal (LIVE=1), fed by state files the parallel builds write.
LIVE=0 BUILD_KEYS=()
build_state() {
    if [ "$LIVE" = 1 ]; then
        printf '%(%s)T %s\n' -1 "$2" >"$RUNDIR/build-$1.state.$BASHPID" && mv -f "$RUNDIR/build-$1.state.$BASHPID" "$RUNDIR/build-$1.state"
    else
        note "image $1: $2"
    fi
}

# Draw the block of the images being built (on a terminal), from their state files.
draw_builds() {
    [ "$LIVE" = 1 ] || return 0
    local key since text now lines=()
    printf -v now '%(%s)T' -1
    for key in "${BUILD_KEYS[@]}"; do
        since="" text=""
        { read -r since text || true; } 2>/dev/null <"$RUNDIR/build-$key.state"
        case "$text" in
            "") text=waiting ;;
            building* | checking*) text="$text ($(((now - since) / 60))m$(((now - since) % 60))s)" ;;
        esac
        lines+=("[$PROJECT] image $key: $text")
    done
    draw_block "${lines[@]}"
}
