# ---- run/lib/state.sh: the state directory, status files, what a killed run left -----------------

# Service $1's status (RUNDIR/NAME.status) becomes $2, and its timeline gets a line "TIME WORD".
set_status() {
    local file="$RUNDIR/$1.status"
    write_lines "$file" "$2"
    now_seconds
    printf '%s %s\n' "$NOW_SECONDS" "${2%% *}" >>"$RUNDIR/$1.timeline"
}

# The status of service $1, in STATUS ("" when it has none).
STATUS=""
get_status() { first_line "$RUNDIR/$1.status"; STATUS=$FIRST_LINE; }

# The time as `date +%s.%N` prints it, in NOW_SECONDS: from EPOCHREALTIME where bash has it (5.0
# and later; microseconds, its decimal point the locale's), else from `date`.
NOW_SECONDS=""
now_seconds() {
    if ((BASH_VERSINFO[0] >= 5)); then
        NOW_SECONDS=${EPOCHREALTIME%%[!0-9]*}.${EPOCHREALTIME##*[!0-9]}000
    else
        NOW_SECONDS=$(date +%s.%N)
    fi
}

prepare_state() {
    umask 077
    make_dirs "$STATE" "$RUNDIR" "$STATE/logs" "$STATE/volumes" "$STATE/services"
    chmod 0700 "$STATE"
    write_hosts
}

# /etc/hosts in every instance: the node's own entries, then every service's names at its address
# (the fallback's where `up` fell back to the plan-time knobs: run/lib/isolation.sh).
write_hosts() {
    local node=() hosts_names="$HERE/hosts.names"
    [ -n "$ISOLATION" ] || isolation_mode
    [ "$ISOLATION" != intercept ] && [ -f "$HERE/fallback/hosts.names" ] && hosts_names="$HERE/fallback/hosts.names"
    { mapfile node </etc/hosts; } 2>/dev/null  # (its lines as they are, read without a child process)
    {
        printf '%s' "${node[@]}"
        echo "# compose2sif: $PROJECT"
        cat "$hosts_names"
    } >"$STATE/hosts.$BASHPID" && chmod 0644 "$STATE/hosts.$BASHPID" && mv -f "$STATE/hosts.$BASHPID" "$STATE/hosts"
    if [ "$ISOLATION" = intercept ]; then
        write_service_hosts "${node[@]}"
        write_resolv_conf
    fi
}

# Under the tracer every service's resolver is Docker's, 127.0.0.11, as on a Docker network: the
# tracer sends its queries to the project's DNS server or its own (run/lib/dns.sh), which answer
# the names its networks reach and ask the node's resolver the rest from the node, where a
# resolver of the node's loopback (127.0.0.1, systemd-resolved's 127.0.0.53) is reached as it is,
# not as the service's own address. The node's search and options lines are kept, and ndots:0
# added where they set none, as Docker writes it. STATE/resolv.conf, bound by runtime_flags.
write_resolv_conf() {
    local lines=() line out=("# compose2sif: Docker's DNS under the per-service loopback (run/lib/state.sh)"
        "nameserver 127.0.0.11") ndots=0
    { mapfile -t lines </etc/resolv.conf; } 2>/dev/null
    for line in "${lines[@]}"; do
        case $line in
            search[[:space:]]* | domain[[:space:]]*) out+=("$line") ;;
            options[[:space:]]*) out+=("$line"); [[ $line == *ndots:* ]] && ndots=1 ;;
        esac
    done
    [ "$ndots" = 1 ] || out+=("options ndots:0")
    printf '%s\n' "${out[@]}" >"$STATE/resolv.conf.$BASHPID" && chmod 0644 "$STATE/resolv.conf.$BASHPID" &&
        mv -f "$STATE/resolv.conf.$BASHPID" "$STATE/resolv.conf"
}

# As written, a service whose networks reach less than all of the project gets a hosts file of
# its own (STATE/hosts.d/NAME, bound as its /etc/hosts): the node's lines ($@), then the names of
# the services it reaches, its own, and every line beyond the project's /24 (extra_hosts); not
# host.docker.internal where all its networks are internal (the gateway is not in S_REACH).
write_service_hosts() {
    local name line addr block=${GATEWAY%.*}. lines=() mine=()
    { mapfile lines <"$HERE/hosts.names"; } 2>/dev/null
    make_dirs "$STATE/hosts.d"
    for name in "${SERVICES[@]}"; do
        load_service "$name"
        if [ "$S_REACH_LIMITED" != 1 ]; then rm -f "$STATE/hosts.d/$name" "$STATE/hosts.d/$name.names"; continue; fi
        mine=()
        for line in "${lines[@]}"; do
            addr=${line%% *}
            if [ "$addr" = "$S_OWN_ADDRESS" ] || [[ ,$S_REACH, == *,"$addr",* ]] || [[ $addr != "$block"* ]]; then
                if [ ${#S_HIDDEN_NAMES[@]} -gt 0 ]; then
                    line=$(without_hidden_names "$line") && [ -n "$line" ] && line+=$'\n'
                fi
                [ -n "$line" ] && mine+=("$line")
            fi
        done
        # NAME.names: what its own DNS server answers (dns.sh); NAME: its /etc/hosts
        printf '%s' "${mine[@]}" >"$STATE/hosts.d/$name.names.$BASHPID" &&
            mv -f "$STATE/hosts.d/$name.names.$BASHPID" "$STATE/hosts.d/$name.names"
        {
            printf '%s' "$@"
            echo "# compose2sif: $PROJECT, as $name reaches it (its networks)"
            printf '%s' "${mine[@]}"
        } >"$STATE/hosts.d/$name.$BASHPID" && chmod 0644 "$STATE/hosts.d/$name.$BASHPID" &&
            mv -f "$STATE/hosts.d/$name.$BASHPID" "$STATE/hosts.d/$name"
    done
}

# A hosts line ("ADDR NAME...") less the names the loaded service does not find there
# (S_HIDDEN_NAMES, ADDR:NAME: a peer's per-network alias on a network it is not on), without its
# newline; nothing where no name is left.
without_hidden_names() {
    local addr=${1%% *} words=() kept=() word
    read -r -a words <<<"${1#* }"
    for word in "${words[@]}"; do
        [[ " ${S_HIDDEN_NAMES[*]} " == *" $addr:$word "* ]] || kept+=("$word")
    done
    [ ${#kept[@]} -eq 0 ] || printf '%s %s' "$addr" "${kept[*]}"
}

# What a killed run (kill -9, an ended batch job, a reboot) leaves behind. The runtime forgets
# its dead instances by itself (`instance list` drops a record whose starter is gone), but RUNDIR
# is on disk: a status that says a service runs whose instance is gone, an instance whose root
# filesystem went with a killed FUSE helper, a supervisor.pid naming a process that is not (or no
# longer) our supervisor. One note says what was found; `up` and `down` ($1) clear the records
# (they restart or remove such instances anyway). `ps` finds the same in its own pass over the
# services, shows them as exited and tells with tell_stale. An instance whose start run.sh did not
# see through (killed while the runtime started it: the runtime may leave it up with its FUSE
# helpers gone, "already running" to a later `up`) has no record of its helpers (record_helpers,
# written once its instance is listed): `up` removes it and starts it again.
STALE_KILLED=() STALE_LOST=() STALE_HALF=()
clean_stale() {
    local name st rec=()
    [ "$INSTANCES_LISTED" = 1 ] || list_instances
    for name in "${SERVICES[@]}"; do
        load_service "$name"
        [ "$S_ONESHOT" = 1 ] && continue
        instance_pid
        if [ -n "$IPID" ]; then
            rec=()
            { read -r -a rec || true; } 2>/dev/null <"$RUNDIR/$name.helpers"
            if [ "${rec[0]:-}" != "$IPID" ]; then
                STALE_HALF+=("$name")
            else
                root_lost || continue
                STALE_LOST+=("$name")
            fi
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
        remove_files "$RUNDIR/$name.status" "$RUNDIR/$name.health" "$RUNDIR/$name.helpers"
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
    if [ ${#STALE_HALF[@]} -gt 0 ]; then
        case "$1" in
            up) st="their instances are removed and started again" ;;
            *) st="their instances are removed" ;;
        esac
        note "${STALE_HALF[*]}: started by a run.sh that ended before the start did (killed): $st"
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
