"""Published ports the way Docker publishes them, and run-time truth (issue 18).

The plan: a port published on another number keeps the service's own address and port, and a
forwarder publishes it. run.sh's functions (run/lib/forward.sh, run/lib/endpoints.sh) on this
machine with real processes and real sockets: the real forwarder (compose2sif/intercept/forward.c,
built into the package: setup.py), its Python fallback (compose2sif/c2s-forward.py), and STAND-IN SERVERS (Python one-liners named `c2s-standin-*`) in place of
services; the "instance init" whose process tree is read is a stand-in bash process as well."""
import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import free_ports, kill_groups, run_lib

# the stand-in servers listen on the services' ports (on 0.0.0.0 among others): under xdist
# these tests run on one worker, one after another, never beside each other
pytestmark = pytest.mark.xdist_group("published-ports")

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "run"
ENGINE_MARKER = "# ---- the engine (the same for every project"
BLOCK = "127.77.7"  # --address-block: services get .2, .3, ... by name


# the services' own ports: free on this machine when the tests start (a stand-in binds one of them on
# 0.0.0.0, which a listener on that port on any address would refuse: never a fixed number)
FREE = free_ports(12)  # (at once: twelve distinct ports)
WEB, LOCAL, BARE, PRIV = FREE[:4]
HINTS = 'x-compose2sif: {ports: {"%d": {env: PORT}}, bind_address: {env: HOST}}'


@pytest.fixture(scope="module")
def ports():
    return FREE[4:]


@pytest.fixture(scope="module")
def converted(tmp_path_factory, ports):
    """A project with each kind of published port, converted once; out/header.sh is run.sh's header."""
    web, inner_c, bare, local, high, same, base = ports[0], ports[1], ports[2], ports[3], ports[4], ports[5], ports[6]
    root = tmp_path_factory.mktemp("published")
    (root / "compose.yaml").write_text(f"""
services:
  web:                      # published on another number: a forwarder, the service keeps its port
    image: busybox
    environment: {{PORT: "{WEB}", HOST: 0.0.0.0}}
    ports: ["{web}:{WEB}"]
    {HINTS % WEB}
  inner:                    # an internal port equal to web's published one: it is the one that moves
    image: busybox
    environment: {{PORT: "{web}", HOST: 0.0.0.0}}
    {HINTS % web}
  bare:                     # cannot be told an address or a port: forwarded all the same
    image: busybox
    command: [sleep, "1000"]
    ports: ["{bare}:{BARE}"]
  local:                    # published on 127.0.0.1 only
    image: busybox
    environment: {{PORT: "{LOCAL}", HOST: 0.0.0.0}}
    ports: ["127.0.0.1:{local}:{LOCAL}"]
    {HINTS % LOCAL}
  priv:                     # published on a privileged port: the forwarder moves, the service does not
    image: busybox
    environment: {{PORT: "{PRIV}", HOST: 0.0.0.0}}
    ports: ["80:{PRIV}"]
    {HINTS % PRIV}
  low:                      # a privileged container port still moves, behind its forwarder
    image: busybox
    environment: {{PORT: "80", HOST: 0.0.0.0}}
    ports: ["{high}:80"]
    {HINTS % 80}
  same:                     # published on its own number: served there directly, as before
    image: busybox
    environment: {{PORT: "{same}", HOST: 0.0.0.0}}
    ports: ["{same}:{same}"]
    extra_hosts: ["gw.example:host-gateway"]
    {HINTS % same}
""")
    proc = subprocess.run(["python3", "-m", "compose2sif", "-f", str(root / "compose.yaml"), "convert", "--offline",
                           "--address-block", f"{BLOCK}.0/24", "--port-base", str(base), "-o", str(root / "out")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    text = (root / "out" / "run.sh").read_text()
    (root / "out" / "header.sh").write_text(text[:text.index(ENGINE_MARKER)])
    (root / "out" / "convert.err").write_text(proc.stderr)
    return root / "out"


def plan_ports(out, name="fallback/plan.json"):
    """Each service's ports by container port: the plan-time knobs' plan (fallback/, the run.sh
    functions below run it: no tracer), or with NAME plan.json, the plan as written."""
    plan = json.loads((out / name).read_text())
    return {s["name"]: {p["container"]: p for p in s["ports"]} for s in plan["services"]}


def own(name):
    return f"{BLOCK}.{2 + sorted(['bare', 'inner', 'local', 'low', 'priv', 'same', 'web']).index(name)}"


# ---- the plan ---------------------------------------------------------------------------------

def test_a_port_published_on_another_number_keeps_the_services_port_behind_a_forwarder(converted, ports):
    p = plan_ports(converted)
    assert p["web"][WEB]["address"] == own("web") and p["web"][WEB]["host"] == WEB
    assert p["web"][WEB]["forward"] == f"0.0.0.0:{ports[0]}"
    assert p["local"][LOCAL]["forward"] == f"127.0.0.1:{ports[3]}"
    assert p["local"][LOCAL]["address"] == own("local")
    # a service that cannot be told anything listens on all addresses; its forwarder reaches it on 127.0.0.1
    assert p["bare"][BARE]["address"] == "0.0.0.0" and p["bare"][BARE]["forward"] == f"0.0.0.0:{ports[2]}"
    err = (converted / "convert.err").read_text()
    assert "cannot tell it another port" not in err
    header = (converted / "header.sh").read_text()
    assert f"S_FORWARDS=(0.0.0.0:{ports[0]} {own('web')}:{WEB})" in header
    assert f"S_FORWARDS=(0.0.0.0:{ports[2]} 127.0.0.1:{BARE})" in header
    assert os.access(converted / "bin" / "x86_64" / "c2s-forward", os.X_OK)


def test_published_ports_claim_their_place_first_and_a_privileged_one_moves_its_forwarder(converted, ports):
    p, base = plan_ports(converted), ports[6]
    assert p["inner"][ports[0]]["host"] != ports[0]  # the internal port moved, the published one stayed
    assert base <= p["inner"][ports[0]]["host"] < base + 100
    forward_port = int(p["priv"][PRIV]["forward"].rsplit(":", 1)[1])
    assert base <= forward_port < base + 100 and p["priv"][PRIV]["host"] == PRIV
    assert (f"service 'priv': published port 80 is privileged; it is published on 0.0.0.0:{forward_port} instead "
            f"(forwarded to its port {PRIV})") in (converted / "convert.err").read_text()
    low = p["low"][80]
    assert base <= low["host"] < base + 100 and low["forward"] == f"0.0.0.0:{ports[4]}"
    same = p["same"][ports[5]]
    assert same["forward"] is None and same["address"] == "0.0.0.0" and same["host"] == ports[5]


def test_as_written_every_service_keeps_its_ports_and_every_published_port_has_a_forwarder(converted, ports):
    """The plan where each service gets a loopback of its own: each port on the service's own
    address, as its compose file says (nothing moved, nothing told); each published port, on its
    own number too, served by a forwarder, on the address compose gives (all of them: run.sh serves
    it on each of the node's addresses); a privileged published port on a block port instead."""
    p, base = plan_ports(converted, "plan.json"), ports[6]
    for name, by_port in p.items():
        assert all(e["address"] == own(name) and e["host"] == e["container"] for e in by_port.values()), name
    assert p["inner"][ports[0]]["forward"] is None  # an internal port beside web's published one: kept
    assert p["web"][WEB]["forward"] == f"0.0.0.0:{ports[0]}" and p["bare"][BARE]["forward"] == f"0.0.0.0:{ports[2]}"
    assert p["local"][LOCAL]["forward"] == f"127.0.0.1:{ports[3]}"
    assert p["low"][80]["forward"] == f"0.0.0.0:{ports[4]}"  # its 80: the tracer moves it at run time
    assert p["same"][ports[5]]["forward"] == f"0.0.0.0:{ports[5]}"
    forward_port = int(p["priv"][PRIV]["forward"].rsplit(":", 1)[1])
    assert base <= forward_port < base + 50
    assert (f"service 'priv': published port 80 is privileged; it is published on 0.0.0.0:{forward_port} instead "
            f"(forwarded to its port {PRIV})") in (converted / "convert.err").read_text()
    env = (converted / "env" / "inner.env").read_text()
    assert f"PORT={ports[0]}" in env and "HOST=0.0.0.0" in env  # as written
    # the node as the services reach it: the project's gateway (the tracer would take 127.0.0.1 for
    # the service's own loopback); the fallback has no tracer, so there it is 127.0.0.1
    names = {n: a for a, *rest in (l.split() for l in (converted / "hosts.names").read_text().splitlines()) for n in rest}
    assert names["host.docker.internal"] == names["gw.example"] == f"{BLOCK}.1"
    names = {n: a for a, *rest in (l.split() for l in (converted / "fallback" / "hosts.names").read_text().splitlines())
             for n in rest}
    assert names["host.docker.internal"] == names["gw.example"] == "127.0.0.1"


# ---- run.sh: forwarders and what services really listen on ------------------------------------

@pytest.fixture
def project(converted, tmp_path):
    shutil.copytree(converted, tmp_path / "out", symlinks=True)
    (tmp_path / "out" / "state" / "run").mkdir(parents=True)
    (tmp_path / "out" / "state" / "logs").mkdir(parents=True)
    started = []
    yield tmp_path, started
    kill_groups(started)




def standin_server(started, address, port, name):
    """A STAND-IN SERVER (answers HTTP) on ADDRESS:PORT, run by a stand-in instance init (bash, its
    parent): the pid returned is the init's. It says when it has bound, so that a port another
    process holds fails here, by name, and not later as a listener the test did not start."""
    code = (f"import http.server as h; s = h.HTTPServer(({address!r}, {port}), h.SimpleHTTPRequestHandler); "
            "print('bound', flush=True); s.serve_forever()")
    proc = subprocess.Popen(["bash", "-c", f'python3 -c "$1" {name} & wait', "c2s-standin-init", code],
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    started.append(proc)
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    bound = ready and proc.stdout.readline() == b"bound\n"
    proc.stdout.close()  # (it prints nothing more; its requests are logged to stderr)
    if not bound:
        raise AssertionError(f"the stand-in server could not listen on {address}:{port} (held by another process?)")
    return proc.pid


def get(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status


def listens(port):
    return any(f":{port:04X} " in line and line.split()[3] == "0A"
               for table in ("/proc/net/tcp", "/proc/net/tcp6") for line in open(table).read().splitlines()[1:])


def test_a_forwarder_answers_on_the_published_port_and_goes_with_stop(project, ports):
    tmp_path, started = project
    standin_server(started, own("web"), WEB, "c2s-standin-web")
    proc = run_lib(tmp_path, 'load_service web && start_forwarders && cat "$RUNDIR/web.forward"')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pid = int(proc.stdout.split()[0])
    assert proc.stdout.split()[2:] == [f"0.0.0.0:{ports[0]}", f"{own('web')}:{WEB}"]
    assert "c2s-forward" in open(f"/proc/{pid}/cmdline").read()  # shown as itself in `ps`
    # clients on the node: localhost:P and 127.0.0.1:P, as under Docker
    assert get(f"http://127.0.0.1:{ports[0]}/") == 200
    assert get(f"http://localhost:{ports[0]}/") == 200
    # a second start finds it running
    again = run_lib(tmp_path, 'load_service web && start_forwarders && cat "$RUNDIR/web.forward"')
    assert again.stdout == proc.stdout
    stop = run_lib(tmp_path, 'stop_forwarders web && wait_ended "${FORWARDERS_ENDED[@]}" && ls "$RUNDIR"')
    assert stop.returncode == 0 and "web.forward" not in stop.stdout, stop.stderr
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z"
    assert not listens(ports[0])


def named_server(started, address, port, name):
    """A STAND-IN SERVER on ADDRESS:PORT that answers every GET with NAME (who answered)."""
    code = ("import http.server as h, sys\n"
            "class A(h.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.end_headers(); self.wfile.write(sys.argv[1].encode())\n"
            "    def log_message(self, *a): pass\n"
            f"s = h.HTTPServer(({address!r}, {port}), A); print('bound', flush=True); s.serve_forever()")
    proc = subprocess.Popen([sys.executable, "-c", code, name], start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    started.append(proc)
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    assert ready and proc.stdout.readline() == b"bound\n", f"{name} could not listen on {address}:{port}"
    return proc.pid


def answer(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def test_as_written_a_published_port_is_served_on_each_node_address_and_others_keep_that_port(project, ports):
    """Under the tracer (ISOLATION=intercept): `same` publishes P on its own number, and `inner`
    listens on P too, on its own address (as two containers do under Docker). The forwarders of
    `same` listen on 127.0.0.1:P, ::1 and each address of the node's interfaces, one by one, never
    on 0.0.0.0, and on the project's gateway (host.docker.internal): the node's clients and other
    services through host.docker.internal reach `same`, a client of `inner` reaches `inner`, and
    nothing answers on an address of the project nobody listens on."""
    tmp_path, started = project
    (tmp_path / "out" / "state" / "run" / "isolation").write_text(f"{socket.gethostname()} auto intercept\ntest\n")
    p = ports[5]
    named_server(started, own("same"), p, "same")
    named_server(started, own("inner"), p, "inner")
    proc = run_lib(tmp_path, 'load_service same && start_forwarders && cat "$RUNDIR/same.forward" && '
                             'node_addresses && echo "${NODE_ADDRESSES[*]} $GATEWAY"', HOSTNAME=socket.gethostname())
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        *records, addresses = proc.stdout.splitlines()
        assert addresses.split()[0] == "127.0.0.1" and "0.0.0.0" not in addresses
        assert addresses.split()[-1] == f"{BLOCK}.1"  # the gateway, where host.docker.internal points
        assert sorted(r.split()[2] for r in records) == sorted(f"{a}:{p}" for a in addresses.split())
        assert all(r.split()[3] == f"{own('same')}:{p}" for r in records)
        assert answer(f"http://127.0.0.1:{p}/") == "same" and answer(f"http://localhost:{p}/") == "same"
        for address in addresses.split()[1:]:
            assert answer(f"http://{address}:{p}/") == "same", address
        assert answer(f"http://{own('inner')}:{p}/") == "inner"
        with pytest.raises(OSError):  # not listening there: refused, never taken by another service
            answer(f"http://{own('web')}:{p}/")
        assert not any(line.split()[1].startswith("00000000:") or line.split()[1].startswith("0" * 32 + ":")
                       for table in ("/proc/net/tcp", "/proc/net/tcp6") for line in open(table).read().splitlines()[1:]
                       if line.split()[1].endswith(f":{p:04X}") and line.split()[3] == "0A")
    finally:
        stop = run_lib(tmp_path, 'stop_forwarders same && wait_ended "${FORWARDERS_ENDED[@]}"', HOSTNAME=socket.gethostname())
    assert stop.returncode == 0, stop.stderr


def test_a_published_port_held_by_another_process_is_named(project, ports):
    tmp_path, started = project
    holder = standin_server(started, "127.0.0.1", ports[3], "c2s-standin-holder")
    proc = run_lib(tmp_path, "load_service local && start_forwarders")
    assert proc.returncode != 0
    assert (f"its published port 127.0.0.1:{ports[3]} (forwarded to {own('local')}:{LOCAL}) is held by another "
            f"process on this node (pid ") in proc.stdout, proc.stdout
    child = open(f"/proc/{holder}/task/{holder}/children").read().split()[0]  # the stand-in server itself
    # its command line as the kernel has it: `python3` as the shell found it (a pyenv shim, say,
    # execs the interpreter by its full path), then -c and the code
    command = open(f"/proc/{child}/cmdline").read().replace("\0", " ")[:80].rstrip()
    assert command.split()[1:4] == ["-c", "import", "http.server"], command
    assert f"(pid {child}: {command}, of user " in proc.stdout and proc.stdout.endswith(
        ", of user root)\n" if os.getuid() == 0 else ")\n"), proc.stdout


def test_a_service_on_all_interfaces_is_told_in_one_line_and_shown_by_ps(project, ports):
    tmp_path, started = project
    init = standin_server(started, "0.0.0.0", WEB, "c2s-standin-web")  # told its address, listens on all
    proc = run_lib(tmp_path, 'load_service web && IPID=$1 && record_truth && tell_truth run.sh: web'
                .replace("$1", str(init)))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == [
        f"run.sh: service web: listens on all interfaces (0.0.0.0:{WEB}), where nothing is published: anyone who "
        f"reaches this node reaches it, and it holds port {WEB} on every address (tell it its address: "
        "x-compose2sif: {bind_address: {env: VAR}})"], lines
    # ps: the forwarder's published port beside the service's, the line as its warning
    ps = run_lib(tmp_path, f"source {RUN}/cmd/ps.sh && load_service web && ps_row 0 running none && "
                        'printf "%s\\n" "${PS_ROWS[@]}"; PS_JSON=1 && ps_row 0 running none && echo "${PS_ROWS[0]}"')
    table, row = ps.stdout.splitlines()[:6], json.loads(ps.stdout.splitlines()[6])
    assert table[4] == f"0.0.0.0:{ports[0]}->{own('web')}:{WEB}"
    assert row["published"] == [f"0.0.0.0:{ports[0]}->{own('web')}:{WEB}"]
    assert row["warnings"][0].startswith(f"listens on all interfaces (0.0.0.0:{WEB})")


def test_a_planned_port_that_never_opened_names_where_it_listens_and_who_holds_it(project, ports):
    tmp_path, started = project
    init = standin_server(started, "127.0.0.1", WEB, "c2s-standin-web")  # not on its own address
    proc = run_lib(tmp_path, f"load_service web && IPID={init} && record_truth && cat \"$RUNDIR/web.truth\"")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (f"does not listen on its planned {own('web')}:{WEB} (it listens on: 127.0.0.1:{WEB}); "
                                   f"its published port 0.0.0.0:{ports[0]} forwards there"), proc.stdout


def test_a_listener_on_another_services_endpoint_names_that_service(project, ports):
    tmp_path, started = project
    # `bare` listens on all addresses on its port, where `local` is planned: local cannot open it
    init = standin_server(started, "0.0.0.0", LOCAL, "c2s-standin-bare")
    proc = run_lib(tmp_path, f"load_service bare && IPID={init} && record_truth && cat \"$RUNDIR/bare.truth\"")
    assert (f"listens on 0.0.0.0:{LOCAL}, where service local is planned ({own('local')}:{LOCAL}): local cannot open it"
            in proc.stdout.splitlines()), proc.stdout
    # and the holder of local's endpoint is named as a service of this project, through its instance's init
    (tmp_path / "listing.json").write_text(json.dumps({"instances": [{"instance": "x", "pid": init}]}))
    inode = next(l.split()[9] for l in open("/proc/net/tcp").read().splitlines()[1:]
                 if l.split()[1] == f"00000000:{LOCAL:04X}" and l.split()[3] == "0A")
    who = run_lib(tmp_path, f'listed_instances() {{ LISTED=(["$(load_service bare; echo "$S_INSTANCE")"]={init}); }}; '
                         f'load_service local && describe_holder {os.getuid()} {inode} && echo "$HOLDER"')
    assert who.stdout.startswith("service bare of this project (pid "), who.stdout + who.stderr


def test_doctor_shows_what_up_found_and_checks_the_forwarders_endpoint(project, ports):
    from compose2sif.doctor import plan_lines
    tmp_path, _ = project
    (tmp_path / "out" / "state" / "run" / "web.truth").write_text(f"listens on all interfaces (0.0.0.0:{WEB}), ...\n")
    lines = plan_lines(str(tmp_path / "out"), fallback=True)
    assert ("warn", f"service web at run time: listens on all interfaces (0.0.0.0:{WEB}), ...") in lines
    assert ("ok", f"service web: published 0.0.0.0:{ports[0]} is free") in lines
    # as written, a port published on all interfaces is checked on each of the node's addresses
    lines = plan_lines(str(tmp_path / "out"))
    assert ("ok", f"service web: published 127.0.0.1:{ports[0]} is free") in lines
    assert not any("0.0.0.0" in text for _, text in lines if "at run time" not in text), lines


def test_convert_writes_the_same_files_whatever_listens_on_this_machine(tmp_path):
    """Whether a port is free is found out where the stack runs (`up` and `doctor` name the holder),
    never by convert: with the service's port, its published port and its address block's first
    address held by listeners here, convert writes what it writes with all of them free."""
    port, published = free_ports(2)
    (tmp_path / "compose.yaml").write_text(f"""
services:
  web:
    image: busybox
    environment: {{PORT: "{port}", HOST: 0.0.0.0}}
    ports: ["{published}:{port}"]
    {HINTS % port}
  cache:
    image: redis:7
""")

    def convert():
        out = tmp_path / "out"
        shutil.rmtree(out, ignore_errors=True)
        done = subprocess.run([sys.executable, "-m", "compose2sif", "convert", "--offline", "-o", str(out)],
                              cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 0, done.stderr
        return done.stderr, {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    free = convert()
    holders = []
    try:
        for address, number in (("0.0.0.0", port), ("0.0.0.0", published), ("127.0.0.1", 6379)):
            holder = socket.socket()
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                holder.bind((address, number))
            except OSError:  # held already (a redis of this machine on 6379): held all the same
                holder.close()
                continue
            holder.listen(1)
            holders.append(holder)
        assert listens(port) and listens(published)
        held = convert()
    finally:
        for holder in holders:
            holder.close()
    assert held == free


# ---- a node whose architecture has no c2s-forward in the package ------------------------------

def test_without_a_forwarder_for_the_nodes_architecture_its_python3_serves_the_published_port(project, ports):
    """The output as a node of another architecture sees it (bin/$HOSTTYPE/c2s-forward absent): `up`
    says in one line that the node's python3 serves published ports, and bin/c2s-forward.py does."""
    tmp_path, started = project
    (tmp_path / "out" / "bin" / "x86_64" / "c2s-forward").unlink()
    standin_server(started, own("web"), WEB, "c2s-standin-web")
    proc = run_lib(tmp_path, 'tell_forwarders web && load_service web && start_forwarders && cat "$RUNDIR/web.forward"')
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stderr.startswith("[") and proc.stderr.split("] ", 1)[1] == (
            "published ports: compose2sif's package has no c2s-forward for this node's architecture, "
            "x86_64 (only for aarch64); the node's /usr/bin/python3 serves them (bin/c2s-forward.py)\n")
        pid = int(proc.stdout.split()[0])
        assert "bin/c2s-forward.py" in open(f"/proc/{pid}/cmdline").read()
        assert get(f"http://127.0.0.1:{ports[0]}/") == 200
    finally:
        stop = run_lib(tmp_path, 'stop_forwarders web && wait_ended "${FORWARDERS_ENDED[@]}"')
    assert stop.returncode == 0, stop.stderr
    assert not listens(ports[0])


def test_without_a_forwarder_nor_python3_up_names_each_service_that_will_fail(project):
    tmp_path, _ = project
    for arch in ("x86_64", "aarch64"):
        (tmp_path / "out" / "bin" / arch / "c2s-forward").unlink()
    bare_path = tmp_path / "no-python"  # PATH without python3: tell_forwarders needs bash's builtins alone
    bare_path.mkdir()
    proc = run_lib(tmp_path, 'tell_forwarders "${SERVICES[@]}"', PATH=str(bare_path))
    lines = proc.stderr.splitlines()
    forwarded = sorted(name for name, by_port in plan_ports(tmp_path / "out").items()
                       if any(p.get("forward") for p in by_port.values()))
    assert len(forwarded) >= 3 and len(lines) == len(forwarded), proc.stderr
    for name, line in zip(forwarded, lines):
        assert line.startswith(f"run.sh: up: {name} will fail: its published ports (") and line.endswith(
            "need a forwarder: no bin/x86_64/c2s-forward: the compose2sif that converted this was not installed by "
            "pip, which builds its helpers (convert again with one that was), and the node has no python3 to run "
            "bin/c2s-forward.py instead"), line
    # and start_forwarders fails the service with the same reason
    start = run_lib(tmp_path, 'load_service web && start_forwarders', PATH=str(bare_path))
    assert start.returncode == 1 and "its published ports need a forwarder: no bin/x86_64/c2s-forward" in start.stdout


@contextlib.contextmanager
def forwarding(command, message):
    """COMMAND LISTEN TARGET (a forwarder) in front of a real server that answers what it received,
    reversed, once the client's half-close reached it. Gives (the answer, LISTEN's port) while the
    forwarder runs; it must end with exit code 0 on SIGTERM."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    listen_port = free_ports(1)[0]
    proc = subprocess.Popen([*command, f"127.0.0.1:{listen_port}", f"127.0.0.1:{server.getsockname()[1]}"])
    try:
        for _ in range(200):
            if listens(listen_port):
                break
            time.sleep(0.05)
        client = socket.create_connection(("127.0.0.1", listen_port), timeout=10)
        conn, _ = server.accept()
        client.sendall(message)
        client.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := conn.recv(100):  # until the half-close arrives
            received += chunk
        conn.sendall(received[::-1])
        conn.close()
        answer = client.recv(100)
        assert client.recv(100) == b""
        client.close()
        yield answer, listen_port
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        server.close()


def test_the_python_forwarder_relays_both_ways_and_half_closes():
    """bin/c2s-forward.py, the fallback: what the client sends comes back through it, the client's
    half-close reaches the server, and a port already held fails with one line."""
    from compose2sif import helpers
    with forwarding([sys.executable, helpers.FALLBACK_FORWARDER], b"ping") as (answer, listen_port):
        assert answer == b"gnip"
        held = subprocess.run([sys.executable, helpers.FALLBACK_FORWARDER, f"127.0.0.1:{listen_port}",
                               "127.0.0.1:9"], capture_output=True, text=True, timeout=30)
        assert held.returncode == 1 and held.stderr == \
            f"c2s-forward: cannot listen on 127.0.0.1:{listen_port}: Address already in use\n"


def test_the_packaged_aarch64_forwarder_relays_under_qemu():
    """bin/aarch64/c2s-forward, as an A64FX or Grace node runs it, run here by qemu-user (Debian's
    qemu-user: the aarch64 instructions emulated, the system calls this machine's own): a real echo
    through it. CI installs qemu-user; elsewhere the test is skipped where it is missing."""
    qemu = shutil.which("qemu-aarch64")
    if qemu is None:
        if os.environ.get("CI"):
            pytest.fail("qemu-aarch64 is missing (.ci/run installs qemu-user)")
        pytest.skip("qemu-aarch64 (Debian's qemu-user) is not installed")
    from helpers import packaged_helper
    binary = packaged_helper("c2s-forward", "aarch64")
    said = subprocess.run([qemu, str(binary), "--version"], capture_output=True, text=True, timeout=60)
    assert said.returncode == 0 and said.stdout.startswith("c2s-forward 0.1.0+"), said
    with forwarding([qemu, str(binary)], b"from an aarch64 forwarder") as (answer, _):
        assert answer == b"redrawrof 46hcraa na morf"
