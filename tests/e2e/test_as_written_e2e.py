"""Issue 37 on the test bed: a project as Docker runs it, with no hint (tests/e2e/as-written-stack),
runs as written under the per-service loopback. A port published on its own number is served by
forwarders on each of the node's addresses, never on the wildcard, so other services keep that
port on their own addresses: `pooler` publishes 5432 beside a real PostgreSQL on 5432 that its
client reaches as `db` on the default port; three servers on 3000, one published 3000:3000, each
reached by name; an nginx config with `resolver 127.0.0.11` and a variable upstream, left as
written, answered by the project's DNS server; a worker of `deploy.replicas: 3`, each replica
running on its own address, the service's name resolving to all three. Every answer says who sent it (the servers answer their own names, PostgreSQL
its own protocol). Real Apptainer as the unprivileged user hpc (rootless)."""
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from testbed import DNS_QUERY

pytestmark = pytest.mark.e2e

OUT = "out-written"


def fetch(node, url: str, via: str = ""):
    """A GET from the node (plain curl, untraced), or from inside service `via` (run.sh exec: under its
    tracer); the completed process."""
    if via:
        code = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode().strip())"
        return node.run(f"cd ~ && {OUT}/run.sh exec {via} python3 -c {json.dumps(code)}", timeout=120)
    return node.run(f"curl -fsS --max-time 10 {url}", timeout=60)


def answer(node, url: str, via: str = "") -> str:
    proc = fetch(node, url, via)
    assert proc.returncode == 0, f"{url} via {via or 'the node'}: {proc.stdout}{proc.stderr}"
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def written(node):
    stack = node.copy_stack("as-written-stack", source="as-written-stack")
    (stack / "app").mkdir(exist_ok=True)  # the intercept stack's server, which answers its own name
    shutil.copy(Path(__file__).parent / "intercept-stack" / "app" / "who.py", stack / "app" / "who.py")
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(stack / "app")], check=True)
    node.run(f"cd ~ && rm -rf {OUT}")
    proc = node.run(f"cd ~ && C2S_PORT_ISOLATION=intercept python3 -m compose2sif -f as-written-stack/compose.yaml up -d "
                    f"--registry-mirror {node.registry} -o {OUT}", timeout=1500)
    yield node, proc
    node.run(f"cd ~ && {OUT}/run.sh down -v", timeout=300)


def own_addresses(node):
    plan = json.loads((node.home / OUT / "plan.json").read_text())
    return {names[0]: address for address, names in plan["hosts"] if names}


def listeners(node, port: int):
    """(address hex, uid) of every TCP socket that listens on PORT on the node."""
    table = node.run("cat /proc/net/tcp /proc/net/tcp6", check=True).stdout
    return [f[1].rsplit(":", 1)[0] for f in (line.split() for line in table.splitlines())
            if len(f) > 3 and f[3] == "0A" and f[1].endswith(f":{port:04X}")]


def test_up_runs_the_project_as_written(written):
    node, proc = written
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads((node.home / OUT / "plan.json").read_text())
    assert plan["isolation"].startswith("as written")
    for service in plan["services"]:  # nothing moved, nothing told
        assert all(p["host"] == p["container"] for p in service["ports"]), service["name"]
    ps = node.run(f"cd ~ && {OUT}/run.sh ps", timeout=120).stdout
    assert "PORTS as written, each service on a loopback of its own" in ps, ps


def test_a_published_port_beside_a_service_that_keeps_it(written):
    node, _ = written
    own = own_addresses(node)
    # the node's clients reach the publisher on 127.0.0.1 and localhost, as under Docker
    assert answer(node, "http://127.0.0.1:5432/") == "I am pooler"
    assert answer(node, "http://localhost:5432/") == "I am pooler"
    # PostgreSQL keeps 5432 on its own address; its client reaches it by name on the default port
    health = json.loads(node.run(f"cd ~ && {OUT}/run.sh ps --format json", check=True).stdout)
    assert {r["service"]: r["health"] for r in health}["dbclient"] == "healthy", health
    said = node.run(f"cd ~ && {OUT}/run.sh exec dbclient psql -h db -U postgres -tAc "
                    "\"select 'postgres answers on ' || current_setting('port')\"", timeout=120)
    assert said.returncode == 0 and said.stdout.strip() == "postgres answers on 5432", said.stdout + said.stderr
    assert answer(node, f"http://{own['pooler']}:5432/") == "I am pooler"
    # inside a service, host.docker.internal is the node (its published ports), localhost its own
    assert answer(node, "http://host.docker.internal:5432/", via="caller") == "I am pooler"
    inside = fetch(node, "http://localhost:5432/", via="caller")
    assert inside.returncode != 0 and "I am" not in inside.stdout, inside.stdout + inside.stderr


def test_three_services_on_one_port_each_reached_by_name(written):
    node, _ = written
    own = own_addresses(node)
    for name in ("w1", "w2", "w3"):
        assert answer(node, f"http://{name}:3000/", via="caller") == f"I am {name}"
        assert answer(node, f"http://{own[name]}:3000/") == f"I am {name}"
    assert answer(node, "http://127.0.0.1:3000/") == "I am w1"
    addresses = node.run("awk '/\\/32 host LOCAL/ {print prev} {prev=$2}' /proc/net/fib_trie | sort -u", timeout=60)
    for address in addresses.stdout.split():
        if not address.startswith("127."):  # each address of the node's interfaces serves it too
            assert answer(node, f"http://{address}:3000/") == "I am w1", address


def test_nothing_of_the_project_listens_on_a_wildcard_and_a_silent_address_refuses(written):
    node, _ = written
    own = own_addresses(node)
    for port in (5432, 3000):
        wild = [a for a in listeners(node, port) if set(a) == {"0"}]
        assert not wild, f"something listens on every address, port {port}"
    refused = fetch(node, f"http://{own['caller']}:3000/")  # caller listens on nothing: refused, not answered
    assert refused.returncode != 0 and "I am" not in refused.stdout


def test_docker_dns_answers_nginx_as_written(written):
    node, _ = written
    own = own_addresses(node)
    plan = json.loads((node.home / OUT / "plan.json").read_text())
    front = next(s for s in plan["services"] if s["name"] == "front")
    site = next(b["source"] for b in front["binds"] if b["target"] == "/etc/nginx/sites-enabled/site")
    assert site.endswith("/as-written-stack/nginx/site")  # the project's own file, as written
    assert answer(node, f"http://{own['front']}:8080/") == "I am w2"  # nginx asked 127.0.0.11 for w2
    log = node.run(f"cd ~ && cat {OUT}/state/logs/dns.log", timeout=60).stdout
    assert "cannot" not in log, log




def test_three_replicas_run_each_on_its_own_address_and_the_name_resolves_to_all(written):
    node, _ = written
    rows = {r["service"]: r for r in json.loads(node.run(f"cd ~ && {OUT}/run.sh ps --format json", check=True).stdout)}
    replicas = [f"worker-{i}" for i in (1, 2, 3)]
    assert all(rows[name]["state"] == "running" for name in replicas), rows
    plan = json.loads((node.home / OUT / "plan.json").read_text())
    addresses = sorted(s["address"] for s in plan["services"] if s.get("replica_of") == "worker")
    assert len(set(addresses)) == 3
    for address in addresses:
        assert answer(node, f"http://{address}:4000/") == "I am worker"
    asked = node.run(f"cd ~ && {OUT}/run.sh exec caller python3 -c {shlex.quote(DNS_QUERY)} worker", timeout=120)
    assert asked.returncode == 0 and asked.stdout.split() == addresses, asked.stdout + asked.stderr
    code = "import urllib.request as u; print(u.urlopen('http://localhost:4000/', timeout=10).read().decode().strip())"
    second = node.run(f"cd ~ && {OUT}/run.sh exec --index 2 worker python3 -c {json.dumps(code)}", timeout=120)
    assert second.returncode == 0 and second.stdout.strip() == "I am worker", second.stdout + second.stderr
