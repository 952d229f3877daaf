# ---- run/lib/dns.sh: Docker's DNS (127.0.0.11) for the project, under the per-service loopback --

# Programs made for Docker ask its embedded DNS at 127.0.0.11:53 (nginx's `resolver 127.0.0.11`,
# a Go or musl resolver where a container's resolv.conf names it). In intercept mode each service's
# tracer sends such a query to DNS_ENDPOINT (127.A.B.1 and a port of the project's block, rendered
# in the header), where `up` runs the project's DNS server: bin/ARCH/c2s-loopback --serve-dns
# (compose2sif/intercept/loopback_dns.c). It answers the names of hosts.names (each service name,
# alias, hostname and container_name: the service's own address) and relays every other query to
# the node's resolver. Recorded as RUNDIR/dns, "PID START"; `down` stops it.

# A service whose networks reach less than the project asks a DNS server of its own, on its own
# address and DNS_PORT (the same port for all: no forwarder takes it, and the own addresses are
# many), which answers the names it reaches (STATE/hosts.d/NAME.names, write_service_hosts) and,
# where all its networks are internal, nothing beyond them (--no-relay): Docker's DNS answers by
# the asker. Recorded as RUNDIR/dns.d/ADDRESS: a network_mode: service:X service asks X's.

# Start the project's DNS servers unless they run; one line where one cannot listen (queries to
# 127.0.0.11 then fail, as where nothing serves Docker's DNS).
start_dns() {
    local name
    [ "$ISOLATION" = intercept ] || return 0
    start_dns_server "$RUNDIR/dns" "$DNS_ENDPOINT" "$HERE/hosts.names"
    make_dirs "$RUNDIR/dns.d"
    for name in "${SERVICES[@]}"; do
        load_service "$name"
        [ "$S_REACH_LIMITED" = 1 ] || continue
        if [ "$S_INTERNAL" = 1 ]; then
            start_dns_server "$RUNDIR/dns.d/$S_OWN_ADDRESS" "$S_OWN_ADDRESS:$DNS_PORT" "$STATE/hosts.d/$name.names" \
                --no-relay
        else
            start_dns_server "$RUNDIR/dns.d/$S_OWN_ADDRESS" "$S_OWN_ADDRESS:$DNS_PORT" "$STATE/hosts.d/$name.names"
        fi
    done
    return 0
}

# One DNS server (RECORD ENDPOINT HOSTS [--no-relay]) unless it runs.
start_dns_server() {
    local record=$1 endpoint=$2 pid start t
    { read -r pid start; } 2>/dev/null <"$record"
    same_process "${pid:-}" "${start:-}" && return 0
    (trap '' HUP && exec "$LOOPBACK" --serve-dns "$endpoint" --hosts "$3" "${@:4}") \
        </dev/null >>"$STATE/logs/dns.log" 2>&1 &
    pid=$!
    write_pid_record "$pid" "$record"
    for ((t = 0; t < 100; t++)); do  # up to 5 s
        [ -n "$(endpoint_listeners "$endpoint")" ] && return 0
        kill -0 "$pid" 2>/dev/null || break
        nap 0.05
    done
    note "Docker's DNS (127.0.0.11) is not served on $endpoint: $(tail -n 1 "$STATE/logs/dns.log" 2>/dev/null)"
}

# Stop the project's DNS servers, those that run; their pids in DNS_ENDED (for wait_ended).
DNS_ENDED=()
stop_dns() {
    local pid="" start="" record
    DNS_ENDED=()
    for record in "$RUNDIR/dns" "$RUNDIR"/dns.d/*; do
        [ -f "$record" ] || continue
        pid="" start=""
        { read -r pid start; } 2>/dev/null <"$record"
        if same_process "$pid" "$start"; then
            kill -TERM "$pid" 2>/dev/null && DNS_ENDED+=("$pid")
        fi
        remove_files "$record"
    done
}
