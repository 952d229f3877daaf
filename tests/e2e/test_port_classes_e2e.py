"""The classes of listener that real projects showed the planner cannot see (issue 18), each on the
real test bed with real processes and sockets: `up` either makes the stack work or prints the one
line that names the cause. All servers are STAND-INS (Python scripts in the test Python image),
named as such below:

- an image that opens an admin port the compose file never mentions (ZooKeeper's AdminServer on
  0.0.0.0:8080), clashing with another service's port;
- a same-image replica pair: told their addresses, both serve one port; not told (the port is the
  image's default on 0.0.0.0), the second one's "Address already in use" names the first;
- a `network_mode: host` service with no `ports`;
- a server whose own init script and healthcheck reach it through localhost:PORT while it listens
  on its own address (MongoDB's replica-set init through `mongosh --host localhost:27017`).

Published ports with P != C and a client using localhost:P (test_published_ports_e2e.py), a
service that listens on 0.0.0.0 whatever it is told (the same file) and dotted variables
(test_dotted_env.py) are proved where they were built.

These tests run with C2S_PORT_ISOLATION=plan: the plan-time mode, which must stay correct
whether or not run-time interception is at hand."""
import json
import re
import subprocess
import time

import pytest

pytestmark = pytest.mark.e2e

STACK = "classes-stack"
OUT = "classes-out"
PLAN_MODE = "export C2S_PORT_ISOLATION=plan; cd ~ &&"
ALL_INTERFACES = ("where nothing is published: anyone who reaches this node reaches it, and it holds port {port} "
                  "on every address (tell it its address: x-compose2sif: {{bind_address: {{env: VAR}}}})")

# a stand-in server without SO_REUSEPORT: listens on $BIND:$PORT, answers its $NAME to every connection
# (with SO_REUSEADDR, as servers set it: it closes first, so a rerun within a minute finds the
# connections of the last run in TIME_WAIT on its address)
SERVER = ("import os, socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
          "s.bind((os.environ['BIND'], int(os.environ['PORT']))); s.listen(); print('listening', flush=True)\\n"
          "while True: c, _ = s.accept(); c.sendall(os.environ['NAME'].encode()); c.close()")
# a stand-in for an image with an admin server the compose file never mentions: it opens
# 0.0.0.0:{admin} (its default) before its main port, which it is told
ADMIN_SERVER = ("import os, socket, time; a = socket.socket(); a.bind(('0.0.0.0', {admin})); a.listen(); "
                "s = socket.socket(); s.bind((os.environ['BIND'], int(os.environ['PORT']))); s.listen(); "
                "open('/tmp/listening', 'w').close(); print('listening', flush=True); time.sleep(600)")
# a stand-in for an image whose default port nobody declares: 0.0.0.0:{port}, a file once it listens
DEFAULT_PORT_SERVER = ("import socket, time; s = socket.socket(); s.bind(('0.0.0.0', {port})); s.listen(); "
                       "open('/tmp/listening', 'w').close(); print('listening', flush=True); time.sleep(600)")
# the healthcheck of those two: the server has opened its ports (/tmp is the service's own)
LISTENING = "{test: [CMD, test, -e, /tmp/listening], interval: 1s, timeout: 1s, retries: 5}"
# a client on the node or in a service: what the server at sys.argv[1] (HOST:PORT) answers
ASK = ("import socket, sys; h, p = sys.argv[1].rsplit(':', 1); "
       "print(socket.create_connection((h, int(p)), 3).recv(100).decode())")


def write_stack(node, compose, files=None):
    root = node.home / STACK
    subprocess.run(["rm", "-rf", str(root)], check=True)
    root.mkdir()
    (root / "compose.yaml").write_text(compose)
    for name, text in (files or {}).items():
        (root / name).write_text(text)
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(root)], check=True)


def convert_and_up(node, options=""):
    """convert's output, and `up -d`'s."""
    converted = node.run(f"{PLAN_MODE} python3 -m compose2sif -f {STACK}/compose.yaml convert "
                         f"--registry-mirror {node.registry} -o {OUT} {options}", check=True)
    node.run(f"{PLAN_MODE} {OUT}/run.sh build", check=True, timeout=900)
    return converted, node.run(f"{PLAN_MODE} {OUT}/run.sh up -d", timeout=300)


def plan_of(node):
    plan = node.home / OUT / "fallback" / "plan.json"  # the plan-time knobs' plan, which plan mode runs
    plan = plan if plan.exists() else node.home / OUT / "plan.json"
    return {s["name"]: s for s in json.loads(plan.read_text())["services"]}


def endpoint(node, service, port):
    return next(f"{p['address']}:{p['host']}" for p in plan_of(node)[service]["ports"] if p["container"] == port)


def ask(node, where):
    return node.run(f"python3 -c \"{ASK}\" {where}")


def wait_healthy(node, service, seconds=30):
    row = {}
    for _ in range(seconds):
        rows = json.loads(node.run(f"{PLAN_MODE} {OUT}/run.sh ps --format json", check=True).stdout)
        row = next(r for r in rows if r["service"] == service)
        if row["health"] == "healthy":
            return row
        time.sleep(1)
    return row


def run_lines(stderr, service):
    """The lines `up` printed about a service's run-time truth."""
    return [l for l in stderr.splitlines() if l.startswith(f"run.sh: service {service}: ")]


@pytest.fixture
def bed(node):
    node.run(f"cd ~ && rm -rf {OUT}")
    yield node
    node.run(f"{PLAN_MODE} {OUT}/run.sh down", timeout=300)


def test_an_undeclared_admin_port_that_clashes_is_named_with_both_services(bed):
    node = bed
    admin, main = 28771, 28772
    write_stack(node, f"""
services:
  coord:                    # opens 0.0.0.0:{admin} too, which the compose file never mentions
    image: c2s/python:test
    command: [python3, -c, "{ADMIN_SERVER.format(admin=admin)}"]
    environment: {{BIND: 0.0.0.0, PORT: "{main}"}}
    x-compose2sif: {{ports: {{"{main}": {{env: PORT}}}}, bind_address: {{env: BIND}}}}
    healthcheck: {LISTENING}
  web:                      # is planned on its own address, port {admin}
    image: c2s/python:test
    command: [python3, -c, "{SERVER}"]
    environment: {{BIND: 0.0.0.0, PORT: "{admin}", NAME: web}}
    x-compose2sif: {{ports: {{"{admin}": {{env: PORT}}}}, bind_address: {{env: BIND}}}}
    depends_on: {{coord: {{condition: service_healthy}}}}
""")
    _, up = convert_and_up(node)
    assert up.returncode != 0, up.stdout + up.stderr
    web = endpoint(node, "web", admin)
    assert run_lines(up.stderr, "coord") == [
        f"run.sh: service coord: listens on all interfaces (0.0.0.0:{admin}), {ALL_INTERFACES.format(port=admin)}",
        f"run.sh: service coord: listens on 0.0.0.0:{admin}, where service web is planned ({web}): web cannot "
        "open it"], up.stderr
    coord_pid = node.run(f"pgrep -o -u {node.uid} -f 'a.bind'").stdout.split()[0]
    # the one line of web's failure names the endpoint, the service that holds it and its process
    assert re.search(rf"^run.sh: service web failed: endpoint {re.escape(web)} \(service web\) is held by service "
                     rf"coord of this project \(pid {coord_pid}: python3 -c .*\)$", up.stderr, re.M), up.stderr


def test_a_same_image_replica_pair_told_their_addresses_serves_one_port_twice(bed):
    node = bed
    port = 28781
    replica = f"""
    image: c2s/python:test
    command: [python3, -c, "{SERVER}"]
    expose: ["{port}"]
    x-compose2sif: {{ports: {{"{port}": {{env: PORT}}}}, bind_address: {{env: BIND}}}}"""
    write_stack(node, f"""
services:
  shard-a:{replica}
    environment: {{BIND: 0.0.0.0, PORT: "{port}", NAME: shard-a}}
  shard-b:{replica}
    environment: {{BIND: 0.0.0.0, PORT: "{port}", NAME: shard-b}}
    deploy: {{replicas: 2}}
  client:                   # reaches both by name, on the one port
    image: c2s/python:test
    command: [python3, -c, "import time; time.sleep(600)"]
    healthcheck:
      test: [CMD, sh, -c, "python3 -c \\"{ASK}\\" shard-a:{port} | grep -qx shard-a &&
                           python3 -c \\"{ASK}\\" shard-b:{port} | grep -qx shard-b"]
      interval: 1s
      retries: 20
    depends_on: [shard-a, shard-b]
""")
    converted, up = convert_and_up(node)
    assert up.returncode == 0, up.stdout + up.stderr
    # both replicas of shard-b run (shard-b-1, shard-b-2), each on its own address, on the one port
    a, b1, b2 = (endpoint(node, name, port) for name in ("shard-a", "shard-b-1", "shard-b-2"))
    assert len({a, b1, b2}) == 3 and all(e.endswith(f":{port}") for e in (a, b1, b2))
    assert ask(node, a).stdout.strip() == "shard-a"
    assert ask(node, b1).stdout.strip() == ask(node, b2).stdout.strip() == "shard-b"
    assert wait_healthy(node, "client")["health"] == "healthy"
    assert [l for l in up.stderr.splitlines() if l.startswith("run.sh: service ")] == [], up.stderr


def test_a_same_image_replica_pair_on_an_undeclared_port_names_the_first_replica(bed):
    node = bed
    port = 28783
    replica = f"""
    image: c2s/python:test
    command: [python3, -c, "{DEFAULT_PORT_SERVER.format(port=port)}"]
    healthcheck: {LISTENING}"""
    write_stack(node, f"""
services:
  worker-a:{replica}
  worker-b:{replica}
    depends_on: {{worker-a: {{condition: service_healthy}}}}
""")
    _, up = convert_and_up(node)
    assert up.returncode != 0, up.stdout + up.stderr
    assert run_lines(up.stderr, "worker-a") == [
        f"run.sh: service worker-a: listens on all interfaces (0.0.0.0:{port}), {ALL_INTERFACES.format(port=port)}"
    ], up.stderr
    assert "run.sh: service worker-b failed: " in up.stderr and "Address already in use" in up.stderr, up.stderr
    # worker-b's log says only "Address already in use": the line names who holds the port
    assert (f"run.sh: service worker-b found an address in use (its endpoints: none known; none is held now); "
            f"service worker-a of this project listens on all interfaces (0.0.0.0:{port}), which holds port {port} "
            "on every address" in up.stderr.splitlines()), up.stderr


def test_a_host_network_service_without_ports_is_reached_on_the_node(bed):
    node = bed
    port = 28791
    write_stack(node, f"""
services:
  agent:                    # the node's network, its default port, no `ports`
    image: c2s/python:test
    network_mode: host
    command: [python3, -c, "{DEFAULT_PORT_SERVER.format(port=port)}"]
    healthcheck: {LISTENING}
  probe:                    # another service reaches it as under Docker: host.docker.internal
    image: c2s/python:test
    command: [python3, -c, "import time; time.sleep(600)"]
    healthcheck:
      test: [CMD, python3, -c, "import socket; socket.create_connection(('host.docker.internal', {port}), 3)"]
      interval: 1s
      retries: 20
    depends_on: [agent]
""")
    _, up = convert_and_up(node)
    assert up.returncode == 0, up.stdout + up.stderr
    assert plan_of(node)["agent"]["ports"] == []
    for where in (f"127.0.0.1:{port}", f"localhost:{port}"):
        got = node.run(f"python3 -c \"import socket; socket.create_connection(('{where.split(':')[0]}', {port}), 3); "
                       "print('reached')\"")
        assert got.stdout.strip() == "reached", (where, got.stdout + got.stderr)
    assert wait_healthy(node, "probe")["health"] == "healthy"
    # on the node's network, as asked; on a shared node that is worth the one line
    assert run_lines(up.stderr, "agent") == [
        f"run.sh: service agent: listens on all interfaces (0.0.0.0:{port}), {ALL_INTERFACES.format(port=port)}"
    ], up.stderr


# the stand-in for a database that must be initiated by a client before it is ready (MongoDB's
# replica set): answers "initiated" once a client has sent "initiate", else "uninitiated"
DB_SERVER = """import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as SERVER)
s.bind((os.environ['BIND'], int(os.environ['PORT'])))
s.listen()
print('listening on', s.getsockname(), flush=True)
state = 'uninitiated'
while True:
    c, _ = s.accept()
    if c.recv(100) == b'initiate':
        state = 'initiated'
    c.sendall(state.encode())
    c.close()
"""
# the stand-in for mongosh: sends argv[2] to argv[1] (HOST:PORT), prints the answer, and fails
# unless the server is initiated
DB_CLIENT = """import socket, sys
host, port = sys.argv[1].rsplit(':', 1)
c = socket.create_connection((host, int(port)), 3)
c.sendall(sys.argv[2].encode())
answer = c.recv(100).decode()
print(answer)
sys.exit(answer != 'initiated')
"""
# the entry: the server, then its initiation from its own init script, through localhost
DB_INIT = """#!/bin/sh
python3 /app/server.py &
until python3 /app/client.py localhost:28795 initiate; do sleep 0.2; done
wait
"""


def test_a_services_own_init_script_and_healthcheck_reach_it_through_localhost(bed):
    node = bed
    port = 28795
    write_stack(node, f"""
services:
  db:
    image: c2s/python:test
    command: [sh, /app/init.sh]
    environment: {{BIND: 0.0.0.0, PORT: "{port}"}}
    volumes: [./server.py:/app/server.py, ./client.py:/app/client.py, ./init.sh:/app/init.sh]
    x-compose2sif: {{ports: {{"{port}": {{env: PORT}}}}, bind_address: {{env: BIND}}}}
    healthcheck:
      test: [CMD, python3, /app/client.py, "localhost:{port}", status]
      interval: 1s
      retries: 20
""", {"server.py": DB_SERVER, "client.py": DB_CLIENT, "init.sh": DB_INIT})
    _, up = convert_and_up(node)
    assert up.returncode == 0, up.stdout + up.stderr
    own = endpoint(node, "db", port)
    assert own.startswith("127.") and not own.startswith("127.0.0.1:")
    assert wait_healthy(node, "db")["health"] == "healthy", node.run(f"{PLAN_MODE} {OUT}/run.sh logs db").stdout
    got = node.run(f"python3 ~/{STACK}/client.py {own} status")
    assert got.stdout.strip() == "initiated", got.stdout + got.stderr
    # it is on its own address, not on the node's 127.0.0.1: its localhost was its own
    assert "refused" in node.run(f"python3 ~/{STACK}/client.py 127.0.0.1:{port} status").stderr
    assert run_lines(up.stderr, "db") == [], up.stderr
