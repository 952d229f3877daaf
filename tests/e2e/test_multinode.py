"""A simulated two-node batch job: the job script from `compose2sif batch` runs its per-node part on
two "nodes" (network namespaces joined by a veth pair named ib0 on each side, each with its own
host name), with the environment PJM or Slurm would set. Each node runs a real Ray (from PyPI,
inside the test image's SIF): the head on node 0, a worker on node 1. On the head, llama-server
with the tiny model is a STAND-IN for `vllm serve` (there is no GPU here): the job starts it the way
it starts vLLM, with the same arguments handling and readiness wait. SIGTERM to the job must leave
no process on either node. A one-node job runs the whole script, as the scheduler does.

Run under the shared e2e lock:  flock /tmp/c2s-e2e.lock python3 -m pytest -q tests/e2e -k multinode
"""
import hashlib
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import HERE, REPO

pytestmark = pytest.mark.e2e

NODES = [("c2s-node0", "c2s-ns0", "10.250.0.1"), ("c2s-node1", "c2s-ns1", "10.250.0.2")]
STACK = """\
name: raytest
services:
  llm:
    image: {registry}/c2s/ray:test
    x-compose2sif:
      image:
        sif: ./ray.sif
    # llama-server stands in for `vllm serve`: the job script starts it like vLLM, on the Ray head
    command: [-m, /models/tiny.gguf, -c, "2048", -np, "4", --port, "8000", --host, 127.0.0.1]
    environment:
      LLAMA_ARG_THREADS: "1"
    volumes:
      - ./models:/models:ro
    healthcheck:
      test: [CMD, curl, -f, http://localhost:8000/health]
      start_period: 2m
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
    script = f"export APPTAINER_NOHTTPS=1 PYTHONPATH=/work PYTHONDONTWRITEBYTECODE=1; {command}"
    return ["ip", "netns", "exec", ns, "unshare", "--uts", "--", "sh", "-c", 'hostname "$1" && shift && exec "$@"',
            "-", host, str(HERE / "enter.sh"), str(node.root), str(REPO), "bash", "-c", script]


def _scheduler_env(scheduler, rank, job_dir):
    """What PJM or Slurm (with its per-node launcher) sets in each node's part of the job."""
    if scheduler == "pjm":
        return {"PJM_JOBID": "4242", "PJM_O_WORKDIR": job_dir, "PJM_O_NODEINF": f"{job_dir}/nodeinf"}
    return {"SLURM_JOB_ID": "4242", "SLURM_SUBMIT_DIR": job_dir, "SLURM_JOB_NODELIST": "c2s-node[0-1]",
            "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": str(rank), "SLURM_PROCID": str(rank)}


def _ray_sif(node) -> str:
    """The test image as a SIF, built once per version of its recipe (squashing Ray takes a minute)."""
    key = hashlib.sha256((HERE / "images" / "ray.image").read_bytes()).hexdigest()[:12]
    path = f"/home/hpc/sif-cache/ray-{key}.sif"
    if not (node.home / "sif-cache" / f"ray-{key}.sif").exists():
        node.run(f"mkdir -p ~/sif-cache && apptainer build -F {path}.tmp docker://{node.registry}/c2s/ray:test "
                 f"&& mv {path}.tmp {path}", timeout=900, check=True)
    return path


def _job(node, scheduler, nodes) -> Path:
    """~/raytest on the node: the tiny model, the stand-in stack, its SIF and `compose2sif batch`'s job.sh."""
    sif = _ray_sif(node)
    stack = node.copy_stack("raytest", "stack")  # for models/ (the tiny model); the compose file is ours
    for item in stack.iterdir():
        if item.name != "models":
            subprocess.run(["rm", "-rf", str(item)], check=True)
    (stack / "compose.yaml").write_text(STACK.format(registry=node.registry))
    (stack / "nodeinf").write_text("".join(f"{host}\n" for host, _, _ in NODES[:nodes]))
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(stack)], check=True)
    node.run(f"ln -sf {sif} ~/raytest/ray.sif", check=True)
    rendered = node.c2s(f"-f raytest/compose.yaml batch --scheduler {scheduler} --group test --nodes {nodes} "
                        "-o raytest/job.sh", check=True)
    assert "WARN" not in rendered.stderr, rendered.stderr
    return stack


def _gone(node) -> None:
    """No process of the job's user is left (orphans handed to init are reaped by it: a bounded wait)."""
    deadline = time.time() + 30
    while node.processes() and time.time() < deadline:
        time.sleep(1)
    left = subprocess.run(["ps", "-u", node.uid, "-o", "pid,ppid,sid,stat,args"], capture_output=True, text=True)
    assert node.processes() == [], left.stdout


def _chat(ns) -> None:
    request = json.dumps({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
    answer = _sh("ip", "netns", "exec", ns, "curl", "-fsS", "-m", "60", "http://10.250.0.1:8000/v1/chat/completions",
                 "-H", "Content-Type: application/json", "-d", request)
    assert json.loads(answer.stdout)["choices"][0]["message"]["content"] is not None


def test_one_node_job_serves_without_ray_and_stops_on_sigterm(node, two_nodes):
    """The whole job script as the scheduler runs it (its batch step): one node, no Ray, no launcher."""
    stack = _job(node, "slurm", 1)
    env = {"SLURM_JOB_ID": "77", "SLURM_SUBMIT_DIR": "/home/hpc/raytest", "SLURM_JOB_NODELIST": "c2s-node0"}
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    with open(stack / "node0.log", "w+") as log:
        job = subprocess.Popen(_on_node(node, *NODES[0][:2], f"export {exports}; cd ~/raytest && exec bash job.sh"),
                               stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 120
            while "ready: http://10.250.0.1:8000/v1" not in (stack / "node0.log").read_text():
                assert job.poll() is None and time.time() < deadline, _logs(stack)
                time.sleep(1)
            _chat(NODES[0][1])
            assert (stack / ".compose2sif-batch" / "77" / "nodes").read_text() == "c2s-node0\n"
            assert not [p for p in node.processes() if "ray start" in p or "raylet" in p or "gcs_server" in p]
            pids = _sh("pgrep", "-u", node.uid, "-x", "-f", "bash job.sh").stdout.split()
            assert len(pids) == 1, pids
            _sh("kill", "-TERM", *pids)
            job.wait(timeout=60)
            _gone(node)
            assert "stopped" in (stack / "node0.log").read_text()
        finally:
            if job.poll() is None:
                job.kill()
            node.kill_all()


@pytest.mark.parametrize("scheduler", ["pjm", "slurm"])
def test_two_node_job_runs_ray_and_the_server_then_stops_clean(node, two_nodes, scheduler):
    stack = _job(node, scheduler, 2)

    logs, parts = [], []
    try:
        for rank, (host, ns, _) in enumerate(NODES):
            env = _scheduler_env(scheduler, rank, "/home/hpc/raytest")
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            log = open(stack / f"node{rank}.log", "w+")
            logs.append(log)
            parts.append(subprocess.Popen(_on_node(node, host, ns, f"export {exports}; cd ~/raytest && "
                                                                   "exec bash job.sh --node"),
                                          stdout=log, stderr=subprocess.STDOUT))
        deadline = time.time() + 300
        while "ready: http://10.250.0.1:8000/v1" not in (stack / "node0.log").read_text():
            assert all(p.poll() is None for p in parts), _logs(stack)
            assert time.time() < deadline, "the head never reported ready\n" + _logs(stack)
            time.sleep(2)

        status = subprocess.run(_on_node(node, NODES[0][0], NODES[0][1],
                                         "apptainer exec ~/raytest/ray.sif ray status --address 10.250.0.1:6379"),
                                capture_output=True, text=True, timeout=120)
        active = status.stdout.split("Active:")[1].split("Pending:")[0]
        assert active.count("node_") == 2, status.stdout + status.stderr

        _chat(NODES[1][1])  # from node 1, across ib0, the OpenAI-compatible API on the head answers
        if scheduler == "pjm":  # bench/serve.py against the stand-in, from node 1: its table goes to the report
            bench = _sh("ip", "netns", "exec", NODES[1][1], sys.executable, str(REPO / "bench" / "serve.py"),
                        "--base-url", "http://10.250.0.1:8000/v1", "--concurrency", "1,2,4", "--max-tokens", "32",
                        timeout=300, check=False)
            print(bench.stdout)
            assert bench.returncode == 0 and "out tok/s" in bench.stdout, bench.stdout + bench.stderr

        # the job is cancelled: the scheduler sends SIGTERM to the job's processes on every node
        pids = _sh("pgrep", "-u", node.uid, "-f", "job.sh --node").stdout.split()
        assert len(pids) == 2, pids
        _sh("kill", "-TERM", *pids)
        for part in parts:
            part.wait(timeout=90)
        _gone(node)
        assert "stopped" in (stack / "node0.log").read_text() and "stopped" in (stack / "node1.log").read_text()
    finally:
        for part in parts:
            if part.poll() is None:
                part.kill()
        for log in logs:
            log.close()
        node.kill_all()


def _logs(stack: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(stack.glob("node*.log")))
