# ---- run/cmd/port.sh: `port [--index N] SERVICE PRIVATE_PORT` ---------------------------------

# As `docker compose port`: where the service's PRIVATE_PORT is published, ADDR:PORT; a port
# published with no host side shows the free port it got when `up` started it (forward.sh).
cmd_port() {
    local index=1 name="" private="" entry at c p
    while [ $# -gt 0 ]; do
        case "$1" in
            --index) index=${2:-}; shift ;;
            --protocol)
                [ "${2:-}" = tcp ] || die "port: only TCP ports are published here"
                shift
                ;;
            -*) die "port: unknown option $1 (usage: port [--index N] SERVICE PRIVATE_PORT)" ;;
            *) if [ -z "$name" ]; then name=$1; else private=${1%/tcp}; fi ;;
        esac
        shift
    done
    if [ -z "$name" ] || [ -z "$private" ]; then die "port: usage: port [--index N] SERVICE PRIVATE_PORT"; fi
    [ -n "${REPLICAS[$name]:-}" ] && name="$name-$index"
    load_service "$name"
    for entry in "${S_PUBLISHED[@]}"; do
        [ "${entry%% *}" = "$private" ] || continue
        at=${entry#* }
        if [ "${at##*:}" = 0 ]; then
            while read -r c p; do [ "$c" = "$private" ] && at=${at%:*}:$p; done 2>/dev/null <"$RUNDIR/$S_NAME.published"
            [ "${at##*:}" != 0 ] || die "port: $name publishes $private on a free port that \`up\` chooses; it has not started it"
        fi
        echo "$at"
        return 0
    done
    die "port: no port $private/tcp is published by service $name"
}
