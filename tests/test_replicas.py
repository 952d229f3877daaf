"""deploy.replicas (and scale): N instances NAME-1..NAME-N, as Compose names its containers, each on
its own address; the service name resolves to all of them (hosts.names, and the project's DNS,
tests/test_intercept.py); what depends on the service depends on each; `up`, `restart`, `logs`,
`exec --index` take the service's name. Where Compose's second replica fails (a fixed published
port), refused in one line. The run.sh verbs run against the recording STAND-IN runtime
(tests/standins), as in test_run_verbs.py."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compose2sif.load import ProjectOptions, load_project
from compose2sif.plan import PlanOptions, build_plan
from test_run_verbs import ENGINE_MARKER, REPO, calls, listing, run_verb, standin_init, stop_dns

COMPOSE = """name: v
services:
  worker:
    image: busybox
    command: ["sleep", "300"]
    deploy: {replicas: 3}
  cache:
    image: busybox
    scale: 2
  app:
    image: busybox
    depends_on:
      worker: {condition: service_started}
"""


def plan_of(tmp_path, text):
    (tmp_path / "compose.yaml").write_text(text)
    project = load_project(ProjectOptions(cwd=str(tmp_path), environ={"HOME": "/home/user"}))
    return build_plan(project, PlanOptions(port_base=30000, address_block="127.45.3", uid=1000, loopback=True))


def test_a_service_of_n_replicas_is_n_instances_each_on_its_own_address(tmp_path):
    plan = plan_of(tmp_path, COMPOSE)
    names = [s.name for s in plan.services]
    assert sorted(names) == ["app", "cache-1", "cache-2", "worker-1", "worker-2", "worker-3"]
    workers = [plan.service(f"worker-{i}") for i in (1, 2, 3)]
    assert [w.instance for w in workers] == ["v-worker-1", "v-worker-2", "v-worker-3"]
    assert all(w.replica_of == "worker" and w.launch == ["/.singularity.d/runscript", "sleep", "300"] for w in workers)
    hosts = {address: names for address, names in plan.hosts}
    worker_addresses = sorted(a for a, n in hosts.items() if "worker" in n)
    assert len(set(worker_addresses)) == 3  # the service's name: every replica's address
    assert hosts[workers[1].address] == ["worker", "v-worker-2"]  # and its container's name: its own
    assert sorted(d["service"] for d in plan.service("app").depends_on) == ["worker-1", "worker-2", "worker-3"]
    assert not any("replicas" in w for w in plan.warnings)


def test_a_fixed_published_port_with_replicas_is_refused_as_compose_fails_it(tmp_path):
    (tmp_path / "compose.yaml").write_text("services:\n  web:\n    image: busybox\n    ports: ['8080:80']\n"
                                           "    deploy: {replicas: 2}\n")
    proc = subprocess.run([sys.executable, "-m", "compose2sif", "convert", "--offline", "-o", "out"], cwd=tmp_path,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1, proc.stderr
    assert "services.web.ports: 2 replicas cannot all publish port 8080" in proc.stderr
    assert 'fix: publish the container port alone (`- "80"`)' in proc.stderr
    ephemeral = plan_of(tmp_path, "services:\n  web:\n    image: busybox\n    ports: ['8000']\n"
                                  "    deploy: {replicas: 2}\n")
    forwards = [(s.name, p.forward) for s in ephemeral.services for p in s.ports]
    # the container port alone: each replica gets a free port of its own when `up` starts it, as Docker does
    assert forwards == [("web-1", "0.0.0.0:0"), ("web-2", "0.0.0.0:0")]


@pytest.fixture
def replicated(tmp_path):
    (tmp_path / "compose.yaml").write_text(COMPOSE)
    subprocess.run([sys.executable, "-m", "compose2sif", "convert", "--offline", "-o", "out"], cwd=tmp_path,
                   check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    text = (tmp_path / "out" / "run.sh").read_text()
    (tmp_path / "out" / "header.sh").write_text(text[:text.index(ENGINE_MARKER)])
    (tmp_path / "listing.json").write_text('{"instances": []}')
    for sif in {line.split('"')[1] for line in text.splitlines() if line.strip().startswith("S_SIF=")}:
        path = Path(sif.replace("$HERE", str(tmp_path / "out")))
        path.parent.mkdir(exist_ok=True)
        path.write_text("")
    yield tmp_path
    stop_dns(tmp_path)


def test_up_restart_exec_and_logs_take_the_services_name(replicated):
    tmp_path = replicated
    up = run_verb(tmp_path, "up", "cmd_up", "-d", "worker")
    started = [c[c.index("instance") + 2:][-1] for c in calls(tmp_path) if c[:2] == ["instance", "start"]]
    assert sorted(started) == ["v-worker-1", "v-worker-2", "v-worker-3"], up.stderr
    # exec: --index N, as Compose's (1 by default)
    with standin_init() as init:
        listing(tmp_path, **{f"v-worker-{i}": {"pid": init} for i in (1, 2, 3)})
        proc = run_verb(tmp_path, "exec", "cmd_exec", "--index", "2", "worker", "echo", "hi")
        assert proc.returncode == 0, proc.stderr
        assert "instance://v-worker-2" in calls(tmp_path)[-1] and calls(tmp_path)[-1][-2:] == ["echo", "hi"]
        proc = run_verb(tmp_path, "exec", "cmd_exec", "worker", "echo", "hi")
        assert "instance://v-worker-1" in calls(tmp_path)[-1]
        proc = run_verb(tmp_path, "exec", "cmd_exec", "--index", "4", "worker", "true")
        assert proc.returncode == 1 and proc.stderr == ("run.sh: exec: worker has no replica 4 "
                                                        "(worker-1 worker-2 worker-3)\n"), proc.stderr
    # logs: each replica's lines, prefixed with its name
    logs = tmp_path / ".apptainer" / "instances" / "logs" / "node" / subprocess.run(
        ["id", "-nu"], capture_output=True, text=True).stdout.strip()  # where the runtime keeps them
    logs.mkdir(parents=True)
    for i in (1, 2, 3):
        (logs / f"v-worker-{i}.out").write_text(f"hello from {i}\n")
    listing(tmp_path, **{f"v-worker-{i}": {"pid": 1} for i in (1, 2, 3)})
    proc = run_verb(tmp_path, "logs", "cmd_logs", "worker")
    assert sorted(proc.stdout.splitlines()) == [f"worker-{i} | hello from {i}" for i in (1, 2, 3)], proc.stderr


def test_an_image_source_given_for_a_service_is_every_replicas(tmp_path):
    """--image-source worker=sif:PATH: worker-1..3 all start from that SIF (issue 44), none from the
    registry; a source named for one replica is that replica's alone."""
    (tmp_path / "compose.yaml").write_text(COMPOSE)
    sif = tmp_path / "worker.sif"
    sif.write_text("")
    project = load_project(ProjectOptions(cwd=str(tmp_path), environ={"HOME": "/home/user"}))
    plan = build_plan(project, PlanOptions(port_base=30000, address_block="127.45.3", uid=1000, loopback=True,
                                           image_sources={"worker": f"sif:{sif}", "cache-2": f"sif:{sif}"}))
    kinds = {s.name: plan.images[s.image].kind for s in plan.services}
    assert kinds == {"worker-1": "sif", "worker-2": "sif", "worker-3": "sif", "cache-1": "docker",
                     "cache-2": "sif", "app": "docker"}
