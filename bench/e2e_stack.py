#!/usr/bin/env python3
"""Timings of the end-to-end test stack on the real rootless Apptainer test bed (needs root to
enter it; builds it on first use, see tests/e2e/provision.sh).

Prints, for `up -d` of the 7-service stack (SIFs already built):
  - wall time to all services healthy, against the sum of the per-service start times (from
    dependencies met to healthy/started): independent services start in parallel, so the ratio
    must be well below 1;
  - each service's start time (its `starting` to `healthy`, `completed` or `started`);
  - a no-op `build` (every SIF up to date);
  - `down -v`.
    python3 bench/e2e_stack.py [runs]

To compare two versions of compose2sif, the same test bed (this tree's tests/e2e) drives another
checkout through its own CLI and run.sh: `--repo DIR` is bound at /work on the node in place of
this tree and its wheel, built by pip, installed there (an older checkout with no setup.py gives a
wheel without helpers: it compiled them at convert time, where cc was), each checkout with an output directory of its own (and, with --sif-cache, a SIF
cache of its own: compose2sif since 06e226d keys a registry image's SIF as before but builds it
from docker:// without the start script, which an older run.sh expects inside); `--record FILE` appends each run's
figures as a JSON line, and `--compare FILE` prints the medians per checkout and new/old ratios
(the checkout given first in FILE is "old" unless --old names it). Rounds interleaved, one run
each, let the load of a shared machine fall on both alike:
    python3 bench/e2e_stack.py 1 --repo /work/old --record r.jsonl; python3 bench/e2e_stack.py 1 --record r.jsonl; ...
    python3 bench/e2e_stack.py --compare r.jsonl --old /work/old
"""
import argparse
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))
import testbed  # noqa: E402
from testbed import Node, provision, registry, taken  # noqa: E402

SERVICES = ("db", "redis", "llm", "init", "api", "worker", "proxy")


def timeline(node: Node, out: str, service: str):
    path = node.home / out / "state" / "run" / f"{service}.timeline"
    events = {}
    for line in path.read_text().splitlines():
        stamp, event = line.split()
        events.setdefault(event, float(stamp))
    return events


def wheel_of(repo: Path, directory: str) -> Path:
    """REPO's wheel, built by pip (its helpers with it), for the node to install as a user does."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", directory, str(repo)], check=True)
    return next(Path(directory).glob("compose2sif-*.whl"))


def timed(node: Node, command: str, timeout: float) -> float:
    start = time.perf_counter()
    node.run(command, check=True, timeout=timeout)
    return time.perf_counter() - start


def bench(runs: int, repo: Path, sif_cache: str):
    """One record per run: the phases' wall times in seconds, and the load when the run began."""
    testbed.REPO = repo  # Node.run binds testbed.REPO at /work on the node
    out = "bench-" + hashlib.sha256(f"{repo} {sif_cache}".encode()).hexdigest()[:8]  # one per checkout
    run_sh = f"cd ~ && C2S_SIF_CACHE={shlex.quote(sif_cache)} {out}/run.sh" if sif_cache else f"cd ~ && {out}/run.sh"
    info = provision()
    records = []
    with taken(), registry(info), tempfile.TemporaryDirectory() as wheels:
        node = Node(Path(info["NODE"]), info["REGISTRY_PORT"], info["HPC_UID"])
        node.kill_all()
        node.install_compose2sif(wheel_of(repo, wheels))
        node.copy_stack("bench-stack")
        node.c2s(f"-f bench-stack/compose.yaml convert --registry-mirror {node.registry} -o {out}", check=True)
        first_build = timed(node, f"{run_sh} build", 1500)
        for _ in range(runs):
            load = Path("/proc/loadavg").read_text().split()[0]
            up = timed(node, f"{run_sh} up -d", 900)
            starts = {}
            for service in SERVICES:
                events = timeline(node, out, service)
                end = events.get("healthy") or events.get("completed") or events.get("started")
                starts[service] = end - events["starting"]
            build = timed(node, f"{run_sh} build", 600)
            down = timed(node, f"{run_sh} down -v", 300)
            records.append({"repo": str(repo), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            "load": float(load), "build_before": first_build, "up": up,
                            "start_sum": sum(starts.values()), "starts": starts, "noop_build": build,
                            "down": down})
            first_build = None
        node.kill_all()
    return records


def phases(records):
    """Median of each phase over the records: name -> seconds."""
    table = {"up -d to all healthy": [r["up"] for r in records],
             "sum of service start times": [r["start_sum"] for r in records],
             "no-op build": [r["noop_build"] for r in records],
             "down -v": [r["down"] for r in records]}
    for service in SERVICES:
        table[f"  start of {service}"] = [r["starts"][service] for r in records]
    return {name: statistics.median(values) for name, values in table.items()}


def report(records):
    median = phases(records)
    print(f"e2e stack (7 services: nginx, api, worker, init, PostgreSQL, Redis, llama-server), {len(records)} runs, "
          "medians:")
    print(f"  up -d to all healthy: {median['up -d to all healthy']:.1f} s wall; sum of per-service start times "
          f"{median['sum of service start times']:.1f} s; wall/sum = "
          f"{median['up -d to all healthy'] / median['sum of service start times']:.2f} (parallel start: < 1)")
    print(f"  no-op build: {median['no-op build']:.2f} s")
    print(f"  down -v: {median['down -v']:.1f} s")


def compare(path: Path, old: str):
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    repos = list(dict.fromkeys(r["repo"] for r in records))
    if len(repos) != 2:
        sys.exit(f"{path}: records of {len(repos)} checkouts, not 2: {repos}")
    old = old or repos[0]
    new = next(r for r in repos if r != old)
    by = {repo: [r for r in records if r["repo"] == repo] for repo in repos}
    med = {repo: phases(by[repo]) for repo in repos}
    loads = [r["load"] for r in records]
    print(f"old {old} ({len(by[old])} runs), new {new} ({len(by[new])} runs); 1-min load at each run's start "
          f"{min(loads):.1f}-{max(loads):.1f}")
    print(f"{'medians, s':30} {'old':>7} {'new':>7} {'new/old':>8}   new runs; old runs")
    for name in med[old]:
        values = lambda repo: ", ".join(f"{v:.1f}" for v in (phases([r])[name] for r in by[repo]))  # noqa: E731
        print(f"{name:30} {med[old][name]:7.2f} {med[new][name]:7.2f} {med[new][name] / med[old][name]:8.2f}   "
              f"{values(new)}; {values(old)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", type=int, default=3)
    parser.add_argument("--repo", type=Path, default=testbed.REPO, help="the compose2sif checkout to drive")
    parser.add_argument("--sif-cache", default="", help="C2S_SIF_CACHE for run.sh (a path on the node): "
                        "versions that key SIFs alike but build them differently must not share a cache")
    parser.add_argument("--record", type=Path, help="append each run's figures to this file (JSON lines)")
    parser.add_argument("--compare", type=Path, help="print medians per checkout from a --record file")
    parser.add_argument("--old", default="", help="with --compare: the checkout taken as the baseline")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare, args.old and str(args.old))
        return
    records = bench(args.runs, args.repo.resolve(), args.sif_cache)
    if args.record:
        with open(args.record, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)
    report(records)


if __name__ == "__main__":
    main()
