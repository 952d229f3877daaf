# ---- run/lib/instances.sh: the runtime's instances, the state of a service, its logs ----------

# The user's instances as the runtime lists them (only the one named $1, where given), in LISTED
# (INSTANCE -> PID): one `instance list --json` read by bash itself (no jq on most nodes, and no
# child process but the runtime), its blanks dropped, each record ("},{" ends one) matched for its
# last "instance":"NAME","pid":PID.
declare -A LISTED=()
listed_instances() {
    local json record re='.*"instance":"([^"]*)","pid":([0-9]*)'
    LISTED=()
    json=$("$RT" instance list --json ${1:+"$1"} 2>/dev/null)
    json=${json//[ $'\t\n']/}
    while [ -n "$json" ]; do
        record=${json%%'},{'*}
        json=${json:${#record}+3}
        [[ $record =~ $re ]] && [ -n "${BASH_REMATCH[1]}" ] && LISTED[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
    done
    return 0
}

# The pids of the user's instances, in INSTANCE_PIDS (INSTANCES_LISTED=1 once listed).
declare -A INSTANCE_PIDS=()
INSTANCES_LISTED=0
list_instances() {
    local name
    listed_instances
    INSTANCE_PIDS=()
    for name in "${!LISTED[@]}"; do INSTANCE_PIDS[$name]=${LISTED[$name]}; done
    INSTANCES_LISTED=1
    list_children
}

# The first child of every listed instance's init (its start script), for child_of: the first
# thread's list of children that names one (an init has several threads), read without a child process.
list_children() {
    local pid f kids
    for pid in "${INSTANCE_PIDS[@]}"; do
        for f in /proc/"$pid"/task/*/children; do
            kids=""
            { read -r kids || true; } 2>/dev/null <"$f"
            kids=${kids# }
            [ -n "$kids" ] && { CHILD_OF[$pid]=${kids%% *}; break; }
        done
    done
    return 0
}

# The pid of this service's instance, in IPID: from the last listing when there is one, else
# from a listing of its own.
IPID=""
instance_pid() {
    if [ "$INSTANCES_LISTED" = 1 ]; then
        IPID=${INSTANCE_PIDS[$S_INSTANCE]:-}
    else
        listed_instances "$S_INSTANCE"
        IPID=${LISTED[$S_INSTANCE]:-}
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
    write_lines "$RUNDIR/$S_NAME.helpers" "$IPID $PARENT ${helpers[*]}"
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

# The exit code the loaded service's command left (its launch line writes it), "" before it ends,
# in EXIT_CODE.
EXIT_CODE=""
exit_code() { abs "$S_TMP"; first_line "$ABS/.c2s-exit"; EXIT_CODE=$FIRST_LINE; }

# The loaded service's output and error logs, in LOG_PATHS (two paths, "" for none): where the
# runtime's listing says, else where the runtime keeps them.
LOG_PATHS=()
log_paths() {
    local json out="" err="" base
    json=$("$RT" instance list --json "$S_INSTANCE" 2>/dev/null)
    json=${json//$'\n'/}
    [[ $json =~ .*\"logOutPath\":\ *\"([^\"]*)\" ]] && out=${BASH_REMATCH[1]}
    [[ $json =~ .*\"logErrPath\":\ *\"([^\"]*)\" ]] && err=${BASH_REMATCH[1]}
    if [ -z "$out" ]; then
        user_name
        for base in "${APPTAINER_CONFIGDIR:-$HOME/.apptainer}" "${SINGULARITY_CONFIGDIR:-$HOME/.singularity}"; do
            for out in "$base"/instances/logs/*/"$USER_NAME"/"$S_INSTANCE".out; do
                [ -e "$out" ] && { err=${out%.out}.err; break 2; }
            done
            out=""
        done
    fi
    LOG_PATHS=("$out" "$err")
}

# Apptainer appends to an instance's log files; a fresh start gets fresh logs.
clear_logs() {
    local base
    user_name
    for base in "${APPTAINER_CONFIGDIR:-$HOME/.apptainer}" "${SINGULARITY_CONFIGDIR:-$HOME/.singularity}"; do
        remove_files "$base"/instances/logs/*/"$USER_NAME"/"$S_INSTANCE".out "$base"/instances/logs/*/"$USER_NAME"/"$S_INSTANCE".err
    done
}

# RUNDIR/NAME.logs is made when start_service starts service NAME (or finds it running), its logs
# cleared: the logs where the runtime keeps them are this run's, not those of an earlier run that
# the runtime keeps after `down` (cmd_logs).

# The last $1 (20) lines of the loaded service's logs.
log_tail() {
    local n=${1:-20} f
    if [ "$S_ONESHOT" = 1 ]; then
        tail -n "$n" "$STATE/logs/$S_NAME.log" 2>/dev/null
        return
    fi
    log_paths
    for f in "${LOG_PATHS[@]}"; do
        [ -n "$f" ] && [ -e "$f" ] && tail -n "$n" "$f"
    done
}
