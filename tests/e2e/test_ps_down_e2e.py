"""`ps` and `down` on a real rootless Apptainer, as the unprivileged user: the table Compose prints
(service, instance, state, health, address:port, uptime), health kept up to date by the supervisor on
each healthcheck's schedule (a hung service turns unhealthy, then healthy again, with no `ps` probing),
and `down` leaving nothing behind: no process, no mount, no instance record."""
import json
import re
import time

import pytest

pytestmark = pytest.mark.e2e

OUT = "out-psdown"
SERVER = ("import os, http.server as h; "
          "h.ThreadingHTTPServer((os.environ['BIND'], int(os.environ['PORT'])), "
          "h.SimpleHTTPRequestHandler).serve_forever()")
COMPOSE = f"""name: c2s-psdown
services:
  web:
    image: c2s/python:test
    command: [python3, -c, "{SERVER}", c2s-psdown-web]
    environment: {{BIND: 127.0.0.1, PORT: '28501'}}
    expose: ['28501']
    healthcheck: {{test: [CMD, curl, -fso, /dev/null, 'http://127.0.0.1:28501/'], interval: 1s, timeout: 1s,
                  retries: 2}}
  side:
    image: c2s/python:test
    command: [python3, -c, "{SERVER}", c2s-psdown-side]
    environment: {{BIND: 127.0.0.1, PORT: '28502'}}
    expose: ['28502']
    depends_on: {{web: {{condition: service_healthy}}}}
"""


@pytest.fixture(scope="module")
def stack(node):
    (node.home / "psdown").mkdir(exist_ok=True)
    (node.home / "psdown" / "compose.yaml").write_text(COMPOSE)
    node.run(f"chown -R {node.uid}:{node.uid} ~/psdown; cd ~ && rm -rf {OUT}")
    proc = node.c2s(f"-f psdown/compose.yaml up -d --registry-mirror {node.registry} -o {OUT}", timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield node
    node.run(f"cd ~ && {OUT}/run.sh down", timeout=300)


def ps_json(node):
    return {s["service"]: s for s in json.loads(node.run(f"cd ~ && {OUT}/run.sh ps --format json", check=True).stdout)}


def test_ps_table_shows_endpoints_and_uptime(stack):
    node = stack
    time.sleep(2)
    plan = {s["name"]: s for s in json.loads((node.home / OUT / "plan.json").read_text())["services"]}
    lines = node.run(f"cd ~ && {OUT}/run.sh ps", check=True).stdout.splitlines()
    assert lines[0].split() == ["SERVICE", "INSTANCE", "STATE", "HEALTH", "ADDRESS:PORT", "UPTIME"]
    web = f"{plan['web']['address']}:28501"
    assert re.match(rf"web +c2s-psdown-web +running +healthy +{re.escape(web)} +Up \d+ seconds$", lines[1]), lines
    assert re.match(r"side +c2s-psdown-side +running +none +\S+:28502 +Up \d+ seconds$", lines[2]), lines
    state = ps_json(node)
    assert state["web"]["endpoints"] == [web] and state["web"]["ports"] == [28501]
    assert 2 <= state["web"]["uptime_seconds"] < 600 and state["web"]["uptime"].startswith("Up ")


def test_supervisor_keeps_health_current_without_ps_probing(stack):
    node = stack
    # no `ps` for 4 s: the last probe is still at most one interval (and a cycle) old
    time.sleep(4)
    when = int((node.home / OUT / "state" / "run" / "web.health").read_text().split()[0])
    assert time.time() - when <= 2.5
    pid = node.run("pgrep -u hpc -f 'c2s-psdown-web$'", check=True).stdout.split()[0]
    node.run(f"kill -STOP {pid}", check=True)  # the server hangs: its probes time out
    try:
        for _ in range(40):  # 2 retries of 1 s probes with a 1 s timeout, on the supervisor's schedule
            time.sleep(0.5)
            health = ps_json(node)["web"]["health"]
            if health == "unhealthy":
                break
        assert health == "unhealthy"
    finally:
        node.run(f"kill -CONT {pid}", check=True)
    for _ in range(20):
        time.sleep(0.5)
        health = ps_json(node)["web"]["health"]
        if health == "healthy":
            break
    assert health == "healthy"


def test_down_leaves_no_process_mount_or_record(stack):
    node = stack
    proc = node.run(f"cd ~ && {OUT}/run.sh down", timeout=300)
    assert proc.returncode == 0, proc.stderr
    # nothing of the stack when `down` returns: no waiting here
    left = [p for p in node.processes() if "<defunct>" not in p and not re.search(r"\bps -u\b", p)]
    assert left == [], left
    mounts = open("/proc/mounts").read()
    assert "squashfuse" not in mounts and "fuse-overlayfs" not in mounts
    records = list((node.home / ".apptainer" / "instances" / "app").rglob("c2s-psdown-*.json"))
    assert records == [], records  # the runtime's listing in `down` deleted those it left
    state = ps_json(node)
    assert {s["state"] for s in state.values()} == {"stopped"}
    assert state["web"]["uptime"] == "" and state["web"]["uptime_seconds"] is None
