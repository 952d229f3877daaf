# ---- run/lib/forward.sh: published ports served by forwarders, as Docker's proxy serves them ----

# A port published on another number ([IP:]P:C) is not the service's: the service listens on its
# own address and port C, and a forwarder listens on IP:P and relays to it: bin/ARCH/c2s-forward (a
# static binary built with compose2sif's package, one per architecture, docs/ports.md), or where
# the package has none for the node's architecture, the node's python3 running bin/c2s-forward.py.
# S_FORWARDS holds pairs LISTEN TARGET. Each service's forwarders are recorded in RUNDIR/NAME.forward,
# one line "PID START LISTEN TARGET",
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

# Why bin/$HOSTTYPE/$1 (a helper: c2s-forward, c2s-loopback) is not there, in MISSING_WHY.
MISSING_WHY=""
missing_helper_why() {
    local found=() path
    for path in "$HERE"/bin/*/"$1"; do
        [ -x "$path" ] || continue
        path=${path%/*}
        found+=("${path##*/}")
    done
    if [ ${#found[@]} -gt 0 ]; then
        MISSING_WHY="compose2sif's package has no $1 for this node's architecture, $HOSTTYPE (only for ${found[*]})"
    else
        MISSING_WHY="no bin/$HOSTTYPE/$1: the compose2sif that converted this was not installed by pip, which builds its helpers (convert again with one that was)"
    fi
}

# The forwarder this node runs, as command words in FORWARDER: the package's static one for the
# node's architecture, else bin/c2s-forward.py under the node's python3 (FORWARDER_NOTE says so);
# none (FORWARDER empty, MISSING_WHY why) where neither is there.
FORWARDER=() FORWARDER_NOTE=""
choose_forwarder() {
    [ ${#FORWARDER[@]} -gt 0 ] && return 0
    local binary="$HERE/bin/$HOSTTYPE/c2s-forward"
    if [ -x "$binary" ]; then
        FORWARDER=("$binary")
        return 0
    fi
    missing_helper_why c2s-forward
    if [ -f "$HERE/bin/c2s-forward.py" ] && hash python3 2>/dev/null; then
        FORWARDER=("${BASH_CMDS[python3]}" "$HERE/bin/c2s-forward.py")
        FORWARDER_NOTE="published ports: ${MISSING_WHY}; the node's ${BASH_CMDS[python3]} serves them (bin/c2s-forward.py)"
        return 0
    fi
    MISSING_WHY="$MISSING_WHY, and the node has no python3 to run bin/c2s-forward.py instead"
    return 1
}

# For `up`, before anything starts: where published ports are served by the Python fallback, one
# line saying so; where nothing can serve them, one line for each service of $@ that will fail.
tell_forwarders() {
    local name
    for name in "$@"; do
        load_service "$name"
        [ ${#S_FORWARDS[@]} -gt 0 ] || continue
        if choose_forwarder; then
            [ -n "$FORWARDER_NOTE" ] && note "$FORWARDER_NOTE"
            return 0
        fi
        printf 'run.sh: up: %s will fail: its published ports (%s) need a forwarder: %s\n' "$name" \
            "${S_FORWARDS[0]}" "$MISSING_WHY" >&2
    done
    return 0
}

# A port published with no host side (`- "5432"`) is planned on port 0: like Docker, run.sh gives it
# a free port of the node when its forwarders first start, the same on every address, kept in
# RUNDIR/NAME.published ("CONTAINER-PORT HOST-PORT" lines) until `down`. kept_ephemeral puts the kept
# ones into S_FORWARDS (load_service calls it); choose_ephemeral chooses the others.
kept_ephemeral() {
    local i c kept=""
    for ((i = 0; i < ${#S_FORWARDS[@]}; i += 2)); do
        [ "${S_FORWARDS[i]##*:}" = 0 ] || continue
        [ -n "$kept" ] || kept=$'\n'$(cat "$RUNDIR/$S_NAME.published" 2>/dev/null)$'\n'
        service_ports "${S_FORWARDS[i + 1]}"  # (keyed by the service's port, a privileged one before the tracer's move)
        c=$SERVICE_PORTS
        [[ $kept == *$'\n'"$c "* ]] || continue
        c=${kept#*$'\n'"$c "} c=${c%%$'\n'*}
        S_FORWARDS[i]=${S_FORWARDS[i]%:*}:$c
    done
}

choose_ephemeral() {
    local i c p t lo=32768 hi=60999
    for ((i = 0; i < ${#S_FORWARDS[@]}; i += 2)); do
        [ "${S_FORWARDS[i]##*:}" = 0 ] || continue
        service_ports "${S_FORWARDS[i + 1]}"
        c=$SERVICE_PORTS
        { read -r lo hi || true; } 2>/dev/null </proc/sys/net/ipv4/ip_local_port_range
        for ((t = 0; t < 50; t++)); do  # a port of the kernel's ephemeral range nothing listens on, as Docker picks
            p=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo + 1)))
            [ -z "$(endpoint_listeners "0.0.0.0:$p")" ] && break
        done
        printf '%s %s\n' "$c" "$p" >>"$RUNDIR/$S_NAME.published"
        kept_ephemeral
    done
}

# Start the forwarders of the loaded service that do not run yet, and wait until each listens.
# Prints why not and fails when one cannot listen (its address in use: by whom).
start_forwarders() {
    local i at to pid t records=() uid inode
    [ ${#S_FORWARDS[@]} -gt 0 ] || return 0
    live_forwarders "$S_NAME"
    records=("${FORWARD_LINES[@]}")
    if ! choose_forwarder; then
        echo "its published ports need a forwarder: $MISSING_WHY"
        return 1
    fi
    choose_ephemeral
    for ((i = 0; i < ${#S_FORWARDS[@]}; i += 2)); do
        at=${S_FORWARDS[i]} to=${S_FORWARDS[i + 1]}
        [ -n "${FORWARD_PID[$at]:-}" ] && continue
        # its own session's hangups ignored (an `up -d` from an ssh session that ends), no descriptor of ours
        (trap '' HUP && exec "${FORWARDER[@]}" "$at" "$to") </dev/null >>"$STATE/logs/$S_NAME.forward.log" 2>&1 &
        pid=$!
        proc_start "$pid" || PROC_START=0
        records+=("$pid $PROC_START $at $to")
        write_lines "$RUNDIR/$S_NAME.forward" "${records[@]}"
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
