# ---- run/lib/state.sh: the state directory, status files, what a killed run left -----------------

status_file() { printf '%s' "$RUNDIR/$1.status"; }
set_status() {
    printf '%s\n' "$2" >"$(status_file "$1").tmp" && mv -f "$(status_file "$1").tmp" "$(status_file "$1")"
    printf '%s %s\n' "$(date +%s.%N)" "${2%% *}" >>"$RUNDIR/$1.timeline"
}
get_status() { first_line "$(status_file "$1")"; }

prepare_state() {
    umask 077
    mkdir -p "$STATE" "$RUNDIR" "$STATE/logs" "$STATE/volumes" "$STATE/services"
    chmod 0700 "$STATE"
    # /etc/hosts in every instance: the node's own entries, then every service name on 127.0.0.1
    {
        cat /etc/hosts 2>/dev/null
        echo "# compose2sif: $PROJECT"
        cat "$HERE/hosts.names"
    } >"$STATE/hosts.tmp" && mv -f "$STATE/hosts.tmp" "$STATE/hosts"
    chmod 0644 "$STATE/hosts"
}

# What a killed run (kill -9, an ended batch job, a reboot) leaves behind. The runtime forgets
# its dead instances by itself (`instance list` drops a record whose starter is gone), but RUNDIR
# is on disk: a status that says a service runs whose instance is gone, an instance whose root
# filesystem went with a killed FUSE helper, a supervisor.pid naming a process that is not (or no
# longer) our supervisor. One note says what was found; `up` and `down` ($1) clear the records
# (they restart or remove such instances anyway). `ps` finds the same in its own pass over the
# services, shows them as exited and tells with tell_stale.
STALE_KILLED=() STALE_LOST=()
clean_stale() {
    local name st
    [ "$INSTANCES_LISTED" = 1 ] || list_instances
    for name in "${SERVICES[@]}"; do
        load_service "$name"
        [ "$S_ONESHOT" = 1 ] && continue
        instance_pid
        if [ -n "$IPID" ]; then
            root_lost || continue
            STALE_LOST+=("$name")
            # its processes still hold its endpoints: gone before `up` checks them (`down` stops it anyway)
            if [ "$1" = up ]; then
                remove_instance
                wait_reaped "$STARTER"
                unset "INSTANCE_PIDS[$S_INSTANCE]"
            fi
            continue
        fi
        st=""
        { IFS= read -r st || true; } 2>/dev/null <"$RUNDIR/$name.status"
        case "$st" in started | healthy) STALE_KILLED+=("$name") ;; *) continue ;; esac
        rm -f "$RUNDIR/$name.status" "$RUNDIR/$name.health" "$RUNDIR/$name.helpers"
    done
    tell_stale "$1"
}

# The notes of what a killed run left (STALE_KILLED, STALE_LOST), and a supervisor.pid that names
# no supervisor of ours, forgotten here; $1: the command that found them.
tell_stale() {
    local name st pid="" start=""
    if [ ${#STALE_KILLED[@]} -gt 0 ]; then
        case "$1" in
            ps) note "${STALE_KILLED[*]}: ended without \`down\` (killed, or the node rebooted): no instance is left; \`up\` starts them again" ;;
            *) note "${STALE_KILLED[*]}: ended without \`down\` (killed, or the node rebooted): their records are cleared" ;;
        esac
    fi
    for name in "${STALE_LOST[@]}"; do
        case "$1" in
            ps) st="counted as exited; \`up\` starts it again" ;;
            *) st="its instance is removed" ;;
        esac
        note "$name: its root filesystem is gone (a FUSE helper of the runtime was killed: \"Transport endpoint is not connected\"); $st"
    done
    { read -r pid start || true; } 2>/dev/null <"$RUNDIR/supervisor.pid"
    if [ -n "$pid" ] && ! same_process "$pid" "$start"; then
        rm -f "$RUNDIR/supervisor.pid"
        case "$1" in
            ps) st="restart policies apply again after \`up\`" ;;
            *) st=forgotten ;;
        esac
        note "the supervisor (pid $pid) has gone without \`down\` (killed, or the node rebooted): $st"
    fi
    return 0
}
