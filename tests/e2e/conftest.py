"""The end-to-end test bed: a real rootless Apptainer, as the unprivileged user `hpc` on a Debian
sid root filesystem (see provision.sh and testbed.py), with images served by a local registry.

Outside CI, without root, these tests are skipped with one line saying why. With CI=true a
missing test bed is a failure, never a skip."""
import os
from pathlib import Path

import pytest

from testbed import Node, provision, registry

CI = bool(os.environ.get("CI"))


def _unavailable(reason: str):
    if CI:
        pytest.fail(f"end-to-end test bed unavailable in CI: {reason}")
    pytest.skip(f"end-to-end tests need the Apptainer test bed: {reason}")


@pytest.fixture(scope="session")
def node():
    if os.geteuid() != 0:
        _unavailable("run as root (it debootstraps a node and enters it with pivot_root)")
    try:
        info = provision()
        with registry(info):
            the_node = Node(Path(info["NODE"]), info["REGISTRY_PORT"], info["HPC_UID"])
            # a scratch file system outside the home directory, as HPC sites have: run.sh keeps
            # SIFs and build caches there (/scratch/$USER)
            the_node.scratch.mkdir(parents=True, exist_ok=True)
            os.chown(the_node.scratch, int(the_node.uid), int(the_node.uid))
            the_node.kill_all()
            yield the_node
            the_node.kill_all()
    except RuntimeError as exc:
        _unavailable(str(exc))
