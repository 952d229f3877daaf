set -uo pipefail

# ---- how it runs -----------------------------------------------------------------------------
# The scheduler starts this script once, on the first node (the "batch step"). It checks what the
# job needs, copies itself to a job directory under the submit directory (shared by the nodes),
# and runs the converted project's runner, `run.sh up SERVICES` in the foreground, on this node.
# Where a service spans nodes (vLLM over Ray), it first starts one task per node through the
# launcher (srun, mpirun, mpiexec): each task starts a "keeper" in a session of its own, which runs
# the Ray head (first node, without GPUs) or a Ray worker (the others) and stops it, with the
# service's stop grace, when the job dir says `stop`, when its task is killed (OpenMPI's mpirun kills
# its ranks 1 s after SIGTERM) or on SIGTERM; it never relies on the launcher to do it. The runner's
# services reach the Ray cluster through RAY_ADDRESS. The first node's GPUs join the cluster from
# inside the Ray service's instance, once the runner started it: a Ray driver finds its node by the
# raylet processes it can see, and an instance has a PID namespace of its own. The job ends (the
# runner exits, a node part fails, a cancel, the time limit) with `run.sh down`, every keeper
# stopped and the job directory removed.

say() { printf '[c2s-batch %s] %s\n' "$(hostname -s 2>/dev/null || hostname)" "$*" >&2; }

runtime=$(command -v apptainer || command -v singularity)

submit_dir=${PJM_O_WORKDIR:-${SLURM_SUBMIT_DIR:-$PWD}}
job_id=${PJM_JOBID:-${SLURM_JOB_ID:-$$}}
job_dir="$submit_dir/.compose2sif-batch/$job_id"
case "${1:-}" in
    --node | --keep)  # from the batch step: launchers need not pass the scheduler's environment on
        job_dir=$2
        job_id=${job_dir##*/}
        ;;
esac

node_names() {  # one host name a line, in the scheduler's order (as the batch step saw it)
    if [ -s "$job_dir/nodes" ]; then
        cat "$job_dir/nodes"
    elif [ -n "${PJM_O_NODEINF:-}" ]; then
        awk 'NF { print $1 }' "$PJM_O_NODEINF"
    elif [ -n "${SLURM_JOB_NODELIST:-}" ]; then
        if command -v scontrol >/dev/null 2>&1; then
            scontrol show hostnames "$SLURM_JOB_NODELIST"
        else
            expand_slurm_nodelist "$SLURM_JOB_NODELIST"
        fi
    else
        hostname -s
    fi
}

expand_slurm_nodelist() {  # "gpu[01-02,05],login1" -> gpu01 gpu02 gpu05 login1 (what scontrol does)
    local list=$1 item prefix ranges range lo hi i items
    while [ -n "$list" ]; do
        if [[ $list =~ ^([^,\[]*)\[([^]]*)\](,?)(.*)$ ]]; then
            prefix=${BASH_REMATCH[1]} ranges=${BASH_REMATCH[2]} list=${BASH_REMATCH[4]}
            IFS=, read -r -a items <<<"$ranges"
            for range in "${items[@]}"; do
                lo=${range%-*} hi=${range#*-}
                for ((i = 10#$lo; i <= 10#$hi; i++)); do
                    printf '%s%0*d\n' "$prefix" "${#lo}" "$i"
                done
            done
        else
            item=${list%%,*}
            [ -n "$item" ] && printf '%s\n' "$item"
            [[ $list == *,* ]] && list=${list#*,} || list=""
        fi
    done
}

my_rank() {  # this node's position in the node list (0: the node of the batch step and the runner)
    local me addrs i=0 name
    me=$(hostname -s 2>/dev/null || hostname)
    addrs=" $(hostname -I 2>/dev/null) "  # node lists may give addresses instead of names
    while read -r name; do
        [ "${name%%.*}" = "${me%%.*}" ] && { echo "$i"; return; }
        [[ $addrs == *" $name "* ]] && { echo "$i"; return; }
        i=$((i + 1))
    done < <(node_names)
    echo "${SLURM_NODEID:-${OMPI_COMM_WORLD_NODE_RANK:-0}}"
}

choose_interface() {  # prints "NAME ADDRESS": $iface if it has an IPv4 address, else the default route's
    local name=$iface addr
    addr=$(ip -o -4 addr show dev "$name" 2>/dev/null | awk '{ split($4, a, "/"); print a[1]; exit }')
    if [ -z "$addr" ]; then
        read -r name addr < <(ip -o -4 route get 192.0.2.1 2>/dev/null |
            awk '{ for (i = 1; i < NF; i++) { if ($i == "dev") d = $(i + 1); if ($i == "src") s = $(i + 1) } } END { print d, s }')
        [ -n "$addr" ] && say "no IPv4 address on $iface; using $name ($addr)"
    fi
    [ -n "$addr" ] || { say "no usable network interface (wanted $iface)"; return 1; }
    echo "$name $addr"
}

# Every wait, poll and timeout of the job (the time-limit timer's too) counts ticks: a second
# each, unless C2S_BATCH_TICK_MS (a whole number of milliseconds) says otherwise. The tests run
# whole jobs on short ticks; a job on a cluster has no reason to set it.
tick_ms=${C2S_BATCH_TICK_MS:-1000}
[[ $tick_ms =~ ^[1-9][0-9]{0,5}$ ]] || tick_ms=1000

ticks() {  # $1 ticks, in seconds as sleep takes them
    local ms=$(($1 * tick_ms))
    printf '%d.%03d' $((ms / 1000)) $((ms % 1000))
}

pause() {  # $1 ticks; a sleep that a signal interrupts at once (the trap runs)
    sleep "$(ticks "$1")" &
    wait "$!"
}

pass_env() {  # NAME=VALUE into the instances the runner starts (--cleanenv keeps these)
    export "APPTAINERENV_$1=$2" "SINGULARITYENV_$1=$2"
}

# ---- checks, in the job's first lines: each failure one line naming the fix ------------------
preflight() {
    local bad=0 sif count
    [ -n "$runtime" ] || { say "neither apptainer nor singularity is on PATH: add --module NAME to compose2sif batch"; bad=1; }
    [ -x "$run_dir/run.sh" ] || { say "$run_dir/run.sh is missing: run compose2sif convert -o $run_dir first"; bad=1; }
    for sif in ${sifs[@]+"${sifs[@]}"}; do
        [ -s "$sif" ] || { say "$sif is missing: run $run_dir/run.sh build before submitting"; bad=1; }
    done
    count=$(node_names | awk 'NF' | wc -l)
    if [ "$count" -lt "$nodes" ]; then
        say "the job has $count node(s), this script needs $nodes: submit it unedited (#PJM -L node= / #SBATCH --nodes=)"
        bad=1
    fi
    if [ "$gpus_per_node" -gt 0 ] && command -v nvidia-smi >/dev/null 2>&1; then
        count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
        if [ "$count" -lt "$gpus_per_node" ]; then
            say "this node shows $count GPU(s), the job needs $gpus_per_node: use a group/partition that gives them, or compose2sif batch --gpus-per-node $count"
            bad=1
        fi
    fi
    return "$bad"
}

# ---- the batch step (first node) ---------------------------------------------------------------
launched=""   # the launcher's process (node parts), if any
runner=""     # run.sh up
timer=""      # the job's own TERM before the time limit
ending=0

nodes_stopped() {  # every node part that started has said `stopped`
    local started stopped
    started=$(find "$job_dir" -maxdepth 1 -name 'rank-on-*' 2>/dev/null | wc -l)
    stopped=$(find "$job_dir" -maxdepth 1 -name 'stopped.*' 2>/dev/null | wc -l)
    [ "$stopped" -ge "$started" ]
}

end_job() {  # stop everything, remove the job directory, exit with $1
    [ "$ending" = 1 ] && return
    ending=1
    trap '' TERM INT HUP
    say "stopping the job"
    [ -n "$timer" ] && kill "$timer" 2>/dev/null
    : >"$job_dir/stop"  # every node's keeper stops its Ray node, with the service's grace
    if [ -n "$runner" ] && kill -0 "$runner" 2>/dev/null; then
        kill -TERM "$runner" 2>/dev/null  # the foreground `up` runs `down`: each service's stop_grace_period
    fi
    "$run_dir/run.sh" down >&2  # what `up` left, or all of it if `up` was still starting (it waits its turn)
    [ -n "$runner" ] && wait "$runner" 2>/dev/null
    if [ -n "$launched" ]; then
        local waited=0
        until nodes_stopped || [ "$waited" -ge $((ray_grace * 2 + 15)) ]; do
            pause 1
            waited=$((waited + 1))
        done
        nodes_stopped || say "not every node part said it stopped within $((ray_grace * 2 + 15))s"
        kill -TERM "$launched" 2>/dev/null
        wait "$launched" 2>/dev/null
    fi
    rm -rf -- "$job_dir" "/dev/shm/c2s-ray-$job_id-driver"
    rmdir -- "$submit_dir/.compose2sif-batch" 2>/dev/null
    say "stopped"
    exit "$1"
}

arm_timer() {  # SIGTERM to this step stop_lead seconds before the time limit (any scheduler)
    [ "$elapse_s" -gt "$stop_lead" ] || return 0
    (
        trap 'kill "$nap" 2>/dev/null; exit 0' TERM
        sleep "$(ticks $((elapse_s - stop_lead)))" &
        nap=$!
        wait "$nap" && say "the time limit is ${stop_lead}s away" && kill -TERM $$
    ) &
    timer=$!
}

tunnel_line() {  # how to reach each published port from your machine, through the login node
    local node login entry address port forwards=""
    node=$(hostname -f 2>/dev/null || hostname)
    login=${SLURM_SUBMIT_HOST:-${PJM_O_HOST:-LOGIN-NODE}}
    for entry in ${published[@]+"${published[@]}"}; do
        address=${entry%:*} port=${entry##*:}
        [ "$address" = 0.0.0.0 ] && address=127.0.0.1
        forwards+=" -L $port:$address:$port"
    done
    [ -n "$forwards" ] || return 0
    say "published ports: ${published[*]} on $node"
    say "from your machine: ssh -N$forwards -J ${USER:-you}@$login ${USER:-you}@$node  (then http://localhost:PORT)"
}

wait_for_ray() {  # the head's "ADDRESS IFNAME" once every node joined, passed to the runner's instances
    local waited=0 address ifname
    until [ -s "$job_dir/ray-head" ]; do
        [ -s "$job_dir/failed" ] && return 1
        kill -0 "$launched" 2>/dev/null || { say "the launcher ended before the Ray cluster was up"; return 1; }
        [ "$waited" -ge "$cluster_timeout" ] && { say "no Ray cluster of $nodes nodes after ${cluster_timeout}s"; return 1; }
        pause 2
        waited=$((waited + 2))
    done
    read -r address ifname <"$job_dir/ray-head"
    say "Ray cluster: $nodes nodes, head $address:$ray_port ($ifname)"
    pass_env RAY_ADDRESS "$address:$ray_port"
    pass_env VLLM_HOST_IP "$address"
    pass_env NCCL_SOCKET_IFNAME "$ifname"
    pass_env GLOO_SOCKET_IFNAME "$ifname"
}

driver_node() {  # this node's GPUs join the Ray cluster from inside the Ray service's instance
    local waited=0 address ifname
    read -r address ifname <"$job_dir/ray-head"
    until "$runtime" instance list "$ray_instance" 2>/dev/null | grep -q -- "$ray_instance"; do
        kill -0 "$runner" 2>/dev/null || return 0  # run.sh up ended: the main loop says so
        [ "$waited" -ge "$cluster_timeout" ] && { say "no instance $ray_instance after ${cluster_timeout}s"; return 1; }
        pause 1
        waited=$((waited + 1))
    done
    # its own temp dir: the head's raylet, outside the instance, has its sockets in the head's
    "$runtime" exec instance://"$ray_instance" ray start --address="$address:$ray_port" --node-ip-address="$address" \
        --num-gpus="$gpus_per_node" --disable-usage-stats --temp-dir="/dev/shm/c2s-ray-$job_id-driver" \
        >"$job_dir/driver-node.log" 2>&1 </dev/null &
    if ! wait "$!"; then
        say "the Ray node in instance $ray_instance did not start: $(tail -n 1 "$job_dir/driver-node.log")"
        return 1
    fi
    say "Ray node in instance $ray_instance: the driver's, $gpus_per_node GPU(s)"
}

batch_step() {
    preflight || exit 1
    mkdir -p "$job_dir" && chmod 0700 "$submit_dir/.compose2sif-batch" "$job_dir" || exit 1
    cp -- "${BASH_SOURCE[0]}" "$job_dir/job.sh"
    node_names | awk 'NF' | head -n "$nodes" >"$job_dir/nodes"
    trap 'end_job 143' TERM
    trap 'end_job 130' INT
    trap 'end_job 129' HUP
    arm_timer
    if [ -n "$ray_service" ]; then
        "${launcher[@]}" bash "$job_dir/job.sh" --node "$job_dir" </dev/null &
        launched=$!
        wait_for_ray || { [ -s "$job_dir/failed" ] && say "$(head -n 1 "$job_dir/failed")"; end_job 1; }
    fi
    # the service spanning nodes keeps the node's network as it is (run/lib/isolation.sh): the
    # other nodes' Ray workers reach its binds at this node's address
    [ -n "$ray_service" ] && export C2S_NODE_NETWORK="$ray_service"
    "$run_dir/run.sh" up ${services[@]+"${services[@]}"} </dev/null &
    runner=$!
    tunnel_line
    [ -n "$ray_service" ] && { driver_node || end_job 1; }
    local rc
    while :; do
        if ! kill -0 "$runner" 2>/dev/null; then
            wait "$runner"
            rc=$?
            say "run.sh up ended (exit status $rc)"
            end_job "$rc"
        fi
        [ -s "$job_dir/failed" ] && { say "$(head -n 1 "$job_dir/failed")"; end_job 1; }
        if [ -n "$launched" ] && ! kill -0 "$launched" 2>/dev/null; then
            say "the launcher (${launcher[0]}) ended"
            end_job 1
        fi
        pause 5
    done
}

# ---- a node part: one task per node, started by the launcher ---------------------------------
fail() {  # one line in the job's log and in the job dir (the batch step ends the job)
    say "$*"
    printf '%s\n' "$*" >>"$job_dir/failed"
    exit 1
}

node_part() {
    local host keeper
    host=$(hostname -s 2>/dev/null || hostname)
    mkdir "$job_dir/rank-on-$host" 2>/dev/null ||
        fail "two tasks on $host: the launcher must start one task per node (OpenMPI: --map-by ppr:1:node; srun: --ntasks-per-node=1)"
    # a signal to this task ends the job on every node; the keeper, in its own session, does the stopping
    trap ': >"$job_dir/stop"' TERM INT HUP
    setsid bash "$job_dir/job.sh" --keep "$job_dir" "$$" </dev/null &
    keeper=$!
    while kill -0 "$keeper" 2>/dev/null; do pause 2; done
    wait "$keeper"
}

sif_opts=()
started=()  # sessions the keeper started (setsid): each is a process group of the same id
stopping=0
ray_tmp=""
left_running() {  # any process (zombies aside) still in those sessions?
    local sid
    for sid in ${started[@]+"${started[@]}"}; do
        ps -s "$sid" -o stat= 2>/dev/null | awk '$1 !~ /^Z/ { found = 1 } END { exit !found }' && return 0
    done
    return 1
}
wait_stopped() {  # up to $ray_grace seconds for those sessions to empty
    local waited=0
    while left_running && [ "$waited" -lt "$ray_grace" ]; do
        pause 1
        waited=$((waited + 1))
    done
}
stop_all() {
    [ "$stopping" = 1 ] && return
    stopping=1
    trap '' TERM INT HUP
    local sid
    for sid in ${started[@]+"${started[@]}"}; do kill -TERM -- "-$sid" 2>/dev/null; done  # apptainer unmounts the SIF
    wait_stopped
    for sid in ${started[@]+"${started[@]}"}; do pkill -TERM -s "$sid" 2>/dev/null; done  # stragglers (squashfuse)
    wait_stopped
    for sid in ${started[@]+"${started[@]}"}; do pkill -KILL -s "$sid" 2>/dev/null; done
    wait  # reap what this keeper started
    [ -n "$ray_tmp" ] && rm -rf -- "$ray_tmp"
    say "stopped"
    : >"$job_dir/stopped.$(hostname -s 2>/dev/null || hostname)" 2>/dev/null
}

in_sif() {  # a command in the Ray service's SIF, in its own session, in the background
    setsid "$runtime" exec "$@" &
    started+=("$!")
}

set_sif_opts() {  # the Ray service's environment file (evaluated or not, as the runtime allows), binds, GPUs
    sif_opts=(--cleanenv)
    if "$runtime" exec --help 2>&1 | grep -q -- --no-eval; then
        sif_opts+=(--no-eval --env-file "$ray_env.env")
    else
        sif_opts+=(--env-file "$ray_env.eval.env")
    fi
    [ "$gpus_per_node" -gt 0 ] && sif_opts+=(--nv)
    sif_opts+=(${ray_binds[@]+"${ray_binds[@]}"} --env "VLLM_HOST_IP=$1" --env "NCCL_SOCKET_IFNAME=$2"
        --env "GLOO_SOCKET_IFNAME=$2")
}

ray_nodes() {  # how many nodes the Ray cluster at $1 has
    "$runtime" exec "${sif_opts[@]}" "$ray_sif" ray status --address "$1" 2>/dev/null |
        awk '/^Active:/ { on = 1; next } /^(Pending|Recent failures):/ { on = 0 } on && /node_/ { n++ } END { print n + 0 }'
}

keeper() {
    local task_pid=$3 rank ifname addr waited=0 sid
    trap 'stop_all; exit 143' TERM
    trap 'stop_all; exit 130' INT
    trap 'stop_all; exit 129' HUP
    trap 'stop_all' EXIT
    rank=$(my_rank)
    read -r ifname addr < <(choose_interface) || fail "no network interface for Ray on $(hostname -s)"
    # node-local and short (Ray's AF_UNIX paths are <= 107 bytes); /dev/shm is the host's in every
    # instance, so the runner's vLLM (the Ray driver) finds the head's sockets at the same path
    ray_tmp="/dev/shm/c2s-ray-$job_id"
    set_sif_opts "$addr" "$ifname"
    say "rank $rank of $nodes, $ifname $addr"
    if [ "$rank" = 0 ]; then
        in_sif "${sif_opts[@]}" "$ray_sif" ray start --head --block --node-ip-address="$addr" --port="$ray_port" \
            --num-gpus=0 --include-dashboard=false --disable-usage-stats --temp-dir="$ray_tmp"
        printf '%s\n' "$addr" >"$job_dir/ray-head.address.$BASHPID" && mv "$job_dir/ray-head.address.$BASHPID" "$job_dir/ray-head.address"
        until [ "$(ray_nodes "$addr:$ray_port")" -ge "$nodes" ]; do
            [ "$waited" -ge "$cluster_timeout" ] && fail "the Ray cluster did not reach $nodes nodes in ${cluster_timeout}s"
            kill -0 "${started[0]}" 2>/dev/null || fail "the Ray head exited (its log: $ray_tmp)"
            [ -e "$job_dir/stop" ] && exit 0
            pause 3
            waited=$((waited + 3))
        done
        printf '%s %s\n' "$addr" "$ifname" >"$job_dir/ray-head.$BASHPID" && mv "$job_dir/ray-head.$BASHPID" "$job_dir/ray-head"
    else
        local head
        until [ -s "$job_dir/ray-head.address" ]; do
            [ "$waited" -ge "$cluster_timeout" ] && fail "no Ray head address after ${cluster_timeout}s"
            [ -e "$job_dir/stop" ] && exit 0
            pause 2
            waited=$((waited + 2))
        done
        head=$(cat "$job_dir/ray-head.address")
        in_sif "${sif_opts[@]}" "$ray_sif" ray start --block --address="$head:$ray_port" --node-ip-address="$addr" \
            --num-gpus="$gpus_per_node" --disable-usage-stats --temp-dir="$ray_tmp"
    fi
    # until the job ends: the stop file, this node's task gone (killed by its launcher), or a Ray node exiting
    while :; do
        [ -e "$job_dir/stop" ] && exit 0
        kill -0 "$task_pid" 2>/dev/null || { say "this node's task ended: stopping"; exit 0; }
        for sid in ${started[@]+"${started[@]}"}; do
            kill -0 "$sid" 2>/dev/null || fail "the Ray node on $(hostname -s) exited"
        done
        pause 2
    done
}

case "${1:-}" in
    --node) node_part ;;
    --keep) keeper "$@" ;;
    *) batch_step ;;
esac
