"""Hostile values on the real Apptainer 1.4.5, as the unprivileged user (issue 11): a project whose
environment, command, healthcheck and build arguments carry shell payloads is built, started,
exec'd into, listed and stopped, on the runtime as it is (--no-eval) and through a wrapper that
hides --no-eval from run.sh so that the escaped env files of older runtimes are used. No payload
runs on the node, and each value reaches the container exactly."""
import json
import re
import shlex
import subprocess

import pytest

pytestmark = pytest.mark.e2e

OUT = "out-hostile"
# the values as the container must see them; in the compose file each `$` is written `$$`
VALUES = {"E1": "\\$(touch /tmp/PWNED-1)", "E2": "ends with \\", "E3": "`touch /tmp/PWNED-3`", "E4": "a'b\"c",
          "E5": "$HOME", "E6": "x; touch /tmp/PWNED-6", "E7": "two\nlines"}
COMPOSE = {"services": {"app": {
    "build": {"context": "./app", "args": {"A": "$$(touch /tmp/PWNED-arg)"}},
    "command": ["python3", "-c", "import time; time.sleep(600)", "$$(touch /tmp/PWNED-cmd)"],
    "environment": {k: v.replace("$", "$$") for k, v in VALUES.items()},
    "healthcheck": {"test": ["CMD", "python3", "-c", "pass", "$$(touch /tmp/PWNED-health)"], "interval": "2s"},
}}}
DOCKERFILE = "FROM c2s/python:test\nARG A\nRUN echo \"$A\" > /opt/a.txt\nENV FROM_IMAGE=\"$(touch /tmp/PWNED-env)\"\n"
# real apptainer, with --no-eval hidden from `exec --help`: run.sh then takes the path of runtimes without it
WITHOUT_NO_EVAL = """#!/bin/bash
if [ "$*" = "exec --help" ]; then apptainer exec --help | grep -v -- --no-eval; else exec apptainer "$@"; fi
"""


@pytest.fixture(scope="module")
def hostile(node):
    stack = node.home / "hostile-stack"
    (stack / "app").mkdir(parents=True, exist_ok=True)
    (stack / "compose.yaml").write_text(json.dumps(COMPOSE))
    (stack / "app" / "Dockerfile").write_text(DOCKERFILE)
    (node.home / "apptainer-without-no-eval").write_text(WITHOUT_NO_EVAL)
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(stack), str(node.home / "apptainer-without-no-eval")],
                   check=True)
    node.run(f"chmod 755 ~/apptainer-without-no-eval; rm -rf ~/{OUT} /tmp/PWNED-*", check=True)
    yield node
    node.run(f"cd ~ && {OUT}/run.sh down -v", timeout=300)


@pytest.mark.parametrize("runtime", ["apptainer", "~/apptainer-without-no-eval"], ids=["no-eval", "eval"])
def test_hostile_values_stay_data_on_the_real_runtime(hostile, runtime):
    node = hostile
    env = f"C2S_RUNTIME={runtime}"
    proc = node.c2s(f"-f hostile-stack/compose.yaml convert --registry-mirror {node.registry} -o {OUT}", timeout=300)
    assert proc.returncode == 0, proc.stderr
    for verb in ("build", "up -d", "ps", "ps --format json", "logs app", "down"):
        if verb == "down":
            script = "import os,sys; sys.stdout.write(chr(0).join(os.environ[k] for k in sys.argv[1:]))"
            got = node.run(f"cd ~ && {env} {OUT}/run.sh exec app python3 -c {shlex.quote(script)} "
                           + " ".join(VALUES), timeout=120)
            assert got.stdout.split("\0") == list(VALUES.values()), got.stdout + got.stderr
        proc = node.run(f"cd ~ && {env} {OUT}/run.sh {verb}", timeout=900)
        assert proc.returncode == 0, (verb, proc.stdout, proc.stderr)
        if verb == "ps --format json":
            assert [r["service"] for r in json.loads(proc.stdout)] == ["app"]
    assert node.run("ls /tmp/PWNED-* 2>/dev/null").stdout == "", "a value ran a command on the node"


def test_doctor_on_the_node_healthy_and_with_a_taken_port(node):
    stack = node.home / "doctor-stack"
    stack.mkdir(exist_ok=True)
    (stack / "compose.yaml").write_text('services:\n  cache:\n    image: c2s/redis:test\n'
                                        '    ports: ["127.0.0.1:18655:6379"]\n')
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(stack)], check=True)
    proc = node.c2s("-f doctor-stack/compose.yaml convert --offline -o out-doctor", timeout=300)
    assert proc.returncode == 0, proc.stderr
    healthy = node.c2s("doctor -o out-doctor", timeout=300)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    for expected in ("ok   runtime: apptainer 1.4.5", "ok   mode: unprivileged",
                     "ok   instances: `apptainer instance list` works", "ok   service cache: published 127.0.0.1:18655 is free",
                     "ok   features of apptainer 1.4.5 used here: --no-eval, a writable root without setuid (",
                     "ok   SIF cache: /scratch/hpc/compose2sif/sif (", "ok   build cache: /scratch/hpc/compose2sif/cache ("):
        assert expected in healthy.stdout, healthy.stdout
    holder = ("python3 -c 'import socket,time; s=socket.socket(); s.bind((\"127.0.0.1\", 18655)); s.listen(); "
              "time.sleep(30)' & sleep 1; ")
    taken = node.run(f"cd ~; {holder} python3 -m compose2sif doctor -o out-doctor; echo rc=$?; kill %1", timeout=300)
    assert "rc=1" in taken.stdout, taken.stdout + taken.stderr
    assert "fail service cache: published 127.0.0.1:18655 is taken (held by python3, pid" in taken.stdout, taken.stdout
    # while the project itself runs, its own instances hold its endpoints: that is no failure
    up = node.c2s(f"-f doctor-stack/compose.yaml up -d --offline --registry-mirror {node.registry} -o out-doctor",
                  timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        running = node.c2s("doctor -o out-doctor", timeout=300)
        assert "ok   service cache: published 127.0.0.1:18655 is served by its forwarder (pid" in running.stdout, \
            running.stdout
        assert re.search(r"ok   service cache: 127\.[0-9.]+:6379 is served by its own running instance", running.stdout), \
            running.stdout
        assert running.returncode == 0, running.stdout + running.stderr
    finally:
        node.run("cd ~ && out-doctor/run.sh down", timeout=300)
