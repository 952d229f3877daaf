#!/usr/bin/env python3
"""Timings of the end-to-end test stack on the real rootless Apptainer test bed (needs root to
enter it; builds it on first use, see tests/e2e/provision.sh).

Prints, for `up -d` of the 7-service stack (SIFs already built):
  - wall time to all services healthy, against the sum of the per-service start times (from
    dependencies met to healthy/started): independent services start in parallel, so the ratio
    must be well below 1;
  - a no-op `build` (every SIF up to date);
  - `down`.
    python3 bench/e2e_stack.py [runs]
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))
from testbed import Node, provision, registry  # noqa: E402

OUT = "bench-out"


def timeline(node: Node, service: str):
    path = node.home / OUT / "state" / "run" / f"{service}.timeline"
    events = {}
    for line in path.read_text().splitlines():
        stamp, event = line.split()
        events.setdefault(event, float(stamp))
    return events


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    info = provision()
    with registry(info):
        node = Node(Path(info["NODE"]), info["REGISTRY_PORT"], info["HPC_UID"])
        node.copy_stack("bench-stack")
        node.c2s(f"-f bench-stack/compose.yaml convert --registry-mirror {node.registry} -o {OUT}", check=True)
        node.run(f"cd ~ && {OUT}/run.sh build", check=True, timeout=1500)
        walls, sums, builds, downs = [], [], [], []
        for _ in range(runs):
            start = time.perf_counter()
            node.run(f"cd ~ && {OUT}/run.sh up -d", check=True, timeout=900)
            walls.append(time.perf_counter() - start)
            total = 0.0
            for service in ("db", "redis", "llm", "init", "api", "worker", "proxy"):
                events = timeline(node, service)
                end = events.get("healthy") or events.get("completed") or events.get("started")
                total += end - events["starting"]
            sums.append(total)
            start = time.perf_counter()
            node.run(f"cd ~ && {OUT}/run.sh build", check=True)
            builds.append(time.perf_counter() - start)
            start = time.perf_counter()
            node.run(f"cd ~ && {OUT}/run.sh down -v", check=True, timeout=300)
            downs.append(time.perf_counter() - start)
    wall, total = statistics.median(walls), statistics.median(sums)
    print(f"e2e stack (7 services: nginx, api, worker, init, PostgreSQL, Redis, llama-server), {runs} runs, medians:")
    print(f"  up -d to all healthy: {wall:.1f} s wall; sum of per-service start times {total:.1f} s; "
          f"wall/sum = {wall / total:.2f} (parallel start: < 1)")
    print(f"  no-op build: {statistics.median(builds):.2f} s")
    print(f"  down -v: {statistics.median(downs):.1f} s")


if __name__ == "__main__":
    main()
