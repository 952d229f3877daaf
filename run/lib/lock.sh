# ---- run/lib/lock.sh: the project lock ---------------------------------------------------------

# One `up`, `down`, `restart`, `build` or `pull` of a project at a time, each from the moment its
# arguments are checked: two at once would start, stop or build the same instances and images
# twice. The lock is a symbolic link whose target names its holder, "PID START COMMAND": made in
# one step, left behind by a killed holder, and then recognised as stale by the pid's start time
# (as supervisor.pid is). A foreground `up` gives it back once its services run; the others at
# their exit. Waiting costs one readlink per 0.2 s. With --try it fails at once where a live holder
# has it (the supervisor's restart of a service: not while `restart`, `up` or `down` works); held
# already (that restart, then `down` on a signal to a foreground `up`), it is kept.
LOCK_HELD=0
take_project_lock() {
    local me holder="" pid start what told=0 tries=0 once=0
    [ "$1" = --try ] && once=1 && shift
    [ "$LOCK_HELD" = 0 ] || return 0
    [ -d "$RUNDIR" ] || (umask 077 && mkdir -p "$RUNDIR")
    proc_start $$
    me="$$ $PROC_START $1"
    until ln -s "$me" "$RUNDIR/lock" 2>/dev/null; do
        if ! holder=$(readlink "$RUNDIR/lock" 2>/dev/null); then  # given back meanwhile, or no lock can be made
            ((++tries < 50)) || die "cannot make the lock $RUNDIR/lock (remove what is there, or make $RUNDIR writable)"
            continue
        fi
        read -r pid start what <<<"$holder"
        if same_process "$pid" "$start"; then
            [ "$once" = 1 ] && return 1
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
