#!/usr/bin/env python3
"""How run.sh scales with the number of services, on the real rootless Apptainer test bed (needs
root to enter it; see tests/e2e/provision.sh). Run it under the e2e lock, as the e2e tests are:
    flock /tmp/c2s-e2e.lock python3 bench/scaling.py [--quick] [--shapes flat,chain,same]

Stacks of N small HTTP services, each a stand-in server (Python's http.server, started with
`python3 -c ... c2s-bench-server`) with a curl healthcheck and `restart: unless-stopped`:
  flat   N independent services, each on its own port;
  chain  service i waits for service i-1 to be healthy (N dependency levels);
  same   N independent services all on one port, each on its own loopback address 127.77.0.i,
         which the stand-in reads from BIND (given by hand: the stack carries no hint).
For N = 1, 2, 4, 8, 16, 32 (--quick: 1, 8, 32), it prints, timed on the node:
  up      `run.sh up -d` until every service is healthy; lower bound = levels x (one bare instance
          start + its first successful probe, measured here);
  ps      `run.sh ps` 9 s after `up` (the supervisor probes each healthcheck on its interval, so
          `ps` reports its results and runs no probe); warm: the median of two more; stale: with
          the health records deleted, so that `ps` runs every probe itself;
  down    `run.sh down`, until every process of the stack has ended;
  floor   the runtime's floor for that: N bare `apptainer instance start`s (no run.sh) of the
          same SIF and env files, with a fuse-overlayfs writable root as run.sh gives, then one
          SIGKILL of every init, starter and FUSE driver, until all have ended, and one
          `instance list` (the runtime then drops their records);
  rss     extra resident memory per service with the stack up (all of the user's processes, less
          the count before `up`), and the part that is not the server process itself;
  sup     CPU of the background supervisor over 9 s: its own loop ("sup core"), and the children
          it reaped ("probes"): the healthcheck probes it runs on each one's interval, as Docker's
          daemon does (their cost is mostly the probe command's, here curl), and any restart.
Also a no-op `run.sh build` (every SIF up to date), whole-process.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))
from testbed import Node, provision, registry  # noqa: E402

STACK, OUT = "scaling", "scaling-out"
BASE_PORT = 28000
SERVER = ("import os, http.server as h; "
          "h.ThreadingHTTPServer((os.environ['BIND'], int(os.environ['PORT'])), "
          "h.SimpleHTTPRequestHandler).serve_forever()")
CLK_TCK = 100
PAGE_KB = 4


def compose(shape: str, n: int) -> str:
    lines = ["name: c2s-scaling", "services:"]
    for i in range(1, n + 1):
        port = BASE_PORT if shape == "same" else BASE_PORT + i
        address = f"127.77.0.{i}" if shape == "same" else "127.0.0.1"
        lines += [f"  s{i}:",
                  "    image: c2s/python:test",
                  f"    command: [python3, -c, \"{SERVER}\", c2s-bench-server]",
                  f"    environment: {{BIND: '{address}', PORT: '{port}'}}",
                  f"    healthcheck: {{test: [CMD, curl, -fso, /dev/null, 'http://{address}:{port}/'], "
                  "interval: 5s, start_period: 60s, start_interval: 0.1s}",
                  "    restart: unless-stopped"]
        if shape != "same":
            lines.append(f"    expose: ['{port}']")
        if shape == "chain" and i > 1:
            lines.append(f"    depends_on: {{s{i - 1}: {{condition: service_healthy}}}}")
    return "\n".join(lines) + "\n"


def timed(node: Node, command: str, timeout: float = 900) -> float:
    """Seconds `command` takes on the node (timed there, without the cost of entering it)."""
    proc = node.run(f"cd ~ && s=$(date +%s%N) && {{ {command}; }} >/dev/null 2>~/scaling.err; rc=$?; "
                    "e=$(date +%s%N); echo $(( (e - s) / 1000000 )) $rc", timeout=timeout)
    ms, rc = proc.stdout.split()[-2:]
    if rc != "0":
        raise AssertionError(f"`{command}` failed ({rc}): {(node.home / 'scaling.err').read_text()[-3000:]}")
    return int(ms) / 1000


def processes(uid: str):
    """(pid, rss kB, argv) of every live (not zombie) process of the user."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/status"):
        try:
            status = stat.read_text()
            if f"\nUid:\t{uid}\t" not in status or "\nState:\tZ" in status:
                continue
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
            rss = int((stat.parent / "statm").read_text().split()[1]) * PAGE_KB
        except (OSError, ValueError, IndexError):
            continue
        out.append((int(stat.parent.name), rss, argv))
    return out


def cpu_seconds(pid: int):
    """(its own CPU seconds, those of the children it reaped): utime+stime, cutime+cstime."""
    fields = [int(f) for f in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:15]]
    return (fields[0] + fields[1]) / CLK_TCK, (fields[2] + fields[3]) / CLK_TCK


def floor_link(node: Node) -> float:
    """One bare instance start and its first successful probe, polled back to back (the runner's
    env file and SIF of service s1, probed on its planned address)."""
    plan = json.loads((node.home / OUT / "plan.json").read_text())
    port = next(s for s in plan["services"] if s["name"] == "s1")["ports"][0]
    script = (f"cd ~/{OUT} && sif=$(ls sif/*.sif | head -n 1) && s=$(date +%s%N) && "
              "apptainer instance start --cleanenv --no-eval --env-file env/s1.env \"$sif\" c2s-scaling-floor "
              ">/dev/null 2>&1 && "
              f"until apptainer exec instance://c2s-scaling-floor curl -fso /dev/null http://{port['address']}:{port['host']}/; "
              "do :; done; e=$(date +%s%N); apptainer instance stop -t 0 c2s-scaling-floor >/dev/null 2>&1; "
              "while pgrep -u hpc -f 'c2s-bench-serve[r]' >/dev/null; do sleep 0.05; done; "
              "echo $(( (e - s) / 1000000 ))")
    return int(node.run(script, check=True, timeout=120).stdout.split()[-1]) / 1000


def floor_down(node: Node, n: int) -> float:
    """Seconds from one SIGKILL of N bare instances' processes to their end and one listing."""
    script = (f"cd ~/{OUT} && sif=$(ls sif/*.sif | head -n 1) && rm -rf ~/scaling-floor && "
              f"for i in $(seq 1 {n}); do mkdir -p ~/scaling-floor/o$i ~/scaling-floor/h$i; "
              "apptainer instance start --cleanenv --no-eval --env-file env/s$i.env --overlay ~/scaling-floor/o$i "
              "--home ~/scaling-floor/h$i \"$sif\" c2s-scaling-kill$i >/dev/null 2>&1 & done; wait; "
              f"until [ \"$(pgrep -u hpc -fc 'c2s-bench-serve[r]')\" -ge {n} ]; do sleep 0.1; done; sleep 1; "
              "pids=''; for p in $(apptainer instance list --json | sed -n 's/.*\"pid\": *\\([0-9]*\\).*/\\1/p'); do "
              "m=$(awk '{print $4}' /proc/$p/stat); pids=\"$pids $p $m $(cat /proc/$m/task/*/children)\"; done; "
              "alive() { local p l; for p in \"$@\"; do l=''; read -r l </proc/$p/stat || continue; "
              "case \"${l##*) }\" in Z*) ;; *) return 0 ;; esac; done 2>/dev/null; return 1; }; "
              "s=${EPOCHREALTIME/./}; kill -KILL $pids 2>/dev/null; while alive $pids; do sleep 0.005; done; "
              "apptainer instance list >/dev/null 2>&1; e=${EPOCHREALTIME/./}; rm -rf ~/scaling-floor; "
              "echo $(( (e - s) / 1000 ))")
    return int(node.run(script, check=True, timeout=300).stdout.split()[-1]) / 1000


def measure(node: Node, shape: str, n: int, floor: float):
    (node.home / STACK).mkdir(exist_ok=True)
    (node.home / STACK / "compose.yaml").write_text(compose(shape, n))
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(node.home / STACK)], check=True)
    node.run(f"cd ~ && rm -rf {OUT}")
    node.c2s(f"-f {STACK}/compose.yaml convert --registry-mirror {node.registry} -o {OUT}", check=True)
    node.run(f"cd ~ && {OUT}/run.sh build", check=True, timeout=1500)
    before = sum(rss for _, rss, _ in processes(node.uid))
    up = timed(node, f"{OUT}/run.sh up -d")
    procs = processes(node.uid)
    total = sum(rss for _, rss, _ in procs) - before
    servers = sum(rss for _, rss, argv in procs if b"c2s-bench-server" in argv)
    supervisor = int((node.home / OUT / "state" / "run" / "supervisor.pid").read_text().split()[0])  # "PID START"
    start_cpu, start = cpu_seconds(supervisor), time.monotonic()
    time.sleep(9)
    end_cpu, elapsed = cpu_seconds(supervisor), time.monotonic() - start
    sup, probes = ((end_cpu[i] - start_cpu[i]) / elapsed for i in (0, 1))
    ps = timed(node, f"{OUT}/run.sh ps")
    ps_warm = statistics.median(timed(node, f"{OUT}/run.sh ps") for _ in range(2))
    node.run(f"cd ~ && rm -f {OUT}/state/run/*.health")
    ps_stale = timed(node, f"{OUT}/run.sh ps")
    down = timed(node, f"{OUT}/run.sh down")
    left = processes(node.uid)  # nothing of the user's should be left: the stack was all it ran
    kill_floor = floor_down(node, n)
    levels = n if shape == "chain" else 1
    return {"up": up, "bound": levels * floor, "ps": ps, "ps_warm": ps_warm, "ps_stale": ps_stale, "down": down, "kill_floor": kill_floor, "rss": total / n / 1024,
            "overhead": (total - servers) / n / 1024, "sup": sup, "probes": probes, "left": len(left)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 1, 8, 32 only")
    parser.add_argument("--shapes", default="flat,chain,same")
    parser.add_argument("--sizes", help="comma-separated N (overrides --quick)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")] if args.sizes else [1, 8, 32] if args.quick else [1, 2, 4, 8, 16, 32]
    info = provision()
    with registry(info):
        node = Node(Path(info["NODE"]), info["REGISTRY_PORT"], info["HPC_UID"])
        node.kill_all()
        try:
            measure(node, "flat", 1, 0.0)  # builds the SIF, warms the caches
            floor = statistics.median(floor_link(node) for _ in range(3))
            build = statistics.median(timed(node, f"{OUT}/run.sh build") for _ in range(3))
            print(f"floor: one bare instance start + first successful probe = {floor:.2f} s; "
                  f"no-op build {build:.2f} s")
            print(f"{'shape':6} {'N':>3} {'up s':>7} {'bound':>6} {'ps s':>6} {'warm':>6} {'stale':>6} {'down s':>7} {'floor':>6} "
                  f"{'MiB/svc':>8} {'ovh/svc':>8} {'sup core':>8} {'probes':>7}")
            ups = {}
            for shape in args.shapes.split(","):
                for n in sizes:
                    r = measure(node, shape, n, floor)
                    ups[shape, n] = r["up"]
                    print(f"{shape:6} {n:>3} {r['up']:>7.2f} {r['bound']:>6.2f} {r['ps']:>6.2f} {r['ps_warm']:>6.2f} {r['ps_stale']:>6.2f} "
                          f"{r['down']:>7.2f} {r['kill_floor']:>6.2f} "
                          f"{r['rss']:>8.1f} {r['overhead']:>8.1f} {r['sup']:>8.3f} {r['probes']:>7.3f}"
                          + (f"  LEFT BEHIND: {r['left']} processes" if r["left"] else ""), flush=True)
            if ("chain", sizes[0]) in ups and len(sizes) > 1:
                link = (ups["chain", sizes[-1]] - ups["chain", sizes[0]]) / (sizes[-1] - sizes[0])
                print(f"chain: {link:.2f} s per link (floor {floor:.2f} s; {link - floor:+.2f} s above it)")
        finally:
            node.run(f"cd ~ && {OUT}/run.sh down", timeout=600)
            node.kill_all()


if __name__ == "__main__":
    main()
