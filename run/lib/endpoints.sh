# ---- run/lib/endpoints.sh: ADDR:PORT a service listens on, and who holds one ---------------------

# The TCP sockets that LISTEN on the endpoints given as arguments: one line "ENDPOINT UID INODE"
# for each endpoint that has one. A listener matches when its port is the endpoint's and its
# address is the same or either one is a wildcard (0.0.0.0 or ::): that is when a bind clashes,
# and when a client of the endpoint reaches the listener. /proc/net/tcp{,6} hold addresses as
# 32-bit words in the host's byte order (little-endian here).
endpoint_listeners() {
    [ $# -gt 0 ] || return 0
    awk -v endpoints="$*" '
        function hex(s,    i, v) { v = 0; for (i = 1; i <= length(s); i++) v = v * 16 + index("0123456789ABCDEF", substr(s, i, 1)) - 1; return v }
        function v4(s) { return hex(substr(s, 7, 2)) "." hex(substr(s, 5, 2)) "." hex(substr(s, 3, 2)) "." hex(substr(s, 1, 2)) }
        function address(s) {
            if (length(s) == 8) return v4(s)
            if (s == "00000000000000000000000000000000") return "::"
            if (substr(s, 1, 16) == "0000000000000000" && substr(s, 17, 8) == "FFFF0000") return v4(substr(s, 25, 8))
            return "v6:" s
        }
        function wild(a) { return a == "0.0.0.0" || a == "::" }
        BEGIN { n = split(endpoints, want, " ") }
        $4 == "0A" {
            split($2, parts, ":"); a = address(parts[1]); p = hex(parts[2])
            for (i = 1; i <= n; i++) {
                ep = want[i]; k = match(ep, /:[0-9]+$/); wa = substr(ep, 1, k - 1); wp = substr(ep, k + 1) + 0
                if (wp == p && !(ep in seen) && (wa == a || wild(wa) || wild(a))) { seen[ep] = 1; print ep, $8, $10 }
            }
        }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# The required endpoints of this service (the others may never be opened).
required_endpoints() {
    local e
    for e in "${S_ENDPOINTS[@]}"; do [ "${e%\?}" = "$e" ] && printf '%s\n' "$e"; done
}

# Who holds socket $2 of uid $1, in HOLDER: the user, and the process where /proc shows it (an
# unprivileged user reads only the descriptors of its own processes); its pid in HOLDER_PID.
HOLDER="" HOLDER_PID=""
describe_holder() {
    local user fd
    user=$(id -nu "$1" 2>/dev/null) || user="uid $1"
    HOLDER="a process of user $user" HOLDER_PID=""
    fd=$(find /proc/[0-9]*/fd -maxdepth 1 -lname "socket:\[$2\]" -print -quit 2>/dev/null)
    [ -n "$fd" ] || return 0
    HOLDER_PID=${fd#/proc/}
    HOLDER_PID=${HOLDER_PID%%/*}
    HOLDER="pid $HOLDER_PID ($(tr '\0' ' ' <"/proc/$HOLDER_PID/cmdline" 2>/dev/null | cut -c1-80 | sed 's/ *$//')) of user $user"
}

# The endpoints of the given services that something other than this project listens on, one
# line each ("ADDR:PORT (service NAME) is held by ..."). Services that already run are skipped,
# and so are endpoints that may never be opened.
endpoints_taken() {
    local name e uid inode endpoints=()
    declare -A owner=()
    for name in "$@"; do
        load_service "$name"
        [ "$S_ONESHOT" = 1 ] && continue
        service_running && continue
        while read -r e; do owner[$e]=$name endpoints+=("$e"); done < <(required_endpoints)
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

# Wait until each required endpoint of this service listens, while it runs, for up to $1 s.
# Prints why not when it fails.
wait_listening() {
    local deadline=$((SECONDS + $1)) missing=() still=() e heard
    mapfile -t missing < <(required_endpoints)
    while [ ${#missing[@]} -gt 0 ]; do
        heard=$'\n'$(endpoint_listeners "${missing[@]}")$'\n'
        still=()
        for e in "${missing[@]}"; do
            case "$heard" in *$'\n'"$e "*) ;; *) still+=("$e") ;; esac
        done
        missing=("${still[@]}")
        [ ${#missing[@]} -eq 0 ] && return 0
        if ! service_running; then
            echo "exited before it listened on ${missing[*]} (exit code $(exit_code))"
            return 1
        fi
        if ((SECONDS >= deadline)); then
            echo "does not listen on ${missing[*]} $1 s after it started"
            return 1
        fi
        nap 0.05
    done
    return 0
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
    [ "$found" = 1 ] ||
        echo "run.sh: service $S_NAME found an address in use (its endpoints: ${endpoints[*]:-none known}; none is held now)"
}
