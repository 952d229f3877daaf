# ---- run/cmd/ps.sh: `ps [--format json]` ---------------------------------------------------------

# Compose's ps: health as the last probe left it (the supervisor probes on each healthcheck's
# schedule, so that `ps` runs none); only a service with no fresh result (no supervisor runs,
# or its probe is late) is probed here, all of those at once. UPTIME: since its instance started.
# Each service is loaded and its state read once (a service probed here is loaded again for its
# result); the runtime is probed for what a probe needs only when one runs. In intercept mode the
# running services' relocations (the tracer's bind and park lines) follow the table.
cmd_ps() {
    local health pid i rows=() w=() probes=() later=() probing=0 running=()
    declare -A ipid_of=()
    PS_JSON=0 PS_ROWS=() PS_WAITING=() NETWORK_ROWS=()
    [ "${1:-}" = --format ] && [ "${2:-}" = json ] && PS_JSON=1
    detect_runtime --images-only
    make_dirs "$RUNDIR"
    list_instances
    for i in "${!SERVICES[@]}"; do
        load_service "${SERVICES[i]}"
        service_state
        [ "$STATE_NOW" = exited ] && [ -n "$IPID" ] && [ "$S_ONESHOT" = 0 ] && root_lost && STALE_LOST+=("$S_NAME")
        health=none
        [ "$STATE_NOW" = running ] && running+=("$S_NAME")
        if [ ${#S_HEALTH[@]} -gt 0 ] && [ "$STATE_NOW" = running ]; then
            if ! recorded_health; then  # its row once it is probed
                [ "$probing" = 1 ] || { detect_runtime; probe_tools; probing=1; }
                { if health_once; then record_health healthy; else record_health unhealthy 1; fi; } &
                probes+=($!) later+=("$i") ipid_of[$i]=$IPID
                continue
            fi
            health=$HEALTH_NOW
        fi
        ps_row "$i" "$STATE_NOW" "$health"
    done
    for pid in "${probes[@]}"; do wait "$pid"; done
    for i in "${later[@]}"; do
        load_service "${SERVICES[i]}"
        IPID=${ipid_of[$i]}
        health=starting
        recorded_health && health=$HEALTH_NOW
        ps_row "$i" running "$health"
    done
    tell_stale ps
    if [ "$PS_JSON" = 1 ]; then
        (IFS=,; printf '[%s]\n' "${PS_ROWS[*]}")
        return 0
    fi
    # the table: each column as wide as its widest cell
    rows=(SERVICE INSTANCE STATE HEALTH ADDRESS:PORT UPTIME "${PS_ROWS[@]}")
    w=(0 0 0 0 0 0)
    for i in "${!rows[@]}"; do ((${#rows[i]} > w[i % 6])) && w[i % 6]=${#rows[i]}; done
    for ((i = 0; i < ${#rows[@]}; i += 6)); do
        printf '%-*s  %-*s  %-*s  %-*s  %-*s  %s\n' "${w[0]}" "${rows[i]}" "${w[1]}" "${rows[i + 1]}" \
            "${w[2]}" "${rows[i + 2]}" "${w[3]}" "${rows[i + 3]}" "${w[4]}" "${rows[i + 4]}" "${rows[i + 5]}"
    done
    if [ -s "$RUNDIR/isolation" ]; then  # which plan `up` ran: as written, or the fallback's knobs
        if [ "$ISOLATION" = intercept ]; then
            echo "PORTS as written, each service on a loopback of its own ($ISOLATION_WHY)"
        else
            echo "PORTS the plan-time knobs'${FALLBACK_REFUSAL+ (fallback/plan.json)} ($ISOLATION_WHY)"
        fi
    fi
    [ ${#PS_WAITING[@]} -eq 0 ] || printf 'WAIT %s\n' "${PS_WAITING[@]}"  # (not_listening_yet)
    networks_lines
    tell_truth WARN "${SERVICES[@]}"  # what they listen on where the plan says otherwise
    relocation_lines "${running[@]}" | sed 's/^/RELOCATED service /'  # what the tracer moved (run/lib/isolation.sh)
    return 0
}
