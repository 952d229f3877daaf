die() { echo "run.sh: $*" >&2; exit 1; }
note() { echo "[$PROJECT] $*" >&2; }

# ---- the container runtime ------------------------------------------------------------------
RT="" RT_VERSION="" EVAL_FLAGS=() ENV_SUFFIX=.env
detect_runtime() {
    if [ -n "${C2S_RUNTIME:-}" ]; then
        RT=$C2S_RUNTIME
    elif command -v apptainer >/dev/null 2>&1; then
        RT=apptainer
    elif command -v singularity >/dev/null 2>&1; then
        RT=singularity
    else
        die "neither apptainer nor singularity is on PATH (try: module load apptainer)"
    fi
    local line
    line=$("$RT" --version 2>/dev/null) || die "$RT --version failed"
    RT_VERSION=$(printf '%s\n' "$line" | sed 's/^.*version //; s/[-+].*$//')
    case "$line" in
        apptainer*) ;;
        *) version_ge "$RT_VERSION" 3.6 || die "$line is too old: --env-file needs Singularity >= 3.6" ;;
    esac
    [ "${1:-}" = --images-only ] && return 0  # building needs neither
    # With --no-eval (Apptainer >= 1.1) values and the image's CMD are taken literally, as Docker
    # does; without it the runtime evaluates them once more, so the escaped env files are used.
    if "$RT" exec --help 2>/dev/null | grep -- --no-eval >/dev/null; then  # not -q: with pipefail, a SIGPIPE would fail it
        EVAL_FLAGS=(--no-eval) ENV_SUFFIX=.env
    else
        EVAL_FLAGS=() ENV_SUFFIX=.eval.env
    fi
    WRITABLE_ROOT=$(writable_root_mode)
}

# The image's root filesystem is writable, as under Docker (entrypoints that copy a script to /,
# logs in /var/log, schedule files in the app directory), and its changes go when the service
# stops: a directory overlay where the runtime runs unprivileged with fuse-overlayfs (on disk, no
# size cap), else --writable-tmpfs (in memory, capped by the runtime's "sessiondir max size").
# Setuid installs refuse directory overlays to users. C2S_WRITABLE_ROOT=overlay|tmpfs|none
# overrides. Measured in docs/writable-paths.md.
# (overlayfs leaves its work directory mode 000: make it removable first)
remove_overlay() {
    [ -e "$STATE/overlay/$1" ] || return 0
    chmod -R u+rwx "$STATE/overlay/$1" 2>/dev/null
    rm_inside "$STATE/overlay/$1"
}

WRITABLE_ROOT=""
writable_root_mode() {
    local starter
    if [ -n "${C2S_WRITABLE_ROOT:-}" ]; then
        printf '%s' "$C2S_WRITABLE_ROOT"
        return
    fi
    starter="$(dirname "$(readlink -f "$(command -v "$RT")")")/../libexec/$RT/bin/starter-suid"
    if [ ! -u "$starter" ] && command -v fuse-overlayfs >/dev/null 2>&1; then
        printf overlay
    else
        printf tmpfs
    fi
}

# The service's env file for this runtime (see detect_runtime).
env_file() { printf '%s' "${S_ENV%.env}$ENV_SUFFIX"; }

version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]; }

# ---- small helpers --------------------------------------------------------------------------
# rm -rf only what lies inside the output directory once its parent is resolved: a link planted
# there must not send a delete elsewhere (a link itself is removed, not followed).
rm_inside() {
    local path parent root
    root=$(cd "$HERE" && pwd -P)
    for path in "$@"; do
        [ -e "$path" ] || [ -L "$path" ] || continue
        parent=$(readlink -m -- "$(dirname -- "$path")") || die "cannot resolve $path"
        case "$parent/$(basename -- "$path")" in
            */. | */..) die "refusing to delete $path" ;;
            "$root"/?*) rm -rf -- "${parent:?}/$(basename -- "$path")" ;;
            *) die "refusing to delete $path: it lies in $parent, outside $root" ;;
        esac
    done
}

# The directories run.sh writes in are real directories of the output dir, never planted links.
check_sealed() {
    local d
    for d in "$STATE" "$HERE/sif" "$HERE/definitions" "$HERE/env"; do
        [ -L "$d" ] && die "$d is a symbolic link; compose2sif does not follow links in its output directory (remove it)"
    done
    return 0
}

# A JSON string of $1 (control characters other than \n \t \r become `?`), in JSON_STR.
JSON_STR=""
json_str() {
    local s=$1
    s=${s//\\/\\\\} s=${s//\"/\\\"} s=${s//$'\n'/\\n} s=${s//$'\t'/\\t} s=${s//$'\r'/\\r}
    s=${s//[$'\001'-$'\037'$'\177']/?}
    JSON_STR="\"$s\""
}

abs() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s' "$HERE/$1" ;; esac; }

# The first line of a file, read without a child process ("" when there is none).
first_line() { local line=""; { IFS= read -r line || true; } 2>/dev/null <"$1"; printf '%s' "$line"; }

# Sleep without a child process: read's timeout on a FIFO that nobody writes to (opened
# read-write, so the open does not block). Polling loops use this, so they cost no fork.
nap() {
    if [ -p "$RUNDIR/nap.fifo" ] || mkfifo -m 0600 "$RUNDIR/nap.fifo" 2>/dev/null; then
        read -r -t "$1" _ <>"$RUNDIR/nap.fifo" || true
    else
        sleep "$1"
    fi
}


status_file() { printf '%s' "$RUNDIR/$1.status"; }
set_status() {
    printf '%s\n' "$2" >"$(status_file "$1").tmp" && mv -f "$(status_file "$1").tmp" "$(status_file "$1")"
    printf '%s %s\n' "$(date +%s.%N)" "${2%% *}" >>"$RUNDIR/$1.timeline"
}
get_status() { first_line "$(status_file "$1")"; }

# The pids of the user's instances, from one `instance list --json` (no jq on most nodes).
declare -A INSTANCE_PIDS=()
INSTANCES_LISTED=0
list_instances() {
    local name pid
    INSTANCE_PIDS=()
    while read -r name pid; do
        INSTANCE_PIDS[$name]=$pid
    done < <({ "$RT" instance list --json 2>/dev/null | tr -d ' \t\n'; echo; } | sed 's/},{/}\n{/g' |
        sed -n 's/.*"instance":"\([^"]*\)","pid":\([0-9]*\).*/\1 \2/p')
    INSTANCES_LISTED=1
    list_children
}

# The first child of every listed instance's init (its start script), for child_of: one grep of
# every thread's list of children, not a read of each (an init has several threads).
list_children() {
    local files=() pid path kids
    declare -A seen=()
    for pid in "${INSTANCE_PIDS[@]}"; do files+=(/proc/"$pid"/task/*/children); done
    [ ${#files[@]} -gt 0 ] || return 0
    while IFS=: read -r path kids; do
        pid=${path#/proc/} kids=${kids# }
        pid=${pid%%/*}
        [ -n "$kids" ] && [ -z "${seen[$pid]:-}" ] && seen[$pid]=1 CHILD_OF[$pid]=${kids%% *}
    done < <(grep -H . "${files[@]}" 2>/dev/null)
}

# The pid of this service's instance, in IPID: from the last listing when there is one, else
# from a listing of its own.
IPID=""
instance_pid() {
    if [ "$INSTANCES_LISTED" = 1 ]; then
        IPID=${INSTANCE_PIDS[$S_INSTANCE]:-}
    else
        IPID=$("$RT" instance list --json "$S_INSTANCE" 2>/dev/null | tr -d ' \t\n' |
            sed -n "s/.*\"instance\":\"$S_INSTANCE\",\"pid\":\([0-9]*\).*/\1/p")
    fi
}

# After this service's instance started or stopped: its entry in the listing.
refresh_instance() {
    local listed=$INSTANCES_LISTED
    INSTANCES_LISTED=0
    instance_pid
    INSTANCES_LISTED=$listed
    if [ -n "$IPID" ]; then INSTANCE_PIDS[$S_INSTANCE]=$IPID; else unset "INSTANCE_PIDS[$S_INSTANCE]"; fi
}

# A live child of process $1, in CHILD: the instance's init runs the start script, which runs
# the service. Where the kernel lists a process's children (/proc/PID/task/*/children) that is
# read. Elsewhere one scan of /proc/*/stat with builtin reads (no fork) finds the children of
# every listed instance at once; an answer is kept while that child lives.
CHILD=""
declare -A CHILD_OF=()
child_of() {
    local f stat line rest ppid pid
    CHILD=${CHILD_OF[$1]:-}
    if [ -n "$CHILD" ] && parent_of "$CHILD" && [ "$PARENT" = "$1" ]; then return 0; fi
    CHILD=""
    unset "CHILD_OF[$1]"
    if [ -e "/proc/$1/task/$1/children" ]; then
        for f in /proc/"$1"/task/*/children; do
            { read -r CHILD _ || true; } 2>/dev/null <"$f"
            [ -n "$CHILD" ] && break
        done
    else
        declare -A want=([$1]=1)
        for pid in "${INSTANCE_PIDS[@]}"; do want[$pid]=1; done
        for stat in /proc/[0-9]*/stat; do
            { read -r line || true; } 2>/dev/null <"$stat" || continue
            rest=${line##*) }   # after "(comm) ": state ppid ...
            [ "${rest%% *}" = Z ] && continue
            rest=${rest#* }
            ppid=${rest%% *}
            [ -n "${want[$ppid]:-}" ] || continue
            pid=${stat#/proc/}
            CHILD_OF[$ppid]=${pid%/stat}
        done
        CHILD=${CHILD_OF[$1]:-}
    fi
    [ -n "$CHILD" ] || return 1
    CHILD_OF[$1]=$CHILD
}

# The parent of live (not zombie) process $1, in PARENT.
PARENT=""
parent_of() {
    local line="" rest
    PARENT=""
    { read -r line || true; } 2>/dev/null <"/proc/$1/stat"
    rest=${line##*) }
    [ -n "$line" ] && [ "${rest%% *}" != Z ] || return 1
    rest=${rest#* }
    PARENT=${rest%% *}
}

# The start time of live process $1 (clock ticks since boot), in PROC_START: with its pid it names
# one process for good, where a pid alone may have been reused (RUNDIR is on disk: a pid recorded
# before a reboot can name anything now).
PROC_START=""
proc_start() {
    local line="" fields=()
    PROC_START=""
    { read -r line || true; } 2>/dev/null <"/proc/$1/stat"
    [ -n "$line" ] || return 1
    read -r -a fields <<<"${line##*) }"  # fields 3.. of stat: the state, ..., the start time (22)
    [ "${fields[0]}" != Z ] || return 1  # a zombie has ended (its parent has not reaped it)
    PROC_START=${fields[19]}
}

# The runtime's FUSE helpers of this service's instance, recorded when it starts (squashfuse
# mounts the image and fuse-overlayfs its writable root, both children of the instance's starter):
# "INSTANCE-PID STARTER-PID HELPER-PID...". Where the kernel lists no children, or the runtime
# mounts in the kernel (setuid installs), none are recorded.
record_helpers() {
    local f pid comm kids=() helpers=()
    parent_of "$IPID" || return 0
    for f in /proc/"$PARENT"/task/*/children; do
        { read -r -a kids || true; } 2>/dev/null <"$f"
        for pid in "${kids[@]}"; do
            comm=""
            { read -r comm || true; } 2>/dev/null <"/proc/$pid/comm"
            case "$comm" in squashfuse* | fuse-overlayfs | fuse2fs) helpers+=("$pid") ;; esac
        done
    done
    printf '%s\n' "$IPID $PARENT ${helpers[*]}" >"$RUNDIR/$S_NAME.helpers"
}

# Whether a recorded FUSE helper of instance IPID has gone: its root filesystem then answers
# "Transport endpoint is not connected" while its processes may live on.
root_lost() {
    local rec=() pid
    { read -r -a rec || true; } 2>/dev/null <"$RUNDIR/$S_NAME.helpers"
    [ "${rec[0]:-}" = "$IPID" ] || return 1
    for pid in "${rec[@]:2}"; do
        parent_of "$pid" && [ "$PARENT" = "${rec[1]}" ] || return 0
    done
    return 1
}

# running: the instance exists, its start script still runs and its root filesystem is there;
# exited: the instance exists but the service ended (or was killed), or its root filesystem went
# with a killed FUSE helper; absent: no instance. In STATE_NOW.
STATE_NOW=""
service_state() {
    instance_pid
    if [ -z "$IPID" ]; then
        STATE_NOW=absent
    elif kill -0 "$IPID" 2>/dev/null && child_of "$IPID" && ! root_lost; then
        STATE_NOW=running
    else
        STATE_NOW=exited
    fi
}
service_running() { service_state; [ "$STATE_NOW" = running ]; }

exit_code() { first_line "$(tmp_dir)/.c2s-exit"; }
tmp_dir() { printf '%s' "$(abs "$S_TMP")"; }

# ---- endpoints: ADDR:PORT a service listens on ----------------------------------------------
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
# line each ("ADDR:PORT (service NAME) is held by ..."). Services that already run are skipped.
endpoints_taken() {
    local name e uid inode endpoints=()
    declare -A owner=()
    for name in "$@"; do
        load_service "$name"
        [ "$S_ONESHOT" = 1 ] && continue
        service_running && continue
        for e in "${S_ENDPOINTS[@]}"; do owner[${e%\?}]=$name endpoints+=("${e%\?}"); done
    done
    # Planned endpoints of two services never overlap (the planner refuses that), so whoever holds
    # one of a service that is not running, another service of this project included, is in its way.
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

log_paths() {
    local json out err base
    json=$("$RT" instance list --json "$S_INSTANCE" 2>/dev/null | tr -d '\n')
    out=$(printf '%s' "$json" | sed -n 's/.*"logOutPath": *"\([^"]*\)".*/\1/p')
    err=$(printf '%s' "$json" | sed -n 's/.*"logErrPath": *"\([^"]*\)".*/\1/p')
    if [ -z "$out" ]; then
        for base in "${APPTAINER_CONFIGDIR:-$HOME/.apptainer}" "${SINGULARITY_CONFIGDIR:-$HOME/.singularity}"; do
            for out in "$base"/instances/logs/*/"$(id -un)"/"$S_INSTANCE".out; do
                [ -e "$out" ] && { err=${out%.out}.err; break 2; }
            done
            out=""
        done
    fi
    printf '%s\n%s\n' "$out" "$err"
}

# Apptainer appends to an instance's log files; a fresh start gets fresh logs.
clear_logs() {
    local base
    for base in "${APPTAINER_CONFIGDIR:-$HOME/.apptainer}" "${SINGULARITY_CONFIGDIR:-$HOME/.singularity}"; do
        rm -f "$base"/instances/logs/*/"$(id -un)"/"$S_INSTANCE".out "$base"/instances/logs/*/"$(id -un)"/"$S_INSTANCE".err
    done
}

log_tail() {
    local n=${1:-20} f
    if [ "$S_ONESHOT" = 1 ]; then
        tail -n "$n" "$STATE/logs/$S_NAME.log" 2>/dev/null
        return
    fi
    while IFS= read -r f; do
        [ -n "$f" ] && [ -e "$f" ] && tail -n "$n" "$f"
    done < <(log_paths)
}

# ---- state directory, hosts file --------------------------------------------------------------
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

# ---- GPUs -------------------------------------------------------------------------------------
GPU_POOL=()
gpu_pool() {
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        IFS=, read -r -a GPU_POOL <<<"$CUDA_VISIBLE_DEVICES"
    elif command -v nvidia-smi >/dev/null 2>&1; then
        local n
        n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
        GPU_POOL=()
        for ((i = 0; i < n; i++)); do GPU_POOL+=("$i"); done
    fi
}

# Give each GPU service its devices, in start order, so that services get disjoint GPUs.
assign_gpus() {
    local name next=0 spec ids count i
    gpu_pool
    for name in "$@"; do
        load_service "$name"
        [ "$S_NV" = 1 ] || continue
        ids=""
        for spec in "${S_GPUS[@]}"; do
            case "$spec" in
                ids=*) ids=${ids:+$ids,}${spec#ids=} ;;
                count=-1) ids=$(IFS=,; echo "${GPU_POOL[*]}") ;;
                count=*)
                    count=${spec#count=}
                    if ((next + count > ${#GPU_POOL[@]})); then
                        die "service $name wants $count GPU(s) but only ${#GPU_POOL[@]} are visible and $next are taken"
                    fi
                    for ((i = 0; i < count; i++)); do ids=${ids:+$ids,}${GPU_POOL[next + i]}; done
                    next=$((next + count))
                    ;;
            esac
        done
        printf '%s\n' "$ids" >"$RUNDIR/$name.gpus"
    done
}

# ---- starting one service -----------------------------------------------------------------------
runtime_flags() {
    # (no --pwd: `instance start` has none; the start script changes to the working directory)
    FLAGS=(--cleanenv "${EVAL_FLAGS[@]}" --env-file "$(env_file)")
    FLAGS+=(--bind "$STATE/hosts:/etc/hosts:ro")
    [ -e "$RUNDIR/$S_NAME.fakeroot" ] && FLAGS+=(--fakeroot)
    local b src rest
    for b in "${S_BINDS[@]}"; do
        src=${b%%:*} rest=${b#*:}
        FLAGS+=(--bind "$(abs "$src"):$rest")
    done
    [ "$S_NV" = 1 ] && FLAGS+=(--nv)
    if [ "$S_NV" = 1 ] && [ -s "$RUNDIR/$S_NAME.gpus" ]; then
        FLAGS+=(--env "CUDA_VISIBLE_DEVICES=$(cat "$RUNDIR/$S_NAME.gpus")")
    fi
    local root=$WRITABLE_ROOT
    [ "$S_WRITABLE_TMPFS" = 1 ] && root=tmpfs
    case "$root" in
        overlay)
            remove_overlay "$S_NAME" && mkdir -p "$STATE/overlay/$S_NAME"
            FLAGS+=(--overlay "$STATE/overlay/$S_NAME")
            ;;
        tmpfs) FLAGS+=(--writable-tmpfs) ;;
    esac
    mkdir -p "$STATE/services/$S_NAME/home"
    FLAGS+=(--home "$STATE/services/$S_NAME/home")
}

# A service that switches to other user ids inside (Dify's sandbox) gets --fakeroot only where that
# maps container uids and gids 0..N here: Apptainer maps what /etc/subuid and /etc/subgid give the
# user (with no entry, one id), setuid installs likewise. Probed at `up`; otherwise it starts
# plainly and one line says what will not work.
probe_fakeroot() {
    load_service "$1"
    rm -f "$RUNDIR/$1.fakeroot"
    [ -n "$S_FAKEROOT_IDS" ] && [ -f "$S_SIF" ] || return 0
    if "$RT" exec --fakeroot "$S_SIF" sh -c 'cat /proc/self/uid_map; echo --; cat /proc/self/gid_map' 2>/dev/null |
        awk -v want="$S_FAKEROOT_IDS" 'BEGIN { f = 1 } $1 == "--" { f++; next } NF == 3 { n[f]++; s[f, n[f]] = $1; c[f, n[f]] = $3 }
            END { if (f != 2) exit 1
                  for (k = 1; k <= 2; k++) { covered = 0  # ids 0..covered-1 are mapped
                      for (p = 0; p < n[k]; p++) for (i = 1; i <= n[k]; i++)
                          if (s[k, i] <= covered && s[k, i] + c[k, i] > covered) covered = s[k, i] + c[k, i]
                      if (covered <= want) exit 1 } }'; then
        : >"$RUNDIR/$1.fakeroot"
    else
        note "$S_FAKEROOT_WITHOUT"
    fi
}

prepare_dirs() {
    local d
    for d in "${S_EMPTY[@]}"; do rm_inside "$(abs "$d")"; done
    for d in "${S_MKDIRS[@]}"; do [ -e "$(abs "$d")" ] || mkdir -p "$(abs "$d")"; done
}

# Wait until each dependency meets its condition. Fails if one fails.
wait_dependencies() {
    local dep name cond st
    for dep in "${S_DEPENDS[@]}"; do
        name=${dep%%:*} cond=${dep#*:}
        while :; do
            st=""
            { IFS= read -r st || true; } 2>/dev/null <"$RUNDIR/$name.status"
            case "$cond:$st" in
                service_started:started | service_started:healthy | service_started:completed\ 0) break ;;
                service_healthy:healthy) break ;;
                service_completed_successfully:completed\ 0) break ;;
                *:failed* | service_completed_successfully:completed\ *)
                    echo "dependency $name did not become ${cond#service_} ($st)"
                    return 1
                    ;;
            esac
            nap 0.05
        done
    done
}

# Where the user owns the instance's namespaces (an unprivileged runtime: every namespace of an
# instance is the user's own), a probe enters them with nsenter, as `exec instance://` does, with
# the service's environment (its start script's) and working directory (the container's sh
# changes to it: nsenter would look for it on the host): about 10 ms of CPU against 50-300 ms
# for a runtime start, which is what lets the supervisor probe every service on its interval.
# Elsewhere (a setuid runtime, a probe with an env file of its own, no nsenter), or when nsenter
# cannot enter or run it (no sh for a working directory), the runtime runs the probe.
# ENTERED=1 when this ran the probe.
NSENTER="" TIMEOUT="" ENTERED=0 EXPORTED=()
probe_tools() {
    local starter v
    [ -z "$NSENTER" ] || return 0
    NSENTER=none
    starter="$(dirname "$(readlink -f "$(command -v "$RT")")")/../libexec/$RT/bin/starter-suid"
    if [ ! -u "$starter" ] && v=$(command -v nsenter) && TIMEOUT=$(command -v timeout); then NSENTER=$v; fi
    mapfile -t EXPORTED < <(compgen -e)  # what a probe's environment drops
}

probe_entering() {
    local name v
    ENTERED=0
    probe_tools
    [ "$NSENTER" != none ] && [ ! -f "${S_ENV%.env}.health$ENV_SUFFIX" ] || return 0
    child_of "$IPID" && [ ! /proc/"$CHILD"/ns/user -ef /proc/$$/ns/user ] || return 0
    local ns=() flag
    for v in user:-U mnt:-m pid:-p ipc:-i uts:-u cgroup:-C; do
        name=${v%:*} flag=${v#*:}
        [ -e "/proc/$CHILD/ns/$name" ] && [ ! "/proc/$CHILD/ns/$name" -ef "/proc/$$/ns/$name" ] && ns+=("$flag")
    done
    (
        unset "${EXPORTED[@]}" 2>/dev/null
        while IFS= read -r -d '' v; do export "${v?}" 2>/dev/null; done <"/proc/$CHILD/environ"
        exec "$TIMEOUT" -k 2 "$S_HEALTH_TIMEOUT" "$NSENTER" -t "$CHILD" "${ns[@]}" --preserve-credentials -- "$@"
    ) >/dev/null 2>"$RUNDIR/$S_NAME.probe.err"
    v=$?
    ENTERED=1
    if [ "$v" != 0 ]; then
        { IFS= read -r name || true; } 2>/dev/null <"$RUNDIR/$S_NAME.probe.err"
        case "$name" in nsenter:*) ENTERED=0 ;; esac  # it could not enter: the runtime probes
    fi
    return "$v"
}

health_once() {
    local cmd=() rc
    case "${S_HEALTH[0]:-NONE}" in
        CMD) cmd=("${S_HEALTH[@]:1}") ;;
        CMD-SHELL) cmd=(/bin/sh -c "${S_HEALTH[1]}") ;;
        *) return 0 ;;
    esac
    if [ -n "$S_WORKDIR" ] && [ "${S_HEALTH[0]}" = CMD-SHELL ]; then
        probe_entering /bin/sh -c 'cd "$1" 2>/dev/null; eval "$2"' sh "$S_WORKDIR" "${S_HEALTH[1]}"
    elif [ -n "$S_WORKDIR" ]; then
        probe_entering /bin/sh -c 'cd "$1" 2>/dev/null; shift; exec "$@"' sh "$S_WORKDIR" "${cmd[@]}"
    else
        probe_entering "${cmd[@]}"
    fi
    rc=$?
    [ "$ENTERED" = 1 ] && return "$rc"
    local flags=(--cleanenv "${EVAL_FLAGS[@]}" --env-file "$(env_file)")
    # a password taken off the probe's command line is in its own env file (render.health_secret)
    [ -f "${S_ENV%.env}.health$ENV_SUFFIX" ] && flags=(--cleanenv "${EVAL_FLAGS[@]}" --env-file "${S_ENV%.env}.health$ENV_SUFFIX")
    [ -n "$S_WORKDIR" ] && flags+=(--pwd "$S_WORKDIR")
    timeout -k 2 "$S_HEALTH_TIMEOUT" "$RT" exec "${flags[@]}" "instance://$S_INSTANCE" "${cmd[@]}" >/dev/null 2>&1
}

# The last probe's result, for `ps`: "TIME INSTANCE-PID healthy|unhealthy|starting FAILURES"
# (FAILURES: consecutive failed probes).
record_health() {
    local t
    printf -v t '%(%s)T' -1
    printf '%s %s %s %s\n' "$t" "$IPID" "$1" "${2:-0}" >"$RUNDIR/$S_NAME.health" 2>/dev/null || true
}

# The recorded result, in HEALTH_NOW, while it is this instance's and fresh (as Compose reports
# the last probe's result).
recorded_health() {
    local t pid result age
    HEALTH_NOW=""
    { read -r t pid result _ || true; } 2>/dev/null <"$RUNDIR/$S_NAME.health"
    [ -n "$result" ] && [ "$pid" = "$IPID" ] || return 1
    printf -v age '%(%s)T' -1
    age=$((age - t))
    # fresh: younger than the probe interval and the supervisor's cycle (its next probe is due),
    # and never less than 5 s (a probe `ps` has just run must still count when the clock ticks
    # between probing and reading)
    ((age >= 0 && age < (${S_HEALTH_INTERVAL%.*} > 3 ? ${S_HEALTH_INTERVAL%.*} + 2 : 5))) || return 1
    HEALTH_NOW=$result
}

# The supervisor's probe of this running service, on Compose's schedule: one every interval
# after the last (the first: the one `up` waited for). A success makes it healthy; `retries`
# consecutive failures make it unhealthy, and until then it keeps its last state. In the
# background; PROBING holds the pid of a probe in flight, so that a slow one is never doubled.
declare -A PROBING=()
probe_when_due() {
    local t="" pid="" result="" failures="" now
    [ ${#S_HEALTH[@]} -gt 0 ] || return 0
    probe_tools  # once, here rather than in each probe's process
    [ -n "${PROBING[$S_NAME]:-}" ] && kill -0 "${PROBING[$S_NAME]}" 2>/dev/null && return 0
    { read -r t pid result failures || true; } 2>/dev/null <"$RUNDIR/$S_NAME.health"
    printf -v now '%(%s)T' -1
    if [ "$pid" != "$IPID" ]; then  # no probe of this instance yet
        result=starting failures=0
    elif ((now - t < ${S_HEALTH_INTERVAL%.*})); then
        return 0
    fi
    {
        if health_once; then
            record_health healthy 0
        else
            failures=$((${failures:-0} + 1))
            ((failures >= S_HEALTH_RETRIES)) && result=unhealthy
            record_health "$result" "$failures"
        fi
    } &
    PROBING[$S_NAME]=$!
}

# Compose's healthcheck schedule: during start_period, probes every start_interval and failures do
# not count; after it, `retries` consecutive failures make the service unhealthy. A probe cannot
# answer before the service listens, so the first one comes as soon as its required endpoints
# listen (within the time Compose gives it: the start period, then `retries` intervals).
wait_healthy() {
    local started=$SECONDS failures=0 period=${S_HEALTH_START_PERIOD%.*} window reason
    window=$((period + S_HEALTH_RETRIES * (${S_HEALTH_INTERVAL%.*} + ${S_HEALTH_TIMEOUT%.*})))
    reason=$(wait_listening "$window") || { echo "$reason"; return 1; }
    while :; do
        if ! service_running; then
            echo "exited while its healthcheck was pending (exit code $(exit_code))"
            return 1
        fi
        if health_once; then
            record_health healthy
            return 0
        fi
        if ((SECONDS - started < period)); then
            nap "$S_HEALTH_START_INTERVAL"
            continue
        fi
        failures=$((failures + 1))
        if ((failures >= S_HEALTH_RETRIES)); then
            echo "unhealthy: $S_HEALTH_RETRIES consecutive healthcheck failures"
            return 1
        fi
        nap "$S_HEALTH_INTERVAL"
    done
}

# ---- progress of `up` ------------------------------------------------------------------------
# Each service's state as it changes: waiting for its dependencies, starting, waiting for health,
# healthy or running, already running, failed (with the reason). On a terminal `up` redraws one
# block, a line per service, in place; otherwise (a batch job's log) each change is one line
# "[project] service: state". The services write their state to RUNDIR/NAME.progress for the block.
PROGRESS_TTY=0
progress() {
    if [ "$PROGRESS_TTY" = 1 ]; then
        printf '%(%s)T %s\n' -1 "$2" >"$RUNDIR/$1.progress"
    else
        note "$1: $2"
    fi
}

# This service's dependencies as words: "db (healthy), init (completed successfully)".
depends_text() {
    local dep cond out=""
    for dep in "${S_DEPENDS[@]}"; do
        cond=${dep#*:} cond=${cond#service_}
        out+=${out:+, }"${dep%%:*} (${cond//_/ })"
    done
    printf '%s' "$out"
}

# Redraw the block for the services in $1.. ("--" then the pids of their start jobs) until the
# jobs have ended: one printf per change (a running clock changes it once a second), no fork.
watch_progress() {
    local names=() pids=() name pid t text now line block last="" width lines=0 alive
    while [ "$1" != -- ]; do names+=("$1"); shift; done
    shift
    pids=("$@")
    width=$(stty size 0<&2 2>/dev/null) width=${width#* }  # "ROWS COLUMNS" of stderr's terminal
    [ "$width" -gt 0 ] 2>/dev/null || width=80  # (a terminal of no known size says 0)
    while :; do
        alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        printf -v now '%(%s)T' -1
        block=""
        for name in "${names[@]}"; do
            t="" text=""
            { read -r t text || true; } 2>/dev/null <"$RUNDIR/$name.progress"
            case "$text" in
                "" ) text=waiting ;;
                healthy | running | completed | "already running" | failed*) ;;
                *) [ -n "$t" ] && text+=" ($((now - t)) s)" ;;
            esac
            line="[$PROJECT] $name: $text"
            block+=$'\r\e[K'"${line:0:width-1}"$'\n'
        done
        if [ "$block" != "$last" ]; then
            ((lines > 0)) && printf '\e[%dA' "$lines" >&2
            printf '%s' "$block" >&2
            last=$block lines=${#names[@]}
        fi
        [ "$alive" = 1 ] || return 0
        nap 0.2
    done
}

# One service of `up`, started in the background: a failure shows in its progress too.
up_one() {
    start_service "$1" && return 0
    local st
    st=$(get_status "$1")
    progress "$1" "failed: ${st#failed }"
    return 1
}

start_service() {
    local name=$1 reason held i already=0
    load_service "$name"
    [ ${#S_DEPENDS[@]} -gt 0 ] && progress "$name" "waiting for $(depends_text)"
    if ! reason=$(wait_dependencies); then
        set_status "$name" "failed $reason"
        return 1
    fi
    set_status "$name" starting
    service_state
    if [ "$STATE_NOW" = running ]; then
        progress "$name" "already running"
        already=1
    else
        if [ "$STATE_NOW" = exited ]; then
            remove_instance
            wait_reaped "$STARTER"
        fi
        [ -f "$S_SIF" ] || { set_status "$name" "failed image $S_SIF is missing (run: ./run.sh build)"; return 1; }
        if [ "$S_ONESHOT" = 0 ]; then
            held=$(endpoints_taken "$name")
            if [ -n "$held" ]; then
                set_status "$name" "failed endpoint ${held%%$'\n'*} (convert again here to re-plan)"
                return 1
            fi
        fi
        prepare_dirs
        clear_logs
        rm -f "$RUNDIR/$name.stopped"
        runtime_flags
        if [ "$S_ONESHOT" = 1 ]; then
            progress "$name" "running to completion"
            "$RT" exec "${FLAGS[@]}" "$S_SIF" /.singularity.d/startscript >"$STATE/logs/$name.log" 2>&1
            local rc=$?
            set_status "$name" "completed $rc"
            [ "$rc" = 0 ] || { set_status "$name" "failed exited with code $rc"; return 1; }
            progress "$name" completed
            return 0
        fi
        progress "$name" "starting instance $S_INSTANCE"
        if ! "$RT" instance start "${FLAGS[@]}" "$S_SIF" "$S_INSTANCE" >"$STATE/logs/$name.start.log" 2>&1; then
            set_status "$name" "failed instance start: $(grep -v '^INFO' "$STATE/logs/$name.start.log" | head -n 2 | tr '\n' ' ')"
            return 1
        fi
        refresh_instance
        record_helpers
        # the start script runs as soon as the instance is up: a moment for it to show
        for ((i = 0; i < 20; i++)); do
            service_running && break
            nap 0.05
        done
        if ! service_running; then
            set_status "$name" "failed exited right after start (exit code $(exit_code))"
            return 1
        fi
    fi
    set_status "$name" started
    if [ ${#S_HEALTH[@]} -gt 0 ]; then
        progress "$name" "waiting for health"
        if ! reason=$(wait_healthy); then
            set_status "$name" "failed $reason"
            return 1
        fi
        set_status "$name" healthy
        progress "$name" healthy
    elif ! reason=$(wait_listening "${C2S_LISTEN_TIMEOUT:-60}"); then
        set_status "$name" "failed $reason"
        return 1
    elif [ "$already" = 0 ]; then
        progress "$name" running
    fi
    return 0
}

# The services to start: the ones asked for and everything they depend on, in start order.
closure() {
    local wanted=("$@") name dep changed=1 out=()
    [ ${#wanted[@]} -eq 0 ] && { printf '%s\n' "${SERVICES[@]}"; return; }
    declare -A in=()
    for name in "${wanted[@]}"; do load_service "$name"; in[$name]=1; done
    while [ $changed = 1 ]; do
        changed=0
        for name in "${!in[@]}"; do
            load_service "$name"
            for dep in "${S_DEPENDS[@]}"; do
                dep=${dep%%:*}
                [ -n "${in[$dep]:-}" ] || { in[$dep]=1; changed=1; }
            done
        done
    done
    for name in "${SERVICES[@]}"; do [ -n "${in[$name]:-}" ] && out+=("$name"); done
    printf '%s\n' "${out[@]}"
}

cmd_up() {
    local detach=0 names=() name failed=0 pids=() st held
    while [ $# -gt 0 ]; do
        case "$1" in
            -d | --detach) detach=1 ;;
            -*) die "up: unknown option $1" ;;
            *) names+=("$1") ;;
        esac
        shift
    done
    for name in "${names[@]}"; do load_service "$name"; done  # unknown names end here, with a message
    take_project_lock up
    detect_runtime
    prepare_state
    stop_supervisor  # one supervisor per project (a new one starts below), and none restarting what `up` starts
    clean_stale up
    mapfile -t names < <(closure "${names[@]}")
    for name in "${names[@]}"; do
        rm -f "$(status_file "$name")" "$RUNDIR/$name.timeline" "$RUNDIR/$name.progress"
        probe_fakeroot "$name"
    done
    assign_gpus "${names[@]}"
    list_instances
    # nothing starts while an endpoint of a service to start is taken on this node
    held=$(endpoints_taken "${names[@]}")
    if [ -n "$held" ]; then
        while IFS= read -r st; do echo "run.sh: up: endpoint $st" >&2; done <<<"$held"
        echo "run.sh: up: nothing was started; stop what holds it, or convert again here to re-plan" >&2
        return 1
    fi
    [ -t 2 ] && [ "${TERM:-dumb}" != dumb ] && PROGRESS_TTY=1
    for name in "${names[@]}"; do
        up_one "$name" &
        pids+=($!)
    done
    [ "$PROGRESS_TTY" = 1 ] && watch_progress "${names[@]}" -- "${pids[@]}"
    PROGRESS_TTY=0  # a restart under the supervisor is told in lines
    local pid
    for pid in "${pids[@]}"; do wait "$pid" || true; done
    for name in "${names[@]}"; do
        case "$(get_status "$name")" in failed*) nap 1; break ;; esac  # let the runtime flush the logs
    done
    for name in "${names[@]}"; do
        st=$(get_status "$name")
        case "$st" in
            failed*)
                failed=1
                load_service "$name"
                echo "run.sh: service $name failed: ${st#failed }" >&2
                case "$st" in
                    *dependency* | failed\ endpoint\ *) ;;  # nothing ran
                    *)
                        echo "--- last 20 log lines of $name ---" >&2
                        log_tail 20 >&2
                        echo "---" >&2
                        explain_address_in_use >&2
                        ;;
                esac
                ;;
        esac
    done
    if [ "$failed" = 1 ]; then
        return 1
    fi
    note "up: ${names[*]}"
    print_entry_points
    printf '%s\n' "${names[@]}" >"$RUNDIR/supervised"
    if [ "$detach" = 1 ]; then
        if needs_supervisor; then
            # ignored from the fork on: where run.sh leads its terminal's session (`ssh -t node
            # run.sh up -d`) the hangup at its exit would reach the child before nohup runs
            trap '' HUP
            nohup setsid "$HERE/run.sh" _supervise </dev/null >"$STATE/logs/supervisor.log" 2>&1 &
            proc_start $!
            echo "$! $PROC_START" >"$RUNDIR/supervisor.pid"
        fi
        return 0
    fi
    # in the foreground this process is the supervisor: `down` or another `up` ends it
    release_project_lock
    proc_start $$
    echo "$$ $PROC_START" >"$RUNDIR/supervisor.pid"
    SUPERVISOR_PID_FILE="$RUNDIR/supervisor.pid"
    trap on_stop_signal TERM INT HUP
    supervise
}

# A signal to the foreground `up`: the end of a batch job (stop everything), or `down` or another
# `up` that took over (they removed our supervisor.pid first; nothing to do).
on_stop_signal() {
    local pid=""
    { read -r pid _ || true; } 2>/dev/null <"$RUNDIR/supervisor.pid"
    if [ "$pid" != "$$" ]; then
        note "up: ended by another run.sh up or down"
        exit 0
    fi
    rm -f "$RUNDIR/supervisor.pid"
    note "stopping (signal)"
    cmd_down
    exit 0
}

# Where a person goes next: the web front's URL on this node, and the SSH tunnel from a laptop
# through the login node (compute nodes are rarely reachable directly).
print_entry_points() {
    local entry service scheme address port path node target
    node=$(hostname -f 2>/dev/null || hostname)
    for entry in "${ENTRY_POINTS[@]}"; do
        read -r service scheme address port path <<<"$entry"
        case "$address" in
            0.0.0.0) target=localhost; note "$service: $scheme://$node:$port$path" ;;
            *) target=$address; note "$service: $scheme://$address:$port$path (on $node)" ;;
        esac
        note "  from your laptop: ssh -N -L $port:$target:$port -J ${USER:-you}@LOGIN-NODE ${USER:-you}@$node" \
            "then open $scheme://localhost:$port$path"
    done
}

# A supervisor keeps restart policies, and probes healthchecks on their schedule (see probe_when_due).
needs_supervisor() {
    local name
    while read -r name; do
        load_service "$name"
        [ "$S_ONESHOT" = 0 ] && { [ "$S_RESTART" != no ] || [ ${#S_HEALTH[@]} -gt 0 ]; } && return 0
    done <"$RUNDIR/supervised"
    return 1
}

# Restart policies: always / unless-stopped restart an ended service; on-failure[:N] restarts it
# when it exited with a non-zero code, at most N times. Running services are probed when their
# healthcheck is due. A cycle costs no fork while every instance lives and no probe is due: the
# runtime is asked again only when one has gone.
supervise() {
    declare -A attempts=()
    local name rc max pid relist
    while :; do
        # a background supervisor that another `up` or `down` replaced ends here
        if [ -n "${SUPERVISOR_PID_FILE:-}" ]; then
            pid=""
            { read -r pid _ || true; } 2>/dev/null <"$SUPERVISOR_PID_FILE"
            [ "$pid" = "$BASHPID" ] || return 0
        fi
        relist=$((1 - INSTANCES_LISTED))
        while read -r name; do
            load_service "$name"
            pid=${INSTANCE_PIDS[$S_INSTANCE]:-}
            { [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; } || relist=1
        done <"$RUNDIR/supervised"
        [ "$relist" = 1 ] && list_instances
        while read -r name; do
            load_service "$name"
            [ "$S_ONESHOT" = 1 ] && continue
            [ -f "$RUNDIR/$name.stopped" ] && continue
            service_running && { probe_when_due; continue; }
            rc=$(exit_code)
            case "$S_RESTART" in
                always | unless-stopped) ;;
                on-failure*)
                    [ "${rc:-1}" != 0 ] || continue
                    max=${S_RESTART#on-failure}
                    max=${max#:}
                    if [ -n "$max" ] && ((${attempts[$name]:-0} >= max)); then continue; fi
                    ;;
                *) continue ;;
            esac
            attempts[$name]=$((${attempts[$name]:-0} + 1))
            note "$name ended (exit code ${rc:-unknown}); restarting (restart: $S_RESTART)"
            S_DEPENDS=()
            start_service "$name" || note "$name: restart failed: $(get_status "$name")"
        done <"$RUNDIR/supervised"
        nap 1
    done
}

cmd_supervise() {
    detect_runtime
    trap 'exit 0' TERM INT
    SUPERVISOR_PID_FILE="$RUNDIR/supervisor.pid"
    local i pid
    for ((i = 0; i < 50; i++)); do  # `up` writes our pid just after starting us
        pid=""
        { read -r pid _ || true; } 2>/dev/null <"$SUPERVISOR_PID_FILE"
        [ "$pid" = "$BASHPID" ] && break
        nap 0.1
    done
    supervise
}

# This service's instance (pid IPID) goes, with whatever still runs in it. `instance stop -t 0`
# would SIGKILL the instance's init and leave its starter (the init's parent) to stop the image's
# FUSE drivers and exit: a runtime start and a cleanup that cost 10-20 ms of CPU per instance.
# Here kill_instance collects the init (and its starter), and end_starters SIGKILLs the inits
# collected, their starters and the starters' FUSE drivers (their other children) together: the
# kernel tears down the mounts with the last process of their mount namespaces, and the runtime
# deletes the records of instances whose starter is gone at its next listing. The init is
# signalled only when its parent is this instance's starter (else the runtime stops it). ENDING
# collects every process that is ending, for wait_ended; STARTER is this instance's starter.
STARTER="" ENDING=() KILLED=() INITS=()
kill_instance() {
    local argv0=""
    STARTER=""
    parent_of "$IPID" && { read -r -d '' argv0 || true; } 2>/dev/null <"/proc/$PARENT/cmdline"
    case "$argv0" in
        *" instance: "*"[$S_INSTANCE]")
            STARTER=$PARENT
            kill -0 "$IPID" 2>/dev/null && { INITS+=("$IPID") KILLED+=("$STARTER"); return 0; }
            ENDING+=("$STARTER")  # (a setuid runtime's starter: it ends when the runtime stops it)
            ;;
    esac
    "$RT" instance stop -t 0 "$S_INSTANCE" >/dev/null 2>&1 || true
}

# One SIGKILL, in one `kill`, of every init kill_instance collected, their starters and the
# starters' other children (the FUSE drivers): the kernel tears them all down at once.
end_starters() {
    local s f k=() kids=()
    [ ${#KILLED[@]} -gt 0 ] || return 0
    for s in "${KILLED[@]}"; do
        for f in /proc/"$s"/task/*/children; do
            { read -r -a k || true; } 2>/dev/null <"$f"
            kids+=("${k[@]}")
        done
    done
    kill -KILL "${INITS[@]}" "${KILLED[@]}" "${kids[@]}" 2>/dev/null
    ENDING+=("${KILLED[@]}" "${kids[@]}")
    KILLED=() INITS=()
}

remove_instance() {
    ENDING=()
    kill_instance
    end_starters
}

# Wait until the given processes have all ended (gone, or zombies), up to 10 s: every one is
# looked at in each round of 0.01 s, and one that has ended is not looked at again.
wait_ended() {
    local pids=("$@") left=() pid i
    for ((i = 0; i < 1000 && ${#pids[@]} > 0; i++)); do
        left=()
        for pid in "${pids[@]}"; do parent_of "$pid" && left+=("$pid"); done
        pids=("${left[@]}")
        [ ${#pids[@]} -gt 0 ] && nap 0.01
    done
    return 0
}

# Compose's stop for one service: the stop signal to it, up to stop_grace_period to end, then the
# instance goes (killing what is left). The signal goes to the start script, which passes it on:
# the instance's init does not forward `instance stop`'s signal to it.
stop_service() {
    local name=$1 waited=0
    load_service "$name"
    touch "$RUNDIR/$name.stopped"
    instance_pid
    if [ -n "$IPID" ]; then
        note "$name: stopping $S_INSTANCE"
        if child_of "$IPID" && kill -s "${S_STOP_SIGNAL#SIG}" "$CHILD" 2>/dev/null; then
            while kill -0 "$CHILD" 2>/dev/null && ((waited < S_STOP_GRACE * 20)); do
                nap 0.05
                waited=$((waited + 1))
            done
        fi
        remove_instance
        wait_ended "$STARTER"
    fi
    remove_overlay "$name"  # what it wrote into its image goes with it, as under Docker
    rm -f "$(status_file "$name")"
}

# The supervisor and whatever it runs (a restart in progress): its process group (setsid made a
# background one a group leader), once it is sure to be ours: supervisor.pid holds its pid and
# start time, and a pid alone may name another process by now.
stop_supervisor() {
    local pid="" start="" i
    { read -r pid start || true; } 2>/dev/null <"$RUNDIR/supervisor.pid"
    [ -n "$pid" ] && proc_start "$pid" && [ "$PROC_START" = "$start" ] || return 0  # (tell_stale tells of it)
    rm -f "$RUNDIR/supervisor.pid"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 200; i++)); do
        parent_of "$pid" || return 0  # gone, or a zombie
        nap 0.01
    done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
}

# Until process $1 is gone and reaped, up to 5 s: the runtime keeps an instance's record (and
# refuses to start it again) while its starter is a zombie, which lasts as long as the node's
# PID 1 takes to reap it.
wait_reaped() {
    local i
    [ -n "$1" ] || return 0  # (no starter of ours: the runtime stopped the instance)
    for ((i = 0; i < 100; i++)); do
        [ -e "/proc/$1" ] || return 0
        nap 0.05
    done
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
    if [ -n "$pid" ] && ! { proc_start "$pid" && [ "$PROC_START" = "$start" ]; }; then
        rm -f "$RUNDIR/supervisor.pid"
        case "$1" in
            ps) st="restart policies apply again after \`up\`" ;;
            *) st=forgotten ;;
        esac
        note "the supervisor (pid $pid) has gone without \`down\` (killed, or the node rebooted): $st"
    fi
    return 0
}

# Compose's down, in reverse start order: the stop signal to every service of a level at once,
# up to each one's stop_grace_period for them to end, then their instances go and the next level
# starts while the runtime tears those down. Everything has ended when `down` returns.
cmd_down() {
    local volumes=0 level i t name alive outlived scripts=() graces=() instances=() ipids=() starters=() statuses=()
    [ "${1:-}" = -v ] || [ "${1:-}" = --volumes ] && volumes=1
    take_project_lock down
    detect_runtime --images-only  # (down runs no image: the rest of the probing is not needed)
    mkdir -p "$RUNDIR"
    stop_supervisor
    list_instances
    clean_stale down
    for ((level = MAX_LEVEL; level >= 0; level--)); do
        scripts=() graces=() instances=() ipids=() outlived=0
        for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do
            [ "${LEVELS[i]}" = "$level" ] || continue
            name=${SERVICES[i]}
            load_service "$name"
            : >"$RUNDIR/$name.stopped"
            statuses+=("$RUNDIR/$name.status")
            instance_pid
            [ -n "$IPID" ] || continue
            note "$name: stopping $S_INSTANCE"
            instances+=("$S_INSTANCE") ipids+=("$IPID")
            if child_of "$IPID" && kill -s "${S_STOP_SIGNAL#SIG}" "$CHILD" 2>/dev/null; then
                scripts+=("$CHILD") graces+=($((S_STOP_GRACE * 100)))
            fi
        done
        # t in hundredths of a second: steps of 0.01 s while a prompt end is likely, then of 0.05 s
        for ((t = 0; ; t += (t < 20 ? 1 : 5))); do
            alive=0
            for i in "${!scripts[@]}"; do
                ((t < graces[i])) && kill -0 "${scripts[i]}" 2>/dev/null && alive=1
            done
            [ "$alive" = 0 ] && break
            if ((t < 20)); then nap 0.01; else nap 0.05; fi
        done
        for i in "${!scripts[@]}"; do kill -0 "${scripts[i]}" 2>/dev/null && outlived=1; done
        ENDING=()
        for i in "${!instances[@]}"; do  # the instances of the level at once (see kill_instance)
            S_INSTANCE=${instances[i]} IPID=${ipids[i]}
            kill_instance
        done
        end_starters
        starters+=("${ENDING[@]}")
        # a service that outlived its grace period is gone before the next level gets its signal
        if [ "$outlived" = 1 ]; then
            wait_ended "${starters[@]}"
            starters=()
        fi
    done
    wait_ended "${starters[@]}"
    [ ${#starters[@]} -gt 0 ] && "$RT" instance list >/dev/null 2>&1  # it deletes the records of the instances killed
    rm -f "${statuses[@]}"
    # what the services wrote into their images (every overlay is one of this project's services)
    if [ -e "$STATE/overlay" ]; then
        chmod -R u+rwx "$STATE/overlay" 2>/dev/null
        rm_inside "$STATE/overlay"
    fi
    if [ "$volumes" = 1 ]; then
        note "removing volumes in $STATE/volumes"
        rm_inside "$STATE/volumes"
    fi
}

# How long ago process $1 started, in seconds, in UPTIME_S ("" when it is gone): its start time
# in /proc/PID/stat (clock ticks after boot) against /proc/uptime.
UPTIME_S="" CLK_TCK=""
process_age() {
    local line="" rest=() now=""
    UPTIME_S=""
    { read -r line || true; } 2>/dev/null <"/proc/$1/stat"
    { read -r now _ || true; } 2>/dev/null </proc/uptime
    [ -n "$line" ] && [ -n "$now" ] || return 1
    [ -n "$CLK_TCK" ] || CLK_TCK=$(getconf CLK_TCK 2>/dev/null) || CLK_TCK=100
    read -r -a rest <<<"${line##*) }"  # after "(comm) ": the 22nd field is the 20th here
    UPTIME_S=$((${now%.*} - rest[19] / CLK_TCK))
    ((UPTIME_S >= 0)) || UPTIME_S=0
}

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
# A service whose status says it runs while no instance is left goes to STALE_KILLED (tell_stale).
PS_JSON=0 PS_ROWS=()
ps_row() {
    local i=$1 st=$2 health=$3 status="" rc="" e ports="" addresses="" quoted="" cells=() row
    { IFS= read -r status || true; } 2>/dev/null <"$RUNDIR/$S_NAME.status"
    if [ "$st" != running ]; then
        case "$S_TMP" in /*) e=$S_TMP ;; *) e=$HERE/$S_TMP ;; esac  # (tmp_dir, without a subshell)
        { IFS= read -r rc || true; } 2>/dev/null <"$e/.c2s-exit"
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
    for e in "${S_ENDPOINTS[@]}"; do
        e=${e%\?}
        ports+=${ports:+,}${e##*:}
        addresses+=${addresses:+,}$e
        json_str "$e"
        quoted+=${quoted:+,}$JSON_STR
    done
    if [ "$PS_JSON" = 1 ]; then
        case "$rc" in '' | *[!0-9-]*) rc=null ;; esac
        for e in "$S_NAME" "$S_INSTANCE" "$st" "$health" "$DURATION"; do json_str "$e"; cells+=("$JSON_STR"); done
        printf -v row '{"service":%s,"instance":%s,"state":%s,"exit_code":%s,"health":%s,"ports":[%s],"endpoints":[%s],"uptime":%s,"uptime_seconds":%s}' \
            "${cells[0]}" "${cells[1]}" "${cells[2]}" "$rc" "${cells[3]}" "$ports" "$quoted" "${cells[4]}" "${UPTIME_S:-null}"
        PS_ROWS[i]=$row
    else
        [ "$st" = exited ] && [ -n "$rc" ] && st="exited($rc)"  # killed: no code was written
        cells=("$S_NAME" "$S_INSTANCE" "$st" "$health" "${addresses:--}" "${DURATION:--}")
        for e in 0 1 2 3 4 5; do PS_ROWS[i * 6 + e]=${cells[e]}; done
    fi
}

# Compose's ps: health as the last probe left it (the supervisor probes on each healthcheck's
# schedule, so that `ps` runs none); only a service with no fresh result (no supervisor runs,
# or its probe is late) is probed here, all of those at once. UPTIME: since its instance started.
# Each service is loaded and its state read once (a service probed here is loaded again for its
# result); the runtime is probed for what a probe needs only when one runs.
cmd_ps() {
    local health pid i rows=() w=() probes=() later=() probing=0
    declare -A ipid_of=()
    PS_JSON=0 PS_ROWS=()
    [ "${1:-}" = --format ] && [ "${2:-}" = json ] && PS_JSON=1
    detect_runtime --images-only
    mkdir -p "$RUNDIR"
    list_instances
    for i in "${!SERVICES[@]}"; do
        load_service "${SERVICES[i]}"
        service_state
        [ "$STATE_NOW" = exited ] && [ -n "$IPID" ] && [ "$S_ONESHOT" = 0 ] && root_lost && STALE_LOST+=("$S_NAME")
        health=none
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
    return 0
}

cmd_logs() {
    local follow=0 name="" files=() f
    while [ $# -gt 0 ]; do
        case "$1" in
            -f | --follow) follow=1 ;;
            *) name=$1 ;;
        esac
        shift
    done
    [ -n "$name" ] || die "logs: name a service"
    detect_runtime
    load_service "$name"
    if [ "$S_ONESHOT" = 1 ]; then
        files=("$STATE/logs/$name.log")
    else
        while IFS= read -r f; do [ -n "$f" ] && [ -e "$f" ] && files+=("$f"); done < <(log_paths)
    fi
    [ ${#files[@]} -gt 0 ] || die "no logs for $name yet"
    if [ "$follow" = 1 ]; then tail -n +1 -F "${files[@]}"; else cat "${files[@]}"; fi
}

cmd_exec() {
    [ $# -ge 2 ] || die "exec: usage: exec SERVICE COMMAND..."
    detect_runtime
    load_service "$1"
    shift
    service_running || die "$S_NAME is not running"
    local flags=(--cleanenv "${EVAL_FLAGS[@]}" --env-file "$(env_file)")
    [ -n "$S_WORKDIR" ] && flags+=(--pwd "$S_WORKDIR")
    exec "$RT" exec "${flags[@]}" "instance://$S_INSTANCE" "$@"
}

cmd_restart() {
    [ $# -ge 1 ] || die "restart: name a service"
    local name
    for name in "$@"; do load_service "$name"; done
    take_project_lock restart
    detect_runtime
    prepare_state
    for name in "$@"; do
        stop_service "$name"
        load_service "$name"
        S_DEPENDS=()
        start_service "$name" || { echo "run.sh: $name: $(get_status "$name")" >&2; return 1; }
    done
}

# ---- where SIFs and build caches go -----------------------------------------------------------
# Off $HOME, whose quota HPC sites keep small (a vLLM SIF is 10-20 GB). In this order: what the
# user set (C2S_STORAGE for all of it; C2S_SIF_CACHE, APPTAINER_CACHEDIR, APPTAINER_TMPDIR each),
# else the first writable of these outside $HOME: $SCRATCH, $WORK (set by many Slurm sites),
# /scratch/$USER, /work/$USER, /work/GROUP/$USER (Wisteria and other PJM sites), /data/GROUP/$USER
# (Fugaku's data area, where the user made one), else this output directory. The choice is made
# once (at the first build, or by `compose2sif doctor`) and kept in $STATE/storage; a copy of the
# output directory on another machine chooses again. SIFs are shared between projects there, by
# the sha256 of their definition.
STORAGE="" STORAGE_WHY="" SIF_CACHE="" BUILD_CACHE="" BUILD_TMP="" BUILD_ENV=()

# A directory we may keep SIFs in: writable, and not in the home directory.
storage_ok() {
    local real home
    [ -d "$1" ] && [ -w "$1" ] && [ -x "$1" ] || return 1
    real=$(cd "$1" && pwd -P) && home=$(cd "${HOME:-/nonexistent}" 2>/dev/null && pwd -P)
    case "$real/" in "${home:-/nonexistent}"/*) return 1 ;; esac
    return 0
}

choose_storage() {
    local dir user=${USER:-$(id -un)} recorded
    if [ -n "${C2S_STORAGE:-}" ]; then
        STORAGE=$C2S_STORAGE STORAGE_WHY="set by C2S_STORAGE"
    else
        recorded=$(first_line "$STATE/storage")
        if [ -n "$recorded" ] && { [ -w "$recorded" ] || [ -w "$(dirname "$recorded")" ]; }; then
            STORAGE=$recorded STORAGE_WHY="chosen at the first build, kept in $STATE/storage"
        else
            STORAGE="$HERE/cache" STORAGE_WHY="no scratch or work directory found: in the output directory"
            for dir in "${SCRATCH:-}" "${WORK:-}" "/scratch/$user" "/work/$user" /work/*/"$user" /data/*/"$user"; do
                if [ -n "$dir" ] && storage_ok "$dir"; then
                    STORAGE="$(cd "$dir" && pwd -P)/compose2sif" STORAGE_WHY="a scratch or work directory outside \$HOME"
                    break
                fi
            done
            (umask 077 && mkdir -p "$STATE" && rm -f "$STATE/storage.tmp" && printf '%s\n' "$STORAGE" >"$STATE/storage.tmp" &&
                mv -f "$STATE/storage.tmp" "$STATE/storage") || die "cannot write $STATE/storage"
            note "storage: SIFs and build caches go to $STORAGE ($STORAGE_WHY; C2S_STORAGE moves them)"
        fi
    fi
    if [ "$STORAGE" = "$HERE/cache" ] && [ -L "$STORAGE" ]; then
        die "$STORAGE is a symbolic link; compose2sif does not follow links in its output directory (remove it)"
    fi
    case "$STORAGE" in /*) ;; *) STORAGE="$PWD/$STORAGE" ;; esac  # as the user meant it: from here
    SIF_CACHE=${C2S_SIF_CACHE:-$STORAGE/sif}
    case "$SIF_CACHE" in /*) ;; *) SIF_CACHE="$PWD/$SIF_CACHE" ;; esac
    BUILD_CACHE=${APPTAINER_CACHEDIR:-${SINGULARITY_CACHEDIR:-}} BUILD_TMP=${APPTAINER_TMPDIR:-${SINGULARITY_TMPDIR:-}}
    BUILD_ENV=()
    local prefix=APPTAINER
    [ -n "$RT" ] && case "$("$RT" --version 2>/dev/null)" in apptainer*) ;; *) prefix=SINGULARITY ;; esac
    if [ -z "$BUILD_CACHE" ]; then
        BUILD_CACHE="$STORAGE/cache"
        BUILD_ENV+=("${prefix}_CACHEDIR=$BUILD_CACHE")
    fi
    # Builds with --fakeroot and /etc/subuid can fail on network file systems (files owned by
    # subordinate ids, root squash): the build space moves there only on a local disk, else it
    # stays at the runtime's default ($TMPDIR or /tmp).
    if [ -z "$BUILD_TMP" ]; then
        (umask 077 && mkdir -p "$STORAGE") 2>/dev/null
        case "$(stat -f -c %T "$STORAGE" 2>/dev/null)" in
            nfs* | lustre | gpfs | beegfs | cifs | smb* | fuse* | ceph | UNKNOWN*) BUILD_TMP=${TMPDIR:-/tmp} ;;
            *) BUILD_TMP="$STORAGE/tmp" BUILD_ENV+=("${prefix}_TMPDIR=$BUILD_TMP") ;;
        esac
    fi
}

# The docker reference a definition starts from, when that is a tag rather than a digest.
registry_tag() {
    local line boot="" from=""
    while IFS= read -r line; do
        case "$line" in
            Bootstrap:*) boot=${line#Bootstrap:} boot=${boot// /} ;;
            From:*) from=${line#From:} from=${from// /} ;;
            %*) break ;;
        esac
    done <"$1"
    [ "$boot" = docker ] && [ -n "$from" ] && [ "${from#*@}" = "$from" ] || return 1
    printf '%s' "$from"
}

# The registry's digest of the tag $1 (Docker Registry HTTP API v2, one HEAD request, anonymous
# token auth as Docker Hub uses; HEAD requests do not count against its pull limit). Empty when
# it cannot be read: no curl, no network, a private registry.
tag_digest() {
    local ref=$1 registry=registry-1.docker.io name tag=latest scheme=https url headers challenge realm service scope token
    local accept="application/vnd.oci.image.index.v1+json,application/vnd.docker.distribution.manifest.list.v2+json,application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json"
    command -v curl >/dev/null 2>&1 || return 0
    name=$ref
    case "${ref%%/*}" in
        *.* | *:* | localhost) [ "${ref#*/}" != "$ref" ] && registry=${ref%%/*} name=${ref#*/} ;;
    esac
    case "$registry" in docker.io | index.docker.io) registry="registry-1.docker.io" ;; esac
    case "${name##*/}" in *:*) tag=${name##*:} name=${name%:*} ;; esac
    [ "$registry" = registry-1.docker.io ] && [ "${name#*/}" = "$name" ] && name="library/$name"
    case "$registry" in 127.* | localhost*) scheme=http ;; esac
    [ -n "${APPTAINER_NOHTTPS:-}${SINGULARITY_NOHTTPS:-}" ] && scheme=http
    url="$scheme://$registry/v2/$name/manifests/$tag"
    headers=$(curl -sSI --connect-timeout 5 --max-time 20 -H "Accept: $accept" -- "$url" 2>/dev/null | tr -d '\r')
    challenge=$(printf '%s\n' "$headers" | sed -n 's/^[Ww][Ww][Ww]-[Aa]uthenticate: *Bearer //p')
    if [ -n "$challenge" ]; then
        realm=$(printf '%s' "$challenge" | sed -n 's/.*realm="\([^"]*\)".*/\1/p')
        service=$(printf '%s' "$challenge" | sed -n 's/.*service="\([^"]*\)".*/\1/p')
        scope=$(printf '%s' "$challenge" | sed -n 's/.*scope="\([^"]*\)".*/\1/p')
        token=$(curl -sS --connect-timeout 5 --max-time 20 -G --data-urlencode "service=$service" \
            --data-urlencode "scope=${scope:-repository:$name:pull}" -- "$realm" 2>/dev/null |
            sed -n 's/.*"\(access_\)\{0,1\}token" *: *"\([^"]*\)".*/\2/p' | head -n 1)
        [ -n "$token" ] || return 0
        headers=$(curl -sSI --connect-timeout 5 --max-time 20 -H "Accept: $accept" -H "Authorization: Bearer $token" \
            -- "$url" 2>/dev/null | tr -d '\r')
    fi
    printf '%s\n' "$headers" | sed -n 's/^[Dd]ocker-[Cc]ontent-[Dd]igest: *\(sha256:[0-9a-f]*\)$/\1/p' | head -n 1
}

# What `build` reports of each image: a line each (plain), or a block redrawn in place on a
# terminal (LIVE=1), fed by state files the parallel builds write.
LIVE=0 DRAWN=0 BUILD_KEYS=()
build_state() {
    if [ "$LIVE" = 1 ]; then
        printf '%(%s)T %s\n' -1 "$2" >"$RUNDIR/build-$1.state.tmp" && mv -f "$RUNDIR/build-$1.state.tmp" "$RUNDIR/build-$1.state"
    else
        note "image $1: $2"
    fi
}

draw_builds() {
    [ "$LIVE" = 1 ] || return 0
    local key line since text now
    printf -v now '%(%s)T' -1
    [ "$DRAWN" -gt 0 ] && printf '\033[%dA' "$DRAWN" >&2
    for key in "${BUILD_KEYS[@]}"; do
        line=$(first_line "$RUNDIR/build-$key.state")
        since=${line%% *} text=${line#* }
        case "$text" in
            "") text=waiting ;;
            building* | checking*) text="$text ($(((now - since) / 60))m$(((now - since) % 60))s)" ;;
        esac
        printf '\r\033[K[%s] image %s: %s\n' "$PROJECT" "$key" "$text" >&2
    done
    DRAWN=${#BUILD_KEYS[@]}
}

# Wait for background build $1, redrawing the block meanwhile; its exit status.
wait_build() {
    if [ "$LIVE" = 1 ]; then
        while kill -0 "$1" 2>/dev/null; do draw_builds; nap 0.5; done
    fi
    wait "$1"
}

# Build image $1 unless its SIF is up to date or in the shared cache. With $2=1 (--pull), an image
# from a registry tag is checked against the registry: a tag that moved is built again.
build_one() {
    local key=$1 pull=${2:-0} def="$HERE/definitions/$1.def" sif="$HERE/sif/$1.sif" digest log cached flags=()
    local force=${C2S_FORCE_BUILD:-0} ref want="" base
    # An image built FROM another image of the project is out of date when that one changed: its
    # digest covers the base's digest and the registry digest the base was pulled at.
    image_bases "$key"
    digest=$({ cat "$def" && for base in "${BASES_OF[@]}"; do
        cat "$HERE/sif/$base.sif.digest" && { cat "$HERE/sif/$base.sif.source" 2>/dev/null || true; }
    done; } | sha256sum | cut -d' ' -f1)
    cached="$SIF_CACHE/$digest.sif"
    if [ "$pull" = 1 ] && ref=$(registry_tag "$def"); then
        build_state "$key" "checking $ref"
        want=$(tag_digest "$ref")
        if [ -z "$want" ]; then
            force=1
            build_state "$key" "cannot read the digest of $ref from its registry: building it again"
        else
            want="$ref@$want"
        fi
    fi
    if [ -f "$sif" ] && [ "$(cat "$sif.digest" 2>/dev/null)" = "$digest" ] && [ "$force" != 1 ] &&
        { [ -z "$want" ] || [ "$(first_line "$sif.source")" = "$want" ]; }; then
        build_state "$key" "up to date"
        return 0
    fi
    if [ -f "$cached" ] && [ "$force" != 1 ] && { [ -z "$want" ] || [ "$(first_line "$cached.source")" = "$want" ]; }; then
        link_sif "$cached" "$sif" "$digest"
        build_state "$key" "taken from $SIF_CACHE"
        return 0
    fi
    if grep -q '^%post' "$def" && [ "$(id -u)" != 0 ]; then
        flags+=(--fakeroot)
    fi
    log="$STATE/logs/build-$key.log"
    if [ -n "$want" ] && [ -f "$sif.source" ]; then
        build_state "$key" "$ref moved: $(first_line "$sif.source") -> ${want##*@}"
    elif [ -n "$want" ]; then
        build_state "$key" "$ref: no digest kept from an earlier pull: building it again"
    fi
    build_state "$key" "building${flags[*]:+ ${flags[*]}}"
    if ! (umask 077 && mkdir -p "$SIF_CACHE" "$BUILD_CACHE" "$BUILD_TMP") 2>"$log"; then
        echo "cannot create $SIF_CACHE, $BUILD_CACHE or $BUILD_TMP (set C2S_STORAGE, or C2S_SIF_CACHE and APPTAINER_CACHEDIR, to a writable place)" >>"$log"
        build_state "$key" "failed (log: $log)"
        return 1
    fi
    # in the output directory: a localimage stage's From (sif/KEY.sif) is relative to it
    if (cd "$HERE" && exec env "${BUILD_ENV[@]}" "$RT" build --force "${flags[@]}" "$cached.$$.tmp" "$def") >"$log" 2>&1 &&
        mv -f "$cached.$$.tmp" "$cached"; then
        if [ -n "$want" ]; then printf '%s\n' "$want" >"$cached.source"; else rm -f "$cached.source"; fi
        link_sif "$cached" "$sif" "$digest"
        build_state "$key" "built"
    else
        rm -f "$cached.$$.tmp"
        build_state "$key" "failed (log: $log)"
        return 1
    fi
}

# The output directory's SIF is the cache's file: a hard link where both are on one filesystem,
# else a symbolic link (never a copy: it would put the image in the home quota again).
link_sif() {
    rm -f "$2" "$2.digest" "$2.source"  # replaced, never written through
    ln "$1" "$2" 2>/dev/null || ln -s "$1" "$2" || return 1
    printf '%s\n' "$3" >"$2.digest"
    if [ -f "$1.source" ]; then cp -f "$1.source" "$2.source"; else rm -f "$2.source"; fi
}

cmd_build() {
    local pull=0
    case "${1:-}" in --pull) pull=1 && shift ;; esac
    [ $# -eq 0 ] || die "build: unknown argument $1 (usage: build [--pull])"
    take_project_lock build
    build_images "$pull" "${IMAGES[@]}"
}

# As `docker compose pull [SERVICE...]`: the images of services that run an image from a registry
# (not a build) are fetched again where their tag moved.
cmd_pull() {
    local keys=() name key
    case "${1:-}" in -*) die "pull: unknown option $1 (usage: pull [SERVICE...])" ;; esac
    if [ $# -eq 0 ]; then
        keys=("${PULLED[@]}")
    fi
    for name in "$@"; do
        load_service "$name"
        key=${S_SIF##*/} key=${key%.sif}
        if [[ " ${PULLED[*]} " == *" $key "* ]]; then
            keys+=("$key")
        else
            note "pull: $name is built, not pulled (build --pull refreshes the base image of a build)"
        fi
    done
    if [ ${#keys[@]} -eq 0 ]; then
        note "pull: no image to pull${*:+ for $*} (build --pull refreshes the base images of builds)"
        return 0
    fi
    take_project_lock pull
    build_images 1 "${keys[@]}"
}

# The images of this project that image $1 starts from, in BASES_OF: the planner writes a FROM
# of an image another service builds as a `Bootstrap: localimage` stage From sif/KEY.sif.
image_bases() {
    local line boot="" from
    BASES_OF=()
    while IFS= read -r line; do
        case "$line" in
            Bootstrap:*) boot=${line#Bootstrap:} boot=${boot// /} ;;
            From:*)
                from=${line#From:} from=${from// /}
                case "$boot:$from" in localimage:sif/*.sif) from=${from#sif/} && BASES_OF+=("${from%.sif}") ;; esac ;;
        esac
    done <"$HERE/definitions/$1.def"
}

# Build images $3... at most $2 at a time; those that fail are tried again one at a time, and
# added to BAD when that fails too.
build_round() {
    local pull=$1 jobs=$2 pids=() keys=() failed=() i key pid
    shift 2
    for key in "$@"; do
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do draw_builds; nap 0.3; done
        build_one "$key" "$pull" &
        pids+=($!) keys+=("$key")
    done
    for i in "${!pids[@]}"; do wait_build "${pids[i]}" || failed+=("${keys[i]}"); done
    # Parallel builds can trip over each other in the runtime's layer cache: retry one at a time.
    for key in "${failed[@]}"; do
        build_state "$key" "build failed; retrying alone"
        build_one "$key" "$pull" &
        pid=$!
        wait_build "$pid" || BAD+=("$key") LOGS+=("$key")
    done
}

# Images that start from another image of the project are built after it, in rounds; one whose
# base failed is not built, and says so.
build_images() {
    local pull=$1 jobs=${C2S_BUILD_JOBS:-2} todo=() round=() later=() key base blocked waiting
    local BAD=() LOGS=()
    shift
    detect_runtime --images-only
    prepare_state
    mkdir -p "$HERE/sif"
    choose_storage
    if [ -t 2 ] && [ "${TERM:-dumb}" != dumb ]; then
        LIVE=1 BUILD_KEYS=("$@")
        for key in "$@"; do rm -f "$RUNDIR/build-$key.state"; done
    fi
    todo=("$@")
    while [ ${#todo[@]} -gt 0 ]; do
        round=() later=()
        for key in "${todo[@]}"; do
            image_bases "$key"
            blocked="" waiting=""
            for base in "${BASES_OF[@]}"; do
                [[ " ${BAD[*]} " == *" $base "* ]] && blocked=$base
                [[ " ${todo[*]} " == *" $base "* ]] && waiting=1
            done
            if [ -n "$blocked" ]; then
                build_state "$key" "not built: it starts from image $blocked, which failed"
                BAD+=("$key")
            elif [ -n "$waiting" ]; then
                later+=("$key")
            else
                round+=("$key")
            fi
        done
        [ ${#round[@]} -gt 0 ] || [ ${#later[@]} -eq 0 ] ||
            die "images ${later[*]} start from each other (definitions/*.def); run compose2sif convert again"
        [ ${#round[@]} -eq 0 ] || build_round "$pull" "$jobs" "${round[@]}"
        todo=("${later[@]}")
    done
    draw_builds
    for key in "${LOGS[@]}"; do
        echo "run.sh: building image $key failed; last lines of $STATE/logs/build-$key.log:" >&2
        tail -n 20 "$STATE/logs/build-$key.log" >&2
    done
    [ ${#BAD[@]} -eq 0 ]
}

# For `compose2sif doctor`: where SIFs, the runtime's cache and the build space go, and why.
cmd_storage() {
    choose_storage
    printf 'storage\t%s\t%s\n' "$STORAGE" "$STORAGE_WHY"
    printf 'SIF cache\t%s\t%s\n' "$SIF_CACHE" "$([ -n "${C2S_SIF_CACHE:-}" ] && echo "set by C2S_SIF_CACHE")"
    printf 'build cache\t%s\t%s\n' "$BUILD_CACHE" "$([ -n "${APPTAINER_CACHEDIR:-}${SINGULARITY_CACHEDIR:-}" ] && echo "set by APPTAINER_CACHEDIR")"
    printf 'build tmp\t%s\t%s\n' "$BUILD_TMP" "$([ -n "${APPTAINER_TMPDIR:-}${SINGULARITY_TMPDIR:-}" ] && echo "set by APPTAINER_TMPDIR")"
}

# One `up`, `down`, `restart`, `build` or `pull` of a project at a time, each from the moment its
# arguments are checked: two at once would start, stop or build the same instances and images
# twice. The lock is a symbolic link whose target names its holder, "PID START COMMAND": made in
# one step, left behind by a killed holder, and then recognised as stale by the pid's start time
# (as supervisor.pid is). A foreground `up` gives it back once its services run; the others at
# their exit. Waiting costs one readlink per 0.2 s.
LOCK_HELD=0
take_project_lock() {
    local me holder="" pid start what told=0 tries=0
    (umask 077 && mkdir -p "$RUNDIR")
    proc_start $$
    me="$$ $PROC_START $1"
    until ln -s "$me" "$RUNDIR/lock" 2>/dev/null; do
        if ! holder=$(readlink "$RUNDIR/lock" 2>/dev/null); then  # given back meanwhile, or no lock can be made
            ((++tries < 50)) || die "cannot make the lock $RUNDIR/lock (remove what is there, or make $RUNDIR writable)"
            continue
        fi
        read -r pid start what <<<"$holder"
        if [ -n "$pid" ] && proc_start "$pid" && [ "$PROC_START" = "$start" ]; then
            [ "$told" = 1 ] || note "waiting for \`$what\` of this project (pid $pid) to finish"
            told=1
            nap 0.2
        else
            rm -f "$RUNDIR/lock"  # its holder ended without giving it back (kill -9, a reboot)
        fi
    done
    LOCK_HELD=1
    trap release_project_lock EXIT
}

release_project_lock() {
    [ "$LOCK_HELD" = 1 ] || return 0
    LOCK_HELD=0
    rm -f "$RUNDIR/lock"
}

main() {
    local command=${1:-}
    shift || true
    check_sealed
    case "$command" in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        ps) cmd_ps "$@" ;;
        logs) cmd_logs "$@" ;;
        exec) cmd_exec "$@" ;;
        restart) cmd_restart "$@" ;;
        build) cmd_build "$@" ;;
        pull) cmd_pull "$@" ;;
        _storage) cmd_storage ;;
        _supervise) cmd_supervise ;;
        -h | --help | help | "") sed -n '2,/^set -o/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
        *) die "unknown command $command (try: ./run.sh help)" ;;
    esac
}

main "$@"
