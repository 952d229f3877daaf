# ---- run/lib/start.sh: starting one service (GPUs, flags, dependencies, its wait to run) ---------

# The GPUs this job may use, in GPU_POOL: CUDA_VISIBLE_DEVICES where the scheduler set it, else
# every GPU nvidia-smi lists.
GPU_POOL=()
gpu_pool() {
    local n i
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        IFS=, read -r -a GPU_POOL <<<"$CUDA_VISIBLE_DEVICES"
    elif command -v nvidia-smi >/dev/null 2>&1; then
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
        write_lines "$RUNDIR/$name.gpus" "$ids"
    done
}

# The loaded service's share of the GPUs (assign_gpus), in GPU_ENV_FLAGS: for its start and for
# every `exec` into it, since an exec gets a clean environment of its own.
GPU_ENV_FLAGS=()
gpu_env_flags() {
    GPU_ENV_FLAGS=()
    if [ "$S_NV" = 1 ] && [ -s "$RUNDIR/$S_NAME.gpus" ]; then
        GPU_ENV_FLAGS=(--env "CUDA_VISIBLE_DEVICES=$(cat "$RUNDIR/$S_NAME.gpus")")
    fi
}

# What the runtime's `instance start` of the loaded service (or a one-shot's exec) gets, in
# START_FLAGS: its environment, hosts file, binds, GPUs, writable root and home.
START_FLAGS=()
runtime_flags() {
    # (no --pwd: `instance start` has none; the start script changes to the working directory)
    env_flags
    START_FLAGS=("${ENV_FLAGS[@]}")
    if [ "$ISOLATION" = intercept ] && [ -f "$STATE/hosts.d/$S_NAME" ]; then  # the names its networks reach
        START_FLAGS+=(--bind "$STATE/hosts.d/$S_NAME:/etc/hosts:ro")
    else
        START_FLAGS+=(--bind "$STATE/hosts:/etc/hosts:ro")
    fi
    loopback_start_flags || start_script_flags  # its entry under the tracer, in intercept mode (run/lib/isolation.sh)
    [ -e "$RUNDIR/$S_NAME.fakeroot" ] && START_FLAGS+=(--fakeroot)
    local b src rest
    for b in "${S_BINDS[@]}"; do
        src=${b%%:*} rest=${b#*:}
        abs "$src"
        START_FLAGS+=(--bind "$ABS:$rest")
    done
    for b in "${S_SOCKETS[@]}"; do  # the Docker socket: only where there is one
        [ -S "${b%%:*}" ] && START_FLAGS+=(--bind "$b")
    done
    [ "$S_NV" = 1 ] && START_FLAGS+=(--nv)
    gpu_env_flags
    START_FLAGS+=("${GPU_ENV_FLAGS[@]}")
    local root=$WRITABLE_ROOT
    [ "$S_WRITABLE_TMPFS" = 1 ] && root=tmpfs
    case "$root" in
        overlay)
            remove_overlay "$S_NAME" && mkdir -p "$STATE/overlay/$S_NAME" && shadow_image_dirs "$STATE/overlay/$S_NAME"
            START_FLAGS+=(--overlay "$STATE/overlay/$S_NAME")
            ;;
        tmpfs) START_FLAGS+=(--writable-tmpfs) ;;
    esac
    make_dirs "$STATE/services/$S_NAME/home"
    START_FLAGS+=(--home "$STATE/services/$S_NAME/home")
}

# A service that switches to other user ids inside (Dify's sandbox) gets --fakeroot only where that
# maps container uids and gids 0..N here: Apptainer maps what /etc/subuid and /etc/subgid give the
# user (with no entry, one id), setuid installs likewise. Probed at `up`; otherwise it starts
# plainly and one line says what will not work.
probe_fakeroot() {
    load_service "$1"
    remove_files "$RUNDIR/$1.fakeroot"
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

# The service's directories: scratch emptied, sources made, empty volumes filled from the image,
# then the mount points of binds that land inside another bind's source (made there, as Docker
# does: a file where a file is bound). Prints why when a fill fails.
prepare_dirs() {
    local d i point why
    for d in "${S_EMPTY[@]}"; do abs "$d" && rm_inside "$ABS"; done
    for d in "${S_MKDIRS[@]}"; do  # (Docker makes a missing bind source as root; here the user must be able to)
        abs "$d"
        if [ ! -e "$ABS" ] && ! why=$(mkdir -p -- "$ABS" 2>&1); then
            echo "the bind source $ABS does not exist, and this user cannot create it (${why##*: }): create it, or make its parent writable"
            return 1
        fi
    done
    for ((i = 0; i < ${#S_FILLS[@]}; i += 2)); do
        abs "${S_FILLS[i]}"
        fill_volume "$ABS" "${S_FILLS[i + 1]}" || return 1
    done
    # a scratch directory (emptied above) gets what the image has at its target, links to /dev/stdout
    # among them, where the SIF can be read straight (no container started for it); else it stays empty
    for ((i = 0; i < ${#S_KEEPS[@]}; i += 2)); do
        abs "${S_KEEPS[i]}"
        unsquash_into "$ABS" "${S_KEEPS[i + 1]}" || true
    done
    for ((i = 0; i < ${#S_MOUNT_POINTS[@]}; i += 2)); do
        abs "${S_MOUNT_POINTS[i]}"
        point=$ABS
        split_path "$point"
        [ -e "$point" ] || [ -L "$point" ] || [ ! -d "$PATH_DIR" ] && continue
        abs "${S_MOUNT_POINTS[i + 1]}"
        if [ -d "$ABS" ]; then mkdir -p -- "$point"; else : >"$point"; fi
    done
}

# Docker's fill rule: a volume that is empty gets the image's content at its target before the
# service starts: modes, links and times kept, ownership as far as the runtime lets a user. Read
# straight out of the SIF where unsquash_into can, else the runtime copies it out of the image with
# the volume bound beside the target. A volume that holds anything stays as it is, and nothing is
# written into it to remember (a database refuses a data directory that is not empty); one lock,
# so that two services filling one volume take turns.
FILL_POINT=/.c2s-fill
fill_volume() {
    local dir=$1 target=$2 why
    (
        flock 9
        [ -z "$(ls -A -- "$dir")" ] || exit 0
        unsquash_into "$dir" "$target" && exit 0
        # shellcheck disable=SC2016  # (expanded by the image's shell)
        why=$("$RT" exec --contain --bind "$dir:$FILL_POINT" "$S_SIF" /bin/sh -c \
            'if [ -d "$1" ]; then cp -a "$1/." "$2/"; fi' sh "$target" "$FILL_POINT" 2>&1 >/dev/null) && exit 0
        find "$dir" -mindepth 1 -delete 2>/dev/null  # empty again: a later start fills it whole
        echo "could not fill volume $dir from the image's $target: $(grep -v '^INFO' <<<"$why" | head -n 1)"
        exit 1
    ) 9>"$RUNDIR/fill.lock"
}

# The fill without a container: unsquashfs reads the target's tree out of the SIF's squashfs
# partition (no FUSE mount, whose one thread makes a copy of many small files several times
# slower), into a directory beside the volume; its entries are then moved in, and the volume gets
# the directory's mode and times. Fails with the volume still empty where it cannot (no
# unsquashfs or one without -o, no such partition, a link on the way to the target, nothing there):
# the runtime copies then, and says why when it fails.
unsquash_into() {
    local dir=$1 target=$2 offset tmp src mode stamp
    command -v unsquashfs >/dev/null 2>&1 && [ -f "$S_SIF" ] || return 1
    offset=$("$RT" sif list "$S_SIF" 2>/dev/null |
        awk -F'|' '/Squashfs\/\*System/ { split($4, at, "-"); print at[1] + 0; exit }')
    [ -n "$offset" ] && [ "$offset" -gt 0 ] || return 1
    tmp=$(mktemp -d "$(dirname -- "$dir")/.c2s-fill.XXXXXX") || return 1
    src="$tmp/root$target"
    # (umask 0: a user's unsquashfs creates files through the umask, run.sh's 077 among them; the
    # image's modes are what the volume gets, as the runtime's `cp -a` keeps them)
    if (umask 0 && unsquashfs -n -no-xattrs -o "$offset" -d "$tmp/root" "$S_SIF" "$target") >/dev/null 2>&1 &&
        [ -d "$src" ] && [ ! -L "$src" ]; then
        mode=$(stat -c %a -- "$src") stamp=$(stat -c %Y -- "$src")
        chmod u+w -- "$src" &&
            find "$src" -mindepth 1 -maxdepth 1 -exec mv -t "$dir" -- {} + &&
            chmod "$mode" -- "$dir" && touch -d "@$stamp" -- "$dir" && src=""
    fi
    chmod -R u+w -- "$tmp" 2>/dev/null
    rm -rf -- "$tmp"
    if [ -n "$src" ]; then  # not done: empty again, for the runtime's copy
        find "$dir" -mindepth 1 -delete 2>/dev/null
        return 1
    fi
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

# One service of `up`, started in the background: a failure shows in its progress too.
up_one() {
    start_service "$1" && return 0
    get_status "$1"
    progress "$1" "failed: ${STATUS#failed }"
    return 1
}

RELEASE_AFTER_START=0
# Start service $1 once its dependencies meet their conditions, and wait until it runs, listens
# on its required endpoints and (with a healthcheck) is healthy. Its status file says how it went
# ("failed REASON" when it did not), its progress line what it is doing. With $2 = restart (a
# restart, by hand or by the supervisor) its dependencies are not waited for, as in Compose.
start_service() {
    local name=$1 reason held i already=0 rc late=()
    load_service "$name"
    [ "${2:-}" = restart ] && S_DEPENDS=()
    # until it starts, the logs there are an earlier run's; whether it listens is this start's to say
    remove_files "$RUNDIR/$name.logs" "$RUNDIR/$name.late"
    # (each wait below runs in a command substitution, a child process, only where there is
    # something to wait for)
    if [ ${#S_DEPENDS[@]} -gt 0 ]; then
        progress "$name" "waiting for $(depends_text)"
        if ! reason=$(wait_dependencies); then
            set_status "$name" "failed $reason"
            return 1
        fi
    fi
    set_status "$name" starting
    service_state
    if [ "$STATE_NOW" = running ]; then
        progress "$name" "already running"
        : >"$RUNDIR/$name.logs"
        already=1
    else
        if [ "$STATE_NOW" = exited ]; then
            remove_instance
            wait_reaped "$STARTER"
        fi
        [ -f "$S_SIF" ] || { set_status "$name" "failed image $S_SIF is missing (run: ./run.sh build)"; return 1; }
        required_endpoints
        if [ "$S_ONESHOT" = 0 ] && [ $((${#REQUIRED[@]} + ${#S_FORWARDS[@]})) -gt 0 ]; then
            held=$(endpoints_taken "$name")
            if [ -n "$held" ]; then
                set_status "$name" "failed endpoint ${held%%$'\n'*} (stop what holds it, or change that port in the compose file)"
                return 1
            fi
        fi
        if [ $((${#S_EMPTY[@]} + ${#S_MKDIRS[@]} + ${#S_FILLS[@]} + ${#S_KEEPS[@]} + ${#S_MOUNT_POINTS[@]})) -gt 0 ] &&
            ! reason=$(prepare_dirs); then
            set_status "$name" "failed $reason"
            return 1
        fi
        clear_logs
        : >"$RUNDIR/$name.logs"
        remove_files "$RUNDIR/$name.stopped"
        run_pre_start || return 1  # its pre_start steps, where they have not run (run/lib/pre_start.sh)
        runtime_flags
        clear_record
        if [ "$S_ONESHOT" = 1 ]; then
            progress "$name" "running to completion"
            "$RT" exec "${START_FLAGS[@]}" "$S_SIF" /.singularity.d/startscript >"$STATE/logs/$name.log" 2>&1
            local rc=$?
            set_status "$name" "completed $rc"
            [ "$rc" = 0 ] || { set_status "$name" "failed exited with code $rc"; return 1; }
            progress "$name" completed
            return 0
        fi
        progress "$name" "starting instance $S_INSTANCE"
        if ! "$RT" instance start "${START_FLAGS[@]}" -- "$S_SIF" "$S_INSTANCE" >"$STATE/logs/$name.start.log" 2>&1; then
            set_status "$name" "failed instance start: $(grep -v '^INFO' "$STATE/logs/$name.start.log" | head -n 2 | tr '\n' ' ')"
            return 1
        fi
        refresh_instance
        record_helpers
        [ "$RELEASE_AFTER_START" = 1 ] && release_project_lock  # (the supervisor's restart: run/lib/supervise.sh)
        # the start script runs as soon as the instance is up: a moment for it to show, up to 10 s
        # on a loaded node; an exit code, or no instance after a second, ends the wait early
        for ((i = 0; i < 200; i++)); do
            service_running && break
            exit_code
            [ -n "$EXIT_CODE" ] && break
            [ "$STATE_NOW" = absent ] && ((i >= 20)) && break
            nap 0.05
        done
        if ! service_running; then
            exit_code
            set_status "$name" "failed exited right after start (exit code $EXIT_CODE)"
            return 1
        fi
    fi
    # its forwarders from the start, as Docker publishes a port whether or not anything listens there
    # (a privileged port's forwarder relays to where the tracer will put it: run/lib/isolation.sh)
    if [ ${#S_FORWARDS[@]} -gt 0 ]; then
        reason=$(start_forwarders) || { set_status "$name" "failed $reason"; return 1; }  # (run/lib/forward.sh)
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
    elif [ $((${#REQUIRED[@]} + ${#S_FORWARDS[@]})) -gt 0 ]; then
        # no healthcheck: started, as Compose has it; a service that exits meanwhile has failed, one
        # that is slow to listen, or never opens a port it publishes, has not (the supervisor
        # watches it: watch_late)
        reason=$(wait_listening "${C2S_LISTEN_TIMEOUT:-60}" published)
        rc=$?
        if [ "$rc" = 1 ]; then
            set_status "$name" "failed $reason"
            return 1
        elif [ "$rc" = 2 ]; then
            read -r -a late <<<"$reason"
            now_seconds
            write_lines "$RUNDIR/$name.late" "$((${NOW_SECONDS%.*} - late[0]))" "${late[@]:1}"
            service_ports "${late[@]:1}"
            progress "$name" "started, not listening yet on $SERVICE_PORTS (waited ${late[0]} s; it is watched, and C2S_LISTEN_TIMEOUT=SECONDS waits longer)"
            return 0
        fi
        [ "$already" = 0 ] && progress "$name" running
    elif [ "$already" = 0 ]; then
        progress "$name" running
    fi
    record_truth  # what it really listens on, against the plan (run/lib/endpoints.sh)
    return 0
}

# For a service that failed with nothing in its output (squid writes why into cache.log): the last
# lines of what it wrote into its scratch directories and tmpfs mounts at this start, and what its
# adapter's check (S_CHECK, `squid -k parse`) says in its image with its binds.
explain_silent_exit() {
    local d f shown=0
    [ -n "$(log_tail 20)" ] && return 0
    echo "run.sh: service $S_NAME said nothing on its output"
    for d in "${S_EMPTY[@]}"; do
        abs "$d"
        while IFS= read -r f; do
            ((shown < 3)) || break
            shown=$((shown + 1))
            echo "--- last 10 lines of $f (written at this start) ---"
            tail -n 10 -- "$f"
        done < <(find "$ABS" -type f -newer "$RUNDIR/$S_NAME.logs" -size +0 2>/dev/null)
    done
    if [ ${#S_CHECK[@]} -gt 0 ] && [ -f "$S_SIF" ]; then
        runtime_flags
        traced "${S_CHECK[@]}"  # under its tracer, as its entry would run
        echo "--- ${S_CHECK[*]} in its image ---"
        "$RT" exec "${START_FLAGS[@]}" "$S_SIF" "${TRACED[@]}" 2>&1 | grep -v '^INFO' | tail -n 20
    fi
    return 0
}

# Before anything starts: host paths outside the project that are missing are made where the user
# can and Compose would (short syntax, create_host_path), else one line each names the service, the
# path and the fix; the Docker socket is told about. Fails when a path is missing.
check_host_paths() {
    local name i src target create b absent=0
    for name in "$@"; do
        load_service "$name"
        for ((i = 0; i < ${#S_HOST_PATHS[@]}; i += 3)); do
            src=${S_HOST_PATHS[i]} target=${S_HOST_PATHS[i + 1]} create=${S_HOST_PATHS[i + 2]}
            [ -e "$src" ] && continue
            [ "$create" = 1 ] && mkdir -p -- "$src" 2>/dev/null && continue
            echo "run.sh: up: service $name binds $src at $target; it is missing$([ "$create" = 1 ] && echo " and you cannot create it");" \
                "bind a directory of your choice at $target in an override file (compose.override.yaml) and convert again" >&2
            absent=1
        done
        for b in "${S_SOCKETS[@]}"; do
            [ -S "${b%%:*}" ] && continue
            note "WARN service $name: no Docker daemon here; its bind of the Docker socket ${b%%:*} is left out and what it does through Docker will not work"
        done
    done
    return "$absent"
}

# The services to start: the ones asked for and everything they depend on, in start order.
closure() {
    local wanted=("$@") name dep changed=1 out=()
    # all of them; none (every service behind a profile not asked for) is no line at all, not an empty name
    [ ${#wanted[@]} -eq 0 ] && { [ ${#SERVICES[@]} -eq 0 ] || printf '%s\n' "${SERVICES[@]}"; return; }
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
