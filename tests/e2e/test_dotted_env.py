"""Dotted environment variables (`discovery.type=single-node`: settings programs read by name) reach
the program on the real test bed, though apptainer's --env-file cannot carry them: through `env` on
the launch line, each one word, quoted as data. The program is a stand-in (a Python one-liner in the
test Python image that writes its environment where the test reads it), named as such here."""
import json
import subprocess

import pytest

pytestmark = pytest.mark.e2e

STACK = "dotted-stack"
OUT = "dotted-out"
# the stand-in: writes its environment to /seen/env.json, then waits
DUMP = ("import os, json, time; json.dump(dict(os.environ), open('/seen/env.json', 'w')); "
        "print('dumped', flush=True); time.sleep(600)")
HOSTILE = "$(touch /tmp/c2s-dotted-pwned) `id` 'q' \"d\" ;x"


@pytest.fixture
def bed(node):
    node.run(f"cd ~ && rm -rf {OUT} {STACK} /tmp/c2s-dotted-pwned")
    yield node
    node.run(f"cd ~ && {OUT}/run.sh down", timeout=300)


def test_dotted_variables_reach_the_program_as_data(bed):
    node = bed
    root = node.home / STACK
    (root / "seen").mkdir(parents=True)
    (root / "compose.yaml").write_text(json.dumps({"services": {"search": {
        "image": "c2s/python:test",
        "command": ["python3", "-c", DUMP],
        "volumes": ["./seen:/seen"],
        "environment": {"discovery.type": "single-node", "xpack.security.enabled": "false",
                        "odd.value": HOSTILE.replace("$", "$$"), "PLAIN": "yes"},
    }}}))
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(root)], check=True)
    node.c2s(f"-f {STACK}/compose.yaml convert --registry-mirror {node.registry} -o {OUT}", check=True)
    node.run(f"cd ~ && {OUT}/run.sh build", check=True, timeout=900)
    proc = node.run(f"cd ~ && {OUT}/run.sh up -d", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = root / "seen" / "env.json"
    node.run(f"for i in $(seq 50); do [ -s ~/{STACK}/seen/env.json ] && break; sleep 0.2; done")
    env = json.loads(seen.read_text())
    assert env["discovery.type"] == "single-node" and env["xpack.security.enabled"] == "false"
    assert env["odd.value"] == HOSTILE and env["PLAIN"] == "yes"
    assert node.run("test -e /tmp/c2s-dotted-pwned").returncode != 0
