#!/usr/bin/env python3
"""Docker's fill rule as run.sh applies it (run/lib/start.sh: fill_volume), against `cp -a` of the
same tree already on disk, on the real rootless Apptainer test bed (needs root to enter it; see
tests/e2e/provision.sh). Run it under the e2e lock, as the e2e tests are:
    flock /tmp/c2s-e2e.lock python3 bench/fill.py [--files 50000]

A SIF is made from the test bed's Python image with a tree of small files (100 to 1000 bytes, 100
a directory) at /bench/tree. Timed on the node in rounds, each way once a round, each into a new
empty directory after a `sync` (so the writeback of the one before is not counted in it); the
medians, and the median of each round's ratio to cp, are printed:
  cp       `cp -a` of the tree from a directory on disk (its pages cached) to another;
  fill     run.sh's own fill_volume (sourced from run/lib), as a start runs it: unsquashfs reads
           the tree out of the SIF's squashfs partition beside the volume, then it is moved in;
  runtime  fill_volume's fallback, where unsquashfs cannot: the runtime copies the tree out of the
           SIF into the volume bound beside it (`apptainer exec --contain --bind VOL:/.c2s-fill
           SIF sh -c 'cp -a ...'`), reading it through the runtime's FUSE mount;
  exec     the runtime's bare `apptainer exec --contain SIF true`, the floor of the fallback.
The goal is fill <= 1.2 x cp.
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))
from testbed import Node, provision, registry, taken  # noqa: E402

MAKE_TREE = """
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
random.seed(1)
for i in range(n):
    folder = os.path.join(root, f"d{i // 100:04d}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"f{i:06d}.txt"), "wb") as fh:
        fh.write(os.urandom(random.randint(50, 500)).hex().encode())
"""
# the repository is at /work on the node (tests/e2e/enter.sh)
FILL = ("RT=apptainer S_SIF=\"$PWD/bench.sif\" RUNDIR=\"$PWD\" && . /work/run/lib/core.sh && . /work/run/lib/start.sh && "
        "fill_volume \"$PWD/d\" /bench/tree")
RUNTIME = ("apptainer exec --contain --bind \"$PWD/d:/.c2s-fill\" bench.sif /bin/sh -c "
           "'if [ -d \"$1\" ]; then cp -a \"$1/.\" \"$2/\"; fi' sh /bench/tree /.c2s-fill")
SAME = "diff -r tree d >/dev/null && [ \"$(stat -c %a tree)\" = \"$(stat -c %a d)\" ]"


def timed(node: Node, setup: str, command: str) -> float:
    proc = node.run(f"cd ~/fillbench && {setup} && s=$(date +%s%N) && {{ {command}; }} >/dev/null 2>err; rc=$?; "
                    "e=$(date +%s%N); echo $(( (e - s) / 1000000 )) $rc", timeout=900)
    ms, rc = proc.stdout.split()[-2:]
    if rc != "0":
        raise AssertionError(f"`{command}` failed ({rc}): {(node.home / 'fillbench' / 'err').read_text()[-2000:]}")
    return int(ms) / 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=50000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with taken():
        info = provision()
        with registry(info):
            measure(Node(Path(info["NODE"]), info["REGISTRY_PORT"], info["HPC_UID"]), args.files, args.runs)


def measure(node: Node, files: int, runs: int) -> None:
    node.run("cd ~ && rm -rf fillbench && mkdir fillbench && cd fillbench && "
             f"apptainer build --sandbox sb docker://{node.registry}/c2s/python:test >build.log 2>&1 && "
             f"python3 -c '{MAKE_TREE}' sb/bench/tree {files} && "
             "apptainer build bench.sif sb >>build.log 2>&1 && cp -a sb/bench/tree tree", check=True, timeout=1800)
    fresh = "rm -rf d && mkdir d && sync"
    ways = {"cp": "cp -a tree/. d/", "fill": FILL, "runtime": RUNTIME}
    times = {name: [] for name in ways}
    for round_ in range(runs):
        for name, command in ways.items():
            times[name].append(timed(node, fresh, command))
            if name == "fill" and round_ == 0:
                node.run(f"cd ~/fillbench && {SAME}", check=True)  # the fill made the same tree
    times["exec"] = [timed(node, "true", "apptainer exec --contain bench.sif true") for _ in range(runs)]
    node.run("rm -rf ~/fillbench")
    cp = times["cp"]
    print(f"files {files}, {runs} rounds")
    for name, values in times.items():
        ratios = statistics.median(v / c for v, c in zip(values, cp))
        print(f"{name:8} median {statistics.median(values):7.2f} s  ({ratios:.2f} x cp, median of the rounds' ratios)"
              f"  runs: {', '.join(f'{v:.2f}' for v in values)}")


if __name__ == "__main__":
    main()
