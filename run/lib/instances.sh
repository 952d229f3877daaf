# ---- run/lib/instances.sh: the runtime's instances, the state of a service, its logs ----------

# The user's instances as the runtime lists them (only the one named $1, where given): a line
# "INSTANCE PID" each, from one `instance list --json` (no jq on most nodes).
listed_instances() {
    { "$RT" instance list --json ${1:+"$1"} 2>/dev/null | tr -d ' \t\n'; echo; } | sed 's/},{/}\n{/g' |
        sed -n 's/.*"instance":"\([^"]*\)","pid":\([0-9]*\).*/\1 \2/p'
}

# The pids of the user's instances, in INSTANCE_PIDS (INSTANCES_LISTED=1 once listed).
declare -A INSTANCE_PIDS=()
INSTANCES_LISTED=0
list_instances() {
    local name pid
    INSTANCE_PIDS=()
    while read -r name pid; do
        INSTANCE_PIDS[$name]=$pid
    done < <(listed_instances)
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
    local name pid
    if [ "$INSTANCES_LISTED" = 1 ]; then
        IPID=${INSTANCE_PIDS[$S_INSTANCE]:-}
    else
        IPID=""
        while read -r name pid; do
            [ "$name" = "$S_INSTANCE" ] && IPID=$pid
        done < <(listed_instances "$S_INSTANCE")
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

# The exit code the loaded service's command left (its launch line writes it), "" before it ends.
exit_code() { first_line "$(tmp_dir)/.c2s-exit"; }
tmp_dir() { printf '%s' "$(abs "$S_TMP")"; }

# The loaded service's output and error logs, a line each: where the runtime's listing says, else
# where the runtime keeps them ("" when there is none).
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

# Made when start_service starts service $1 (or finds it running), its logs cleared: the logs
# where the runtime keeps them are this run's, not those of an earlier run that the runtime keeps
# after `down` (cmd_logs).
logs_mark() { printf '%s' "$RUNDIR/$1.logs"; }

# The last $1 (20) lines of the loaded service's logs.
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
