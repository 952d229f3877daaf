# ---- run/cmd/up.sh: `up [-d] [SERVICE...]` -------------------------------------------------------

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
    expand_replicas "${names[@]}" && names=("${EXPANDED[@]}")  # a service of N replicas: each of them
    for name in "${names[@]}"; do load_service "$name"; done  # unknown names end here, with a message
    [ ${#SERVICES[@]} -gt 0 ] || die "no service selected"  # Docker Compose's words: all are behind profiles
    take_project_lock up
    detect_runtime
    refuse_missing_images "${names[@]}"
    prepare_state
    choose_isolation  # a loopback per service, or the plan-time knobs (run/lib/isolation.sh)
    stop_supervisor  # one supervisor per project (a new one starts below), and none restarting what `up` starts
    clean_stale up
    mapfile -t names < <(closure "${names[@]}")
    refuse_untraceable "${names[@]}" || { echo "run.sh: up: nothing was started" >&2; return 1; }
    tell_forwarders "${names[@]}"  # how published ports are served on this node, or who will fail
    for name in "${names[@]}"; do
        remove_files "$RUNDIR/$name.status" "$RUNDIR/$name.timeline" "$RUNDIR/$name.progress" "$RUNDIR/$name.truth" \
            "$RUNDIR/$name.late"
        probe_fakeroot "$name"
    done
    assign_gpus "${names[@]}"
    list_instances
    check_host_paths "${names[@]}" || { echo "run.sh: up: nothing was started" >&2; return 1; }
    # nothing starts while an endpoint of a service to start is taken on this node
    held=$(endpoints_taken "${names[@]}")
    if [ -n "$held" ]; then
        while IFS= read -r st; do echo "run.sh: up: endpoint $st" >&2; done <<<"$held"
        echo "run.sh: up: nothing was started; stop what holds it, or change that port in the compose file (a published one: its host port) and convert again" >&2
        return 1
    fi
    start_dns  # Docker's 127.0.0.11, in intercept mode (run/lib/dns.sh)
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
        get_status "$name"
        case "$STATUS" in failed*) nap 1; break ;; esac  # let the runtime flush the logs
    done
    for name in "${names[@]}"; do
        get_status "$name"
        st=$STATUS
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
                        case "$st" in "failed exited"* | *"exited before it"* | *"exited while its"*) explain_silent_exit >&2 ;; esac
                        explain_address_in_use >&2
                        ;;
                esac
                ;;
        esac
    done
    # a service reported started that has no instance now (its start was refused after its status was
    # written, or it vanished) is not up: say which, and fail as for a failed start
    list_instances
    for name in "${names[@]}"; do
        get_status "$name"
        case "$STATUS" in failed* | completed*) continue ;; esac
        load_service "$name"
        service_state
        if [ "$STATE_NOW" = absent ]; then
            failed=1
            echo "run.sh: service $name is not running: it has no instance after up" >&2
        fi
    done
    tell_truth run.sh: "${names[@]}" >&2  # what they listen on where the plan says otherwise
    if [ "$failed" = 1 ]; then
        return 1
    fi
    note "up: ${names[*]}"
    print_entry_points
    write_lines "$RUNDIR/supervised" "${names[@]}"
    if [ "$detach" = 1 ]; then
        if needs_supervisor; then
            # ignored from the fork on: where run.sh leads its terminal's session (`ssh -t node
            # run.sh up -d`) the hangup at its exit would reach the child before nohup runs
            trap '' HUP
            nohup setsid "$HERE/run.sh" _supervise </dev/null >"$STATE/logs/supervisor.log" 2>&1 &
            write_pid_record $! "$RUNDIR/supervisor.pid"
        fi
        return 0
    fi
    # in the foreground this process is the supervisor: `down` or another `up` ends it
    release_project_lock
    write_pid_record $$ "$RUNDIR/supervisor.pid"
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
    local entry service scheme address port container path node target c p entries=("${ENTRY_POINTS[@]}")
    [ "$ISOLATION" != intercept ] && [ -n "${FALLBACK_ENTRY_POINTS+set}" ] && entries=("${FALLBACK_ENTRY_POINTS[@]}")
    [ ${#entries[@]} -gt 0 ] || return 0  # (no hostname to ask, which may be a DNS lookup)
    node=$(hostname -f 2>/dev/null || hostname)
    for entry in "${entries[@]}"; do
        read -r service scheme address port container path <<<"$entry"
        if [ "$port" = 0 ]; then  # published with no host side: the free port its forwarders took
            while read -r c p; do [ "$c" = "$container" ] && port=$p; done 2>/dev/null <"$RUNDIR/$service.published"
            [ "$port" != 0 ] || continue
        fi
        case "$address" in
            0.0.0.0) target=localhost; note "$service: $scheme://$node:$port$path" ;;
            *) target=$address; note "$service: $scheme://$address:$port$path (on $node)" ;;
        esac
        note "  from your laptop: ssh -N -L $port:$target:$port -J ${USER:-you}@LOGIN-NODE ${USER:-you}@$node" \
            "then open $scheme://localhost:$port$path"
    done
}
