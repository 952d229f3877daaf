#!/usr/bin/env python3
"""What c2s-loopback (compose2sif/intercept, issue 23) costs, on this machine: prints figures and
ratios, traced against untraced, each the median of interleaved rounds.

    python3 bench/intercept.py [--rounds 5] [--seconds 3] [--server 'CMD ... {port}']

1. One call in a C loop: a connect() (UDP, so no server is involved: the system call alone)
   untraced, traced and rewritten (127.0.0.1 -> the own address: a seccomp stop and a syscall-exit
   stop), traced and left alone (another service's address: the seccomp stop only); a fork+wait
   and a thread create+join, untraced and traced (each new tracee costs an attach stop).
2. HTTP requests/s of one client against one server, with keep-alive and with a new connection per
   request: both without the tracer (the client connects to the server's address); the server
   under it with a client of the same service (connects to 127.0.0.1: rewritten, the worst case)
   and with a client of another service (connects to the server's address: one stop, left alone). The default server is
   Python's ThreadingHTTPServer (HTTP/1.1); --server runs another one that binds 0.0.0.0:{port}
   (e.g. a Go server: --server '/usr/bin/etcd --data-dir /tmp/e --listen-client-urls
   http://0.0.0.0:{port} --advertise-client-urls http://127.0.0.1:{port}' with path /version).
Section 1 and 2 also run the client of another service under --reach with 250 addresses (a
service on networks of 250 peers, the server's the last): the networks check's cost.
3. UDP request/response/s of one client of another service against an echo server that receives
   with recvfrom: untraced, traced, and traced with --private (each datagram's exit stopped and its
   sender's owner looked up: docs/isolation.md); and against one that receives with recv (which
   does not ask the sender: with --private its fd is watched, each recv stopped and run as a
   recvfrom), answering the client's known port, untraced and with --private.
Needs compose2sif installed by pip (its packaged c2s-loopback), cc (the C loops) and Linux x86_64.
"""
import argparse
import os
import resource
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "compose2sif" / "intercept"
ADDR = "127.0.10.1"    # the service's own address in the traced runs
OTHER = "127.0.10.2"   # another service's address
# a service on networks with 250 peers, the one it connects to among the last: --reach checks each connect (docs/isolation.md)
# the server as run.sh runs it: accepted connections of other users closed (--private: an accept stop
# and a look at /proc/net/tcp{,6} per connection); C2S_BENCH_PRIVATE=0 leaves it out
PRIVATE = ("--private",) if os.environ.get("C2S_BENCH_PRIVATE", "1") == "1" else ()
REACH_WORDS = ("--reach", ",".join([f"127.0.10.{i}" for i in range(3, 251)] + [OTHER, ADDR]))

LOOPS = r"""
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static void *nothing(void *arg) { return arg; }
/* loops MODE N [ADDR PORT]: prints the mean microseconds of one connect, fork+wait or thread+join */
int main(int argc, char **argv) {
    long n = atol(argv[2]);
    struct sockaddr_in a = {.sin_family = AF_INET};
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (argc > 4) { a.sin_port = htons(atoi(argv[4])); inet_pton(AF_INET, argv[3], &a.sin_addr); }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < n; i++) {
        if (!strcmp(argv[1], "connect")) {
            if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) { perror("connect"); return 1; }
        } else if (!strcmp(argv[1], "fork")) {
            pid_t pid = fork();
            if (pid == 0) _exit(0);
            waitpid(pid, NULL, 0);
        } else {
            pthread_t t;
            pthread_create(&t, NULL, nothing, NULL);
            pthread_join(t, NULL);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.3f\n", ((t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3) / n);
    return 0;
}
"""

SERVER = """
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall
    def do_GET(self):
        body = b"ok\\n"
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args): pass
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
"""

CLIENT = """
import http.client, sys, time
host, port, path, keep_alive, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", float(sys.argv[5])
done, conn, end = 0, None, time.monotonic() + seconds
start, startup_cpu = time.monotonic(), time.process_time()
while time.monotonic() < end:
    if conn is None:
        conn = http.client.HTTPConnection(host, port)
    conn.request("GET", path)
    response = conn.getresponse(); response.read()
    if response.status != 200: sys.exit("status %d" % response.status)
    done += 1
    if not keep_alive:
        conn.close(); conn = None
print(done / (time.monotonic() - start), done, startup_cpu)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((ADDR, 0))
        return s.getsockname()[1]


def wait_listening(addr: str, port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection((addr, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"intercept.py: the server did not listen on {addr}:{port}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0, help="per HTTP measurement")
    ap.add_argument("--connects", type=int, default=200000, help="per connect measurement")
    ap.add_argument("--server", help="a server command binding 0.0.0.0:{port} (default: Python's)")
    ap.add_argument("--path", default="/", help="the path the client asks for")
    ap.add_argument("--prebuilt", type=Path, help="a directory holding c2s-loopback and loops built "
                    "elsewhere with --build-only (for a machine without cc)")
    ap.add_argument("--build-only", type=Path, help="build c2s-loopback and loops into this directory and stop")
    args = ap.parse_args()

    if args.build_only:
        args.build_only.mkdir(parents=True, exist_ok=True)
        build(args.build_only)
        return
    if args.prebuilt:
        measure(args, args.prebuilt)
        return
    with tempfile.TemporaryDirectory(prefix="c2s-intercept-bench-") as work:
        build(Path(work))
        measure(args, Path(work))


def build(work: Path) -> None:
    """The tracer as the package built it (pip install), and the C loops, static (so they run on a
    machine without cc)."""
    from compose2sif import helpers
    import shutil
    shutil.copy2(Path(helpers.PACKAGED) / "x86_64" / "c2s-loopback", work / "c2s-loopback")
    (work / "loops.c").write_text(LOOPS)
    subprocess.run(["cc", "-O2", "-static", "-pthread", "-o", str(work / "loops"), str(work / "loops.c")],
                   check=True)


def measure(args, work: Path) -> None:
    tracer = work / "c2s-loopback"

    def under_tracer(argv, traced, reach=()):
        return [str(tracer), "--addr", ADDR, *reach, "--", *argv] if traced else argv

    print(f"kernel {os.uname().release}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"medians of {args.rounds} rounds")
    # 1. the cost of one connect, fork, thread
    cases = {"connect, untraced": (False, ["connect", str(args.connects), ADDR, "9"]),
             "connect, rewritten": (True, ["connect", str(args.connects), "127.0.0.1", "9"]),
             "connect, left alone": (True, ["connect", str(args.connects), OTHER, "9"]),
             "connect, --reach 250": (True, ["connect", str(args.connects), OTHER, "9"]),
             "fork+wait, untraced": (False, ["fork", str(args.connects // 50)]),
             "fork+wait, traced": (True, ["fork", str(args.connects // 50)]),
             "thread+join, untraced": (False, ["thread", str(args.connects // 20)]),
             "thread+join, traced": (True, ["thread", str(args.connects // 20)])}
    us = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (traced, loop) in cases.items():
            reach = REACH_WORDS if name.endswith("--reach 250") else ()
            out = subprocess.run(under_tracer([str(work / "loops"), *loop], traced, reach),
                                 capture_output=True, text=True, check=True).stdout
            us[name].append(float(out))
    print(f"\none call in a C loop ({args.connects} UDP connects, a 50th as many forks, a 20th as many threads)")
    for name in cases:
        kind = name.split(",")[0]
        base = statistics.median(us[f"{kind}, untraced"])
        m = statistics.median(us[name])
        print(f"  {name:22s} {m:8.2f} us   +{m - base:7.2f} us   x{m / base:6.1f}")

    # 2. HTTP requests/s
    print(f"\nHTTP requests/s, one client, {args.seconds:g} s each"
          f" ({'server: ' + args.server if args.server else 'server: Python ThreadingHTTPServer'})")
    rates, cpu_us = {}, {}
    for _ in range(args.rounds):
        for traced in (False, True):
            port = free_port()
            server_argv = (shlex.split(args.server.format(port=port)) if args.server
                           else [sys.executable, "-c", SERVER, str(port)])
            if not traced:  # untraced, the server binds where the traced one is relocated to
                server_argv = [a.replace("0.0.0.0", ADDR) for a in server_argv]
            server = subprocess.Popen(under_tracer(server_argv, traced, PRIVATE), stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
            try:
                wait_listening(ADDR, port)
                for keep_alive in (True, False):
                    # traced: a client of the same service (127.0.0.1, rewritten) and one of another
                    # service (the server's address, left alone); untraced: the server's address
                    for client_case, host, client_addr in ((("same", "127.0.0.1", ADDR), ("other", ADDR, OTHER),
                                                            ("reach", ADDR, OTHER))
                                                           if traced else (("plain", ADDR, None),)):
                        client = [sys.executable, "-c", CLIENT, host, str(port), args.path,
                                  "1" if keep_alive else "0", str(args.seconds)]
                        if client_addr:
                            reach = REACH_WORDS if client_case == "reach" else ()
                            client = [str(tracer), "--addr", client_addr, *reach, "--", *client]
                        before = resource.getrusage(resource.RUSAGE_CHILDREN)
                        out = subprocess.run(client, capture_output=True, text=True, check=True)
                        after = resource.getrusage(resource.RUSAGE_CHILDREN)
                        rate, done, startup_cpu = (float(x) for x in out.stdout.split())
                        cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) - startup_cpu
                        rates.setdefault((keep_alive, client_case), []).append(rate)
                        # CPU time of the client's loop and its tracer per request: what load blurs less
                        cpu_us.setdefault((keep_alive, client_case), []).append(cpu / done * 1e6)
            finally:
                server.terminate()
                server.wait()
    for keep_alive in (True, False):
        plain, same, other, reach = (statistics.median(rates[(keep_alive, c)])
                                     for c in ("plain", "same", "other", "reach"))
        label = "keep-alive" if keep_alive else "new connection per request"
        print(f"  {label:27s} untraced {plain:7.0f}/s | traced: client of the same service {same:7.0f}/s"
              f" ({same / plain:5.3f}), of another service {other:7.0f}/s ({other / plain:5.3f}),"
              f" that one under --reach of 250 {reach:7.0f}/s ({reach / plain:5.3f})")
        plain, same, other = (statistics.median(cpu_us[(keep_alive, c)]) for c in ("plain", "same", "other"))
        print(f"  {'':27s} client CPU per request: untraced {plain:6.1f} us | same service {same:6.1f} us"
              f" (+{same - plain:.1f}), another service {other:6.1f} us (+{other - plain:.1f})")

    # 3. UDP round trips
    print(f"\nUDP request/response/s, one client of another service, {args.seconds:g} s each (server: Python,"
          " recvfrom; the last: recv, which does not ask the sender, answering the client's known port)")
    udp = {}
    for _ in range(args.rounds):
        for case, words, how in (("untraced", None, "recvfrom"), ("traced", (), "recvfrom"),
                                 ("--private", ("--private",), "recvfrom"), ("untraced recv", None, "recv"),
                                 ("--private recv", ("--private",), "recv")):
            port, client_port = free_port(), free_port()
            argv = [sys.executable, "-c", UDP_SERVER, ADDR if words is None else "0.0.0.0", str(port), how,
                    OTHER, str(client_port)]
            server = subprocess.Popen(argv if words is None else [str(tracer), "--addr", ADDR, *words, "--", *argv],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            try:
                server.stdout.readline()
                client = [str(tracer), "--addr", OTHER, "--", sys.executable, "-c", UDP_CLIENT, ADDR, str(port),
                          str(args.seconds), str(client_port)]
                udp.setdefault(case, []).append(float(subprocess.run(client, capture_output=True, text=True,
                                                                     check=True).stdout))
            finally:
                server.terminate()
                server.wait()
    for cases in (("untraced", "traced", "--private"), ("untraced recv", "--private recv")):
        plain = statistics.median(udp[cases[0]])
        print("  " + " | ".join(f"{case} {statistics.median(udp[case]):7.0f}/s"
                                f" ({statistics.median(udp[case]) / plain:5.3f})" for case in cases))


UDP_SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], int(sys.argv[2])))
client = (sys.argv[4], int(sys.argv[5]))
print("ready", flush=True)
if sys.argv[3] == "recv":  # read as read(), recv() and Go's UDPConn.Read do: with --private, a watched fd
    while True:
        s.sendto(s.recv(512), client)
while True:
    data, sender = s.recvfrom(512); s.sendto(data, sender)
"""
UDP_CLIENT = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", int(sys.argv[4])))
s.connect((sys.argv[1], int(sys.argv[2]))); s.settimeout(5)
end, done = time.monotonic() + float(sys.argv[3]), 0
while time.monotonic() < end:
    s.send(b"ping"); s.recv(16); done += 1
print(done / float(sys.argv[3]))
"""


if __name__ == "__main__":
    main()
