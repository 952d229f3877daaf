# ---- run/lib/listing.sh: the rows of `ps` (table cells or JSON objects) --------------------------

# Docker's words for a duration of $1 seconds ("3 minutes", "About an hour"), in DURATION.
DURATION=""
human_duration() {
    local s=$1 h=$((($1 + 1800) / 3600))
    if ((s < 1)); then DURATION="Less than a second"
    elif ((s == 1)); then DURATION="1 second"
    elif ((s < 60)); then DURATION="$s seconds"
    elif ((s < 120)); then DURATION="About a minute"
    elif ((s < 3600)); then DURATION="$((s / 60)) minutes"
    elif ((h == 1)); then DURATION="About an hour"
    elif ((h < 48)); then DURATION="$h hours"
    elif ((h < 24 * 7 * 2)); then DURATION="$((h / 24)) days"
    elif ((h < 24 * 30 * 2)); then DURATION="$((h / 24 / 7)) weeks"
    elif ((h < 24 * 365 * 2)); then DURATION="$((h / 24 / 30)) months"
    else DURATION="$((s / 3600 / 24 / 365)) years"
    fi
}

# One row of `ps` for the service loaded, whose state is $2 and health $3: row $1 (the service's
# index) of PS_ROWS, a JSON object, or 6 table cells from 6 * $1 on. Files read without a child.
# A port published through a forwarder shows as LISTEN->TARGET; the lines record_truth left (what
# it listens on where the plan says otherwise) are its "warnings" (the table's notes, cmd_ps).
# A service whose status says it runs while no instance is left goes to STALE_KILLED (tell_stale);
# one that `up` found not listening yet on some of its ports, and still does not, to PS_WAITING.
PS_JSON=0 PS_ROWS=() PS_WAITING=() NETWORK_ROWS=()
ps_row() {
    local i=$1 st=$2 health=$3 status="" rc="" e k ports="" addresses="" quoted="" forwards="" truth="" cells=() row
    { IFS= read -r status || true; } 2>/dev/null <"$RUNDIR/$S_NAME.status"
    if [ "$st" != running ]; then
        exit_code
        rc=$EXIT_CODE
    fi
    if [ "$S_ONESHOT" = 1 ]; then
        case "$status" in
            completed*) st=exited rc=${status#completed } ;;
        esac
    fi
    if [ "$st" = absent ]; then
        # gone without `down`: it ended or was killed; otherwise it is simply not running
        case "$status" in
            started | healthy) st=exited && [ "$S_ONESHOT" = 0 ] && STALE_KILLED+=("$S_NAME") ;;
            *) st=stopped ;;
        esac
    fi
    UPTIME_S="" DURATION=""
    if [ "$st" = running ] && process_age "$IPID"; then
        human_duration "$UPTIME_S"
        DURATION="Up $DURATION"
    fi
    declare -A forward_of=()
    for ((k = 0; k < ${#S_FORWARDS[@]}; k += 2)); do  # published ports a forwarder serves
        e="${S_FORWARDS[k]}->${S_FORWARDS[k + 1]}"
        # (the table shows a port's first: 127.0.0.1 where it is published on each of the node's addresses)
        [ -n "${forward_of[${S_FORWARDS[k + 1]##*:}]:-}" ] || forward_of[${S_FORWARDS[k + 1]##*:}]=$e
        json_str "$e"
        forwards+=${forwards:+,}$JSON_STR
    done
    for e in "${S_ENDPOINTS[@]}"; do
        e=${e%\?}
        ports+=${ports:+,}${e##*:}
        addresses+=${addresses:+,}${forward_of[${e##*:}]:-$e}
        json_str "$e"
        quoted+=${quoted:+,}$JSON_STR
    done
    NOT_LISTENING=() SERVICE_PORTS=""
    [ "$st" = running ] && not_listening_yet && service_ports "${NOT_LISTENING[@]}"
    [ -n "$SERVICE_PORTS" ] && PS_WAITING+=("service $S_NAME: started, not listening yet on $SERVICE_PORTS")
    while IFS= read -r e; do  # what it really listens on, where the plan says otherwise (record_truth)
        json_str "$e"
        truth+=${truth:+,}$JSON_STR
    done 2>/dev/null <"$RUNDIR/$S_NAME.truth"
    if [ "$PS_JSON" = 1 ]; then
        case "$rc" in '' | *[!0-9-]*) rc=null ;; esac
        for e in "$S_NAME" "$S_INSTANCE" "$st" "$health" "$DURATION"; do json_str "$e"; cells+=("$JSON_STR"); done
        local networks="" net
        for net in ${S_NETWORKS//,/ }; do json_str "$net"; networks+=${networks:+,}$JSON_STR; done
        printf -v row '{"service":%s,"instance":%s,"state":%s,"exit_code":%s,"health":%s,"ports":[%s],"endpoints":[%s],"published":[%s],"not_listening":[%s],"warnings":[%s],"uptime":%s,"uptime_seconds":%s,"networks":[%s]}' \
            "${cells[0]}" "${cells[1]}" "${cells[2]}" "$rc" "${cells[3]}" "$ports" "$quoted" "$forwards" \
            "${SERVICE_PORTS//, /,}" "$truth" "${cells[4]}" "${UPTIME_S:-null}" "$networks"
        PS_ROWS[i]=$row
    else
        [ "$st" = exited ] && [ -n "$rc" ] && st="exited($rc)"  # killed: no code was written
        cells=("$S_NAME" "$S_INSTANCE" "$st" "$health" "${addresses:--}" "${DURATION:--}")
        for e in 0 1 2 3 4 5; do PS_ROWS[i * 6 + e]=${cells[e]}; done
        NETWORK_ROWS[i]="$S_NAME ${S_NETWORKS//,/ }"
    fi
}

# After the table, where the project has networks of its own: "NETWORK NAME: SERVICE ..." for
# each, from the rows' services (S_NETWORKS: its compose networks, or its network_mode).
networks_lines() {
    local entry net name
    declare -A members=()
    local order=()
    for entry in "${NETWORK_ROWS[@]}"; do
        read -r name entry <<<"$entry"
        for net in $entry; do
            [ -n "${members[$net]:-}" ] || order+=("$net")
            members[$net]+=" $name"
        done
    done
    [ "${order[*]}" = default ] || [ ${#order[@]} -eq 0 ] && return 0
    for net in "${order[@]}"; do printf 'NETWORK %s:%s\n' "$net" "${members[$net]}"; done
}
