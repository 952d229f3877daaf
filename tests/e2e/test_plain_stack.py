"""A stack written with no x-compose2sif hints (tests/e2e/plain-stack) runs as written: two services
from one image on one port, clients that name only a host and rely on the default port, a one-shot
init, nginx on port 80 inside published on 18090. Real nginx, PostgreSQL, Redis and Python on a real
rootless Apptainer, as an unprivileged user."""
import json
import time

import pytest

pytestmark = pytest.mark.e2e

OUT = "out-plain"


@pytest.fixture(scope="module")
def plain(node):
    node.copy_stack("plain-stack", source="plain-stack")
    node.run(f"cd ~ && rm -rf {OUT}")
    yield node
    node.run(f"cd ~ && {OUT}/run.sh down -v", timeout=300)


def get(node, path, method="GET", body=None):
    data = f"-H 'Content-Type: application/json' -d {json.dumps(json.dumps(body))}" if body is not None else ""
    proc = node.run(f"curl -fsS -X {method} {data} http://127.0.0.1:18090{path}", timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_stack_without_hints_serves_traffic(plain):
    node = plain
    proc = node.c2s(f"-f plain-stack/compose.yaml up -d --registry-mirror {node.registry} -o {OUT}", timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads((node.home / OUT / "plan.json").read_text())
    services = {s["name"]: s for s in plan["services"]}
    for name, port in (("api", 9000), ("worker", 9000), ("db", 5432), ("cache", 6379)):
        endpoint = services[name]["ports"][0]
        assert (endpoint["address"], endpoint["host"]) == (services[name]["address"], port), name  # not moved
    assert len({services[n]["address"] for n in services}) == len(services)
    # each role answers on its own address behind nginx
    assert get(node, "/api/health")["role"] == "api" and get(node, "/worker/health")["role"] == "worker"
    # api -> PostgreSQL and Redis found by host name alone; the worker's result through Redis and PostgreSQL
    created = get(node, "/api/notes", "POST", {"text": "plain"})
    for _ in range(50):
        notes = get(node, "/api/notes")["notes"]
        if notes and notes[-1]["result"]:
            break
        time.sleep(0.2)
    assert notes[-1]["id"] == created["id"] and notes[-1]["result"] == "PLAIN"
    # the servers listen on their own addresses only, not on 127.0.0.1 or all interfaces
    listening = node.run("cat /proc/net/tcp", check=True).stdout
    for name, port in (("db", 5432), ("cache", 6379)):
        octets = [int(o) for o in services[name]["address"].split(".")]
        own = "".join(f"{o:02X}" for o in reversed(octets)) + f":{port:04X}"
        assert own in listening, name
        assert f"00000000:{port:04X}" not in listening and f"0100007F:{port:04X}" not in listening, name
