#!/usr/bin/env python3
"""What the unit suite costs on this machine, against issue 22's goal (under 60 s): runs the
README's unit command, `python3 -m pytest -q -m "not e2e"`, and prints its wall time, the CPU it
used (user + sys of every process it waited for; and the whole machine's busy CPU over the run,
which also counts what no one waits for, such as each test process's fork server, and anything
else running: on a quiet machine the truer figure), the ratio of each to the goal, the load
average around it, and the test files that used the most CPU.

    python3 bench/unit_suite.py [--rounds 1] [--cold] [--top 12] [-- PYTEST ARGS...]

--cold empties pytest's cache first (the answers of Docker Compose's loader and shellcheck's
passes that helpers.remembered keeps between runs), as on a fresh clone; otherwise the run finds
what the last one kept, as a developer's second run does. Each round is one whole run. The per-file
CPU is this process's own measure, taken in each pytest worker around each test (its own CPU and
that of the children it waited for): a process a test leaves running is not counted there, but is in
the total.
"""
import argparse
import collections
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOAL_S = 60.0

# loaded into each pytest process (-p): each test's CPU, by this process and the children it waited for
PLUGIN = '''
import json, os, resource, time
import pytest
_rows = []

def _cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _cpu()
    yield
    _rows.append((item.nodeid.split("::")[0], _cpu() - before))

def pytest_sessionfinish(session):
    name = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    with open(os.path.join(os.environ["C2S_BENCH_ROWS"], name + ".json"), "w") as fh:
        json.dump(_rows, fh)
'''


def busy_seconds():
    """The machine's CPU time so far, all CPUs, not idle or waiting (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


def host_probe():
    """CPU seconds of a fixed piece of work like the suite's (a Python loop; forks and execs of
    `true`). This host's speed changes by a third from one ten-minute stretch to the next: the
    probe, taken before and after a round, tells a slow stretch from a slower suite."""
    started = time.process_time()
    total = 0
    for i in range(3_000_000):
        total += i * i % 7
    python = time.process_time() - started
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(60):
        subprocess.run(["true"])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return python + (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


# host_probe() on this 2-CPU machine in a quiet stretch (the least of 40, 2026-11-26; the median
# of those 40 was 0.39 s)
QUIET_PROBE_S = 0.28


def one_round(args, pytest_args):
    with tempfile.TemporaryDirectory(prefix="c2s-bench-unit-") as tmp:
        Path(tmp, "c2s_bench_unit.py").write_text(PLUGIN)
        env = {**os.environ, "C2S_BENCH_ROWS": tmp,
               "PYTHONPATH": os.pathsep.join(filter(None, [tmp, os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, "-m", "pytest", "-q", "-m", "not e2e", "-p", "c2s_bench_unit", *pytest_args]
        if args.cold:
            command.append("--cache-clear")
        probe_before = statistics.median(host_probe() for _ in range(5))
        load_before = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started, busy_before = time.monotonic(), busy_seconds()
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        wall, busy = time.monotonic() - started, busy_seconds() - busy_before
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        by_file = collections.Counter()
        for rows in Path(tmp).glob("*.json"):
            for path, seconds in json.loads(rows.read_text()):
                by_file[path] += seconds
        summary = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        load_after, probe_after = os.getloadavg()[0], statistics.median(host_probe() for _ in range(5))
        return (proc.returncode, summary, wall, cpu, busy, load_before, load_after, by_file,
                (probe_before, probe_after))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cold", action="store_true", help="empty pytest's cache before each round")
    parser.add_argument("--top", type=int, default=12, help="how many test files to list by CPU")
    args, pytest_args = parser.parse_known_args()
    pytest_args = [a for a in pytest_args if a != "--"]
    print(f"machine: {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable); goal: under {GOAL_S:.0f} s wall")
    for n in range(1, args.rounds + 1):
        rc, summary, wall, cpu, busy, load_before, load_after, by_file, probes = one_round(args, pytest_args)
        print(f"round {n}{' (cold cache)' if args.cold else ''}: {summary}")
        print(f"  wall {wall:6.1f} s   {wall / GOAL_S:4.2f} of the goal")
        print(f"  CPU  {cpu:6.1f} s   (user + sys; {cpu / len(os.sched_getaffinity(0)):.1f} s a CPU, "
              f"{cpu / len(os.sched_getaffinity(0)) / GOAL_S:4.2f} of the goal)")
        print(f"  busy {busy:6.1f} s   (the machine's, over the run; "
              f"{busy / len(os.sched_getaffinity(0)) / GOAL_S:4.2f} of the goal)")
        print(f"  load average {load_before:.1f} before, {load_after:.1f} after")
        slowdown = sum(probes) / 2 / QUIET_PROBE_S
        print(f"  host speed: the probe took {probes[0]:.2f} s before, {probes[1]:.2f} s after, "
              f"{QUIET_PROBE_S:.2f} s in a quiet stretch: the host ran at about 1/{slowdown:.2f} of its quiet speed; "
              f"at that speed: wall {wall / slowdown:.1f} s, busy {busy / slowdown:.1f} s (estimates)")
        measured = sum(by_file.values())
        print(f"  CPU by test file (of {measured:.1f} s measured around the tests; the rest is start-up "
              "and collection in each worker):")
        for path, seconds in by_file.most_common(args.top):
            print(f"    {seconds:6.1f} s  {seconds / measured:5.1%}  {path}")
        if rc != 0:
            print(f"  pytest exited {rc}")
            sys.exit(rc)


if __name__ == "__main__":
    main()
