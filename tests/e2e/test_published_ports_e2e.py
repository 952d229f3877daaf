"""Published ports the way Docker publishes them, and run-time truth, on the real test bed (issue 18):
a port published on another number is answered on the node through the forwarder (bin/c2s-forward)
at localhost:P and 127.0.0.1:P, shown by `ps`, and gone after `down`; a service that listens on
0.0.0.0 whatever it is told is reported in one line by `up`, `ps` and `doctor`. The servers are
STAND-INS (Python one-liners in the test Python image), named as such below."""
import json
import re
import subprocess

import pytest

pytestmark = pytest.mark.e2e

STACK = "published-stack"
OUT = "published-out"
PUBLISHED, CONTAINER = 28761, 8000
STUBBORN = 28762
# a stand-in web server: listens on $BIND:$PORT and answers HTTP
SERVER = ("import os, http.server as h; h.HTTPServer((os.environ['BIND'], int(os.environ['PORT'])), "
          "h.SimpleHTTPRequestHandler).serve_forever()")
# a stand-in server that listens on all addresses whatever it is told (its own LISTEN_ON, not BIND)
STUBBORN_SERVER = ("import os, socket, time; s = socket.socket(); s.bind((os.environ['LISTEN_ON'], "
                   "int(os.environ['PORT']))); s.listen(); print('listening', flush=True); time.sleep(600)")
# the client service's healthcheck: the published port through host.docker.internal (its localhost
# is its own, as in a container, where each service has a loopback of its own)
PROBE = f"import urllib.request as u; u.urlopen('http://host.docker.internal:{PUBLISHED}/', timeout=2)"
# a client on the node (the node's Python): the HTTP status of a GET
CLIENT = "import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).status)"


@pytest.fixture
def bed(node):
    node.run(f"cd ~ && rm -rf {OUT}")
    root = node.home / STACK
    root.mkdir(exist_ok=True)
    (root / "compose.yaml").write_text(f"""
services:
  web:
    image: c2s/python:test
    command: [python3, -c, "{SERVER}"]
    environment: {{BIND: 0.0.0.0, PORT: "{CONTAINER}"}}
    ports: ["{PUBLISHED}:{CONTAINER}"]
    x-compose2sif: {{ports: {{"{CONTAINER}": {{env: PORT}}}}, bind_address: {{env: BIND}}}}
  client:                   # a client in another instance that uses the published port, as under Docker
    image: c2s/python:test
    command: [python3, -c, "import time; time.sleep(600)"]
    healthcheck:
      test: [CMD, python3, -c, "{PROBE}"]
      interval: 1s
      retries: 20
    depends_on: [web]
  stubborn:
    image: c2s/python:test
    command: [python3, -c, "{STUBBORN_SERVER}"]
    environment: {{BIND: 0.0.0.0, LISTEN_ON: 0.0.0.0, PORT: "{STUBBORN}"}}
    x-compose2sif: {{ports: {{"{STUBBORN}": {{env: PORT}}}}, bind_address: {{env: BIND}}}}
""")
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(root)], check=True)
    node.c2s(f"-f {STACK}/compose.yaml convert --registry-mirror {node.registry} -o {OUT}", check=True)
    node.run(f"cd ~ && {OUT}/run.sh build", check=True, timeout=900)
    yield node
    node.run(f"cd ~ && {OUT}/run.sh down", timeout=300)


def forwarders(node):
    return [p for p in node.processes() if "/c2s-forward " in p]


def test_a_published_port_answers_on_the_node_through_its_forwarder_until_down(bed):
    node = bed
    plan = json.loads((node.home / OUT / "plan.json").read_text())
    web = next(p for s in plan["services"] if s["name"] == "web" for p in s["ports"])
    own = web["address"]
    # the server keeps its own address and port; the published port is the forwarder's
    assert (web["host"], web["forward"]) == (CONTAINER, f"0.0.0.0:{PUBLISHED}") and own.startswith("127.")
    up = node.run(f"cd ~ && {OUT}/run.sh up -d", timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    for url in (f"http://localhost:{PUBLISHED}/", f"http://127.0.0.1:{PUBLISHED}/", f"http://{own}:{CONTAINER}/"):
        got = node.run(f"python3 -c '{CLIENT}' {url}")
        assert got.stdout.strip() == "200", (url, got.stdout + got.stderr)
    rows = {r["service"]: r for r in json.loads(node.run(f"cd ~ && {OUT}/run.sh ps --format json", check=True).stdout)}
    assert rows["client"]["health"] == "healthy", rows["client"]  # host.docker.internal:P inside
    # published on all interfaces: a forwarder on each of the node's addresses, never on 0.0.0.0
    running = forwarders(node)
    assert any(f"/c2s-forward 127.0.0.1:{PUBLISHED} {own}:{CONTAINER}" in p for p in running), running
    assert all(f" {own}:{CONTAINER}" in p and "0.0.0.0" not in p for p in running), running
    ps = node.run(f"cd ~ && {OUT}/run.sh ps", check=True)
    assert re.search(rf"web .* running .* 127\.0\.0\.1:{PUBLISHED}->{re.escape(own)}:{CONTAINER} ", ps.stdout), ps.stdout
    rows = {r["service"]: r for r in json.loads(node.run(f"cd ~ && {OUT}/run.sh ps --format json", check=True).stdout)}
    published = rows["web"]["published"]
    assert published[0] == f"127.0.0.1:{PUBLISHED}->{own}:{CONTAINER}" and len(published) == len(running), published
    assert rows["web"]["warnings"] == []
    down = node.run(f"cd ~ && {OUT}/run.sh down", timeout=300)
    assert down.returncode == 0, down.stderr
    assert forwarders(node) == []
    gone = node.run(f"python3 -c '{CLIENT}' http://127.0.0.1:{PUBLISHED}/")
    assert gone.returncode != 0 and "Connection refused" in gone.stderr, gone.stdout + gone.stderr


def test_a_service_on_all_interfaces_whatever_it_is_told_is_one_line_in_up_ps_and_doctor(bed):
    """With the plan-time knobs only (C2S_PORT_ISOLATION=plan), where nothing can move its bind."""
    node = bed
    up = node.run(f"cd ~ && C2S_PORT_ISOLATION=plan {OUT}/run.sh up -d", timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    line = (f"service stubborn: listens on all interfaces (0.0.0.0:{STUBBORN}), where nothing is published: anyone "
            f"who reaches this node reaches it, and it holds port {STUBBORN} on every address (tell it its address: "
            "x-compose2sif: {bind_address: {env: VAR}})")
    assert [l for l in up.stderr.splitlines() if "listens on all interfaces" in l] == [f"run.sh: {line}"], up.stderr
    ps = node.run(f"cd ~ && {OUT}/run.sh ps", check=True)
    assert f"WARN {line}" in ps.stdout.splitlines(), ps.stdout
    assert "web" not in "".join(l for l in ps.stdout.splitlines() if l.startswith("WARN")), ps.stdout
    doctor = node.run(f"cd ~ && C2S_PORT_ISOLATION=plan python3 -m compose2sif doctor -o {OUT}", timeout=300)
    assert (f"warn service stubborn at run time: listens on all interfaces (0.0.0.0:{STUBBORN})"
            in doctor.stdout), doctor.stdout
    assert f"ok   service web: published 0.0.0.0:{PUBLISHED} is served by its forwarder (pid" in doctor.stdout, \
        doctor.stdout


def test_by_default_the_same_service_is_moved_to_its_own_address_and_nothing_is_said(bed):
    """The default (auto) on the test bed, where c2s-loopback --check passes: the bind to 0.0.0.0
    lands on the service's own address, so there is nothing to warn about; ps shows the move."""
    node = bed
    up = node.run(f"cd ~ && {OUT}/run.sh up -d", timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "listens on all interfaces" not in up.stderr, up.stderr
    plan = json.loads((node.home / OUT / "plan.json").read_text())
    own = {name: address for address, names in plan["hosts"] for name in names}
    ps = node.run(f"cd ~ && {OUT}/run.sh ps", check=True).stdout
    assert f"RELOCATED service stubborn: bind TCP 0.0.0.0:{STUBBORN} {own['stubborn']}:{STUBBORN}" in ps, ps
    assert not [l for l in ps.splitlines() if l.startswith("WARN")], ps
    table = node.run("cat /proc/net/tcp", check=True).stdout
    assert f"00000000:{STUBBORN:04X} 00000000:0000 0A" not in table, "stubborn still listens on every address"
