"""An image that writes into its own filesystem (an entrypoint that copies a script to /, a log under
/var/log/app) starts and serves as under Docker; what it wrote is gone after `down`. Real rootless
Apptainer on the test bed, as the unprivileged user."""
import json

import pytest

pytestmark = pytest.mark.e2e

OUT = "out-writable"


def test_image_writes_into_its_root_and_forgets_it_at_down(node):
    node.copy_stack("writable-stack", source="writable-stack")
    node.run(f"cd ~ && rm -rf {OUT}")
    up = f"-f writable-stack/compose.yaml up -d --registry-mirror {node.registry} -o {OUT}"
    try:
        proc = node.c2s(up, timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        app = json.loads((node.home / OUT / "plan.json").read_text())["services"][0]
        first = node.run(f"curl -fsS http://{app['address']}:9100/started", timeout=30)
        assert first.returncode == 0 and first.stdout.startswith("started"), first.stderr
        assert (node.home / OUT / "state" / "overlay" / "app").is_dir()  # fuse-overlayfs on the test bed
        node.run(f"cd ~ && {OUT}/run.sh down", check=True, timeout=120)
        assert not (node.home / OUT / "state" / "overlay" / "app").exists()
        node.c2s(up, timeout=900, check=True)
        second = node.run(f"curl -fsS http://{app['address']}:9100/started", timeout=30)
        assert second.stdout.startswith("started") and second.stdout != first.stdout  # written afresh
    finally:
        node.run(f"cd ~ && {OUT}/run.sh down", timeout=120)
