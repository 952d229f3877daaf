# ---- run/lib/dns.sh: Docker's DNS (127.0.0.11) for the project, under the per-service loopback --

# Programs made for Docker ask its embedded DNS at 127.0.0.11:53 (nginx's `resolver 127.0.0.11`,
# a Go or musl resolver where a container's resolv.conf names it). In intercept mode each service's
# tracer sends such a query to DNS_ENDPOINT (127.A.B.1 and a port of the project's block, rendered
# in the header), where `up` runs the project's DNS server: bin/ARCH/c2s-loopback --serve-dns
# (compose2sif/intercept/loopback_dns.c). It answers the names of hosts.names (each service name,
# alias, hostname and container_name: the service's own address) and relays every other query to
# the node's resolver. Recorded as RUNDIR/dns, "PID START"; `down` stops it.

# Start the project's DNS server unless it runs; one line where it cannot listen (queries to
# 127.0.0.11 then fail, as where nothing serves Docker's DNS).
start_dns() {
    local pid start t
    [ "$ISOLATION" = intercept ] || return 0
    { read -r pid start; } 2>/dev/null <"$RUNDIR/dns"
    same_process "${pid:-}" "${start:-}" && return 0
    (trap '' HUP && exec "$LOOPBACK" --serve-dns "$DNS_ENDPOINT" --hosts "$HERE/hosts.names") \
        </dev/null >>"$STATE/logs/dns.log" 2>&1 &
    pid=$!
    write_pid_record "$pid" "$RUNDIR/dns"
    for ((t = 0; t < 100; t++)); do  # up to 5 s
        [ -n "$(endpoint_listeners "$DNS_ENDPOINT")" ] && return 0
        kill -0 "$pid" 2>/dev/null || break
        nap 0.05
    done
    note "Docker's DNS (127.0.0.11) is not served: $(tail -n 1 "$STATE/logs/dns.log" 2>/dev/null)"
    return 0
}

# Stop the project's DNS server, if it runs; its pid in DNS_ENDED (for wait_ended).
DNS_ENDED=()
stop_dns() {
    local pid="" start=""
    DNS_ENDED=()
    { read -r pid start; } 2>/dev/null <"$RUNDIR/dns"
    if same_process "$pid" "$start"; then
        kill -TERM "$pid" 2>/dev/null && DNS_ENDED=("$pid")
    fi
    remove_files "$RUNDIR/dns"
}
