"""Issue 23 on the test bed: a stack whose services all bind 0.0.0.0 on one port, with no hint
(tests/e2e/intercept-stack: three copies of one Python server answering its own name, an nginx
listening on 80 and [::]:80, and Debian's etcd, a Go server, downloaded from
Debian's archive), runs under the per-service loopback (bin/c2s-loopback): each answers by its name on its
own address, from the node and from another service. With C2S_PORT_ISOLATION=plan the same stack
gets today's plan-time knobs only: the copies clash on 0.0.0.0:8000. Real Apptainer, real images,
as the unprivileged user hpc (rootless), and on the setuid node where the test bed has one."""
import glob
import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

OUT = "out-icpt"
COPIES = ("a", "b", "c")


def etcd_deb(node) -> str:
    """Debian's etcd-server package (a Go server), downloaded from Debian's archive once and kept
    beside the test bed's cache."""
    cache = node.root.parent / "debs"
    cache.mkdir(exist_ok=True)
    found = sorted(glob.glob(str(cache / "etcd-server_*_amd64.deb")))
    if not found:
        download = ["apt-get", "download", "-q", "etcd-server"]
        if subprocess.run(download, cwd=cache, capture_output=True, timeout=600).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True, timeout=600)  # a fresh machine
            subprocess.run(download, cwd=cache, check=True, capture_output=True, timeout=600)
        found = sorted(glob.glob(str(cache / "etcd-server_*_amd64.deb")))
    assert found, f"apt-get download etcd-server left no package in {cache}"
    return found[-1]


def add_go_server(node, stack: Path) -> None:
    """Debian's etcd binary into the stack (bound into the Python image), and a service for it in
    an override file: a Go program makes its binds from its own threads as raw system calls."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", etcd_deb(node), tmp], check=True)
        (stack / "go").mkdir()
        (stack / "go" / "etcd").write_bytes((Path(tmp) / "usr/bin/etcd").read_bytes())
    (stack / "go" / "etcd").chmod(0o755)
    (stack / "compose.go.yaml").write_text(
        "services:\n  go:\n    image: c2s/python:test\n    volumes: ['./go:/go:ro']\n"
        "    command: ['/go/etcd', '--name', 'go', '--data-dir', '/tmp/etcd']\n")
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(stack)], check=True)


def up(node, isolation: str):
    files = "-f intercept-stack/compose.yaml -f intercept-stack/compose.go.yaml"
    return node.run(f"cd ~ && C2S_PORT_ISOLATION={isolation} python3 -m compose2sif {files} up -d "
                    f"--registry-mirror {node.registry} -o {OUT}", timeout=1500)


def own_addresses(node):
    plan = json.loads((node.home / OUT / "plan.json").read_text())
    return {names[0]: address for address, names in plan["hosts"] if names}


def fetch(node, url: str, via: str = "") -> str:
    """A GET from the node (plain curl, untraced), or from inside service `via` (run.sh exec: under its tracer)."""
    if via:
        code = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode().strip())"
        proc = node.run(f"cd ~ && {OUT}/run.sh exec {via} python3 -c {json.dumps(code)}", timeout=120)
    else:
        proc = node.run(f"curl -fsS --max-time 10 {url}", timeout=60)
    assert proc.returncode == 0, f"{url} via {via or 'the node'}: {proc.stdout}{proc.stderr}"
    return proc.stdout.strip()


@pytest.fixture(scope="module", params=["rootless", "setuid"])
def bed(request, node):
    if request.param == "setuid":
        node = request.getfixturevalue("setuid_node")
    stack = node.copy_stack("intercept-stack", source="intercept-stack")
    add_go_server(node, stack)
    node.run(f"cd ~ && rm -rf {OUT}")
    yield node
    node.run(f"cd ~ && {OUT}/run.sh down -v", timeout=300)


def test_every_service_keeps_its_port_and_answers_by_name(bed):
    node = bed
    proc = up(node, "intercept")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    own = own_addresses(node)
    ps = node.run(f"cd ~ && {OUT}/run.sh ps", timeout=120).stdout
    for name in COPIES:  # from the node: each on its own address, the port it bound
        assert fetch(node, f"http://{own[name]}:8000/") == f"I am {name}"
    # nginx's port 80 went to the project's block on its own address (its IPv6-only twin parked)
    moved = re.search(rf"RELOCATED service web: bind TCP 0\.0\.0\.0:80 ({re.escape(own['web'])}:\d+)", ps)
    assert moved, ps
    assert re.search(r"RELOCATED service web: park TCPv6 \[::\]:80 ", ps), ps
    assert fetch(node, f"http://{moved.group(1)}/") == "I am web"
    # from inside: another service by name (port 80 through web's record), and its own localhost
    assert fetch(node, "http://b:8000/", via="a") == "I am b"
    assert fetch(node, "http://web/", via="c") == "I am web"
    assert fetch(node, "http://localhost:8000/", via="c") == "I am c"
    table = node.run("cat /proc/net/tcp /proc/net/tcp6", check=True).stdout
    wildcards = [f[1] for f in (line.split() for line in table.splitlines()) if len(f) > 3 and f[3] == "0A"
                 and f[1].endswith(":1F40") and set(f[1][:-5]) == {"0"}]
    assert not wildcards, "something listens on every address, port 8000"
    members = node.run(f"curl -fsS --max-time 10 -X POST -d '{{}}' http://{own['go']}:2379/v3/cluster/member/list",
                       timeout=60)
    assert members.returncode == 0 and '"name":"go"' in members.stdout, members.stdout + members.stderr
    doctor = node.c2s(f"doctor -o {OUT}", timeout=300).stdout
    assert "ok   port isolation: per-service loopback (ptrace+seccomp" in doctor, doctor


def test_plan_mode_is_todays_behaviour(bed):
    """C2S_PORT_ISOLATION=plan: the node's one loopback. nginx cannot bind 80, and the copies
    share one 0.0.0.0:8000 (Python's server sets SO_REUSEPORT where it has it: the kernel deals
    connections among them; else the later ones find it held). The services start at once, so
    `up` fails on whichever clash it meets first and says which, or, where each had started when
    it was checked, succeeds and nginx's failure is in its log. One port, not three."""
    node = bed
    node.run(f"cd ~ && {OUT}/run.sh down", timeout=300)
    proc = up(node, "plan")
    port_80 = "bind() to 0.0.0.0:80 failed (13: Permission denied)"
    if proc.returncode == 0:
        logs = ""
        for _ in range(60):
            logs = node.run(f"cd ~ && {OUT}/run.sh logs web", timeout=120).stdout
            if port_80 in logs:
                break
            time.sleep(0.5)
        assert port_80 in logs, proc.stderr + logs
    else:
        port_8000 = re.search(r"service [abc] could not listen on 0\.0\.0\.0:8000: held by service [abc] of this "
                              r"project", proc.stderr)
        assert port_80 in proc.stderr or port_8000, proc.stderr
    # convert's summary of the fallback names the wildcard listener
    assert "listening on all interfaces there: a (0.0.0.0:8000)" in proc.stderr, proc.stderr
    answers = {fetch(node, "http://127.0.0.1:8000/") for _ in range(6)}
    assert answers <= {f"I am {n}" for n in COPIES}, answers
    ps = node.run(f"cd ~ && {OUT}/run.sh ps", timeout=120).stdout
    assert "RELOCATED" not in ps, ps


LOW = 28791  # published port of the server fixed on port 80


def test_a_privileged_port_nothing_can_move_runs_under_the_tracer_and_is_refused_by_up_without_it(bed):
    """A server fixed on port 80 (`python3 -m http.server 80`: no variable or flag compose2sif
    could tell it another port through), published on LOW. convert no longer refuses it (the output
    has bin/c2s-loopback): its summary says the fallback refuses it. `up` with the plan-time knobs only refuses
    it in one line with the fix for such nodes, and starts nothing; by default the tracer moves its
    80 onto the project's block and the published port reaches it there."""
    node = bed
    stack = node.home / "low-stack"
    stack.mkdir(exist_ok=True)
    (stack / "compose.yaml").write_text(
        "name: c2s-low\nservices:\n  low:\n    image: c2s/python:test\n"
        f"    command: [python3, -m, http.server, '80']\n    ports: ['{LOW}:80']\n")
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(stack)], check=True)
    node.run("cd ~ && rm -rf low-out")
    try:
        convert = node.c2s(f"-f low-stack/compose.yaml convert --registry-mirror {node.registry} -o low-out",
                           timeout=300)
        assert convert.returncode == 0, convert.stdout + convert.stderr
        # convert plans it as written; the fallback's refusal is one line of its summary, in full at `up`
        assert [l for l in convert.stderr.splitlines() if l.startswith("WARN ")] == [
            "WARN where a node cannot give each service a loopback of its own, `up` falls back to the plan-time "
            "knobs (fallback/plan.json): refused there: low; nothing is isolated there: any user of the node "
            "reaches every port of every service, and networks (internal ones too) do not keep services apart"], \
            convert.stderr
        node.run("cd ~ && low-out/run.sh build", check=True, timeout=900)  # as `compose2sif up` does first
        refused = node.run("cd ~ && C2S_PORT_ISOLATION=plan low-out/run.sh up -d", timeout=900)
        assert refused.returncode != 0, refused.stdout + refused.stderr
        lines = [l for l in refused.stderr.splitlines() if l.startswith("run.sh: up: service 'low' listens on port 80")]
        assert len(lines) == 1 and "; fix: " in lines[0] and lines[0].endswith(
            "(port isolation: C2S_PORT_ISOLATION=plan)"), refused.stderr
        assert "run.sh: up: nothing was started" in refused.stderr, refused.stderr
        assert not [p for p in node.processes() if "http.server" in p]
        doctor = node.run("cd ~ && C2S_PORT_ISOLATION=plan python3 -m compose2sif doctor -o low-out", timeout=300).stdout
        assert "fail service low: `up` refuses it on this node: service 'low' listens on port 80" in doctor, doctor
        up = node.run("cd ~ && low-out/run.sh up -d", timeout=900)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "Directory listing" in fetch(node, f"http://127.0.0.1:{LOW}/")
        ps = node.run("cd ~ && low-out/run.sh ps", timeout=120).stdout
        assert re.search(r"RELOCATED service low: bind TCPv?6? \S+:80 \S+:\d+", ps), ps
    finally:
        node.run("cd ~ && low-out/run.sh down -v", timeout=300)
