"""c2s-loopback (compose2sif/intercept): the per-service virtual loopback, run on this machine as
an ordinary process. Real servers and clients (python3, sh, small C programs compiled here), real
sockets on 127.0.0.0/8; nothing is simulated except the kernel stop order of Linux < 4.8, which
no kernel here has (test_stop_order_of_old_kernels says so)."""
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import packaged_helper

SOURCE = Path(__file__).resolve().parent.parent / "compose2sif" / "intercept"

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64" or not shutil.which("cc"),
    reason="c2s-loopback is built for x86_64 Linux only; two tests compile small C programs here with cc")


@pytest.fixture(scope="module")
def tracer():
    """The tracer convert ships: the package's compose2sif/helpers/x86_64/c2s-loopback, built when
    it was installed (setup.py; conftest.py checked it was built from the sources as they are now)."""
    return packaged_helper("c2s-loopback")


def free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def wait_listening(addr: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((addr, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {addr}:{port}")


def refused(addr: str, port: int) -> bool:
    try:
        socket.create_connection((addr, port), timeout=0.5).close()
        return False
    except ConnectionRefusedError:
        return True


class Service:
    """A command run under c2s-loopback as a background process."""

    def __init__(self, tracer, addr, argv, tmp_path, extra=(), prefix=(), cwd=None):
        self.record = tmp_path / f"record-{addr}"
        self.proc = subprocess.Popen([*prefix, str(tracer), "--addr", addr, "--record", str(self.record),
                                      *extra, "--", *argv], cwd=cwd,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def lines(self):
        return self.record.read_text().splitlines() if self.record.exists() else []

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.communicate(timeout=10)


@pytest.fixture
def services(tracer, tmp_path):
    started = []

    def start(addr, argv, **kw):
        service = Service(tracer, addr, argv, tmp_path, **kw)
        started.append(service)
        return service

    yield start
    for service in started:
        if service.proc.poll() is None:
            service.proc.kill()
            service.proc.wait()


def traced(tracer, addr, argv, *extra, **kw):
    return subprocess.run([str(tracer), "--addr", addr, *extra, "--", *argv], capture_output=True, text=True,
                          timeout=60, **kw)


def test_check_says_interception_works_here(tracer):
    proc = subprocess.run([str(tracer), "--check"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "ok: bind/connect relocation" in proc.stdout


@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace to hold the ptrace slot")
def test_check_says_why_not_in_one_line(tracer):
    """Under another tracer (strace -f, as a site's debugger or a nested tracer would be), the
    command cannot be traced a second time: --check fails with one line saying so."""
    proc = subprocess.run(["strace", "-f", "-o", "/dev/null", str(tracer), "--check"], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == ["c2s-loopback: ptrace refused: Operation not permitted"]


def test_dynamic_server_binding_all_addresses_answers_on_its_own(services, tracer, tmp_path):
    port = free_port("127.0.0.1")
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "who").write_text("first\n")
    server = services("127.0.9.1", [sys.executable, "-m", "http.server", str(port)], cwd=tmp_path / "www")
    wait_listening("127.0.9.1", port)
    assert urllib.request.urlopen(f"http://127.0.9.1:{port}/who").read() == b"first\n"
    assert refused("127.0.0.1", port)  # not on the shared loopback any more
    # a client of the same service reaches it through 127.0.0.1 and localhost
    for host in ("127.0.0.1", "localhost"):
        client = traced(tracer, "127.0.9.1", ["curl", "-sf", f"http://{host}:{port}/who"])
        assert client.stdout == "first\n", client.stderr
    assert f"bind TCPv6 [::]:{port} [::ffff:127.0.9.1]:{port}" in server.lines()


def test_two_copies_of_one_program_on_one_port(services, tmp_path):
    port = free_port("127.0.0.1")
    for n, addr in enumerate(("127.0.9.2", "127.0.9.3")):
        www = tmp_path / f"www{n}"
        www.mkdir()
        (www / "who").write_text(addr)
        services(addr, [sys.executable, "-m", "http.server", str(port)], cwd=www)
    for addr in ("127.0.9.2", "127.0.9.3"):
        wait_listening(addr, port)
        assert urllib.request.urlopen(f"http://{addr}:{port}/who").read().decode() == addr


SERVE_ONE_LINE = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen()
    print("%s:%d" % s.getsockname(), flush=True)
    while True:
        c, _ = s.accept(); c.sendall(b"served\\n"); c.close()
""")


def read_line_from(host: str, port: int):
    """argv of a client that prints the first line the server sends."""
    return [sys.executable, "-c", f"import socket; print(socket.create_connection(({host!r}, {port})).makefile().readline(), end='')"]


DNS_CLIENT = """
import socket, struct, sys
def query(name, qtype, tcp):
    q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\\0" + struct.pack(">HH", qtype, 1)
    if tcp:
        s = socket.create_connection(("127.0.0.11", 53), timeout=10)
        s.sendall(struct.pack(">H", len(q)) + q)
        r = b""
        while len(r) < 2 or len(r) < 2 + struct.unpack(">H", r[:2])[0]:
            r += s.recv(4096)
        r = r[2:]
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(10)
        s.sendto(q, ("127.0.0.11", 53))
        r = s.recv(4096)
    ident, flags, _, count = struct.unpack(">HHHH", r[:8])
    at = len(q)
    found = []
    for _ in range(count):
        rtype, _, _, length = struct.unpack(">HHIH", r[at + 2:at + 12])
        found.append(socket.inet_ntoa(r[at + 12:at + 16]) if rtype == 1 else str(rtype))
        at += 12 + length
    return "%x %d %s" % (ident, flags & 15, ",".join(found) or "-")
for word in sys.argv[1:]:
    name, qtype, how = word.split("/")
    print(word, query(name, int(qtype), how == "tcp"), flush=True)
"""


def test_docker_dns_answers_the_projects_names_and_relays_the_rest(tracer, tmp_path):
    """--serve-dns: the project's DNS server, and --dns: a traced program's query to Docker's
    127.0.0.11:53 goes there, over UDP (unconnected, as a resolver sends) and TCP. A name of the
    hosts file gets its addresses (every one: replicas), case aside; an AAAA for it no record;
    another name goes to the node's resolver (here, with no network, its failure comes back); a
    name added to the hosts file is answered at once."""
    hosts = tmp_path / "hosts.names"
    hosts.write_text("127.0.9.20 db postgres-db\n127.0.9.21 web\n127.0.9.22 worker\n127.0.9.23 worker\n")
    port = free_port("127.0.9.1")
    server = subprocess.Popen([str(tracer), "--serve-dns", f"127.0.9.1:{port}", "--hosts", str(hosts)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening("127.0.9.1", port)
        record = tmp_path / "record"
        words = ["db/1/udp", "WORKER/1/udp", "postgres-db/1/tcp", "db/28/udp", "no-such-name.invalid/1/udp",
                 "worker/1/tcp"]
        proc = traced(tracer, "127.0.9.30", [sys.executable, "-c", DNS_CLIENT, *words], "--dns", f"127.0.9.1:{port}",
                      "--record", str(record))
        assert proc.returncode == 0, proc.stderr
        got = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
        assert got["db/1/udp"] == "1234 0 127.0.9.20"
        assert got["WORKER/1/udp"] == got["worker/1/tcp"] == "1234 0 127.0.9.22,127.0.9.23"
        assert got["postgres-db/1/tcp"] == "1234 0 127.0.9.20"
        assert got["db/28/udp"] == "1234 0 -"  # known, no IPv6: no record, no error
        ident, rcode, _ = got["no-such-name.invalid/1/udp"].split()
        assert ident == "1234" and rcode in ("2", "3")  # the node's resolver's failure, or ours without one
        lines = record.read_text().splitlines()
        assert f"connect UDP 127.0.0.11:53 127.0.9.1:{port}" in lines or \
            f"sendto UDP 127.0.0.11:53 127.0.9.1:{port}" in lines, lines
        with hosts.open("a") as fh:
            fh.write("127.0.9.24 late\n")
        later = traced(tracer, "127.0.9.30", [sys.executable, "-c", DNS_CLIENT, "late/1/udp"], "--dns",
                       f"127.0.9.1:{port}")
        assert later.stdout == "late/1/udp 1234 0 127.0.9.24\n", later.stderr
    finally:
        server.kill()
        server.wait()
    bad = traced(tracer, "127.0.9.7", ["true"], "--dns", "x")
    assert bad.returncode == 125 and bad.stderr == "c2s-loopback: --dns wants ADDR:PORT, got x\n"


def test_privileged_port_goes_to_the_block_and_connects_follow(services, tracer, tmp_path):
    block = free_port("127.0.9.4")
    peers = tmp_path / "peers"
    peers.mkdir()
    server = services("127.0.9.4", [sys.executable, "-c", SERVE_ONE_LINE, "80"],
                      extra=("--block", f"{block}-{block + 9}"))
    assert server.proc.stdout.readline().strip() == f"127.0.9.4:{block}"  # getsockname tells the truth
    assert f"bind TCP 0.0.0.0:80 127.0.9.4:{block}" in server.lines()
    # a healthcheck or exec beside it (another tracer, same record): 127.0.0.1:80 goes where 80 went
    own = traced(tracer, "127.0.9.4", read_line_from("127.0.0.1", 80), "--block", f"{block}-{block + 9}",
                 "--record", str(server.record))
    assert own.stdout == "served\n", own.stderr
    # another service reaches 127.0.9.4:80 through the first one's record
    shutil.copy(server.record, peers / "server")
    other = traced(tracer, "127.0.9.5", read_line_from("127.0.9.4", 80), "--peers", str(peers))
    assert other.stdout == "served\n", other.stderr


def test_ipv6_only_socket_is_parked_and_the_ipv4_one_serves(services, tmp_path):
    port = free_port("127.0.0.1")
    program = textwrap.dedent(f"""
        import socket
        v4 = socket.socket(); v4.bind(("0.0.0.0", {port})); v4.listen()
        v6 = socket.socket(socket.AF_INET6); v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        v6.bind(("::", {port})); v6.listen()  # nginx's `listen [::]:80` does this
        print(v4.getsockname()[0], v6.getsockname()[0], flush=True)
        c, _ = v4.accept(); c.sendall(b"v4\\n"); c.close()
    """)
    server = services("127.0.9.6", [sys.executable, "-c", program])
    assert server.proc.stdout.readline().split() == ["127.0.9.6", "::1"]
    assert socket.create_connection(("127.0.9.6", port)).recv(10) == b"v4\n"
    assert any(line.startswith(f"park TCPv6 [::]:{port} [::1]:0") for line in server.lines())


def test_other_addresses_are_untouched(services, tracer, tmp_path):
    port = free_port("127.0.9.8")
    services("127.0.9.8", [sys.executable, "-c", SERVE_ONE_LINE, str(port)]).proc.stdout.readline()
    client = traced(tracer, "127.0.9.7", read_line_from("127.0.9.8", port))
    assert client.stdout == "served\n"
    assert refused("127.0.0.1", port)


CONNECT_EACH = textwrap.dedent("""
    import socket, sys
    for target in sys.argv[1:]:
        host, port = target.rsplit(":", 1)
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.connect((host, int(port)))
            print(target, "ok")
        except OSError as e:
            print(target, e.errno)
""")


def test_reach_and_internal_refuse_what_the_services_networks_do_not_reach(services, tracer, tmp_path):
    """--reach: of the own /24, only the listed addresses (ECONNREFUSED, the call never made);
    --internal: nothing beyond it, nor its gateway .1 (ENETUNREACH); the own address, the DNS
    endpoint and 127.0.0.1 (the own address) always go. Each refusal is said once on stderr."""
    port = free_port("127.0.0.1")
    for addr in ("127.0.9.3", "127.0.9.4", "127.0.9.1", "127.0.8.9"):  # a peer, a stranger, the gateway, outside
        services(addr, [sys.executable, "-c", SERVE_ONE_LINE, str(port)]).proc.stdout.readline()
    targets = [f"{a}:{port}" for a in ("127.0.9.3", "127.0.9.4", "127.0.9.1", "127.0.8.9")]
    free = traced(tracer, "127.0.9.2", [sys.executable, "-c", CONNECT_EACH, *targets])
    assert free.stdout.split() == [w for t in targets for w in (t, "ok")], free.stderr
    limited = traced(tracer, "127.0.9.2", [sys.executable, "-c", CONNECT_EACH, *targets, *targets],
                     "--reach", "127.0.9.3,127.0.9.1")
    assert limited.stdout.split()[:8] == [targets[0], "ok", targets[1], "111", targets[2], "ok", targets[3], "ok"]
    assert limited.stderr.count("was refused") == 1 and "127.0.9.4" in limited.stderr  # once, though asked twice
    jailed = traced(tracer, "127.0.9.2", [sys.executable, "-c", CONNECT_EACH, *targets, f"127.0.0.1:{port}",
                                          "[::ffff:127.0.8.9]:1", "[2001:db8::1]:80"],
                    "--reach", "127.0.9.3", "--internal", "--dns", "127.0.9.1:1")
    assert jailed.stdout.split() == [targets[0], "ok", targets[1], "111", targets[2], "101", targets[3], "101",
                                     f"127.0.0.1:{port}", "111",  # the own address, where nothing listens
                                     "[::ffff:127.0.8.9]:1", "101", "[2001:db8::1]:80", "101"], jailed.stderr
    assert "every network of this service is internal" in jailed.stderr
    dns = traced(tracer, "127.0.9.2", [sys.executable, "-c", CONNECT_EACH, "127.0.0.11:53"],
                 "--reach", "", "--internal", "--dns", f"127.0.9.1:{port}")
    assert dns.stdout.split() == ["127.0.0.11:53", "ok"], dns.stderr  # the project's DNS (its stand-in here)
    bad = traced(tracer, "127.0.9.2", ["true"], "--reach", "127.0.9.3,not-an-address")
    assert bad.returncode == 125 and "--reach wants" in bad.stderr


SENDMSG_EACH = textwrap.dedent("""
    import ctypes, socket, sys
    for target in sys.argv[1:]:
        host, port = target.rsplit(":", 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.sendmsg([b"ping"], [], 0, (host, int(port)))  # an address in the msghdr, as libuv's UDP sends
            s.settimeout(3)
            print(target, s.recv(64).decode())
        except OSError as e:
            print(target, e.errno)
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)
    ring = libc.syscall(425, 4, params)  # io_uring_setup
    print("io_uring", ring if ring >= 0 else ctypes.get_errno())
""")
UDP_ECHO = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", int(sys.argv[1])))
    print("ready", flush=True)
    while True:
        data, sender = s.recvfrom(64); s.sendto(b"echo " + data, sender)
""")


def test_sendmsg_with_an_address_is_relocated_and_refused_as_sendto_is_and_io_uring_is_refused(services, tracer):
    """sendmsg naming its address in the msghdr: 127.0.0.1 goes to the own address (a UDP echo
    there answers), --reach refuses a peer it does not list (ECONNREFUSED, nothing sent), as for
    sendto. io_uring_setup fails with EPERM, as Docker's default seccomp profile makes it: a
    ring's connects and sends would pass no filter."""
    port = free_port("127.0.0.1")
    services("127.0.9.41", [sys.executable, "-c", UDP_ECHO, str(port)]).proc.stdout.readline()
    services("127.0.9.42", [sys.executable, "-c", UDP_ECHO, str(port)]).proc.stdout.readline()
    targets = [f"127.0.0.1:{port}", f"127.0.9.42:{port}"]
    free = traced(tracer, "127.0.9.41", [sys.executable, "-c", SENDMSG_EACH, *targets])
    assert free.stdout.split("\n")[:2] == [f"{targets[0]} echo ping", f"{targets[1]} echo ping"], free.stderr
    assert free.stdout.split("\n")[2] == "io_uring 1", free.stdout
    limited = traced(tracer, "127.0.9.41", [sys.executable, "-c", SENDMSG_EACH, *targets], "--reach", "127.0.9.41")
    assert limited.stdout.split("\n")[:2] == [f"{targets[0]} echo ping", f"{targets[1]} 111"], limited.stderr
    disabled = Path("/proc/sys/kernel/io_uring_disabled")
    if not disabled.exists() or disabled.read_text().strip() == "0":  # the kernel gives rings: the check can fail
        untraced = subprocess.run([sys.executable, "-c", SENDMSG_EACH], capture_output=True, text=True)
        assert untraced.stdout.startswith("io_uring ") and int(untraced.stdout.split()[1]) > 2, untraced.stdout


# struct iovec and struct mmsghdr for the scripts below, and the C library
MMSG_TYPES = textwrap.dedent("""
    import ctypes
    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    class mmsghdr(ctypes.Structure):  # struct msghdr, then msg_len
        _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.POINTER(iovec)),
                    ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                    ("flags", ctypes.c_int), ("pad", ctypes.c_int), ("len", ctypes.c_uint32)]
    libc = ctypes.CDLL(None, use_errno=True)
""")
SENDMMSG_EACH = MMSG_TYPES + textwrap.dedent("""
    import socket, struct, sys
    targets = [(t.rsplit(":", 1)[0], int(t.rsplit(":", 1)[1])) for t in sys.argv[1:]]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 0)); s.settimeout(3)
    names = [ctypes.create_string_buffer(struct.pack("=H", socket.AF_INET) + struct.pack(">H", p)
                                         + socket.inet_aton(h) + bytes(8)) for h, p in targets]
    words = [ctypes.create_string_buffer(f"ping{i}".encode()) for i in range(len(targets))]
    iovs = [iovec(ctypes.cast(w, ctypes.c_void_p), len(w.value)) for w in words]
    vec = (mmsghdr * len(targets))(*[mmsghdr(ctypes.cast(n, ctypes.c_void_p), 16, ctypes.pointer(i), 1, None, 0, 0,
                                             0, 0) for n, i in zip(names, iovs)])
    done, calls = 0, []
    while done < len(targets):  # as a caller of sendmmsg does: the rest again after a partial send
        n = libc.sendmmsg(s.fileno(), ctypes.byref(vec, done * ctypes.sizeof(mmsghdr)), len(targets) - done, 0)
        calls.append(n if n >= 0 else -ctypes.get_errno())
        for i in range(done, done + max(n, 0)):
            print(sys.argv[1 + i], "sent", vec[i].len)
        if n < 0:
            print(sys.argv[1 + done], "errno", ctypes.get_errno())
        done += max(n, 1)
    print("calls", *calls)
    for _ in range(sum(c for c in calls if c > 0)):
        try:
            print(s.recv(64).decode())
        except socket.timeout:
            print("no answer")
""")


def test_sendmmsg_with_addresses_is_relocated_and_refused_message_by_message(services, tracer):
    """sendmmsg naming an address per message (as busy UDP clients and QUIC stacks send): each goes
    as a sendmsg would, one message per call (callers send the rest again, as after a full socket
    buffer), its sent length where the program looks. 127.0.0.1 goes to the own address; a peer
    --reach does not list is refused (ECONNREFUSED, nothing sent); with --internal, an address
    beyond the project too (ENETUNREACH). Untraced, one call sends all three."""
    port = free_port("127.0.0.1")
    services("127.0.9.45", [sys.executable, "-c", UDP_ECHO, str(port)]).proc.stdout.readline()
    services("127.0.9.46", [sys.executable, "-c", UDP_ECHO, str(port)]).proc.stdout.readline()
    targets = [f"127.0.0.1:{port}", f"127.0.9.46:{port}", f"127.0.8.9:{port}"]
    free = traced(tracer, "127.0.9.45", [sys.executable, "-c", SENDMMSG_EACH, *targets[:2]])
    lines = free.stdout.splitlines()
    assert lines[:3] == [f"{targets[0]} sent 5", f"{targets[1]} sent 5", "calls 1 1"], free.stderr
    assert sorted(lines[3:]) == ["echo ping0", "echo ping1"], free.stdout
    jailed = traced(tracer, "127.0.9.45", [sys.executable, "-c", SENDMMSG_EACH, *targets], "--reach", "127.0.9.45",
                    "--internal")
    assert jailed.stdout.splitlines() == [f"{targets[0]} sent 5", f"{targets[1]} errno 111", f"{targets[2]} errno 101",
                                          "calls 1 -111 -101", "echo ping0"], jailed.stderr
    untraced = subprocess.run([sys.executable, "-c", SENDMMSG_EACH, f"127.0.9.45:{port}", f"127.0.9.46:{port}"],
                              capture_output=True, text=True, timeout=30)
    assert untraced.stdout.splitlines()[2] == "calls 2", untraced.stdout


ASK_CONNECTED = ("import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3); "
                 "s.connect((sys.argv[1], int(sys.argv[2]))); s.send(b'ping'); print(s.recv(64).decode())")


def test_a_udp_reply_reaches_a_connected_client_of_another_service(services, tracer):
    """A client of another service sends from a connected UDP socket: its datagrams come from
    127.0.0.1 (the kernel's source towards every 127.x address), and the server's reply to
    127.0.0.1:ITS-PORT goes there as written, not to the server's own address (where no client
    is). A send to 127.0.0.1 on a port nothing of the node holds still goes to the own address."""
    port = free_port("127.0.0.1")
    services("127.0.9.43", [sys.executable, "-c", UDP_ECHO, str(port)]).proc.stdout.readline()
    client = traced(tracer, "127.0.9.44", [sys.executable, "-c", ASK_CONNECTED, "127.0.9.43", str(port)])
    assert client.stdout == "echo ping\n", client.stderr
    itself = traced(tracer, "127.0.9.43", [sys.executable, "-c", ASK_CONNECTED, "127.0.0.1", str(port)])
    assert itself.stdout == "echo ping\n", itself.stderr


# A rendezvous as torch.distributed's (vLLM's tensor-parallel ranks) makes one: the address found
# the way vLLM's get_ip does (a UDP connect towards the outside: nothing is sent), a server on
# every address of a port of the kernel's choosing, and a client connecting to the found address.
RENDEZVOUS = textwrap.dedent("""
    import socket
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); probe.connect(("8.8.8.8", 80))
    found = probe.getsockname()[0]
    server = socket.socket(socket.AF_INET6); server.bind(("::", 0)); server.listen()
    client = socket.create_connection((found, server.getsockname()[1]), timeout=5)
    peer, _ = server.accept()
    print(found, client.getpeername()[0], server.getsockname()[0])
""")


def node_address():
    """This machine's address towards the outside (not 127/8), as get_ip finds it; None without a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("8.8.8.8", 80))
        except OSError:
            return None
        return probe.getsockname()[0]


def test_a_connect_to_the_nodes_own_address_finds_the_service_where_only_it_listens(tracer):
    """In a container, a program's "own" address is the container's; here it is the node's, where
    the service no longer listens (its bind went to its own address): such a connect goes to its
    own address, where nothing listens on the node's address. A listener that is there (untraced,
    outside the service) is reached as written."""
    found = node_address()
    if found is None:
        pytest.fail("this machine has no route towards the outside: no node address to connect to")
    proc = traced(tracer, "127.0.9.13", [sys.executable, "-c", RENDEZVOUS])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [found, "127.0.9.13", "::ffff:127.0.9.13"]
    port = free_port(found)
    with socket.socket() as outside:
        outside.bind((found, port))
        outside.listen()
        code = f"import socket; print(socket.create_connection(({found!r}, {port}), timeout=5).getpeername()[0])"
        child = subprocess.Popen([str(tracer), "--addr", "127.0.9.13", "--", sys.executable, "-c", code],
                                 stdout=subprocess.PIPE, text=True)
        conn, _ = outside.accept()
        conn.close()
        assert child.communicate(timeout=30)[0].strip() == found


# Helper sockets as squid makes them (its ipcCreate, UDP and TCP): bound to [::1] on port 0, each
# end told the other's address by getsockname, checked to be IPv6 as bound (squid refuses to
# connect an IPv6 socket to an IPv4 address), then a hello through them after a fork.
HELPER_SOCKETS = textwrap.dedent("""
    import os, socket
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        parent, child = (socket.socket(socket.AF_INET6, kind) for _ in range(2))
        for s in (parent, child): s.bind(("::1", 0))
        assert parent.getsockname()[0] == "::1", parent.getsockname()
        if kind == socket.SOCK_STREAM: child.listen()
        pid = os.fork()
        if pid == 0:
            if kind == socket.SOCK_DGRAM:
                child.connect(parent.getsockname()); child.send(b"hello")
            else:
                child.accept()[0].send(b"hello")
            os._exit(0)
        if kind == socket.SOCK_DGRAM:
            parent.connect(child.getsockname()); got = parent.recv(16)
        else:
            parent.connect(child.getsockname()); got = parent.recv(16)
        os.waitpid(pid, 0)
        print(got.decode(), end=" ")
""")


def test_helper_sockets_on_the_ipv6_loopback_stay_as_the_program_made_them(tracer):
    proc = traced(tracer, "127.0.9.14", [sys.executable, "-c", HELPER_SOCKETS])
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "hello hello ", "")


THREADS_FORK_EXEC = textwrap.dedent("""
    import os, socket, subprocess, sys, threading
    def bound():
        s = socket.socket(); s.bind(("0.0.0.0", 0)); return s.getsockname()[0]
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(bound())) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    pid = os.fork()
    if pid == 0:
        os.write(1, ("fork " + bound() + "\\n").encode()); os._exit(0)
    os.waitpid(pid, 0)
    exec_child = subprocess.run([sys.executable, "-c",
        "import socket; s = socket.socket(socket.AF_INET6); s.bind(('::', 0)); print('exec', s.getsockname()[0])"],
        capture_output=True, text=True).stdout
    print("threads", *sorted(set(seen))); print(exec_child, end="")
""")


def test_threads_forks_and_execs_are_all_relocated(tracer):
    proc = traced(tracer, "127.0.9.9", [sys.executable, "-c", THREADS_FORK_EXEC])
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["exec ::ffff:127.0.9.9", "fork 127.0.9.9", "threads 127.0.9.9"]


@pytest.mark.parametrize("argv, code", [
    (["sh", "-c", "exit 7"], 7),
    (["sh", "-c", "exit 0"], 0),
    (["/nonexistent/program"], 127),
    (["NOT_EXECUTABLE"], 126),
])
def test_exit_codes_pass_through(tracer, tmp_path, argv, code):
    (tmp_path / "NOT_EXECUTABLE").write_text("exit 0\n")  # mode 0644
    argv = [str(tmp_path / a) if a == "NOT_EXECUTABLE" else a for a in argv]
    assert traced(tracer, "127.0.9.10", argv).returncode == code


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGUSR1])
def test_death_by_signal_passes_through(tracer, sig):
    argv = ["sh", "-c", f"kill -{sig.name[3:]} $$"]
    # (the signal's default action in both: a test run started in the background of a
    # non-interactive shell ignores SIGINT, and an ignored signal stays ignored across exec)
    default = lambda: signal.signal(sig, signal.SIG_DFL) if sig != signal.SIGKILL else None  # noqa: E731
    plain = subprocess.run(argv, preexec_fn=default).returncode
    assert plain == -sig
    assert traced(tracer, "127.0.9.10", argv, preexec_fn=default).returncode == plain


def test_core_dump_is_written_as_without_it(tracer, tmp_path):
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|") or "/" in pattern:
        pytest.skip(f"core_pattern {pattern!r} does not write into the working directory")
    crash = [sys.executable, "-c", "import ctypes; ctypes.string_at(0)"]

    def cores(argv, where):
        where.mkdir()
        proc = subprocess.run(argv, cwd=where, capture_output=True,
                              preexec_fn=lambda: __import__("resource").setrlimit(
                                  __import__("resource").RLIMIT_CORE, (-1, -1)))
        return proc.returncode, sorted(p.stat().st_size > 0 for p in where.iterdir())

    assert cores(crash, tmp_path / "plain") == (-signal.SIGSEGV, [True])
    tracer_argv = [str(tracer), "--addr", "127.0.9.10", "--", *crash]
    assert cores(tracer_argv, tmp_path / "traced") == (-signal.SIGSEGV, [True])  # one core: the program's


TRAPS = textwrap.dedent("""
    import signal, sys, time
    def on(sig, _): print("got", signal.Signals(sig).name, flush=True); sys.exit(3 if sig == signal.SIGTERM else 0)
    signal.signal(signal.SIGTERM, on); signal.signal(signal.SIGHUP, on)
    print("ready", flush=True)
    while True: time.sleep(1)
""")


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 3), (signal.SIGHUP, 0)])
def test_signals_sent_to_the_tracer_reach_the_command(tracer, sig, code):
    proc = subprocess.Popen([str(tracer), "--addr", "127.0.9.10", "--", sys.executable, "-c", TRAPS],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(sig)
    assert proc.stdout.readline() == f"got {sig.name}\n"
    assert proc.wait(timeout=10) == code


def test_sigstop_and_sigcont_behave_as_without_it(tracer, tmp_path):
    ticks = tmp_path / "ticks"
    program = f"import time\nwhile True:\n    open({str(ticks)!r}, 'a').write('.'); time.sleep(0.01)"
    proc = subprocess.Popen([str(tracer), "--addr", "127.0.9.10", "--", sys.executable, "-c", program])
    try:
        while not ticks.exists():
            time.sleep(0.01)
        command = int(subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout)
        os.kill(command, signal.SIGSTOP)
        time.sleep(0.2)
        size = ticks.stat().st_size
        time.sleep(0.3)
        assert ticks.stat().st_size == size, "still running after SIGSTOP"
        os.kill(command, signal.SIGCONT)
        time.sleep(0.3)
        assert ticks.stat().st_size > size, "not running after SIGCONT"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


STACK_BOTTOM = r"""
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
/* in .rodata: the tracer must not (cannot) leave it rewritten */
static const struct sockaddr_in any = {.sin_family = AF_INET, .sin_addr = {.s_addr = 0}};
int main(void) {
    /* a stack whose bottom is 64 bytes under the stack pointer, a guard page below it: no room
       under the red zone, so the tracer rewrites the const sockaddr in place and restores it */
    char *pages = mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    mprotect(pages, 4096, PROT_NONE);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    long ret;
    __asm__ volatile("mov %%rsp, %%r12\n\tmov %[top], %%rsp\n\tsyscall\n\tmov %%r12, %%rsp"
                     : "=a"(ret) : "a"((long)SYS_bind), "D"((long)fd), "S"(&any), "d"((long)sizeof any),
                       [top] "r"(pages + 4096 + 64) : "rcx", "r11", "r12", "memory");
    struct sockaddr_in got; socklen_t len = sizeof got;
    getsockname(fd, (struct sockaddr *)&got, &len);
    printf("%ld %s %s\n", ret, inet_ntoa(got.sin_addr), any.sin_addr.s_addr == 0 ? "restored" : "changed");
    return 0;
}
"""


def test_sockaddr_in_read_only_memory_at_the_bottom_of_a_stack(tracer, tmp_path):
    (tmp_path / "stack_bottom.c").write_text(STACK_BOTTOM.replace("#include <stdio.h>",
                                                                  "#include <stdio.h>\n#include <arpa/inet.h>"))
    subprocess.run(["cc", "-O1", "-o", str(tmp_path / "stack_bottom"), str(tmp_path / "stack_bottom.c")], check=True)
    proc = traced(tracer, "127.0.9.11", [str(tmp_path / "stack_bottom")])
    assert proc.stdout.split() == ["0", "127.0.9.11", "restored"], proc.stderr


STATE_TEST = r"""
#include "SOURCE"
#include <assert.h>
#include <stdio.h>
/* The stops a rewritten call goes through, as each kernel reports them. */
static void walk(int legacy, const enum stop *stops, int n)
{
    enum phase p = IDLE;
    for (int i = 0; i < n; i++) {
        p = next_phase(p, stops[i], 1, legacy);
        if (i < n - 1)
            assert(p == AWAIT_ENTRY || p == AWAIT_EXIT);  /* resumed with PTRACE_SYSCALL */
    }
    assert(p == AT_EXIT);
}
int main(void)
{
    enum stop modern[] = {STOP_SECCOMP, STOP_SYSCALL};                /* >= 4.8: seccomp, exit */
    enum stop legacy[] = {STOP_SECCOMP, STOP_SYSCALL, STOP_SYSCALL};  /* < 4.8: seccomp, entry, exit */
    walk(0, modern, 2);
    walk(1, legacy, 3);
    /* the old kernel's sequence read with the new order would restore at the entry: caught */
    assert(next_phase(next_phase(IDLE, STOP_SECCOMP, 1, 0), STOP_SYSCALL, 0, 0) == AT_EXIT);
    assert(next_phase(next_phase(IDLE, STOP_SECCOMP, 1, 1), STOP_SYSCALL, 0, 1) == AWAIT_EXIT);
    /* a call left alone never waits for a syscall stop; a restarted one is passed, then waited for */
    assert(next_phase(IDLE, STOP_SECCOMP, 0, 1) == IDLE && next_phase(IDLE, STOP_SECCOMP, 0, 0) == IDLE);
    assert(next_phase(RESTARTED, STOP_SECCOMP, 0, 0) == AWAIT_EXIT);
    assert(next_phase(RESTARTED, STOP_SECCOMP, 0, 1) == AWAIT_ENTRY);
    puts("ok");
    return 0;
}
"""


def test_stop_order_of_old_kernels(tmp_path):
    """Linux < 4.8 reports the seccomp stop before the syscall-entry stop; no such kernel is here,
    so the phase logic is driven with both orders (compiled from the tracer's own header)."""
    (tmp_path / "state.c").write_text(STATE_TEST.replace("SOURCE", str(SOURCE / "loopback_phase.h")))
    subprocess.run(["cc", "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / "state"), str(tmp_path / "state.c")],
                   check=True)
    assert subprocess.run([str(tmp_path / "state")], capture_output=True, text=True).stdout == "ok\n"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become nobody")
def test_unprivileged_user(shared_tracer):
    """As nobody: --check passes, and a bind to port 80 (refused to nobody) lands on the block."""
    nobody = as_user(65534)
    python = "/usr/bin/python3"  # not a python under root's home
    tracer = shared_tracer
    assert subprocess.run([*nobody, str(tracer), "--check"], capture_output=True).returncode == 0
    block = free_port("127.0.9.12")
    program = "import socket; s = socket.socket(); s.bind(('0.0.0.0', 80)); print(*s.getsockname())"
    proc = subprocess.run([*nobody, str(tracer), "--addr", "127.0.9.12", "--block", f"{block}-{block}", "--",
                           python, "-c", program], capture_output=True, text=True, cwd="/")
    assert proc.stdout.split() == ["127.0.9.12", str(block)], proc.stderr
    plain = subprocess.run([*nobody, python, "-c", program], capture_output=True, text=True, cwd="/")
    assert "Permission denied" in plain.stderr


def as_user(uid: int):
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


@pytest.fixture
def shared_tracer(tracer):
    """The tracer copied where every user may run it (the other users of these tests)."""
    shared = Path(tempfile.mkdtemp())
    shared.chmod(0o755)
    yield Path(shutil.copy(tracer, shared))
    shutil.rmtree(shared)


SERVE_EACH = textwrap.dedent("""
    import socket, sys
    family = socket.AF_INET6 if sys.argv[2] == "6" else socket.AF_INET
    s = socket.socket(family); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", int(sys.argv[1]))); s.listen()
    print("ready", flush=True)
    while True:
        c, _ = s.accept(); c.sendall(b"served\\n"); c.close()
""")
ASK = ("import socket, sys; s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); "
       "print(s.recv(16).decode().strip() or 'closed')")


@pytest.mark.parametrize("family", ["4", "6"])
def test_private_closes_what_another_user_connects_before_the_program_reads(shared_tracer, family):
    """--private: the service (run by uid 65534 here) gets the connections of its own user and
    root's; one of another user (65533) is closed before the program sees it, and the program
    keeps accepting. Its IPv6 socket (bound to [::], so v4-mapped) compares as its IPv4 peer does."""
    python = "/usr/bin/python3"
    copy = shared_tracer
    addr = "127.0.9.21"
    port = free_port(addr)
    results = {}
    for private in (True, False):
        server = subprocess.Popen([*as_user(65534), str(copy), "--addr", addr, *(["--private"] if private else []),
                                   "--", python, "-c", SERVE_EACH, str(port), family],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        try:
            assert server.stdout.readline() == "ready\n", server.stderr.read()
            wait_listening(addr, port)
            results[private] = [subprocess.run([*as_user(uid), python, "-c", ASK, addr, str(port)], cwd="/",
                                               capture_output=True, text=True, timeout=30).stdout.strip()
                                for uid in (65534, 65533, 0, 65533, 65534)]
        finally:
            server.kill()
            server.wait()
    assert results[True] == ["served", "closed", "served", "closed", "served"]
    assert results[False] == ["served"] * 5


ECHO_DATAGRAMS = MMSG_TYPES + textwrap.dedent("""
    import os, socket, sys
    port, family, how = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    s = socket.socket(socket.AF_INET6 if family == "6" else socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("::" if family == "6" else "0.0.0.0", port))
    def recvmmsg():  # a batch of up to 4 (MSG_WAITFORONE), as busy UDP servers ask; the first one's
        bufs = [ctypes.create_string_buffer(512) for _ in range(4)]
        names = [ctypes.create_string_buffer(128) for _ in range(4)]
        iovs = [iovec(ctypes.cast(b, ctypes.c_void_p), 512) for b in bufs]
        vec = (mmsghdr * 4)(*[mmsghdr(ctypes.cast(n, ctypes.c_void_p), 128, ctypes.pointer(i), 1, None, 0, 0, 0, 0)
                              for n, i in zip(names, iovs)])
        n = libc.recvmmsg(s.fileno(), vec, 4, 0x10000, None)
        assert n >= 1, ctypes.get_errno()
        fam = int.from_bytes(names[0].raw[:2], "little")
        raw = names[0].raw
        port = int.from_bytes(raw[2:4], "big")
        host = socket.inet_ntop(fam, raw[4:8] if fam == socket.AF_INET else raw[8:24])
        return bufs[0].raw[:vec[0].len], (host, port)
    print("ready", flush=True)
    while True:
        sender = None
        if how == "recvmmsg":
            data, sender = recvmmsg()
        elif how == "recvmsg":
            data, _, _, sender = s.recvmsg(512)
        elif how == "peek":  # as a program sizing a datagram first: the one it then reads is the same
            peeked, _ = s.recvfrom(512, socket.MSG_PEEK)
            data, sender = s.recvfrom(512)
            assert data == peeked, (data, peeked)
        elif how == "recvfrom":
            data, sender = s.recvfrom(512)
        elif how == "recv":  # recvfrom without an address: nothing says the sender
            data = s.recv(512)
        elif how == "recv-peek":
            peeked = s.recv(512, socket.MSG_PEEK)
            data = s.recv(512)
            assert data == peeked, (data, peeked)
        elif how == "read":  # as Go's net.UDPConn.Read and libuv-less C servers read
            data = os.read(s.fileno(), 512)
        else:  # readv
            buf = bytearray(512)
            data = bytes(buf[:os.readv(s.fileno(), [buf])])
        word, reply_to = data.decode().split()
        if sender is None:  # the sender said where it waits for the answer
            host, port = reply_to.rsplit(":", 1)
            sender = (host, int(port)) if family == "4" else ("::ffff:" + host, int(port))
        print("got", word, flush=True)
        s.sendto(b"served " + word.encode(), sender)
""")
SEND_DATAGRAM = textwrap.dedent("""
    import socket, sys
    addr, port, connected, word = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "connected", sys.argv[4]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.5)
    if connected:  # as glibc's resolver sends, from an address of the project's (as another service's)
        s.bind((addr.rsplit(".", 1)[0] + ".23", 0)); s.connect((addr, port))
        s.send(f"{word} {s.getsockname()[0]}:{s.getsockname()[1]}".encode())
    else:  # from 127.0.0.1, as the kernel sends towards a 127.x address from an unbound socket
        s.bind(("0.0.0.0", 0))
        s.sendto(f"{word} 127.0.0.1:{s.getsockname()[1]}".encode(), (addr, port))
    try:
        print(s.recv(64).decode())
    except socket.timeout:
        print("no answer")
""")


@pytest.mark.parametrize("how", ["recvfrom", "recvmsg", "recvmmsg", "peek", "recv", "recv-peek", "read", "readv"])
@pytest.mark.parametrize("family", ["4", "6"])
def test_private_drops_datagrams_another_user_sends(shared_tracer, family, how):
    """--private, UDP: a datagram from a socket of another user (65533) never reaches the service
    (run by 65534), sent to it unconnected or from a connected socket; its own user's and root's
    do, before and after, by each way of receiving: those that name the sender, and read, readv
    and recv, which do not (the bound socket's fd is watched: inject_watch). A peeked one is taken
    off the socket, not peeked at for ever. Without --private all five are answered. Each sender
    waits for its answer, its socket open: the owner of a socket already closed cannot be found."""
    python = "/usr/bin/python3"
    copy = shared_tracer
    addr = "127.0.9.22"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((addr, 0))
        port = probe.getsockname()[1]
    senders = [(65534, "plain"), (65533, "plain"), (0, "connected"), (65533, "connected"), (65534, "connected")]
    results, seen = {}, {}
    for private in (True, False):
        server = subprocess.Popen([*as_user(65534), str(copy), "--addr", addr, *(["--private"] if private else []),
                                   "--", python, "-c", ECHO_DATAGRAMS, str(port), family, how],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        try:
            assert server.stdout.readline() == "ready\n", server.stderr.read()
            results[private] = [subprocess.run([*as_user(uid), python, "-c", SEND_DATAGRAM, addr, str(port), way,
                                                f"from-{uid}"], cwd="/", capture_output=True, text=True,
                                               timeout=30).stdout.strip()
                                for uid, way in senders]
        finally:
            server.kill()
            seen[private] = [line for line in server.communicate()[0].splitlines() if line.startswith("got")]
    assert results[True] == ["served from-65534", "no answer", "served from-0", "no answer", "served from-65534"]
    assert seen[True] == ["got from-65534", "got from-0", "got from-65534"]  # the program never saw 65533's
    assert results[False] == [f"served from-{uid}" for uid, _ in senders]


NODE_RESOLVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 53))
    print("ready", flush=True)
    while True:
        _, asker = s.recvfrom(512); s.sendto(b"answer", asker)
""")
ASK_RESOLVER = ("import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); "
                "s.connect((sys.argv[1], 53)); s.send(b'q')\ntry: print(s.recvfrom(64)[0].decode())\n"
                "except socket.timeout: print('no answer')")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become other users")
def test_private_lets_in_what_a_privileged_port_of_another_user_sends(shared_tracer):
    """The node's resolver answers under a user of its own (systemd-resolved on 127.0.0.53:53, a
    dnsmasq): a datagram from a privileged port, which no ordinary user can bind, is let in under
    --private (here 65533 given CAP_NET_BIND_SERVICE, as such daemons are); one from an unprivileged
    port of that user is not (test_private_drops_datagrams_another_user_sends)."""
    python = "/usr/bin/python3"
    resolver = subprocess.Popen([*as_user(65533), "--inh-caps=+net_bind_service", "--ambient-caps=+net_bind_service",
                                 python, "-c", NODE_RESOLVER, "127.0.9.53"], stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert resolver.stdout.readline() == "ready\n"
        asked = subprocess.run([*as_user(65534), str(shared_tracer), "--addr", "127.0.9.24", "--private", "--",
                                python, "-c", ASK_RESOLVER, "127.0.9.53"], capture_output=True, text=True, timeout=30,
                               cwd="/")
        assert asked.stdout.strip() == "answer", asked.stderr
    finally:
        resolver.kill()
        resolver.wait()


def test_the_projects_dns_server_answers_no_other_user(shared_tracer):
    """The project's DNS server (--serve-dns) answers its user and root, over UDP and TCP; a query
    of another user gets nothing (the project's names are the project's, as under Docker)."""
    copy = shared_tracer
    hosts = copy.parent / "hosts.names"
    hosts.write_text("127.0.9.20 db\n")
    hosts.chmod(0o644)
    port = free_port("127.0.9.1")
    server = subprocess.Popen([*as_user(65534), str(copy), "--serve-dns", f"127.0.9.1:{port}", "--hosts", str(hosts),
                               "--no-relay"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    ask = textwrap.dedent(f"""
        import socket, struct, sys
        q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"\\x02db\\x00" + struct.pack(">HH", 1, 1)
        try:
            if sys.argv[1] == "tcp":
                s = socket.create_connection(("127.0.9.1", {port}), timeout=3)
                s.sendall(struct.pack(">H", len(q)) + q)
                r = b""
                while len(r) < 2 or len(r) < 2 + struct.unpack(">H", r[:2])[0]:
                    part = s.recv(4096)
                    if not part:
                        break
                    r += part
                r = r[2:]
            else:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1.5)
                s.sendto(q, ("127.0.9.1", {port})); r = s.recv(4096)
            print(socket.inet_ntoa(r[-4:]) if r else "closed")
        except socket.timeout:
            print("no answer")
        except ConnectionError:  # closed with the query unread: a reset
            print("closed")
    """)
    try:
        wait_listening("127.0.9.1", port)
        got = [subprocess.run([*as_user(uid), "/usr/bin/python3", "-c", ask, how], cwd="/", capture_output=True,
                              text=True, timeout=30).stdout.strip()
               for uid in (65534, 65533, 0) for how in ("udp", "tcp")]
    finally:
        server.kill()
        server.wait()
    assert got == ["127.0.9.20", "127.0.9.20", "no answer", "closed", "127.0.9.20", "127.0.9.20"]


SERVE_NAMED = textwrap.dedent("""
    import socket, sys
    family = socket.AF_INET6 if sys.argv[3] == "6" else socket.AF_INET
    s = socket.socket(family); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", int(sys.argv[2]))); s.listen()
    except OSError as e:
        print("bind failed", e.errno, flush=True); sys.exit(0)
    print("ready", flush=True)
    while True:
        c, _ = s.accept(); c.sendall(sys.argv[1].encode() + b"\\n"); c.close()
""")


@pytest.mark.parametrize("host_first", [True, False], ids=["host-first", "own-first"])
@pytest.mark.parametrize("family", ["4", "6"])
def test_a_host_network_wildcard_bind_and_own_address_binds_share_a_port(tracer, host_first, family):
    """qanything: a network_mode: host service binds the wildcard on a port that another service
    holds on its own address. --host-network and --share-ports let both bind, whichever is first;
    a connection to the own address reaches that service, one to 127.0.0.1 the host-network one.
    Without them the second bind fails (the check can fail)."""
    addr = "127.0.9.31"
    results = {}
    for shared in (True, False):
        port = free_port("127.0.0.1")
        host = [str(tracer), "--host-network", "--", sys.executable, "-c", SERVE_NAMED, "host", str(port), family]
        own = [str(tracer), "--addr", addr, "--share-ports", "--", sys.executable, "-c", SERVE_NAMED, "own",
               str(port), family]
        order = [host, own] if host_first else [own, host]
        if not shared:
            order = [[w for w in argv if w not in ("--host-network", "--share-ports")] for argv in order]
            order = [argv[argv.index("--") + 1:] if "--addr" not in argv else argv for argv in order]
        started = []
        try:
            said = []
            for argv in order:
                started.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                said.append(started[-1].stdout.readline().strip())
            results[shared] = said
            if said == ["ready", "ready"]:
                ask = lambda where: socket.create_connection((where, port), timeout=5).makefile().readline().strip()
                results[shared] += [ask(addr), ask("127.0.0.1")]
        finally:
            for proc in started:
                proc.kill()
                proc.wait()
    assert results[True] == ["ready", "ready", "own", "host"]
    assert results[False] == ["ready", "bind failed 98"]
