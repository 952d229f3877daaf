# ---- run/lib/isolation.sh: port isolation, a loopback per service or the plan-time knobs ------

# Docker gives every container a loopback of its own; here the services share the node's. Where
# the node lets a process trace its children (ptrace) and filter system calls (seccomp),
# bin/ARCH/c2s-loopback (compose2sif/intercept/loopback.c, docs/interception.md) runs each service's
# entry, healthchecks and execs with their binds and connects relocated to the service's own
# address (S_OWN_ADDRESS), privileged ports onto LOOPBACK_BLOCK: ISOLATION=intercept. Elsewhere,
# or with C2S_PORT_ISOLATION=plan, the addresses and ports convert told each service are all there
# is: ISOLATION=plan. `up` decides (choose_isolation) and keeps the answer in RUNDIR/isolation,
# "HOST REQUESTED MODE" then the reason; every other command reads it (isolation_mode).
ISOLATION_DEFAULT=auto
LOOPBACK="$HERE/bin/$HOSTTYPE/c2s-loopback"  # the node's architecture, as bash names it (uname -m)
LOOPBACK_IN=/.c2s/loopback RECORDS_IN=/.c2s/records
ISOLATION="" ISOLATION_WHY=""

# Each service's relocations, one "KIND PROTO FROM TO" line each, written by its tracers, are in
# RUNDIR/loopback/NAME.

# Whether the loaded service runs under the tracer: in intercept mode, unless it asked for the
# node's network as it is (network_mode: host), which is what it gets, or a batch job runs it
# across nodes (C2S_NODE_NETWORK, names separated by spaces: other nodes reach it at this node's
# address, where the tracer would move its binds off).
traced_service() {
    [ "$ISOLATION" = intercept ] && [ "$S_HOST_NETWORK" != 1 ] && [[ " ${C2S_NODE_NETWORK:-} " != *" $S_NAME "* ]]
}

# A network_mode: host service beside services on their own addresses: its entry runs under the
# tracer's --host-network (its wildcard binds share their port with the own addresses' binds,
# which get --share-ports: SHARE_PORTS, convert's), and nothing else of it is relocated.
host_beside_own_addresses() {
    [ "$ISOLATION" = intercept ] && [ "$S_HOST_NETWORK" = 1 ] && [ "$SHARE_PORTS" = 1 ] &&
        [[ " ${C2S_NODE_NETWORK:-} " != *" $S_NAME "* ]]
}

# Services whose ports work only on a loopback of their own (a privileged port, or one another
# service holds too, that nothing could move: S_NEEDS_LOOPBACK, decided by convert), where they
# would run untraced: one line each, and 1.
refuse_untraceable() {
    local name refused=0
    if [ "$ISOLATION" != intercept ] && [ -n "${FALLBACK_REFUSAL:-}" ]; then
        printf 'run.sh: up: %s (port isolation: %s)\n' "$FALLBACK_REFUSAL" "$ISOLATION_WHY" >&2
        return 1
    fi
    for name in "$@"; do
        load_service "$name"
        [ -f "$S_SIF" ] || continue  # not built: nothing could be checked, and start_service says so
        if [ -n "$S_NEEDS_LOOPBACK" ] && ! traced_service; then
            printf 'run.sh: up: %s (port isolation: %s)\n' "$S_NEEDS_LOOPBACK" "$ISOLATION_WHY" >&2
            refused=1
        fi
    done
    return "$refused"
}

# ISOLATION and ISOLATION_WHY as the last `up` on this node decided (plan when none did).
isolation_mode() {
    local host="" requested="" mode=""
    { read -r host requested mode && IFS= read -r ISOLATION_WHY; } 2>/dev/null <"$RUNDIR/isolation"
    if [ "$mode" = intercept ] && [ "$host" = "$HOSTNAME" ]; then ISOLATION=intercept; else ISOLATION=plan; fi
}

keep_isolation() {  # MODE REQUESTED WHY
    ISOLATION=$1 ISOLATION_WHY=$3
    write_lines "$RUNDIR/isolation" "$HOSTNAME $2 $1" "$3"
}

# For `up`: C2S_PORT_ISOLATION=auto|intercept|plan. auto and intercept ask the node once (kept
# until the tracer changes): `c2s-loopback --check` inside the first service's image, as services
# run. Where it cannot work, auto says why in one line and keeps to the plan; intercept fails.
choose_isolation() {
    local requested=${C2S_PORT_ISOLATION:-$ISOLATION_DEFAULT} host="" asked="" mode="" why name sif="" rc
    case "$requested" in
        auto | intercept | plan) ;;
        *) die "C2S_PORT_ISOLATION=$requested: give auto, intercept or plan" ;;
    esac
    make_dirs "$RUNDIR/loopback"
    if [ "$requested" = plan ]; then
        keep_isolation plan plan "C2S_PORT_ISOLATION=plan"
        return 0
    fi
    { read -r host asked mode && IFS= read -r why; } 2>/dev/null <"$RUNDIR/isolation"
    if [ "$host" = "$HOSTNAME" ] && [ "$asked" = "$requested" ] && [ -x "$LOOPBACK" ] && [ "$RUNDIR/isolation" -nt "$LOOPBACK" ]; then
        ISOLATION=$mode ISOLATION_WHY=$why
    else
        mode=plan
        for name in "${SERVICES[@]}"; do
            load_service "$name"
            [ -f "$S_SIF" ] && { sif=$S_SIF; break; }
        done
        if [ ! -x "$LOOPBACK" ]; then
            missing_helper_why c2s-loopback
            why=$MISSING_WHY
        elif [ -z "$sif" ]; then
            why="no image is built yet to check c2s-loopback in"
        elif why=$("$RT" exec --bind "$LOOPBACK:$LOOPBACK_IN:ro" "$sif" "$LOOPBACK_IN" --check --addr "$S_OWN_ADDRESS" 2>&1); then
            why="ptrace+seccomp, kernel $(uname -r)"
            mode=intercept
        else
            rc=$?
            why=$(grep -v -e '^INFO' -e '^[[:space:]]*$' <<<"$why" | tail -n 1)
            why="c2s-loopback --check: ${why:-it failed with exit code $rc}"
        fi
        if [ -n "$sif" ] || [ ! -x "$LOOPBACK" ]; then keep_isolation "$mode" "$requested" "$why"; else ISOLATION=plan ISOLATION_WHY=$why; fi
    fi
    write_hosts  # (the names of the mode chosen)
    if [ "$ISOLATION" = plan ]; then
        [ "$requested" = intercept ] && die "up: C2S_PORT_ISOLATION=intercept, but $ISOLATION_WHY"
        note "port isolation: plan-time knobs only ($ISOLATION_WHY); nothing is isolated: any user of the node reaches every port of every service, and networks (internal ones too) do not keep services apart"
    fi
    return 0
}

# The tracer's words for the loaded service: --addr, --map (where its privileged ports go, planned
# by convert: S_PORT_MAP), --dns (the project's DNS server, dns.sh), --record, --peers (and $@
# before them). Its published ports are its forwarders' (isolated_endpoints): the service keeps
# its own address.
TRACER_WORDS=()
tracer_words() {
    local m
    TRACER_WORDS=("$LOOPBACK_IN" --addr "$S_OWN_ADDRESS" "$@")
    for m in "${S_PORT_MAP[@]}"; do TRACER_WORDS+=(--map "$m"); done
    local dns=$DNS_ENDPOINT  # the project's DNS server, or its own one (the names its networks reach: dns.sh)
    [ "$S_REACH_LIMITED" = 1 ] && dns=$S_OWN_ADDRESS:$DNS_PORT
    TRACER_WORDS+=(--dns "$dns" --record "$RECORDS_IN/$S_NAME" --peers "$RECORDS_IN")
    # its compose networks: the project's addresses it may connect to, and none beyond where all are internal
    if [ "$S_REACH_LIMITED" = 1 ]; then TRACER_WORDS+=(--reach "$S_REACH"); fi
    if [ "$S_INTERNAL" = 1 ]; then TRACER_WORDS+=(--internal); fi
    # no other user of the node gets a connection it accepts (its published ports' forwarders are ours)
    TRACER_WORDS+=(--private)
    # a host-network service's wildcard binds share their ports with its binds
    if [ "$SHARE_PORTS" = 1 ]; then TRACER_WORDS+=(--share-ports); fi
}

# In intercept mode, the flags that start the loaded service's entry under the tracer (added to
# START_FLAGS): the tracer and the records bound in, and a start script of ours over the image's
# that runs the image's own (its definition's %startscript) under c2s-loopback. Returns 1 in plan
# mode, for a host-network service alone on the node's network, and for a definition without a
# start script of ours (the image's start script as it is).
loopback_start_flags() {
    local key=${S_SIF##*/} lines=() line i entry wrapper word words=()
    if traced_service; then
        tracer_words --block "$LOOPBACK_BLOCK"
        words=("${TRACER_WORDS[@]}")
    elif host_beside_own_addresses; then
        words=("$LOOPBACK_IN" --host-network)
    else
        return 1
    fi
    key=${key%.sif}
    entry="$RUNDIR/$key.entry" wrapper="$RUNDIR/$S_NAME.traced"
    # the definition's lines, each with its newline (a last line without one is not taken)
    { mapfile lines <"$HERE/definitions/$key.def"; } 2>/dev/null || return 1
    for ((i = 0; i < ${#lines[@]}; i++)); do
        [ "${lines[i]%$'\n'}" = %startscript ] && break
    done
    ((i < ${#lines[@]})) || return 1
    {
        printf '#!/bin/sh\n\n'
        for line in "${lines[@]:i+1}"; do if [[ $line == *$'\n' ]]; then printf '%s' "$line"; fi; done
    } >"$entry.$BASHPID" && mv -f "$entry.$BASHPID" "$entry" || return 1
    {
        printf '#!/bin/sh\n# compose2sif: the start script under the per-service loopback (run/lib/isolation.sh)\nexec'
        # each word quoted for /bin/sh whatever it holds: in single quotes, a ' as '\''
        for word in "${words[@]}" -- /bin/sh /.c2s/entry; do printf " '%s'" "${word//\'/\'\\\'\'}"; done
        printf ' "$@"\n'
    } >"$wrapper.$BASHPID" && chmod 0755 "$wrapper.$BASHPID" && mv -f "$wrapper.$BASHPID" "$wrapper" || return 1
    START_FLAGS+=(--bind "$LOOPBACK:$LOOPBACK_IN:ro" --bind "$RUNDIR/loopback:$RECORDS_IN"
        --bind "$entry:/.c2s/entry:ro" --bind "$wrapper:/.singularity.d/startscript:ro")
    # Docker's DNS as its resolver, as on a Docker network (write_resolv_conf, run/lib/state.sh)
    traced_service && START_FLAGS+=(--bind "$STATE/resolv.conf:/etc/resolv.conf:ro")
    return 0
}

# Before the loaded service's entry starts: its record emptied (the relocations of its last run
# are not this one's), and the service loaded again, so that its endpoints and forwarder targets
# are not where the last run's record put them.
clear_record() {
    traced_service || return 0
    : >"$RUNDIR/loopback/$S_NAME"
    load_service "$S_NAME"
}

# The command $@ prefixed with the tracer for the loaded service, in TRACED (a healthcheck or an
# exec: its own relocations go to the service's record, and it finds where the entry's went).
TRACED=()
traced() {
    if traced_service; then
        tracer_words
        TRACED=("${TRACER_WORDS[@]}" -- "$@")
    else
        TRACED=("$@")
    fi
}

# Where the tracer puts a bind of the loaded service to $1 (ADDR:PORT), in ISOLATED: a loopback
# or wildcard address becomes its own, a privileged port goes where S_PORT_MAP says (known before
# the bind happens, so that its forwarders run from the start). Other addresses are left alone,
# as by the tracer.
ISOLATED=""
isolated_endpoint() {
    local port=${1##*:} m
    ISOLATED=$1
    case "${1%:*}" in 0.0.0.0 | :: | 127.0.0.1 | "$S_OWN_ADDRESS") ;; *) return 0 ;; esac
    ISOLATED="$S_OWN_ADDRESS:$port"
    ((port < 1024)) || return 0
    for m in "${S_PORT_MAP[@]}"; do
        [ "${m%%:*}" = "$port" ] && ISOLATED="$S_OWN_ADDRESS:${m#*:}"
    done
    return 0
}

# Called by load_service: in intercept mode the service's endpoints and forwarder targets are
# where the tracer puts them (isolated_endpoint).
isolated_endpoints() {
    [ -n "$ISOLATION" ] || isolation_mode
    local i e optional pairs=() at a
    kept_ephemeral  # (a port published with no host side: the free port it got, while the project runs)
    if ! traced_service; then
        [ "$ISOLATION" = intercept ] || return 0
        # the node's network as it is (network_mode: host, a batch job's C2S_NODE_NETWORK): a port
        # published on its own number is the service's own bind there, as written; no forwarder
        for ((i = 0; i < ${#S_FORWARDS[@]}; i += 2)); do
            [ "${S_FORWARDS[i]##*:}" = "${S_FORWARDS[i + 1]##*:}" ] || pairs+=("${S_FORWARDS[i]}" "${S_FORWARDS[i + 1]}")
        done
        S_FORWARDS=("${pairs[@]}")
        return 0
    fi
    for i in "${!S_ENDPOINTS[@]}"; do
        e=${S_ENDPOINTS[i]} optional=""
        [ "${e%\?}" != "$e" ] && optional="?" e=${e%\?}
        isolated_endpoint "$e"
        S_ENDPOINTS[i]=$ISOLATED$optional
    done
    for ((i = 0; i < ${#S_FORWARDS[@]}; i += 2)); do
        isolated_endpoint "${S_FORWARDS[i + 1]}"
        at=${S_FORWARDS[i]}
        case "${at%:*}" in
            0.0.0.0 | ::)  # published on all interfaces: on each of the node's addresses, one by one,
                # and on the project's gateway, where host.docker.internal points
                node_addresses
                for a in "${NODE_ADDRESSES[@]}" "$GATEWAY"; do pairs+=("$a:${at##*:}" "$ISOLATED"); done
                ;;
            *) pairs+=("$at" "$ISOLATED") ;;
        esac
    done
    S_FORWARDS=("${pairs[@]}")
}

# The relocations `ps` shows: each service's bind and park lines, as "NAME: LINE".
relocation_lines() {
    [ "$ISOLATION" = intercept ] || return 0
    local name kind rest
    for name in "$@"; do
        while read -r kind rest; do
            case "$kind" in bind | park) printf '%s: %s %s\n' "$name" "$kind" "$rest" ;; esac
        done 2>/dev/null <"$RUNDIR/loopback/$name"
    done
}

# `_isolation`, for `compose2sif doctor`: what `up` gets here (where C2S_PORT_ISOLATION is not
# set: what this node allows, auto), asked now where it is not kept.
cmd_isolation() {
    detect_runtime
    prepare_state
    C2S_PORT_ISOLATION=${C2S_PORT_ISOLATION:-auto} choose_isolation
    if [ "$ISOLATION" = intercept ]; then
        printf 'intercept\t%s\n' "$ISOLATION_WHY"
    else
        printf 'plan\t%s\n' "$ISOLATION_WHY"
    fi
}
