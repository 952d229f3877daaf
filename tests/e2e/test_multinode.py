"""A simulated two-node batch job: the job script from `compose2sif batch` runs a converted project on
two "nodes" (network namespaces joined by a veth pair named ib0 on each side, each with its own host
name), with the environment PJM would set. The batch step runs on node 0: its checks, then one task
per node through the launcher (a STAND-IN here: it asks the test, which starts `job.sh --node` in each
node's namespace, as PJM's pjrsh would), whose keepers run a real Ray (from PyPI, in the test image's
SIF): the head on node 0, a worker on node 1. Then the real runner, `run.sh up`, starts the service:
a STAND-IN for `vllm serve` over Ray (there is no GPU here): llama-server with the tiny model on the
published port, whose command carries the flags `compose2sif batch` reads, after a real Ray driver
(ray.init() in the runner's instance, as vLLM's) joined the job's cluster. SIGTERM to the job's
processes must leave no process on either node and no job directory. A one-node job runs the whole
project without Ray or launcher.

Run under the shared e2e lock:  flock /tmp/c2s-e2e.lock python3 -m pytest -q tests/e2e -k multinode
"""
import hashlib
import json
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from testbed import HERE, NODE_ENV, REPO

pytestmark = pytest.mark.e2e

NODES = [("c2s-node0", "c2s-ns0", "10.250.0.1"), ("c2s-node1", "c2s-ns1", "10.250.0.2")]
JOB_DIR = "/home/hpc/raytest/.compose2sif-batch/4242"
# the STAND-IN for `vllm serve` over Ray: a real Ray driver joins the job's cluster as vLLM's does
# (ray.init() with the RAY_ADDRESS the job gives) and says what it found, then llama-server serves.
# What `compose2sif batch` reads from it (tensor parallel 2 on nodes of 1 GPU: 2 nodes, Ray) follows
# the script, as sh's $0 and $1.
RAY_DRIVER = ("import ray; ray.init(); alive = [n for n in ray.nodes() if n['Alive']]; "
              "print('ray driver joined:', len(alive), 'nodes,', ray.cluster_resources().get('GPU', 0), 'GPUs', "
              "flush=True); ray.shutdown()")
RAY_SERVER = """\
    entrypoint: [sh, -c]
    command:
      - python3 -c "RAY_DRIVER" && exec llama-server -m /models/tiny.gguf -c 2048 -np 4 --port 8000 --host 0.0.0.0
      - --tensor-parallel-size=2
      - --distributed-executor-backend=ray
    deploy:
      resources:
        reservations:
          devices: [{driver: nvidia, count: 1, capabilities: [gpu]}]
""".replace("RAY_DRIVER", RAY_DRIVER)
PLAIN_SERVER = """\
    command: [-m, /models/tiny.gguf, -c, "2048", -np, "4", --port, "8000", --host, 0.0.0.0]
"""
# The image is the test image ray.image, given as a SIF; its name is a vLLM stand-in's so that
# compose2sif reads the service's command as vLLM's (adapters go by the compose image's name).
STACK = """\
name: raytest
services:
  llm:
    image: {registry}/c2s/vllm-standin:test
    x-compose2sif:
      image:
        sif: ./ray.sif
{server}    environment:
      LLAMA_ARG_THREADS: "1"
    ports: ["8000:8000"]
    volumes:
      - ./models:/models:ro
"""
# STAND-IN for mpirun/srun: records the task command for the test to start on each node, then
# stays until the batch step ends it
LAUNCHER_STANDIN = """\
#!/bin/bash
printf '%s\\n' "$*" >/home/hpc/raytest/launch-request
while :; do sleep 1; done
"""


def _sh(*args, check=True, **kw):
    return subprocess.run(list(args), capture_output=True, text=True, check=check, **kw)


@pytest.fixture
def two_nodes():
    """Two network namespaces joined by ib0 <-> ib0."""
    for _, ns, _ in NODES:
        _sh("ip", "netns", "del", ns, check=False)
    for _, ns, _ in NODES:
        _sh("ip", "netns", "add", ns)
    _sh("ip", "link", "add", "c2s-ib-a", "type", "veth", "peer", "name", "c2s-ib-b")
    for (_, ns, addr), end in zip(NODES, ("c2s-ib-a", "c2s-ib-b")):
        _sh("ip", "link", "set", end, "netns", ns)
        _sh("ip", "-n", ns, "link", "set", end, "name", "ib0")
        _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "ib0")
        _sh("ip", "-n", ns, "link", "set", "ib0", "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
    try:
        yield
    finally:
        for _, ns, _ in NODES:
            _sh("ip", "netns", "del", ns, check=False)


def _on_node(node, host, ns, command):
    """argv running COMMAND as hpc on the test bed node, inside network namespace NS, as host HOST."""
    script = f"{NODE_ENV} {command}"
    return ["ip", "netns", "exec", ns, "unshare", "--uts", "--", "sh", "-c", 'hostname "$1" && shift && exec "$@"',
            "-", host, str(HERE / "enter.sh"), str(node.root), str(REPO), "bash", "-c", script]


def _ray_sif(node) -> str:
    """The test image as a SIF, built once per version of its recipe (squashing Ray takes a minute)."""
    key = hashlib.sha256((HERE / "images" / "ray.image").read_bytes()).hexdigest()[:12]
    path = f"/home/hpc/sif-cache/ray-{key}.sif"
    if not (node.home / "sif-cache" / f"ray-{key}.sif").exists():
        node.run(f"mkdir -p ~/sif-cache && apptainer build -F {path}.tmp docker://{node.registry}/c2s/ray:test "
                 f"&& mv {path}.tmp {path}", timeout=900, check=True)
    return path


def _job(node, ray: bool) -> Path:
    """~/raytest on the node: the tiny model, the stack converted and built, and its job.sh."""
    sif = _ray_sif(node)
    stack = node.copy_stack("raytest", "stack")  # for models/ (the tiny model); the compose file is ours
    for item in stack.iterdir():
        if item.name != "models":
            subprocess.run(["rm", "-rf", str(item)], check=True)
    server = RAY_SERVER if ray else PLAIN_SERVER
    (stack / "compose.yaml").write_text(STACK.format(registry=node.registry, server=server))
    (stack / "nodeinf").write_text("".join(f"{host}\n" for host, _, _ in NODES[:2 if ray else 1]))
    (stack / "launcher-standin.sh").write_text(LAUNCHER_STANDIN)
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(stack)], check=True)
    node.run(f"ln -sf {sif} ~/raytest/ray.sif", check=True)
    node.c2s("-f raytest/compose.yaml convert --offline -o raytest/out", check=True)
    node.run("~/raytest/out/run.sh build", check=True, timeout=600)
    rendered = node.c2s("batch --dir raytest/out --scheduler pjm --group test --gpus-per-node 1 "
                        "--launcher 'bash /home/hpc/raytest/launcher-standin.sh' -o raytest/job.sh", check=True)
    assert "WARN" not in rendered.stderr, rendered.stderr
    return stack


def _job_env(nodes: int) -> str:
    """What PJM sets in the job (and CUDA_VISIBLE_DEVICES: the one GPU the stand-in asks for)."""
    env = {"PJM_JOBID": "4242", "PJM_O_WORKDIR": "/home/hpc/raytest", "PJM_O_NODEINF": "/home/hpc/raytest/nodeinf",
           "PJM_MPI_PROC": str(nodes), "CUDA_VISIBLE_DEVICES": "0"}
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())


def _gone(node) -> None:
    """No process is left in either node's network namespace: everything the job started runs there
    (other tests on the shared test bed run as hpc too, outside them). Orphans handed to init are
    reaped by it: a bounded wait."""
    def left():
        pids = [p for _, ns, _ in NODES for p in _sh("ip", "netns", "pids", ns, check=False).stdout.split()]
        return subprocess.run(["ps", "-o", "pid,ppid,sid,stat,args", "-p", ",".join(pids)], capture_output=True,
                              text=True).stdout if pids else ""
    deadline = time.time() + 30
    while left() and time.time() < deadline:
        time.sleep(1)
    assert left() == ""


def _chat(ns) -> None:
    request = json.dumps({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
    answer = _sh("ip", "netns", "exec", ns, "curl", "-fsS", "-m", "60", "http://10.250.0.1:8000/v1/chat/completions",
                 "-H", "Content-Type: application/json", "-d", request)
    assert json.loads(answer.stdout)["choices"][0]["message"]["content"] is not None


def _answers(ns) -> bool:
    return _sh("ip", "netns", "exec", ns, "curl", "-fsS", "-m", "5", "http://10.250.0.1:8000/health",
               check=False).returncode == 0


def test_one_node_job_runs_the_project_and_stops_on_sigterm(node, two_nodes):
    """The whole job script as the scheduler runs it (its batch step): one node, no Ray, no launcher."""
    stack = _job(node, ray=False)
    with open(stack / "node0.log", "w+") as log:
        job = subprocess.Popen(_on_node(node, *NODES[0][:2], f"{_job_env(1)}; cd ~/raytest && exec bash job.sh"),
                               stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 180
            while not _answers(NODES[0][1]):
                assert job.poll() is None and time.time() < deadline, _logs(stack)
                time.sleep(2)
            _chat(NODES[0][1])
            text = (stack / "node0.log").read_text()
            assert "from your machine: ssh -N -L 8000:127.0.0.1:8000 -J hpc@LOGIN-NODE hpc@c2s-node0" in text, text
            assert (stack / ".compose2sif-batch" / "4242" / "nodes").read_text() == "c2s-node0\n"
            assert not [p for p in node.processes() if "ray start" in p or "raylet" in p or "gcs_server" in p]
            # cancelled: SIGTERM to the job's processes (the batch step and its timer subshell). A
            # subshell of the step's (a command substitution: "bash job.sh" too) may end between
            # pgrep and kill: kill's status then says so, and the job's end below is the check
            pids = _sh("pgrep", "-u", node.uid, "-x", "-f", "bash job.sh").stdout.split()
            assert pids, _logs(stack)
            _sh("kill", "-TERM", *pids, check=False)
            job.wait(timeout=90)
            _gone(node)
            assert "stopped" in (stack / "node0.log").read_text()
            assert not (stack / ".compose2sif-batch").exists()
        finally:
            if job.poll() is None:
                job.kill()
            node.kill_all()


def test_two_node_job_runs_ray_then_the_project_and_stops_clean(node, two_nodes):
    stack = _job(node, ray=True)
    logs, parts = [], []

    def start(rank, command):
        host, ns, _ = NODES[rank]
        log = open(stack / f"node{rank}{'' if parts else '-batch'}.log", "w+")
        logs.append(log)
        parts.append(subprocess.Popen(_on_node(node, host, ns, f"{_job_env(2)}; cd ~/raytest && exec {command}"),
                                      stdout=log, stderr=subprocess.STDOUT))

    try:
        start(0, "bash job.sh")
        request = stack / "launch-request"
        deadline = time.time() + 60
        while not request.exists():
            assert parts[0].poll() is None and time.time() < deadline, _logs(stack)
            time.sleep(1)
        assert request.read_text().split() == ["bash", f"{JOB_DIR}/job.sh", "--node", JOB_DIR]
        for rank in (0, 1):  # what pjrsh does for the launcher: the task on each node
            start(rank, request.read_text().strip())
        deadline = time.time() + 300
        while not _answers(NODES[1][1]):  # from node 1, across ib0, the published port on node 0
            assert all(p.poll() is None for p in parts), _logs(stack)
            assert time.time() < deadline, "the server never answered\n" + _logs(stack)
            time.sleep(2)
        _chat(NODES[1][1])
        batch_log = (stack / "node0-batch.log").read_text()
        assert "Ray cluster: 2 nodes, head 10.250.0.1:6379 (ib0)" in batch_log, batch_log
        # the driver in the runner's instance joined: the head (no GPU), node 1's worker and the
        # first node's GPU from inside that instance
        served = node.run("~/raytest/out/run.sh logs llm", check=True).stdout
        assert "ray driver joined: 3 nodes, 2.0 GPUs" in served, served + batch_log

        # the job is cancelled: the scheduler sends SIGTERM to the job's processes on every node
        pids = _sh("pgrep", "-u", node.uid, "-f", "job.sh").stdout.split()
        _sh("kill", "-TERM", *pids)
        for part in parts:
            part.wait(timeout=120)
        _gone(node)
        text = _logs(stack)
        assert "[c2s-batch c2s-node1] stopped" in text and "[c2s-batch c2s-node0] stopped" in text, text
        assert not (stack / ".compose2sif-batch").exists()
    finally:
        for part in parts:
            if part.poll() is None:
                part.kill()
        for log in logs:
            log.close()
        node.kill_all()


def _logs(stack: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(stack.glob("node*.log")))
