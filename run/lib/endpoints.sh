# ---- run/lib/endpoints.sh: ADDR:PORT a service listens on, and who holds one ---------------------

# awk functions that decode /proc/net/tcp{,6}, which hold addresses as 32-bit words in the host's
# byte order (little-endian here): address(HEX) is "a.b.c.d", "::", "::1" or an IPv6 address in
# full (eight groups of four hex digits, as node_addresses writes them); hex(S) a number.
TCP_AWK='
    function hex(s,    i, v) { v = 0; for (i = 1; i <= length(s); i++) v = v * 16 + index("0123456789ABCDEF", substr(s, i, 1)) - 1; return v }
    function v4(s) { return hex(substr(s, 7, 2)) "." hex(substr(s, 5, 2)) "." hex(substr(s, 3, 2)) "." hex(substr(s, 1, 2)) }
    function address(s) {
        if (length(s) == 8) return v4(s)
        if (s == "00000000000000000000000000000000") return "::"
        if (substr(s, 1, 16) == "0000000000000000" && substr(s, 17, 8) == "FFFF0000") return v4(substr(s, 25, 8))
        if (s == "00000000000000000000000001000000") return "::1"
        return v6(s)
    }
    function v6(s,    w, out, word) {  # the full form node_addresses writes: eight groups of four, lower case
        out = ""
        for (w = 0; w < 4; w++) {
            word = substr(s, 8 * w + 1, 8)
            word = substr(word, 7, 2) substr(word, 5, 2) substr(word, 3, 2) substr(word, 1, 2)
            out = out (w ? ":" : "") tolower(substr(word, 1, 4)) ":" tolower(substr(word, 5, 4))
        }
        return out
    }'

# The TCP sockets that LISTEN on the endpoints given as arguments: one line "ENDPOINT UID INODE"
# for each endpoint that has one. A listener matches when its port is the endpoint's and its
# address is the same or either one is a wildcard (0.0.0.0 or ::): that is when a bind clashes,
# and when a client of the endpoint reaches the listener.
endpoint_listeners() {
    [ $# -gt 0 ] || return 0
    awk -v endpoints="$*" "$TCP_AWK"'
        function wild(a) { return a == "0.0.0.0" || a == "::" }
        BEGIN { n = split(endpoints, want, " ") }
        $4 == "0A" {
            split($2, parts, ":"); a = address(parts[1]); p = hex(parts[2])
            for (i = 1; i <= n; i++) {
                ep = want[i]; k = match(ep, /:[0-9]+$/); wa = substr(ep, 1, k - 1); wp = substr(ep, k + 1) + 0
                if (substr(wa, 1, 1) == "[") wa = substr(wa, 2, length(wa) - 2)
                if (wp == p && !(ep in seen) && (wa == a || wild(wa) || wild(a))) { seen[ep] = 1; print ep, $8, $10 }
            }
        }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# The node's addresses, where a port published on all interfaces is served one by one (never on
# the wildcard, which would take every other service's port P too), in NODE_ADDRESSES: 127.0.0.1,
# ::1 where the node has IPv6, and each address of its interfaces as the kernel has them now: IPv4
# from the local routes (/proc/net/fib_trie), IPv6 the global ones (/proc/net/if_inet6; a
# link-local one needs its interface named, which an endpoint cannot carry). IPv6 ones in brackets.
NODE_ADDRESSES=()
node_addresses() {
    [ ${#NODE_ADDRESSES[@]} -gt 0 ] && return 0
    local line previous="" hex scope full i
    declare -A seen=()
    NODE_ADDRESSES=(127.0.0.1)
    while read -r line; do
        case "$line" in
            "|-- "*) previous=${line#|-- } ;;
            "/32 host LOCAL")
                [[ $previous == 127.* || -n ${seen[$previous]:-} ]] && continue
                seen[$previous]=1
                NODE_ADDRESSES+=("$previous")
                ;;
        esac
    done 2>/dev/null </proc/net/fib_trie
    while read -r hex _ _ scope _; do
        if [ "$hex" = 00000000000000000000000000000001 ]; then
            NODE_ADDRESSES+=("[::1]")
        elif [ "$scope" = 00 ] && [ ${#hex} = 32 ]; then
            full=""
            for ((i = 0; i < 32; i += 4)); do full+=${full:+:}${hex:i:4}; done
            NODE_ADDRESSES+=("[${full,,}]")
        fi
    done 2>/dev/null </proc/net/if_inet6
    return 0
}

# The required endpoints of this service (the others may never be opened), in REQUIRED.
REQUIRED=()
required_endpoints() {
    local e
    REQUIRED=()
    for e in "${S_ENDPOINTS[@]}"; do [ "${e%\?}" = "$e" ] && REQUIRED+=("$e"); done
    return 0
}

# Who holds socket $2 of uid $1, in HOLDER: a service of this project (a process of its instance,
# or its forwarder), else "another process on this node" with the process where /proc shows it
# (an unprivileged user reads only the descriptors of its own processes) and its user; the pid in
# HOLDER_PID.
HOLDER="" HOLDER_PID=""
describe_holder() {
    local user fd command
    user=$(id -nu "$1" 2>/dev/null) || user="uid $1"
    HOLDER="another process on this node (of user $user)" HOLDER_PID=""
    fd=$(find /proc/[0-9]*/fd -maxdepth 1 -lname "socket:\[$2\]" -print -quit 2>/dev/null)
    [ -n "$fd" ] || return 0
    HOLDER_PID=${fd#/proc/}
    HOLDER_PID=${HOLDER_PID%%/*}
    command=$(tr '\0' ' ' <"/proc/$HOLDER_PID/cmdline" 2>/dev/null | cut -c1-80 | sed 's/ *$//')
    if project_service_of "$HOLDER_PID"; then
        HOLDER="service $OWNER of this project (pid $HOLDER_PID: $command)"
    else
        HOLDER="another process on this node (pid $HOLDER_PID: $command, of user $user)"
    fi
}

# The service of this project that process $1 belongs to, in OWNER: its instance's init is an
# ancestor, or it is one of its forwarders. The service loaded stays loaded.
OWNER=""
project_service_of() {
    local loaded=${S_NAME:-} name pid start rest instance p=$1 i
    declare -A service_of=()
    OWNER=""
    for name in "${SERVICES[@]}"; do
        while read -r pid start rest; do
            [ "$pid" = "$1" ] && same_process "$pid" "$start" && OWNER=$name
        done 2>/dev/null <"$RUNDIR/$name.forward"
        load_service "$name"
        service_of[$S_INSTANCE]=$name
    done
    [ -n "$loaded" ] && load_service "$loaded"
    [ -n "$OWNER" ] && return 0
    declare -A init_of=()
    listed_instances
    for instance in "${!LISTED[@]}"; do
        pid=${LISTED[$instance]}
        [ -n "${service_of[$instance]:-}" ] && init_of[$pid]=${service_of[$instance]}
    done
    for ((i = 0; i < 64; i++)); do
        [ -n "${init_of[$p]:-}" ] && { OWNER=${init_of[$p]}; return 0; }
        parent_of "$p" || return 1
        p=$PARENT
        [ "$p" -gt 1 ] || return 1
    done
    return 1
}

# The endpoints of the given services that something other than this project listens on, one
# line each ("ADDR:PORT (service NAME) is held by ..."), published ports that a forwarder serves
# included. Services that already run are skipped, and so are endpoints that may never be opened.
endpoints_taken() {
    local name e uid inode i endpoints=()
    declare -A owner=()
    for name in "$@"; do
        load_service "$name"
        [ "$S_ONESHOT" = 1 ] && continue
        service_running && continue
        required_endpoints
        for e in "${REQUIRED[@]}"; do owner[$e]=$name endpoints+=("$e"); done
        live_forwarders "$name"  # (one left running by an earlier `up` serves again)
        for ((i = 0; i < ${#S_FORWARDS[@]}; i += 2)); do
            e=${S_FORWARDS[i]}
            [ -n "${FORWARD_PID[$e]:-}" ] || { owner[$e]=$name endpoints+=("$e"); }
        done
    done
    # Only the endpoints a service needs: an EXPOSE or `expose:` port may be another service's real
    # one (a worker built from its web server's Dockerfile), and is never opened. Whoever holds a
    # needed endpoint of a service that is not running, another service of this project included,
    # is in its way.
    while read -r e uid inode; do
        describe_holder "$uid" "$inode"
        printf '%s (service %s) is held by %s\n' "$e" "${owner[$e]}" "$HOLDER"
    done < <(endpoint_listeners "${endpoints[@]}")
}

# Wait until each required endpoint of this service (with $2 = published: and each that a forwarder
# of its published ports relays to) listens, while it runs, for up to $1 s; once
# one of them listens, the others get LISTEN_SETTLE_S more (a program opens its sockets together:
# a port it never opens, a published HTTPS port of a server with HTTPS off, is not waited for to
# the end). Returns 1 and prints why when it exits first; returns 2 and prints the endpoints that
# do not listen yet when the wait ends, after how long it waited in seconds ("12 ADDR:PORT...").
LISTEN_SETTLE_S=10
wait_listening() {
    local start=$SECONDS deadline=$((SECONDS + $1)) missing=() still=() e heard i
    required_endpoints
    missing=("${REQUIRED[@]}")
    for ((i = 1; i < ${#S_FORWARDS[@]}; i += 2)); do
        [ "${2:-}" = published ] || break
        [[ " ${missing[*]} " == *" ${S_FORWARDS[i]} "* ]] || missing+=("${S_FORWARDS[i]}")
    done
    while [ ${#missing[@]} -gt 0 ]; do
        heard=$'\n'$(endpoint_listeners "${missing[@]}")$'\n'
        still=()
        for e in "${missing[@]}"; do
            case "$heard" in *$'\n'"$e "*) ;; *) still+=("$e") ;; esac
        done
        if [ ${#still[@]} -lt ${#missing[@]} ] && ((SECONDS + LISTEN_SETTLE_S < deadline)); then
            deadline=$((SECONDS + LISTEN_SETTLE_S))
        fi
        missing=("${still[@]}")
        [ ${#missing[@]} -eq 0 ] && return 0
        if ! service_running; then
            exit_code
            echo "exited before it listened on ${missing[*]} (exit code $EXIT_CODE)"
            return 1
        fi
        if ((SECONDS >= deadline)); then
            echo "$((SECONDS - start)) ${missing[*]}"
            return 2
        fi
        nap 0.05
    done
    return 0
}

# The loaded service's endpoints $@ (ADDR:PORT) as the ports it binds, in SERVICE_PORTS
# ("443, 5001"; a privileged port by its own number, not the one the tracer gives it), each once.
SERVICE_PORTS=""
service_ports() {
    local e port m named=" "
    SERVICE_PORTS=""
    for e in "$@"; do
        port=${e##*:}
        for m in "${S_PORT_MAP[@]}"; do [ "${m#*:}" = "$port" ] && port=${m%%:*}; done
        [[ $named == *" $port "* ]] && continue
        named+="$port "
        SERVICE_PORTS+=${SERVICE_PORTS:+, }$port
    done
}

# For the supervisor: a service that did not listen on all its endpoints when `up` stopped waiting
# (RUNDIR/NAME.late: when it started, then those endpoints) is watched; once they all listen, one
# line says so and how long it took, and what it listens on is compared with the plan.
watch_late() {
    [ -f "$RUNDIR/$S_NAME.late" ] || return 0
    local since="" e heard missing=()
    { IFS= read -r since && mapfile -t missing; } 2>/dev/null <"$RUNDIR/$S_NAME.late"
    heard=$'\n'$(endpoint_listeners "${missing[@]}")$'\n'
    for e in "${missing[@]}"; do
        case "$heard" in *$'\n'"$e "*) ;; *) return 0 ;; esac
    done
    remove_files "$RUNDIR/$S_NAME.late"
    now_seconds
    printf '%s listening\n' "$NOW_SECONDS" >>"$RUNDIR/$S_NAME.timeline"
    service_ports "${missing[@]}"
    note "$S_NAME: listening on $SERVICE_PORTS now, $((${NOW_SECONDS%.*} - ${since:-0})) s after its start"
    instance_pid
    record_truth
}

# For `ps`: the endpoints of the loaded service that `up` found not listening yet and that still
# do not, in NOT_LISTENING (none where the file is gone: it listened, or it stopped).
NOT_LISTENING=()
not_listening_yet() {
    local e heard missing=()
    NOT_LISTENING=()
    [ -f "$RUNDIR/$S_NAME.late" ] || return 0
    { IFS= read -r _ && mapfile -t missing; } 2>/dev/null <"$RUNDIR/$S_NAME.late"
    heard=$'\n'$(endpoint_listeners "${missing[@]}")$'\n'
    for e in "${missing[@]}"; do
        case "$heard" in *$'\n'"$e "*) ;; *) NOT_LISTENING+=("$e") ;; esac
    done
}

# For a log that says "Address already in use" (or nginx's "bind() ... failed (98"): which of
# the service's endpoints, or of the ADDR:PORT the error lines name, is taken, and by whom.
explain_address_in_use() {
    local e uid inode found=0 lines endpoints=()
    lines=$(log_tail 50 | grep -E 'Address already in use|bind\(\).*failed \(98') || return 0
    for e in "${S_ENDPOINTS[@]}"; do endpoints+=("${e%\?}"); done
    mapfile -t -O ${#endpoints[@]} endpoints < <(grep -oE '([0-9]{1,3}\.){3}[0-9]{1,3}:[0-9]+' <<<"$lines")
    while read -r e uid inode; do
        found=1
        describe_holder "$uid" "$inode"
        echo "run.sh: service $S_NAME could not listen on $e: held by $HOLDER"
    done < <(endpoint_listeners "${endpoints[@]}")
    [ "$found" = 1 ] && return 0
    lines="run.sh: service $S_NAME found an address in use (its endpoints: ${endpoints[*]:-none known}; none is held now)"
    wildcard_listeners_of_others && lines="$lines; $WILDCARD_HOLDERS"
    echo "$lines"
}

# A port the plan never saw (an image's default, a second replica of one image) may clash with a
# listener on every address: those of the other services of this project, in
# WILDCARD_HOLDERS ("service A of this project listens on all interfaces (0.0.0.0:P), which holds
# port P on every address; ..."). Fails where there is none.
WILDCARD_HOLDERS=""
wildcard_listeners_of_others() {
    local me=$S_NAME name l found=()
    list_instances
    for name in "${SERVICES[@]}"; do
        [ "$name" = "$me" ] && continue
        load_service "$name"
        instance_pid
        service_listeners
        for l in "${LISTENING[@]}"; do
            case "${l%:*}" in
                0.0.0.0 | ::) found+=("service $name of this project listens on all interfaces ($l), which holds port ${l##*:} on every address") ;;
            esac
        done
    done
    load_service "$me"
    instance_pid
    WILDCARD_HOLDERS=$(printf '%s; ' "${found[@]}")
    WILDCARD_HOLDERS=${WILDCARD_HOLDERS%; }
    [ ${#found[@]} -gt 0 ]
}

# ---- run-time truth: what a service really listens on, against the plan ----------------------

# The TCP endpoints that the loaded service's processes (its instance's init IPID and every
# descendant) listen on, in LISTENING ("ADDR:PORT", IPv6 other than :: and ::1 in full): their
# socket descriptors (/proc/PID/fd) matched with /proc/net/tcp{,6}.
LISTENING=()
service_listeners() {
    local dirs=() inodes tree i f kids
    LISTENING=()
    [ -n "$IPID" ] || return 0
    if [ -e "/proc/$IPID/task/$IPID/children" ]; then
        # where the kernel lists each thread's children: down the tree from the init, no child process
        tree=("$IPID")
        for ((i = 0; i < ${#tree[@]}; i++)); do
            dirs+=("/proc/${tree[i]}/fd")
            for f in /proc/"${tree[i]}"/task/*/children; do
                kids=()
                { read -r -a kids || true; } 2>/dev/null <"$f"
                tree+=("${kids[@]}")
            done
        done
    else
        # (cat, not awk, reads /proc/*/stat: a process that ends meanwhile would stop mawk)
        mapfile -t dirs < <(cat /proc/[0-9]*/stat 2>/dev/null | awk -v root="$IPID" '
            { line = $0; sub(/.*\) /, "", line); split(line, f, " "); kids[f[2]] = kids[f[2]] " " $1 }
            END {
                queue[1] = root; n = 1
                for (i = 1; i <= n; i++) {
                    print "/proc/" queue[i] "/fd"
                    m = split(kids[queue[i]], k, " ")
                    for (j = 1; j <= m; j++) queue[++n] = k[j]
                }
            }')
    fi
    inodes=$(find "${dirs[@]}" -maxdepth 1 -lname 'socket:\[*' -printf '%l ' 2>/dev/null)
    [ -n "$inodes" ] || return 0
    mapfile -t LISTENING < <(awk -v inodes="$inodes" "$TCP_AWK"'
        BEGIN { n = split(inodes, s, " "); for (i = 1; i <= n; i++) { gsub(/[^0-9]/, "", s[i]); mine[s[i]] = 1 } }
        $4 == "0A" && ($10 in mine) { split($2, parts, ":"); e = address(parts[1]) ":" hex(parts[2]); if (!(e in seen)) { seen[e] = 1; print e } }
        ' /proc/net/tcp /proc/net/tcp6 2>/dev/null)
}

# Whether listener $1 (ADDR:PORT) serves endpoint $2: the same port, and the same address or a
# wildcard listener.
serves() {
    [ "${1##*:}" = "${2##*:}" ] || return 1
    case "${1%:*}" in 0.0.0.0 | ::) return 0 ;; esac
    [ "${1%:*}" = "${2%:*}" ]
}

# Compare what the loaded service (running, IPID set) listens on with its plan; one line each in
# RUNDIR/NAME.truth (none: removed), which `up` prints and `ps` and `doctor` show:
#  - a listener on 0.0.0.0 or :: where the plan has none (not published there): other users of
#    the node reach it, and it holds the port on every address;
#  - a listener on an endpoint another service of this project needs (or forwards from; an
#    image's EXPOSE port may never be opened: that service's own failure names the holder);
#  - a planned endpoint it needs that nothing of it serves (a required one, or one a forwarder
#    relays to), with what it listens on instead and who holds the endpoint, if anyone.
record_truth() {
    local me=$S_NAME l e p name i ok uid inode lines=() planned=() needed=() theirs=()
    service_listeners
    for e in "${S_ENDPOINTS[@]}"; do
        planned+=("${e%\?}")
        [ "${e%\?}" = "$e" ] && needed+=("$e")
    done
    for ((i = 1; i < ${#S_FORWARDS[@]}; i += 2)); do
        case " ${needed[*]} " in *" ${S_FORWARDS[i]} "*) ;; *) needed+=("${S_FORWARDS[i]}") ;; esac
    done
    for name in "${SERVICES[@]}"; do
        [ "$name" = "$me" ] && continue
        load_service "$name"
        for e in "${S_ENDPOINTS[@]}"; do [ "${e%\?}" = "$e" ] && theirs+=("$e $name"); done
        for ((i = 0; i < ${#S_FORWARDS[@]}; i += 2)); do theirs+=("${S_FORWARDS[i]} $name"); done
    done
    load_service "$me"
    for l in "${LISTENING[@]}"; do
        p=${l##*:}
        case "${l%:*}" in
            0.0.0.0 | ::)
                ok=0
                for e in "${planned[@]}"; do [ "$e" = "$l" ] || [ "$e" = "0.0.0.0:$p" ] || [ "$e" = ":::$p" ] && ok=1; done
                [ "$ok" = 1 ] || lines+=("listens on all interfaces ($l), where nothing is published: anyone who reaches this node reaches it, and it holds port $p on every address (tell it its address: x-compose2sif: {bind_address: {env: VAR}})")
                ;;
        esac
        for e in "${theirs[@]}"; do
            serves "$l" "${e% *}" || serves "${e% *}" "$l" || continue
            lines+=("listens on $l, where service ${e#* } is planned (${e% *}): ${e#* } cannot open it")
        done
    done
    for e in "${needed[@]}"; do
        ok=0
        for l in "${LISTENING[@]}"; do serves "$l" "$e" && ok=1; done
        [ "$ok" = 1 ] && continue
        l="does not listen on its planned $e (it listens on: ${LISTENING[*]:-nothing})"
        for ((i = 1; i < ${#S_FORWARDS[@]}; i += 2)); do
            [ "${S_FORWARDS[i]}" = "$e" ] && l="$l; its published port ${S_FORWARDS[i - 1]} forwards there"
        done
        inode=""
        read -r _ uid inode < <(endpoint_listeners "$e")
        if [ -n "$inode" ]; then
            describe_holder "$uid" "$inode"
            l="$l; $e is held by $HOLDER"
        fi
        lines+=("$l")
    done
    if [ ${#lines[@]} -gt 0 ]; then
        write_lines "$RUNDIR/$me.truth" "${lines[@]}"
    else
        remove_files "$RUNDIR/$me.truth"
    fi
}

# The lines record_truth left for the given services, each as "PREFIX NAME: LINE".
tell_truth() {
    local prefix=$1 name line
    shift
    for name in "$@"; do
        while IFS= read -r line; do
            printf '%s service %s: %s\n' "$prefix" "$name" "$line"
        done 2>/dev/null <"$RUNDIR/$name.truth"
    done
}
