# ---- run/lib/pre_start.sh: a service's pre_start steps, one-off containers run before it starts ----

# Compose's init containers. Before the loaded service starts (its dependencies met, its directories
# made), each of its pre_start steps runs to completion, in order: an `exec` of the step's image
# (its SIF) with the service's flags (binds and volumes, hosts file, home, GPUs: runtime_flags) and
# the step's own env file (the service's environment with the step's, its command in C2S_LAUNCH).
# S_PRE_START holds three words a step: its image key, its env file, its fingerprint. A step that
# succeeded leaves its fingerprint in $STATE/pre_start/SERVICE/INDEX and does not run again while
# that matches: not on a restart, not on a later `up`. A changed step runs again, and so does every
# step after `down` (cmd_down forgets them: Compose's down removes the container they ran for).
# A failing step fails the service; its status names the step, its exit code and its last line of
# output (all of it is in $STATE/logs/SERVICE.pre_start.INDEX.log).
run_pre_start() {
    local i n sif print done_file log rc last d ran=0 S_ENV=$S_ENV  # (S_ENV: the step's, for runtime_flags)
    [ ${#S_PRE_START[@]} -gt 0 ] || return 0
    make_dirs "$STATE/pre_start/$S_NAME"
    for ((i = 0; i + 2 < ${#S_PRE_START[@]}; i += 3)); do
        n=$((i / 3))
        sif="$HERE/sif/${S_PRE_START[i]}.sif" S_ENV="$HERE/${S_PRE_START[i + 1]}" print=${S_PRE_START[i + 2]}
        done_file="$STATE/pre_start/$S_NAME/$n" log="$STATE/logs/$S_NAME.pre_start.$n.log"
        first_line "$done_file"
        [ "$FIRST_LINE" = "$print" ] && continue
        rm -f "$done_file"
        if [ ! -f "$sif" ]; then
            set_status "$S_NAME" "failed pre_start[$n]: image $sif is missing (run: ./run.sh build)"
            return 1
        fi
        progress "$S_NAME" "running pre_start[$n]"
        runtime_flags
        ran=1
        "$RT" exec "${START_FLAGS[@]}" "$sif" /.singularity.d/startscript </dev/null >"$log" 2>&1
        rc=$?
        if [ "$rc" != 0 ]; then
            last=$(grep -v -e '^INFO' -e '^[[:space:]]*$' "$log" | tail -n 1)
            set_status "$S_NAME" "failed pre_start[$n] exited with code $rc${last:+: $last} (output: ${log#"$HERE"/})"
            return 1
        fi
        write_lines "$done_file" "$print"
    done
    # a tmpfs is the container's own: what a step wrote in one is not the service's
    if [ "$ran" = 1 ]; then
        for d in "${S_EMPTY[@]}"; do abs "$d" && rm_inside "$ABS" && mkdir -p "$ABS"; done
    fi
    return 0
}
