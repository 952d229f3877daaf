"""`config` and `convert` keep no state between calls (issue 38; the test fork server runs them in
one process, tests/forkserver.py): a set of projects converted, and printed by `config`, in one
Python process, in two shuffled orders, give the same files and the same output as each converted in
a fresh process. Generated secrets and the self-signed TLS pair are random: each output directory
keeps the ones its fresh convert made (secrets.env, tls/), which a later convert reuses, as it does
for a user."""
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROJECTS = {  # name -> (project directory, global options, convert's options)
    "llm-chat": (REPO / "stacks" / "llm-chat", [], []),
    "e2e-stack": (REPO / "tests" / "e2e" / "stack", [], []),
    "plain-stack": (REPO / "tests" / "e2e" / "plain-stack", [], []),
    "include": (REPO / "tests" / "corpus" / "include", [], []),
    "healthchecks": (REPO / "tests" / "corpus" / "healthchecks", [], []),
    "ports": (REPO / "tests" / "corpus" / "ports", [], []),
    "extends": (REPO / "tests" / "corpus" / "extends-other-file", [], []),
    "profiles": (REPO / "tests" / "corpus" / "profiles", ["--profile", "debug"], []),
    "tls": (REPO / "stacks" / "llm-chat", [], ["--tls"]),
}

# runs each ARGV of a JSON list in this one process, as the command line would; prints what each
# printed and its exit code, as one JSON line
IN_ONE_PROCESS = r"""
import contextlib, io, json, os, sys
from compose2sif import cli
said = []
for cwd, argv in json.load(sys.stdin):
    os.chdir(cwd)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(argv)
            code = 0
        except SystemExit as done:
            code = done.code or 0
    said.append([out.getvalue(), err.getvalue(), code])
print(json.dumps(said))
"""


def commands(tmp_path: Path):
    """(cwd, argv) of each project's `config --format json` and `convert`, into tmp_path/out/NAME."""
    for name, (directory, global_options, options) in sorted(PROJECTS.items()):
        cwd = tmp_path / "projects" / name
        shutil.copytree(directory, cwd, ignore=shutil.ignore_patterns("*.gguf"))
        yield str(cwd), [*global_options, "config", "--format", "json"]
        yield str(cwd), [*global_options, "convert", "--offline", "-o", str(tmp_path / "out" / name), *options]


def snapshot(out: Path):
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_conversions_in_one_process_in_any_order_equal_fresh_processes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    listed = list(commands(tmp_path))
    fresh = []
    for cwd, argv in listed:
        done = subprocess.run([sys.executable, "-m", "compose2sif", *argv], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=120)
        fresh.append([done.stdout, done.stderr, done.returncode])
    assert all(code == 0 for _, _, code in fresh), [err for _, err, code in fresh if code]
    files = snapshot(tmp_path / "out")
    # what a convert makes once at random and reuses: generated secrets, the self-signed TLS pair
    secrets = {p: files[p] for p in files if p.endswith("/secrets.env") or "/tls/" in p}
    for order in (1, 2):
        shuffled = random.Random(order).sample(range(len(listed)), len(listed))
        shutil.rmtree(tmp_path / "out")
        kept = {**secrets, **{p: files[p] for p in files if p.endswith("/plan.json")}}  # plan.json: "ours, convert again"
        for path, data in kept.items():  # the fresh converts' secrets reused; every other file written anew
            (tmp_path / "out" / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "out" / path).write_bytes(data)
        done = subprocess.run([sys.executable, "-c", IN_ONE_PROCESS], input=json.dumps([listed[i] for i in shuffled]),
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        said = json.loads(done.stdout)
        for position, i in enumerate(shuffled):
            assert said[position] == fresh[i], (order, listed[i])
        again = snapshot(tmp_path / "out")
        assert sorted(again) == sorted(files), order
        for path in files:
            assert again[path] == files[path], (order, path)
