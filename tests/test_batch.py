"""`compose2sif batch`: PJM and Slurm job scripts that run a converted project (the runner `run.sh up`)
for the length of a job, with Ray workers on the other nodes where a vLLM service spans nodes.

The scripts must pass `bash -n` and shellcheck, carry every value as one quoted word, write what the
scheduler and the site accept, and refuse what they would reject. The generated script is also run
whole, as the scheduler runs it, under STAND-INS named as such (this machine has no PJM, Slurm, GPU
or vLLM): a stand-in runner, apptainer, launcher and hostname. Where Debian's OpenMPI is installed,
the real mpirun places the ranks from a machinefile, through a pjrsh stand-in.
The stacks themselves must load exactly as Docker Compose loads them."""
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import compose2sif_forked, shellcheck_passes
from oracle import base_env, differences, oracle_mark, run_oracle, run_ours

REPO = Path(__file__).resolve().parent.parent
STACKS = REPO / "stacks"
TP4 = STACKS / "vllm-tp" / "qwen3-32b-tp4" / "compose.yaml"
PP2 = STACKS / "vllm-tp" / "llama-70b-tp4-pp2" / "compose.yaml"
CHAT = STACKS / "llm-chat" / "compose.yaml"
CI = bool(os.environ.get("CI"))


def c2s(*args, cwd=REPO, env=None):
    return compose2sif_forked(list(args), cwd, {**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def converted(tmp_path: Path, compose: Path, env=None) -> Path:
    """`convert --offline` of COMPOSE, with a placeholder file for every SIF (nothing here is built)."""
    out = tmp_path / ("out-" + compose.parent.name)
    proc = c2s("-f", str(compose), "convert", "--offline", "-o", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    for image in json.loads((out / "plan.json").read_text())["images"].values():
        (out / image["sif"]).write_text("placeholder, not a SIF\n")
    return out


def render(out: Path, scheduler, *extra, expect=0):
    job = out.parent / f"job-{scheduler}.sh"
    proc = c2s("batch", "--dir", str(out), "--scheduler", scheduler, "-o", str(job), *extra, cwd=out.parent)
    assert proc.returncode == expect, proc.stderr
    return (job.read_text() if expect == 0 else ""), proc.stderr


def values(script: str, *names) -> dict:
    """The header's NAME=VALUE assignments, as bash reads them."""
    dump = "; ".join(f'printf "%s\\0" {n} "${{#{n}[@]}}" "${{{n}[@]}}"' for n in names)
    header = script.split("set -uo pipefail")[0]
    raw = subprocess.run(["bash", "-c", header + "\n" + dump], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"], "PJM_MPI_PROC": "2", "PJM_O_NODEINF": "/x/nodeinf"}).stdout
    words, out = raw.split("\0")[:-1], {}
    while words:
        name, count = words[0], int(words[1])
        out[name], words = words[2:2 + count], words[2 + count:]
    return out


def shellcheck(text: str, tmp_path: Path) -> None:
    assert subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True).returncode == 0
    if shutil.which("shellcheck") is None:
        if CI:
            pytest.fail("shellcheck is not installed")
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    script = tmp_path / "check.sh"
    # the job's paths (under tmp_path) the same in every session, so that a pass is remembered
    script.write_text(text.replace(str(tmp_path), "/tmp/c2s-shellcheck"))
    shellcheck_passes([script])


# ---- what is written ---------------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", ["pjm", "slurm"])
def test_a_whole_project_is_one_job_on_one_node(tmp_path, scheduler):
    out = converted(tmp_path, CHAT)
    text, stderr = render(out, scheduler, "--group", "gpu-grp", "--elapse", "2:30:00", "--module", "apptainer")
    lines = text.splitlines()
    if scheduler == "pjm":
        for line in ("#PJM -L rscgrp=gpu-grp", "#PJM -L node=1", "#PJM -L gpu=4", "#PJM -L elapse=2:30:00"):
            assert line in lines
        assert not [line for line in lines if line.startswith("#PJM --mpi")]  # one node: no launcher
    else:
        for line in ("#SBATCH --partition=gpu-grp", "#SBATCH --nodes=1", "#SBATCH --gpus-per-node=4",
                     "#SBATCH --time=2:30:00", f"#SBATCH --job-name={json.loads((out / 'plan.json').read_text())['project']}"):
            assert line in lines
        assert [line for line in lines if line.startswith("#SBATCH --signal=B:TERM@")]
    got = values(text, "nodes", "run_dir", "services", "sifs", "published", "ray_service", "elapse_s")
    plan = json.loads((out / "plan.json").read_text())
    assert got["nodes"] == ["1"] and got["run_dir"] == [str(out)] and got["services"] == []  # all of them
    assert got["ray_service"] == [""] and got["elapse_s"] == ["9000"]
    assert sorted(got["sifs"]) == sorted({str(out / i["sif"]) for i in plan["images"].values()})
    # where a node's clients reach them: a forwarder's address, as written (each service on its own)
    published = {p["forward"] or f"{p['address']}:{p['host']}" for s in plan["services"] for p in s["ports"]
                 if p["published"]}
    assert published == {"0.0.0.0:8080"} and set(got["published"]) == published
    assert "    module load apptainer" in lines
    shellcheck(text, tmp_path)


@pytest.mark.parametrize("scheduler", ["pjm", "slurm"])
def test_named_services_are_what_run_sh_up_is_given(tmp_path, scheduler):
    out = converted(tmp_path, CHAT)
    text, _ = render(out, scheduler, "--group", "g", "api")
    got = values(text, "services", "sifs")
    assert got["services"] == ["api"]
    plan = {s["name"]: s for s in json.loads((out / "plan.json").read_text())["services"]}
    assert len(got["sifs"]) < len(plan)  # only what api needs (and what it depends on)
    _, stderr = render(out, scheduler, "--group", "g", "no-such", expect=1)
    assert "no service 'no-such'" in stderr and stderr.count("\n") == 1


def test_flow_two_nodes_openmpi_through_pjrsh(tmp_path):
    out = converted(tmp_path, PP2)
    text, stderr = render(out, "pjm", "--site", "flow", "--group", "cx-small", "--elapse", "4:00:00")
    lines = text.splitlines()
    for line in ("#PJM -L rscgrp=cx-small", "#PJM -L node=2", "#PJM --mpi proc=2",
                 "export OMPI_MCA_plm_rsh_agent=/bin/pjrsh"):
        assert line in lines, text[:1500]
    assert not [line for line in lines if line.startswith("#PJM -L gpu=")]  # whole nodes outside cx-share
    assert "--group cx-small: not in site flow's table" in stderr
    got = values(text, "nodes", "launcher", "ray_service", "ray_binds", "ray_grace")
    assert got["nodes"] == ["2"] and got["ray_service"] == ["vllm"] and got["ray_grace"] == ["10"]
    # PJM's variables are expanded when the job runs: here PJM_MPI_PROC=2, PJM_O_NODEINF=/x/nodeinf
    assert got["launcher"] == ["mpirun", "-np", "2", "-machinefile", "/x/nodeinf", "--map-by", "ppr:1:node"]
    assert any(b.endswith("/models:/models:ro") for b in got["ray_binds"])
    shellcheck(text, tmp_path)
    # cx-share takes gpu= but holds one node: a 2-node job is refused there, a 1-node job gets gpu=4
    _, stderr = render(out, "pjm", "--site", "flow", "--group", "cx-share", expect=1)
    assert "--group cx-share holds at most 1 node(s), the job needs 2" in stderr and stderr.count("\n") == 1
    text, _ = render(converted(tmp_path, TP4), "pjm", "--site", "flow", "--group", "cx-share")
    assert "#PJM -L gpu=4" in text.splitlines()


def test_fujitsu_mpi_and_a_launcher_given_as_shell_words(tmp_path):
    out = converted(tmp_path, PP2)
    text, _ = render(out, "pjm", "--group", "g", "--mpi", "fujitsu")
    assert "#PJM --mpi rank-map-bynode" in text.splitlines()
    assert values(text, "launcher")["launcher"] == ["mpiexec", "-n", "2"]
    text, _ = render(out, "pjm", "--group", "g", "--launcher",
                     """mpirun -np $PJM_MPI_PROC --hostfile ${PJM_O_NODEINF} -x "A B" --map-by 'ppr:1:node'""")
    assert values(text, "launcher")["launcher"] == ["mpirun", "-np", "2", "--hostfile", "/x/nodeinf", "-x", "A B",
                                                    "--map-by", "ppr:1:node"]
    _, stderr = render(out, "pjm", "--group", "g", "--mpi", "srun", expect=1)
    assert "--mpi srun is for slurm" in stderr


def test_slurm_two_nodes_srun_and_what_sinfo_says(tmp_path):
    out = converted(tmp_path, PP2)
    text, _ = render(out, "slurm")
    assert values(text, "launcher")["launcher"] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                                                    "--kill-on-bad-exit=1"]
    # a STAND-IN for sinfo (the login node's view of the partitions) decides what sbatch would reject
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    standin = bin_dir / "sinfo"
    path = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def sinfo(rows):
        standin.write_text(f"#!/bin/sh\n# STAND-IN for sinfo -h -o '%P %D %G'\nprintf '{rows}'\n")
        standin.chmod(0o755)

    sinfo(r"debug* 2 (null)\ngpu 1 gpu:4\n")
    job = tmp_path / "j.sh"
    proc = c2s("batch", "--dir", str(out), "--scheduler", "slurm", "-o", str(job), env=path)
    assert proc.returncode == 1 and "partition debug defines no GPU gres" in proc.stderr, proc.stderr
    assert "--gpus-per-node 0" in proc.stderr and proc.stderr.count("\n") == 1
    proc = c2s("batch", "--dir", str(out), "--scheduler", "slurm", "--group", "gpu", "-o", str(job), env=path)
    assert proc.returncode == 1 and "partition gpu has 1 node(s), the job needs 2" in proc.stderr, proc.stderr
    proc = c2s("batch", "--dir", str(out), "--scheduler", "slurm", "--group", "nope", "-o", str(job), env=path)
    assert proc.returncode == 1 and "no such Slurm partition" in proc.stderr
    sinfo(r"gpu* 2 gpu:4\n")
    proc = c2s("batch", "--dir", str(out), "--scheduler", "slurm", "-o", str(job), env=path)
    assert proc.returncode == 0 and "#SBATCH --gpus-per-node=4" in job.read_text().splitlines()


def test_checks_before_the_job_each_one_line_naming_the_fix(tmp_path):
    out = converted(tmp_path, PP2)
    (out / "sif" / "vllm-v100.sif").unlink()
    _, stderr = render(out, "slurm", expect=1)
    assert "vllm-v100.sif is missing: run" in stderr and "run.sh build first" in stderr
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    _, stderr = render(tmp_path / "nothing-here", "slurm", expect=1)
    assert "plan.json is missing: run `compose2sif convert" in stderr
    out = converted(tmp_path, TP4)
    _, stderr = render(out, "slurm", "--nodes", "2", expect=1)
    assert "no service spans nodes" in stderr
    _, stderr = render(out, "slurm", "--elapse", "90 minutes", expect=1)
    assert "--elapse" in stderr
    _, stderr = render(out, "slurm", "--job-output", "x.out\nrm -rf ~", expect=1)
    assert "--job-output" in stderr and "Traceback" not in stderr
    _, stderr = render(out, "pjm", expect=1)
    assert "rscgrp" in stderr


@oracle_mark()
@pytest.mark.parametrize("scheduler", ["pjm", "slurm"])
def test_dify_plus_vllm_is_one_job(tmp_path, scheduler):
    """With a copy of Dify 1.17.1's docker/ directory standing in for the user's checkout."""
    dify = REPO.parent / "shared" / "reference" / "dify-1.17.1"
    if not dify.is_dir():
        raise AssertionError(f"{dify} is missing: ../shared must be beside the repository")
    shutil.copytree(dify, tmp_path / "docker")
    (tmp_path / "docker" / ".env").write_text("SSRF_PROXY_ALLOW_PRIVATE_IPS=192.0.2.0/24\n")  # the user's .env
    shutil.copytree(STACKS / "vllm-tp", tmp_path / "stacks" / "vllm-tp")
    shutil.copytree(STACKS / "dify-vllm", tmp_path / "stacks" / "dify-vllm")
    out = converted(tmp_path, tmp_path / "stacks" / "dify-vllm" / "compose.yaml",
                    env={"DIFY_DOCKER_DIR": str(tmp_path / "docker")})
    text, _ = render(out, scheduler, "--group", "g")
    plan = json.loads((out / "plan.json").read_text())
    names = {s["name"] for s in plan["services"]}
    assert {"vllm", "api", "worker", "web", "nginx", "sandbox"} <= names, names
    got = values(text, "nodes", "services", "sifs")
    assert got["nodes"] == ["1"] and got["services"] == []
    assert len(got["sifs"]) == len({s["image"] for s in plan["services"]})
    shellcheck(text, tmp_path)


# ---- the script's helpers, under a scheduler's environment -------------------------------------

def _helpers(text: str, env: dict, call: str, args=()) -> str:
    """Run one of the job script's shell functions with a scheduler's environment and the script's ARGS."""
    functions = text.split("set -uo pipefail")[1].rsplit('\ncase "${1:-}" in\n    --node)', 1)[0]
    proc = subprocess.run(["bash", "-c", text.split("set -uo pipefail")[0] + functions + "\n" + call, "job.sh",
                           *args], capture_output=True, text=True, env={"PATH": os.environ["PATH"], **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_node_lists_and_ranks_come_from_the_scheduler(tmp_path):
    text, _ = render(converted(tmp_path, PP2), "slurm")
    hostname = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    slurm = _helpers(text, {"SLURM_JOB_NODELIST": "gpu[008-010,012],login1,x[1-2]"}, "node_names")
    assert slurm.split() == ["gpu008", "gpu009", "gpu010", "gpu012", "login1", "x1", "x2"]
    nodeinf = tmp_path / "nodeinf"
    nodeinf.write_text(f"other1\n{hostname}.example.org\n")
    assert _helpers(text, {"PJM_O_NODEINF": str(nodeinf)}, "my_rank").strip() == "1"
    addresses = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    if addresses:  # a node list of addresses (some PJM sites)
        nodeinf.write_text(f"198.51.100.1\n198.51.100.2\n{addresses[0]}\n")  # TEST-NET-2: not ours
        assert _helpers(text, {"PJM_O_NODEINF": str(nodeinf)}, "my_rank").strip() == "2"
    job_dir = tmp_path / "submit" / ".compose2sif-batch" / "123.pjm"
    job_dir.mkdir(parents=True)
    (job_dir / "nodes").write_text(f"head-node\n{hostname}\n")
    out = _helpers(text, {}, 'echo "$job_dir $job_id $(my_rank)"', ["--node", str(job_dir)])
    assert out.split() == [str(job_dir), "123.pjm", "1"]


def test_interface_by_name_with_a_fallback(tmp_path):
    text, _ = render(converted(tmp_path, PP2), "pjm", "--group", "g")
    name, addr = _helpers(text, {}, "iface=lo; choose_interface").split()
    assert (name, addr) == ("lo", "127.0.0.1")
    fallback = subprocess.run(["bash", "-c", "ip -o -4 route get 192.0.2.1"], capture_output=True, text=True)
    if fallback.returncode != 0:
        pytest.skip("this machine has no default route to fall back to")
    name, addr = _helpers(text, {}, "iface=no-such-if0; choose_interface 2>/dev/null").split()
    assert f"dev {name}" in fallback.stdout and f"src {addr}" in fallback.stdout


# ---- the whole script, run as the scheduler runs it, under stand-ins ---------------------------

STANDIN_HOSTNAME = """#!/bin/bash
# STAND-IN for hostname: each simulated node's task has C2S_STANDIN_HOST (no -I addresses)
case "${1:-}" in -I) echo ;; *) echo "${C2S_STANDIN_HOST:?}" ;; esac
"""

# Plays a Ray node: `ray start --block` stays up, joins by a file, and takes 0.2 s to stop on SIGTERM
# (a grace the keeper must wait for: two ticks, TICK_MS); `ray status` counts the joined nodes.
STANDIN_APPTAINER = r"""#!/bin/bash
# STAND-IN for apptainer: only what the job script calls on the Ray service's SIF
rec=${C2S_STANDIN_DIR:?}
case "$*" in
    "exec --help") echo "      --no-eval   do not shell evaluate env vars" ; exit 0 ;;
esac
args=" $* "
if [[ $args == " instance list "* ]]; then  # the runner's instance: there once the runner's `up` began
    grep -q '^up \[' "$rec/events" 2>/dev/null && echo "$3"
    exit 0
fi
if [[ $args == " exec instance://"* ]]; then  # a Ray node in the runner's instance: `ray start` returns
    printf '%s\n' "$*" >"$rec/ray-args.instance"
    echo "node in ${2#instance://} started" >>"$rec/events"
    exit 0
fi
if [[ $args == *" ray status "* ]]; then
    echo "Active:"; for f in "$rec"/joined.*; do [ -e "$f" ] && echo " 1 node_${f##*.}"; done; echo "Pending:"
    exit 0
fi
if [[ $args == *" ray start "* ]]; then
    host=$(hostname -s)
    role=worker; [[ $args == *" --head "* ]] && role=head
    printf '%s\n' "$*" >"$rec/ray-args.$host"
    trap 'sleep 0.2; echo "$role on $host stopped after SIGTERM" >>"$rec/events"; rm -f "$rec/joined.$host"; exit 0' TERM
    : >"$rec/joined.$host"
    echo "$role on $host started" >>"$rec/events"
    while :; do sleep 0.2; done
fi
echo "unexpected: $*" >>"$rec/events"; exit 1
"""

STANDIN_RUNNER = r"""#!/bin/bash
# STAND-IN for the converted project's run.sh: `up` in the foreground until SIGTERM, `down`
rec=${C2S_STANDIN_DIR:?}
case "$1" in
    up)
        echo "up [${*:2}] RAY_ADDRESS=${APPTAINERENV_RAY_ADDRESS:-} VLLM_HOST_IP=${APPTAINERENV_VLLM_HOST_IP:-}" >>"$rec/events"
        trap 'echo "up stopped by SIGTERM" >>"$rec/events"; exit 0' TERM
        while :; do sleep 0.2; done ;;
    down) echo "down" >>"$rec/events" ;;
esac
"""

# Plays OpenMPI's mpirun under PJM: one task per node of the machinefile (or, with
# C2S_STANDIN_PACK=1, every task on the first node, as OpenMPI did without --map-by ppr:1:node),
# and on SIGTERM kills its tasks with SIGKILL 1 s later.
STANDIN_MPIRUN = r"""#!/bin/bash
# STAND-IN for mpirun -np N -machinefile FILE --map-by ppr:1:node COMMAND...
n=$2 file=$4; shift 6
mapfile -t hosts < <(awk 'NF { print $1 }' "$file")
pids=()
for ((i = 0; i < n; i++)); do
    host=${hosts[i]}; [ "${C2S_STANDIN_PACK:-0}" = 1 ] && host=${hosts[0]}
    C2S_STANDIN_HOST=$host OMPI_COMM_WORLD_RANK=$i "$@" &
    pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null; sleep 1; kill -KILL "${pids[@]}" 2>/dev/null; exit 143' TERM
wait
"""


STANDIN_PJRSH = r"""#!/bin/bash
# STAND-IN for PJM's pjrsh HOST COMMAND: runs OpenMPI's orted here, as simulated node HOST, with a
# temporary directory of its own as a node has (OpenMPI's session directory is made there: mpirun
# and an orted making the same one on this one machine race, and one fails with "File exists")
host=$1
shift
tmp=$(mktemp -d) || exit 1
trap 'rm -rf -- "$tmp"' EXIT
C2S_STANDIN_HOST=$host TMPDIR=$tmp bash -c "$*"
"""

OPENMPI = shutil.which("mpirun") and "Open MPI" in subprocess.run(
    ["mpirun", "--version"], capture_output=True, text=True).stdout
FLOW_DOCUMENTED = "mpirun -np $PJM_MPI_PROC -machinefile $PJM_O_NODEINF"  # without --map-by ppr:1:node


# the job's waits and polls count ticks of this many ms (a second each on a cluster): the job's own
# timing, on a tenth of the time
TICK_MS = 100


def _standin_job(tmp_path, pack=False, openmpi=False):
    """A converted 2-node project (the plan of PP2) with stand-ins on PATH, and the job's environment.
    PACK: the launcher puts both tasks on the first node. OPENMPI: Debian's real mpirun, through a
    stand-in pjrsh, instead of the mpirun stand-in."""
    out = converted(tmp_path, PP2)
    (out / "run.sh").write_text(STANDIN_RUNNER)
    (out / "run.sh").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    standins = [("hostname", STANDIN_HOSTNAME), ("apptainer", STANDIN_APPTAINER)]
    standins.append(("pjrsh", STANDIN_PJRSH) if openmpi else ("mpirun", STANDIN_MPIRUN))
    for name, text in standins:
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    extra = ["--launcher", FLOW_DOCUMENTED] if pack and openmpi else []
    job_text, _ = render(out, "pjm", "--group", "g", "--interface", "lo", *extra)
    # 20 s (on TICK_MS ticks) for the Ray cluster, not 10 minutes: a broken job fails the test soon
    job_text = job_text.replace("cluster_timeout=600", "cluster_timeout=200")
    # the stack's grace (10 ticks, 1 s) outlasts the Ray stand-in's 0.2 s stop five times; the job's
    # wait (2 graces + 15 ticks) for node parts that a launcher killed before they could say so is 3.5 s
    assert "\nray_grace=10  #" in job_text
    job_text = job_text.replace("OMPI_MCA_plm_rsh_agent=/bin/pjrsh", f"OMPI_MCA_plm_rsh_agent={bin_dir}/pjrsh")
    job = tmp_path / "job.sh"
    job.write_text(job_text)
    submit = tmp_path / "submit"
    submit.mkdir()
    (submit / "nodeinf").write_text("node0\nnode1\n")
    rec = tmp_path / "rec"
    rec.mkdir()
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "C2S_STANDIN_DIR": str(rec),
           "C2S_STANDIN_HOST": "node0", "C2S_STANDIN_PACK": "1" if pack else "0",
           "PJM_JOBID": "77", "PJM_O_WORKDIR": str(submit), "PJM_O_NODEINF": str(submit / "nodeinf"),
           "PJM_MPI_PROC": "2", "C2S_BATCH_TICK_MS": str(TICK_MS)}
    if openmpi and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return job, submit, rec, env


def _launchers():
    return [pytest.param(False, id="standin-mpirun"),
            pytest.param(True, id="openmpi", marks=pytest.mark.skipif(
                not OPENMPI and not CI, reason="Open MPI is not installed (apt-get install openmpi-bin)"))]


def _nothing_left(session: int, within: float = 0) -> None:
    """No process of the job's session (the scheduler's view of the job) is left, zombies aside,
    WITHIN seconds of the job's end."""
    deadline = time.time() + within
    while True:
        left = subprocess.run(["ps", "-s", str(session), "-o", "pid=,stat=,args="], capture_output=True, text=True)
        alive = [line for line in left.stdout.splitlines() if " Z" not in line]
        if not alive or time.time() >= deadline:
            break
        time.sleep(0.1)
    assert alive == [], left.stdout


def _wait_for(predicate, seconds, what):
    deadline = time.time() + seconds
    while not predicate():
        assert time.time() < deadline, what()
        time.sleep(0.2)


@pytest.mark.parametrize("openmpi", _launchers())
def test_two_node_job_runs_ray_then_the_runner_and_stops_every_node_on_term(tmp_path, openmpi):
    """Cancelled: SIGTERM to every process of the job. OpenMPI's mpirun (and its stand-in) kill the
    tasks with SIGKILL 1 s later; the keepers still stop each Ray node with its grace."""
    job, submit, rec, env = _standin_job(tmp_path, openmpi=openmpi)
    log = tmp_path / "job.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(["bash", str(job)], stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # the job's process group, as the scheduler makes it
    events = rec / "events"
    try:
        _wait_for(lambda: events.exists() and "up [" in events.read_text(), 30,
                  lambda: log.read_text() + (events.read_text() if events.exists() else ""))
        text = events.read_text()
        assert "head on node0 started" in text and "worker on node1 started" in text
        assert "up [] RAY_ADDRESS=127.0.0.1:6379 VLLM_HOST_IP=127.0.0.1" in text  # the runner's instances get it
        assert "--address=127.0.0.1:6379" in (rec / "ray-args.node1").read_text()
        assert "/models:/models:ro" in (rec / "ray-args.node0").read_text()
        assert "--num-gpus=0" in (rec / "ray-args.node0").read_text()  # the head: its node's GPUs join below
        # the driver's node: in the Ray service's instance (a Ray driver finds its node among the
        # raylets it sees), with the first node's GPUs
        _wait_for(lambda: "node in vllm-llama-70b-vllm started" in events.read_text(), 10, events.read_text)
        driver = (rec / "ray-args.instance").read_text().split()
        assert driver[:4] == ["exec", "instance://vllm-llama-70b-vllm", "ray", "start"], driver
        assert "--address=127.0.0.1:6379" in driver and "--num-gpus=4" in driver, driver
        _wait_for(lambda: "from your machine: ssh -N -L 8000:127.0.0.1:8000 -J" in log.read_text(), 10, log.read_text)
        assert "Ray cluster: 2 nodes" in log.read_text()
        job_dir = submit / ".compose2sif-batch" / "77"
        assert sorted(p.name for p in job_dir.glob("rank-on-*")) == ["rank-on-node0", "rank-on-node1"]
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        text = events.read_text()
        assert "head on node0 stopped after SIGTERM" in text and "worker on node1 stopped after SIGTERM" in text, text
        assert "up stopped by SIGTERM" in text and "\ndown\n" in text
        assert not (submit / ".compose2sif-batch").exists()  # the job dir is gone
        assert "stopped" in log.read_text().splitlines()[-1]
        # OpenMPI's daemons end a moment after mpirun: the pjrsh stand-in runs them on this machine, in
        # the job's session (on a cluster they run on the nodes, where pjrsh reached)
        _nothing_left(proc.pid, within=15 if openmpi else 0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("openmpi", _launchers())
def test_two_tasks_on_one_node_stop_the_job_with_one_line(tmp_path, openmpi):
    """With OpenMPI: Flow's documented mpirun line, which fills the first node's slots first."""
    job, submit, rec, env = _standin_job(tmp_path, pack=True, openmpi=openmpi)
    proc = subprocess.run(["bash", str(job)], capture_output=True, text=True, env=env, timeout=60,
                          start_new_session=True)
    assert proc.returncode == 1
    assert "two tasks on node0: the launcher must start one task per node (OpenMPI: --map-by ppr:1:node" \
        in proc.stderr, proc.stderr
    assert not (submit / ".compose2sif-batch").exists()
    assert "up [" not in (rec / "events").read_text() if (rec / "events").exists() else True
    assert subprocess.run(["pgrep", "-f", str(job)], capture_output=True).stdout == b""


def test_missing_sif_stops_the_job_in_its_first_lines(tmp_path):
    job, submit, rec, env = _standin_job(tmp_path)
    (Path(values(job.read_text(), "sifs")["sifs"][0])).unlink()
    proc = subprocess.run(["bash", str(job)], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 1 and "vllm-v100.sif is missing: run" in proc.stderr, proc.stderr
    assert not rec.joinpath("events").exists() and not (submit / ".compose2sif-batch").exists()


def test_the_job_stops_itself_before_its_time_limit(tmp_path):
    job, submit, rec, env = _standin_job(tmp_path)
    text = job.read_text()
    # 30 ticks (3 s) before the stop lead runs out: the runner is up by then
    job.write_text(text.replace("elapse_s=3600", "elapse_s=150", 1))
    proc = subprocess.run(["bash", str(job)], capture_output=True, text=True, env=env, timeout=90)
    assert "the time limit is 120s away" in proc.stderr, proc.stderr
    assert "up stopped by SIGTERM" in (rec / "events").read_text()
    assert not (submit / ".compose2sif-batch").exists()


# ---- the stacks load as Docker Compose loads them ----------------------------------------------

@oracle_mark()
@pytest.mark.parametrize("compose", [TP4, PP2], ids=["tp4", "tp4-pp2"])
def test_stacks_load_as_docker_compose_loads_them(tmp_path, compose):
    work = tmp_path / compose.parent.name
    shutil.copytree(compose.parent, work)
    env = base_env({})
    rc_theirs, theirs, err = run_oracle([], work, env)
    assert rc_theirs == 0, err
    rc_ours, ours, err = run_ours([], work, env)
    assert rc_ours == 0, err
    assert differences(ours, theirs) == []


@oracle_mark()
@pytest.mark.parametrize("name", ["compose.yaml", "compose.remote.yaml"])
def test_dify_vllm_loads_as_docker_compose_loads_it(tmp_path, name):
    """With a copy of Dify 1.17.1's docker/ directory standing in for the user's checkout."""
    dify = REPO.parent / "shared" / "reference" / "dify-1.17.1"
    if not dify.is_dir():
        raise AssertionError(f"{dify} is missing: ../shared must be beside the repository")
    shutil.copytree(dify, tmp_path / "docker")
    # the user's .env, copied from .env.example, with an allow-list of its own
    (tmp_path / "docker" / ".env").write_text("SSRF_PROXY_ALLOW_PRIVATE_IPS=192.0.2.0/24\n")
    shutil.copytree(STACKS / "vllm-tp", tmp_path / "stacks" / "vllm-tp")
    shutil.copytree(STACKS / "dify-vllm", tmp_path / "stacks" / "dify-vllm")
    work = tmp_path / "stacks" / "dify-vllm"
    env = base_env({"DIFY_DOCKER_DIR": str(tmp_path / "docker")})
    rc_theirs, theirs, err = run_oracle(["-f", name], work, env)
    assert rc_theirs == 0, err
    rc_ours, ours, err = run_ours(["-f", name], work, env)
    assert rc_ours == 0, err
    assert differences(ours, theirs) == []
    assert ("vllm" in ours["services"]) == (name == "compose.yaml")
    allowed = ours["services"]["ssrf_proxy"]["environment"]["SSRF_PROXY_ALLOW_PRIVATE_IPS"]
    assert allowed == ""  # dify-vllm.env, read after Dify's .env, has the last word (see its comments)
