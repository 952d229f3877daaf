# ---- run/lib/forward.sh: published ports served by forwarders, as Docker's proxy serves them ----

# A port published on another number ([IP:]P:C) is not the service's: the service listens on its
# own address and port C, and bin/c2s-forward (a static binary convert put beside run.sh, see
# docs/ports.md) listens on IP:P and relays to it. S_FORWARDS holds pairs LISTEN TARGET. Each
# service's forwarders are recorded in RUNDIR/NAME.forward, one line "PID START LISTEN TARGET",
# so that `down`, `ps` and a second `up` know them (a pid alone may name another process later).

# The live forwarders of service $1, in FORWARD_PID (LISTEN -> pid) and FORWARD_LINES (its records).
declare -A FORWARD_PID=()
FORWARD_LINES=()
live_forwarders() {
    local pid start at to
    FORWARD_PID=() FORWARD_LINES=()
    while read -r pid start at to; do
        same_process "$pid" "$start" || continue
        FORWARD_PID[$at]=$pid
        FORWARD_LINES+=("$pid $start $at $to")
    done 2>/dev/null <"$RUNDIR/$1.forward"
    return 0
}

# Start the forwarders of the loaded service that do not run yet, and wait until each listens.
# Prints why not and fails when one cannot listen (its address in use: by whom).
start_forwarders() {
    local i at to pid t records=() uid inode forwarder="$HERE/bin/c2s-forward"
    [ ${#S_FORWARDS[@]} -gt 0 ] || return 0
    live_forwarders "$S_NAME"
    records=("${FORWARD_LINES[@]}")
    if [ ! -x "$forwarder" ]; then
        echo "its published ports need $forwarder, which convert could not build (no C compiler there): convert again where \`cc\` is"
        return 1
    fi
    for ((i = 0; i < ${#S_FORWARDS[@]}; i += 2)); do
        at=${S_FORWARDS[i]} to=${S_FORWARDS[i + 1]}
        [ -n "${FORWARD_PID[$at]:-}" ] && continue
        # its own session's hangups ignored (an `up -d` from an ssh session that ends), no descriptor of ours
        (trap '' HUP && exec "$forwarder" "$at" "$to") </dev/null >>"$STATE/logs/$S_NAME.forward.log" 2>&1 &
        pid=$!
        proc_start "$pid" || PROC_START=0
        records+=("$pid $PROC_START $at $to")
        printf '%s\n' "${records[@]}" >"$RUNDIR/$S_NAME.forward"
        for ((t = 0; t < 100; t++)); do  # up to 5 s
            grep -q "^$at " < <(endpoint_listeners "$at") && kill -0 "$pid" 2>/dev/null && break
            if ! kill -0 "$pid" 2>/dev/null; then
                read -r _ uid inode < <(endpoint_listeners "$at")
                if [ -n "${inode:-}" ]; then
                    describe_holder "$uid" "$inode"
                    echo "its published port $at (forwarded to $to) is held by $HOLDER"
                else
                    echo "its published port $at (forwarded to $to) could not be opened: $(tail -n 1 "$STATE/logs/$S_NAME.forward.log")"
                fi
                return 1
            fi
            nap 0.05
        done
    done
    return 0
}

# The forwarders of service $1 end (their connections with them, as with Docker's proxy); their
# pids in FORWARDERS_ENDED, for wait_ended.
FORWARDERS_ENDED=()
stop_forwarders() {
    local line
    FORWARDERS_ENDED=()
    live_forwarders "$1"
    for line in "${FORWARD_LINES[@]}"; do FORWARDERS_ENDED+=("${line%% *}"); done
    [ ${#FORWARDERS_ENDED[@]} -gt 0 ] && kill -TERM "${FORWARDERS_ENDED[@]}" 2>/dev/null
    remove_files "$RUNDIR/$1.forward"
}
