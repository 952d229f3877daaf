# ---- run/lib/proc.sh: processes of this node, read from /proc without a child process --------

# The parent of live (not zombie) process $1, in PARENT.
PARENT=""
parent_of() {
    local line="" rest
    PARENT=""
    [ -n "$1" ] || return 1  # "" would read /proc//stat, the kernel's /proc/stat: never a process
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
    [ -n "$1" ] || return 1
    { read -r line || true; } 2>/dev/null <"/proc/$1/stat"
    [ -n "$line" ] || return 1
    read -r -a fields <<<"${line##*) }"  # fields 3.. of stat: the state, ..., the start time (22)
    [ "${fields[0]}" != Z ] || return 1  # a zombie has ended (its parent has not reaped it)
    PROC_START=${fields[19]}
}

# Whether process $1 lives and started at $2 (a record "PID START" names it, as write_pid_record
# writes one): then it is the process recorded, not another one given the same pid since.
same_process() { [ -n "$1" ] && proc_start "$1" && [ "$PROC_START" = "$2" ]; }

# Record process $1 in file $2 as "PID START" (see same_process).
write_pid_record() { proc_start "$1"; write_lines "$2" "$1 $PROC_START"; }

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

# How long ago process $1 started, in seconds, in UPTIME_S ("" when it is gone): its start time
# in /proc/PID/stat (clock ticks after boot) against /proc/uptime.
UPTIME_S="" CLK_TCK=""
process_age() {
    local now=""
    UPTIME_S=""
    proc_start "$1" || return 1
    { read -r now _ || true; } 2>/dev/null </proc/uptime
    [ -n "$now" ] || return 1
    [ -n "$CLK_TCK" ] || CLK_TCK=$(getconf CLK_TCK 2>/dev/null) || CLK_TCK=100
    UPTIME_S=$((${now%.*} - PROC_START / CLK_TCK))
    ((UPTIME_S >= 0)) || UPTIME_S=0
}
