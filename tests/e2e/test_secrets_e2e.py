"""Secrets and configs on a real rootless Apptainer, as the unprivileged user: a file secret, an
environment secret and an inline config are read at their paths; the environment secret is in no
process's argv and no world-readable file. Two services with the same build build once."""
import hashlib
import json
import os
import time

import pytest

pytestmark = pytest.mark.e2e

OUT = "secrets-out"
API_KEY = "env-secret-7f3a9c"


def test_secrets_configs_and_a_shared_build(node):
    node.copy_stack("build-stack", source="build-stack")  # the shared build's context
    stack = node.copy_stack("secrets-stack", source="secrets-stack")
    env_file = stack / ".env"
    env_file.write_text(f"API_KEY={API_KEY}\n")
    env_file.chmod(0o600)
    os.chown(env_file, int(node.uid), int(node.uid))
    node.run(f"cd ~ && rm -rf {OUT}")
    args = f"-f secrets-stack/compose.yaml {{}} --registry-mirror {node.registry} -o {OUT}"
    node.c2s(args.format("convert"), timeout=300, check=True)
    plan = json.loads((node.home / OUT / "plan.json").read_text())
    (shared,) = [k for k, v in plan["images"].items() if v["kind"] == "build"]
    assert sorted(plan["images"][shared]["services"]) == ["hello", "hello-again"]
    # not from an earlier run's cache: this build really happens, once
    node.run(f"rm -f /scratch/hpc/compose2sif/sif/{plan['images'][shared]['digest']}.sif", check=True)
    proc = node.c2s(args.format("up -d"), timeout=900)
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stderr.count(f"image {shared}: building") == 1, proc.stderr
        for _ in range(100):
            logs = node.run(f"cd ~ && {OUT}/run.sh logs reader").stdout
            if logs.strip():
                break
            time.sleep(0.2)
        digest = hashlib.sha256(API_KEY.encode()).hexdigest()
        assert logs.strip() == f"'file-secret\\n' {digest} 'listen=8080\\n' 'a=1\\n'"
        for service in ("hello", "hello-again"):
            assert node.run(f"cd ~ && {OUT}/run.sh logs {service}").stdout.strip() == "hi built /opt/app"
        assert not [p for p in node.processes() if API_KEY in p]
        # the secret is in the user's .env and in the file convert wrote, both private, and nowhere else
        found = node.run(f"grep -rlF {API_KEY} ~ /tmp /var/tmp 2>/dev/null").stdout.split()
        assert sorted(found) == [f"/home/hpc/{OUT}/config/secrets/api_key", "/home/hpc/secrets-stack/.env"]
        modes = node.run("stat -c '%a %n' " + " ".join(found), check=True).stdout.splitlines()
        assert all(int(line.split()[0], 8) & 0o077 == 0 for line in modes), modes
        assert API_KEY not in (node.home / OUT / "plan.json").read_text()
    finally:
        node.run(f"cd ~ && {OUT}/run.sh down", timeout=300)
