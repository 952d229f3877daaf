set -uo pipefail

# ---- how it runs -----------------------------------------------------------------------------
# The scheduler starts this script once, on the first node (the "batch step"). It copies itself to
# a job directory under the submit directory (shared by the nodes), then starts its per-node part
# (`--node`) on every node through the launcher: srun (Slurm) or mpiexec (PJM). Each node finds its
# rank in the scheduler's node list and its address on the interface named $iface (ib0), or the
# interface of its default route. Node 0 starts the Ray head, waits for every node's worker, then
# the server; the others start Ray workers. A trap in every part stops all it started when the job
# ends, is cancelled (SIGTERM) or a part fails. With one node there is no Ray: vLLM's mp executor.

say() { printf '[c2s-batch %s] %s\n' "$(hostname -s 2>/dev/null || hostname)" "$*" >&2; }

runtime=$(command -v apptainer || command -v singularity) || {
    say "neither apptainer nor singularity is on PATH (module load apptainer?)"
    exit 1
}

pass_env() {  # pass NAME=VALUE into the container; --cleanenv keeps these
    export "APPTAINERENV_$1=$2" "SINGULARITYENV_$1=$2"
}

# the service's environment, from the compose project
# ENVIRONMENT

submit_dir=${PJM_O_WORKDIR:-${SLURM_SUBMIT_DIR:-$PWD}}
job_id=${PJM_JOBID:-${SLURM_JOB_ID:-$$}}
job_dir="$submit_dir/.compose2sif-batch/$job_id"
if [ "${1:-}" = --node ] && [ -n "${2:-}" ]; then
    job_dir=$2  # from the batch step: launchers need not pass the scheduler's environment on
    job_id=${job_dir##*/}
fi

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

my_rank() {  # this node's position in the node list
    if [ -n "${SLURM_NODEID:-}" ]; then
        echo "$SLURM_NODEID"
        return
    fi
    local me addrs i=0 name
    me=$(hostname -s 2>/dev/null || hostname)
    addrs=" $(hostname -I 2>/dev/null) "  # node lists may give addresses instead of names
    while read -r name; do
        [ "${name%%.*}" = "${me%%.*}" ] && { echo "$i"; return; }
        [[ $addrs == *" $name "* ]] && { echo "$i"; return; }
        i=$((i + 1))
    done < <(node_names)
    echo "${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-0}}}"
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

ray_tmp=""
started=()  # sessions this node part started (setsid): each is a process group of the same id
stopping=0
left_running() {  # any process (zombies aside) still in those sessions?
    local sid
    for sid in ${started[@]+"${started[@]}"}; do
        ps -s "$sid" -o stat= 2>/dev/null | awk '$1 !~ /^Z/ { found = 1 } END { exit !found }' && return 0
    done
    return 1
}
wait_stopped() {  # up to $stop_grace seconds for those sessions to empty
    local waited=0
    while left_running && [ "$waited" -lt "$stop_grace" ]; do
        sleep 1
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
    wait  # reap what this part started
    rm -rf "$ray_tmp"
    say "stopped"
}

in_sif() {  # start a command inside the SIF in its own process group, in the background
    setsid "$runtime" "$@" &
    started+=("$!")
}

pause() {  # sleep that a signal interrupts at once (the trap runs)
    sleep "$1" &
    wait "$!"
}

ray_nodes() {  # how many nodes the Ray cluster at $1 has
    "$runtime" exec --cleanenv ${sif_opts[@]+"${sif_opts[@]}"} "$sif" ray status --address "$1" 2>/dev/null |
        awk '/^Active:/ { on = 1; next } /^(Pending|Recent failures):/ { on = 0 } on && /node_/ { n++ } END { print n + 0 }'
}

node_main() {
    trap 'stop_all; exit 143' TERM
    trap 'stop_all; exit 130' INT
    trap 'stop_all; exit 129' HUP
    trap 'stop_all' EXIT
    local rank ifname addr
    rank=$(my_rank)
    read -r ifname addr < <(choose_interface) || exit 1
    ray_tmp="${TMPDIR:-/tmp}/c2s-ray-$job_id"  # node-local and short: Ray's AF_UNIX paths are <= 107 bytes
    say "rank $rank of $nodes, $ifname $addr"
    pass_env VLLM_HOST_IP "$addr"
    pass_env NCCL_SOCKET_IFNAME "$ifname"
    pass_env GLOO_SOCKET_IFNAME "$ifname"
    pass_env RAY_NODE_IP_ADDRESS "$addr"
    local nv=()
    [ "$gpus_per_node" -gt 0 ] && nv=(--nv)
    mkdir -p "$cache_dir"

    if [ "$nodes" -gt 1 ]; then
        local head_file="$job_dir/head-address"
        if [ "$rank" = 0 ]; then
            mkdir -p "$job_dir" && chmod 0700 "$job_dir"
            in_sif exec --cleanenv ${nv[@]+"${nv[@]}"} ${sif_opts[@]+"${sif_opts[@]}"} "$sif" ray start --head --block \
                --node-ip-address="$addr" --port="$ray_port" --num-gpus="$gpus_per_node" \
                --include-dashboard=false --disable-usage-stats --temp-dir="$ray_tmp"
            printf '%s\n' "$addr" >"$head_file.tmp" && mv "$head_file.tmp" "$head_file"
            local waited=0
            until [ "$(ray_nodes "$addr:$ray_port")" -ge "$nodes" ]; do
                [ "$waited" -ge "$cluster_timeout" ] && { say "the Ray cluster did not reach $nodes nodes"; exit 1; }
                kill -0 "${started[0]}" 2>/dev/null || { say "the Ray head exited"; exit 1; }
                pause 3
                waited=$((waited + 3))
            done
            say "Ray cluster: $nodes nodes"
            pass_env RAY_ADDRESS "$addr:$ray_port"
        else
            local waited=0 head
            until [ -s "$head_file" ]; do
                [ "$waited" -ge "$cluster_timeout" ] && { say "no Ray head address after ${cluster_timeout}s"; exit 1; }
                pause 2
                waited=$((waited + 2))
            done
            head=$(cat "$head_file")
            in_sif exec --cleanenv ${nv[@]+"${nv[@]}"} ${sif_opts[@]+"${sif_opts[@]}"} "$sif" ray start --block \
                --address="$head:$ray_port" --node-ip-address="$addr" --num-gpus="$gpus_per_node" \
                --disable-usage-stats --temp-dir="$ray_tmp"
        fi
    fi

    if [ "$rank" = 0 ]; then
        in_sif "${serve_verb[@]}" --cleanenv ${nv[@]+"${nv[@]}"} ${sif_opts[@]+"${sif_opts[@]}"} "$sif" ${serve_args[@]+"${serve_args[@]}"} --host "$addr"
        local server=${started[${#started[@]} - 1]} waited=0
        until curl -fsS -o /dev/null "http://$addr:$port$ready_path" 2>/dev/null; do
            kill -0 "$server" 2>/dev/null || { say "the server exited before it was ready"; exit 1; }
            [ "$waited" -ge "$ready_timeout" ] && { say "the server was not ready after ${ready_timeout}s"; exit 1; }
            pause 5
            waited=$((waited + 5))
        done
        say "ready: http://$addr:$port/v1 (from your machine: ssh -N -L $port:$addr:$port $(hostname -f 2>/dev/null || hostname) via the login node)"
    fi
    # until the job ends: any process this node started exiting ends the node part (and the trap the rest)
    while :; do
        local pgid
        for pgid in ${started[@]+"${started[@]}"}; do
            kill -0 "$pgid" 2>/dev/null || { say "process group $pgid exited"; exit 1; }
        done
        pause 10
    done
}

batch_step() {
    mkdir -p "$job_dir" && chmod 0700 "$submit_dir/.compose2sif-batch" "$job_dir"
    cp -- "${BASH_SOURCE[0]}" "$job_dir/job.sh"
    node_names >"$job_dir/nodes.tmp" && mv "$job_dir/nodes.tmp" "$job_dir/nodes"
    if [ "$nodes" = 1 ]; then
        node_main
        return
    fi
    local launched
    "${launcher[@]}" bash "$job_dir/job.sh" --node "$job_dir" &
    launched=$!
    trap 'kill -TERM "$launched" 2>/dev/null; wait "$launched"; exit 143' TERM INT HUP
    wait "$launched"
}

if [ "${1:-}" = --node ]; then
    node_main
else
    batch_step
fi
