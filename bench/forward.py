#!/usr/bin/env python3
"""What the forwarder of published ports (compose2sif/intercept/forward.c, issue 18) costs, on this
machine: prints figures and ratios, through the forwarder against a direct connection, each the
median of interleaved rounds.

    python3 bench/forward.py [--rounds 5] [--megabytes 1024] [--pings 20000] [--connects 2000] [--binary PATH]

1. Throughput: one client sends --megabytes to a sink server, which answers one byte when it has
   all of them (MB/s over the whole transfer, 1 MB = 10^6 bytes).
2. Latency: round trips of 64 bytes on one connection (TCP_NODELAY), p50 and p99 in microseconds.
3. Connection latency: connect, one 64-byte round trip and close, each on a new connection, p50
   and p99 (the forwarder forks a process per connection and connects on to the server).
The servers are this script's own (Python threads: every figure has the same server and client
cost in both columns, so the ratio is the forwarder's). Takes the installed package's forwarder, or --binary.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from compose2sif import helpers  # noqa: E402

CHUNK = 1 << 20
MESSAGE = 64


def serve(listener, handle):
    def loop():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=handle, args=(conn,), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()


def sink(conn):
    """Reads an 8-byte length, then that many bytes; answers one byte."""
    with conn:
        want = int.from_bytes(conn.recv(8, socket.MSG_WAITALL), "big")
        buffer = memoryview(bytearray(CHUNK))
        while want > 0:
            n = conn.recv_into(buffer, min(CHUNK, want))
            if n == 0:
                return
            want -= n
        conn.sendall(b"k")


def echo(conn):
    with conn:
        while True:
            data = conn.recv(MESSAGE)
            if not data:
                return
            conn.sendall(data)


def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(512)
    return s


def connect(port):
    c = socket.create_connection(("127.0.0.1", port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def throughput(port, megabytes):
    total = megabytes * 10**6
    block = b"\0" * CHUNK
    with connect(port) as c:
        start = time.perf_counter()
        c.sendall(total.to_bytes(8, "big"))
        left = total
        while left > 0:
            c.sendall(block[:min(CHUNK, left)])
            left -= min(CHUNK, left)
        assert c.recv(1) == b"k"
        return total / 1e6 / (time.perf_counter() - start)


def round_trips(port, pings):
    message, times = b"x" * MESSAGE, []
    with connect(port) as c:
        for _ in range(pings):
            start = time.perf_counter()
            exchange(c, message)
            times.append(time.perf_counter() - start)
    return times


def connections(port, count):
    message, times = b"x" * MESSAGE, []
    for _ in range(count):
        start = time.perf_counter()
        with connect(port) as c:
            exchange(c, message)
        times.append(time.perf_counter() - start)
    return times


def exchange(c, message):
    """One request and its echoed reply."""
    c.sendall(message)
    got = 0
    while got < MESSAGE:
        got += len(c.recv(MESSAGE - got))


def percentile(times, p):
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))] * 1e6


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_forwarder(binary, target):
    port = free_port()
    proc = subprocess.Popen([binary, f"127.0.0.1:{port}", f"127.0.0.1:{target}"])
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return proc, port
        except OSError:
            time.sleep(0.01)
    proc.kill()
    raise SystemExit("the forwarder did not listen")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--megabytes", type=int, default=1024)
    parser.add_argument("--pings", type=int, default=20000)
    parser.add_argument("--connects", type=int, default=2000)
    parser.add_argument("--binary", help="the forwarder to measure (default: the installed package's, for x86_64)")
    args = parser.parse_args()
    binary = args.binary or os.path.join(helpers.PACKAGED, "x86_64", helpers.FORWARD)
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"no forwarder at {binary}: `python3 -m pip install -e .` builds it")
    sink_listener, echo_listener = listener(), listener()
    serve(sink_listener, sink)
    serve(echo_listener, echo)
    sink_port, echo_port = sink_listener.getsockname()[1], echo_listener.getsockname()[1]
    fwd_sink, fwd_sink_port = start_forwarder(binary, sink_port)
    fwd_echo, fwd_echo_port = start_forwarder(binary, echo_port)
    results = {k: {"direct": [], "forwarded": []} for k in ("mbs", "p50", "p99", "c50", "c99")}
    try:
        for _ in range(args.rounds):  # interleaved: drift on a shared machine falls on both columns
            for kind, sp, ep in (("direct", sink_port, echo_port), ("forwarded", fwd_sink_port, fwd_echo_port)):
                results["mbs"][kind].append(throughput(sp, args.megabytes))
                times = round_trips(ep, args.pings)
                results["p50"][kind].append(percentile(times, 50))
                results["p99"][kind].append(percentile(times, 99))
                times = connections(ep, args.connects)
                results["c50"][kind].append(percentile(times, 50))
                results["c99"][kind].append(percentile(times, 99))
    finally:
        fwd_sink.kill()
        fwd_echo.kill()
    print(f"forwarder (compose2sif/intercept/forward.c) vs direct, 127.0.0.1, median of {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs")
    print(f"{'':38} {'direct':>10} {'forwarded':>10} {'ratio':>7}")
    rows = (("throughput, MB/s (%d MB)" % args.megabytes, "mbs"),
            ("round trip p50, us (64 B)", "p50"), ("round trip p99, us (64 B)", "p99"),
            ("connect+round trip+close p50, us", "c50"), ("connect+round trip+close p99, us", "c99"))
    for label, key in rows:
        direct, forwarded = (statistics.median(results[key][k]) for k in ("direct", "forwarded"))
        print(f"{label:38} {direct:10.1f} {forwarded:10.1f} {forwarded / direct:7.2f}")
    added = [statistics.median(results[k]["forwarded"]) - statistics.median(results[k]["direct"]) for k in ("p50", "c50")]
    print(f"added latency: {added[0]:.1f} us per round trip, {added[1]:.1f} us per new connection (p50)")


if __name__ == "__main__":
    main()
