"""Issue 45 on the real test bed (rootless Apptainer, then setuid Apptainer on a node without user
namespaces; as written under the tracer on both): a project's
compose networks keep its services apart as Docker's do (tests/e2e/networks-stack, no hint). Every
check runs inside a service (`run.sh exec`, under that service's tracer and rules) and every answer
names its sender: the servers are STAND-INS that answer their own name (intercept-stack's who.py);
db is Debian's real Redis."""
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from testbed import DNS_QUERY

pytestmark = pytest.mark.e2e

OUT = "nets-out"
CONNECT = """
import socket, sys
s = socket.socket()
s.settimeout(10)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
except OSError as e:
    print("refused", e.errno)
    sys.exit(0)
if sys.argv[2] == "6379":
    s.sendall(b"PING\\r\\n"); print(s.recv(64).decode().strip())
else:
    s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
    answer = b""
    while True:
        part = s.recv(4096)
        if not part:
            break
        answer += part
    print(answer.decode().strip().splitlines()[-1] if answer.strip() else "nothing")
"""


@pytest.fixture(scope="module", params=["rootless", "setuid"])
def nets(request):
    """The stack up on the rootless node, then on the setuid one (no user namespaces for hpc)."""
    node = request.getfixturevalue("node" if request.param == "rootless" else "setuid_node")
    stack = node.copy_stack("networks-stack", source="networks-stack")
    (stack / "app").mkdir(exist_ok=True)
    shutil.copy(Path(__file__).parent / "intercept-stack" / "app" / "who.py", stack / "app" / "who.py")
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(stack / "app")], check=True)
    node.run(f"cd ~ && rm -rf {OUT}")
    proc = node.run(f"cd ~ && C2S_PORT_ISOLATION=intercept python3 -m compose2sif -f networks-stack/compose.yaml "
                    f"up -d --registry-mirror {node.registry} -o {OUT}", timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # a listener of the node's on every address (the gateway 127.A.B.1 too), outside the project
    node.run("cd /tmp && (setsid python3 -m http.server --bind 0.0.0.0 18777 &) </dev/null >/dev/null 2>&1")
    yield node, proc
    node.run(f"cd ~ && {OUT}/run.sh down -v", timeout=300)
    node.run("pkill -f 'http.server --bind 0.0.0.0 18777'")


def addresses(node):
    plan = json.loads((node.home / OUT / "plan.json").read_text())
    return {names[0]: address for address, names in plan["hosts"] if names}


def from_inside(node, via: str, host: str, port: int) -> str:
    proc = node.run(f"cd ~ && {OUT}/run.sh exec {via} python3 -c {shlex.quote(CONNECT)} {host} {port}", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


def test_convert_says_nothing_of_networks_not_isolated(nets):
    _, proc = nets
    assert "networks are not isolated" not in proc.stderr, proc.stderr


def test_services_on_a_common_network_reach_each_other_by_name(nets):
    node, _ = nets
    assert from_inside(node, "front", "api", 8000) == "I am api"
    assert from_inside(node, "api", "front", 8000) == "I am front"
    assert from_inside(node, "api", "db", 6379) == "+PONG"
    assert from_inside(node, "sandbox", "egress", 8000) == "I am egress"
    assert from_inside(node, "egress", "front", 8000) == "I am front"


def test_a_service_on_no_common_network_is_not_found_by_name_and_refused_by_address(nets):
    node, _ = nets
    own = addresses(node)
    for via, name in (("front", "db"), ("sandbox", "api"), ("sandbox", "db"), ("sandbox", "host.docker.internal")):
        said = from_inside(node, via, name, 8000)
        assert said.startswith("refused -"), f"{via} resolved {name}: {said}"  # a getaddrinfo error: not found
    assert from_inside(node, "front", own["db"], 6379) == "refused 111"
    assert from_inside(node, "sandbox", own["api"], 8000) == "refused 111"
    assert from_inside(node, "sandbox", own["db"], 6379) == "refused 111"


def test_a_host_network_wildcard_bind_and_an_own_address_bind_share_a_port(nets):
    """qanything: hostnet binds 0.0.0.0:18213 on the node's network, metrics binds 18213 on its own
    address after it. Each answers where Docker would send the connection."""
    node, proc = nets
    own = addresses(node)
    said = node.run(f"python3 -c {shlex.quote(ASK)} 127.0.0.1 18213", timeout=60)
    assert said.stdout.strip() == "I am hostnet", said.stdout + said.stderr + proc.stderr
    said = node.run(f"python3 -c {shlex.quote(ASK)} {own['metrics']} 18213", timeout=60)
    assert said.stdout.strip() == "I am metrics", said.stdout + said.stderr
    assert from_inside(node, "front", "metrics", 18213) == "I am metrics"
    assert from_inside(node, "front", "host.docker.internal", 18213) == "I am hostnet"


def test_a_per_network_alias_is_found_on_its_network_only(nets):
    node, _ = nets
    assert from_inside(node, "sandbox", "proxy", 8000) == "I am egress"     # jail's alias, from jail
    assert from_inside(node, "front", "egress-web", 8000) == "I am egress"  # web's, from web
    for via, name in (("sandbox", "egress-web"), ("front", "proxy")):
        said = from_inside(node, via, name, 8000)
        assert said.startswith("refused -"), f"{via} resolved {name}: {said}"  # not found


def test_an_internal_only_service_reaches_nothing_beyond_the_project(nets):
    node, _ = nets
    gateway = json.loads((node.home / OUT / "plan.json").read_text())["address_block"] + ".1"
    assert from_inside(node, "sandbox", gateway, 18777) == "refused 101"
    node_ip = node.run("hostname -I 2>/dev/null | cut -d' ' -f1", timeout=30).stdout.strip() or "10.255.255.1"
    assert from_inside(node, "sandbox", node_ip, 18777) == "refused 101"
    # egress, also on a network that is not internal, reaches the node's listener through the gateway
    said = from_inside(node, "egress", gateway, 18777)
    assert said and not said.startswith("refused"), said


def test_plan_and_ps_say_who_reaches_whom(nets):
    node, _ = nets
    plan = {s["name"]: s for s in json.loads((node.home / OUT / "plan.json").read_text())["services"]}
    assert plan["sandbox"]["reach"] == {"networks": ["jail"], "services": ["egress"], "outside": False,
                                        "mode": "networks", "hidden_names": {"egress": ["egress-web"]}}
    assert plan["front"]["reach"]["services"] == ["api", "egress", "hostnet", "metrics"]
    assert plan["front"]["reach_limited"]
    ps = node.run(f"cd ~ && {OUT}/run.sh ps", timeout=120).stdout
    assert "NETWORK jail: egress sandbox" in ps and "NETWORK data: api db" in ps, ps
    rows = {r["service"]: r for r in json.loads(node.run(f"cd ~ && {OUT}/run.sh ps --format json",
                                                         timeout=120).stdout)}
    assert rows["egress"]["networks"] == ["jail", "web"]


ASK = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
try:  # closed by the service's side before anything is read: an end of file, or a reset
    s.sendall(b"PING\\r\\n" if sys.argv[2] == "6379" else b"GET / HTTP/1.0\\r\\n\\r\\n")
    answer = s.recv(4096)
    while sys.argv[2] != "6379" and answer:  # HTTP/1.0: the whole answer, to the server's close
        part = s.recv(4096)
        if not part:
            break
        answer += part
    print((answer.decode().strip().splitlines() or ["closed"])[-1])
except (ConnectionResetError, BrokenPipeError):
    print("closed")
"""


def as_outsider(host: str, port: int) -> str:
    """A process of another unprivileged user of the node (nobody, 65534, on the host: the node shares
    its network), connecting and sending a request."""
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                           ASK, host, str(port)], capture_output=True, text=True, timeout=60, cwd="/")
    return proc.stdout.strip() or proc.stderr.strip().splitlines()[-1]


DATAGRAM = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.sendto(b"who", (sys.argv[1], int(sys.argv[2])))
try:
    print(s.recv(64).decode())
except socket.timeout:
    print("no answer")
"""


# to who.py's udp-read server: a datagram naming where the answer goes (it reads with read())
DATAGRAM_READ = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.bind(("0.0.0.0", 0))
host, port = s.getsockname()
s.sendto(f"who {'127.0.0.1' if host == '0.0.0.0' else host}:{port}".encode(), (sys.argv[1], int(sys.argv[2])))
try:
    print(s.recv(64).decode())
except socket.timeout:
    print("no answer")
"""


def test_another_user_of_the_node_reaches_only_what_is_published(nets):
    node, _ = nets
    own = addresses(node)
    assert as_outsider(own["db"], 6379) == "closed"       # the project's redis: no +PONG for another user
    assert as_outsider(own["api"], 8000) == "closed"
    assert as_outsider("127.0.0.1", 18211) == "I am front"  # published: everyone, as under Docker
    # the project's own user reaches the services' own addresses from a shell of the node (untraced)
    said = node.run(f"python3 -c {shlex.quote(ASK)} {own['db']} 6379", timeout=60)
    assert said.stdout.strip() == "+PONG", said.stdout + said.stderr
    said = node.run(f"python3 -c {shlex.quote(ASK)} {own['api']} 8000", timeout=60)
    assert said.stdout.strip() == "I am api", said.stdout + said.stderr
    # UDP: another user's datagram never reaches api; the project's user's, from a node shell and
    # from a service on its network, are answered
    outsider = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                               "-c", DATAGRAM, own["api"], "8000"], capture_output=True, text=True, timeout=60, cwd="/")
    assert outsider.stdout.strip() == "no answer", outsider.stdout + outsider.stderr
    said = node.run(f"python3 -c {shlex.quote(DATAGRAM)} {own['api']} 8000", timeout=60)
    assert said.stdout.strip() == "I am api", said.stdout + said.stderr
    said = node.run(f"cd ~ && {OUT}/run.sh exec front python3 -c {shlex.quote(DATAGRAM)} api 8000", timeout=120)
    assert said.stdout.strip() == "I am api", said.stdout + said.stderr
    # the same for datagrams api reads with read(), which does not say the sender
    outsider = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                               "-c", DATAGRAM_READ, own["api"], "8001"], capture_output=True, text=True, timeout=60,
                              cwd="/")
    assert outsider.stdout.strip() == "no answer", outsider.stdout + outsider.stderr
    said = node.run(f"python3 -c {shlex.quote(DATAGRAM_READ)} {own['api']} 8001", timeout=60)
    assert said.stdout.strip() == "I am api", said.stdout + said.stderr
    said = node.run(f"cd ~ && {OUT}/run.sh exec front python3 -c {shlex.quote(DATAGRAM_READ)} api 8001", timeout=120)
    assert said.stdout.strip() == "I am api", said.stdout + said.stderr




def test_dockers_dns_answers_each_service_the_names_its_networks_reach(nets):
    """Docker's DNS (127.0.0.11) answers by the asker: each service of a network of its own asks a
    DNS server of its own, which knows the names it reaches."""
    node, _ = nets
    own = addresses(node)

    def ask(via, name):
        proc = node.run(f"cd ~ && {OUT}/run.sh exec {via} python3 -c {shlex.quote(DNS_QUERY)} {name}", timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout.strip()
    assert ask("front", "api") == own["api"]
    assert ask("api", "db") == own["db"]
    assert ask("sandbox", "egress") == own["egress"]
    assert ask("sandbox", "proxy") == own["egress"] and ask("front", "egress-web") == own["egress"]
    assert ask("sandbox", "egress-web").startswith("rcode ") and ask("front", "proxy").startswith("rcode ")
    for via, name in (("front", "db"), ("sandbox", "api"), ("sandbox", "db")):
        assert ask(via, name).startswith("rcode "), f"{via} resolved {name}"


LOOKUP = ("import socket, sys\ntry: print(socket.gethostbyname(sys.argv[1]))\n"
          "except OSError as e: print('not found', e.errno)")


def test_a_services_resolver_is_dockers_dns_as_on_a_docker_network(nets):
    """As on a Docker network, each traced service's /etc/resolv.conf names 127.0.0.11 alone (the
    node's search and options kept, ndots:0 added where they set none), which its tracer sends to
    its DNS server: glibc's lookups beyond the hosts file go through it to the node's resolver
    (asked from the node, so a resolver on the node's loopback works), and a service whose
    networks are all internal gets no name from beyond."""
    node, _ = nets
    conf = node.run(f"cd ~ && {OUT}/run.sh exec front cat /etc/resolv.conf", timeout=120)
    servers = [line.split()[1] for line in conf.stdout.splitlines() if line.startswith("nameserver")]
    assert servers == ["127.0.0.11"], conf.stdout + conf.stderr
    outside = "pypi.org"  # a name of the node's resolver, where the node has one that answers
    on_node = node.run(f"python3 -c {shlex.quote(LOOKUP)} {outside}", timeout=60).stdout.strip()
    in_front = node.run(f"cd ~ && {OUT}/run.sh exec front python3 -c {shlex.quote(LOOKUP)} {outside}", timeout=120)
    in_sandbox = node.run(f"cd ~ && {OUT}/run.sh exec sandbox python3 -c {shlex.quote(LOOKUP)} {outside}",
                          timeout=120)
    assert in_sandbox.stdout.startswith("not found"), in_sandbox.stdout + in_sandbox.stderr
    if on_node.startswith("not found"):
        pytest.skip(f"the node resolves no {outside} ({on_node}): the relay beyond the project is not checked here")
    assert in_front.stdout.strip() == on_node, in_front.stdout + in_front.stderr
