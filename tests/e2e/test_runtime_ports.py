"""run.sh's checks of the endpoints (ADDR:PORT) a service listens on, on the real test bed: `up`
refuses an endpoint that another process holds and names the holder; a service that never
listens on its planned endpoint fails `up`; "Address already in use" in a service's log is
explained by who holds the address. The servers are stand-ins (Python one-liners in the test
Python image, and one started on the node as the holder), named as such below."""
import json
import re
import subprocess

import pytest

pytestmark = pytest.mark.e2e

STACK = "ports-stack"
OUT = "ports-out"
PORT = 28731
# a stand-in server: listens on $BIND:$PORT and answers HTTP
SERVER = ("import os, http.server as h; h.ThreadingHTTPServer((os.environ['BIND'], int(os.environ['PORT'])), "
          "h.SimpleHTTPRequestHandler).serve_forever()")
# a stand-in listener without SO_REUSEPORT (which Python's http.server may set, letting two share a port)
LISTENER = ("import os, socket, time; s = socket.socket(); s.bind((os.environ['BIND'], int(os.environ['PORT']))); "
            "s.listen(); print('listening', flush=True); time.sleep(600)")
# the holder takes the port on every address, so it blocks the service's own one too
HOLDER = (f"import socket, time; s = socket.socket(); s.bind(('0.0.0.0', {PORT})); s.listen(); "
          "time.sleep(600)")
# a listener the planner cannot see: its address and port come from variables it does not read
HIDDEN = ("import os, socket, time; s = socket.socket(); s.bind((os.environ['LISTEN_ON'], int(os.environ['P']))); "
          "s.listen(); print('listening', flush=True); time.sleep(600)")


def write_stack(node, text):
    root = node.home / STACK
    root.mkdir(exist_ok=True)
    (root / "compose.yaml").write_text(text)
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(root)], check=True)


def up(node, env="", before_up=None, options=""):
    node.c2s(f"-f {STACK}/compose.yaml convert --registry-mirror {node.registry} -o {OUT} {options}", check=True)
    node.run(f"cd ~ && {OUT}/run.sh build", check=True, timeout=900)
    if before_up:
        before_up()
    return node.run(f"cd ~ && {env} {OUT}/run.sh up -d", timeout=300)


def endpoint(node, service, port):
    """Where `up` expects the service to listen: the plan's endpoint, or, where the last `up` gave
    each service a loopback of its own (state/run/isolation says intercept: the default on the test
    bed), its own address in place of 0.0.0.0 or 127.0.0.1."""
    plan = json.loads((node.home / OUT / "plan.json").read_text())
    address, host = next((p["address"], p["host"]) for s in plan["services"] if s["name"] == service
                         for p in s["ports"] if p["container"] == port)
    isolation = node.home / OUT / "state" / "run" / "isolation"
    if isolation.exists() and isolation.read_text().split()[2:3] == ["intercept"] and \
            address in ("0.0.0.0", "127.0.0.1"):
        address = next(a for a, names in plan["hosts"] if service in names)
    return f"{address}:{host}"


def instances(node):
    proc = node.run("apptainer instance list --json", check=True)
    return [i["instance"] for i in json.loads(proc.stdout).get("instances", [])]


@pytest.fixture
def bed(node):
    node.run(f"cd ~ && rm -rf {OUT}")
    yield node
    node.run(f"cd ~ && {OUT}/run.sh down", timeout=300)
    node.run(f"pkill -u {node.uid} -f c2s-port-holder")


def test_up_refuses_an_endpoint_held_by_another_process_and_names_it(bed):
    node = bed
    write_stack(node, f"""
services:
  web:
    image: c2s/python:test
    command: [python3, -c, "{SERVER}"]
    environment: {{BIND: 127.0.0.1, PORT: "{PORT}"}}
    expose: ["{PORT}"]
""")
    # the holder: a stand-in process of the same user, outside the project, started after convert
    # (convert would have planned around it)
    def start_holder():
        node.run(f"setsid nohup python3 -c \"{HOLDER}\" c2s-port-holder >/dev/null 2>&1 & sleep 1", check=True)
    proc = up(node, before_up=start_holder)
    holder = node.run("pgrep -o -u hpc -f c2s-port-holder").stdout.split()[0]
    assert proc.returncode != 0
    planned = re.escape(endpoint(node, "web", PORT))
    assert re.search(rf"endpoint {planned} \(service web\) is held by another process on this node \(pid {holder}: "
                     r"python3 -c .*, of user hpc\)", proc.stderr), proc.stderr
    assert "nothing was started" in proc.stderr
    assert instances(node) == []


def test_a_service_slow_to_listen_is_started_and_watched_one_with_a_healthcheck_fails_in_its_window(bed):
    node = bed
    write_stack(node, f"""
services:
  quiet:
    image: c2s/python:test
    command: [python3, -c, "print('quiet: up, listening nowhere', flush=True); import time; time.sleep(600)"]
    environment: {{PORT: "{PORT}"}}
  checked:
    image: c2s/python:test
    command: [python3, -c, "import time; time.sleep(600)"]
    environment: {{PORT: "{PORT + 1}"}}
    healthcheck: {{test: [CMD, "true"], interval: 1s, timeout: 1s, retries: 2}}
""")
    proc = up(node, env="C2S_LISTEN_TIMEOUT=3")
    assert proc.returncode != 0
    # without a healthcheck: started, as Compose has it, and said in one line that names the knob
    assert "service quiet failed" not in proc.stderr, proc.stderr
    assert re.search(rf"quiet: started, not listening yet on {PORT} \(waited [34] s; it is watched, and "
                     r"C2S_LISTEN_TIMEOUT=SECONDS waits longer\)", proc.stderr), proc.stderr
    # with a healthcheck: within its window (retries x (interval + timeout)), even though the probe passes
    assert f"service checked failed: does not listen on {endpoint(node, 'checked', PORT + 1)} 4 s after it started" \
        in proc.stderr


def test_a_listener_on_a_services_address_is_named_before_it_starts(bed):
    node = bed
    # `first` listens where the planner cannot see (from variables it does not read): on the address
    # `second` is planned on (127.45.3.3 in this address block: services take .2, .3... by name)
    write_stack(node, f"""
services:
  first:
    image: c2s/python:test
    command: [python3, -c, "{HIDDEN}"]
    environment: {{LISTEN_ON: 127.45.3.3, P: "{PORT}"}}
    healthcheck: {{test: [CMD, python3, -c, "import socket; socket.create_connection(('127.45.3.3', {PORT}), 1)"],
                  interval: 1s, retries: 5}}
  second:
    image: c2s/python:test
    command: [python3, -c, "{LISTENER}"]
    environment: {{BIND: 0.0.0.0, PORT: "{PORT}"}}
    depends_on: {{first: {{condition: service_healthy}}}}
""")
    proc = up(node, options="--address-block 127.45.3.0/24")
    assert proc.returncode != 0
    first_pid = node.run("pgrep -o -u hpc -f 'socket.socket[(][)]'").stdout.split()[0]
    planned = re.escape(endpoint(node, "second", PORT))
    # another service of the project in the way counts like any other holder: second never starts
    assert re.search(rf"service second failed: endpoint {planned} \(service second\) is held by service first of "
                     rf"this project \(pid {first_pid}: python3 -c .*\)", proc.stderr), proc.stderr
