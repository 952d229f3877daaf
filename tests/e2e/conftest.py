"""The end-to-end test bed: a real rootless Apptainer, as the unprivileged user `hpc` on a Debian
sid root filesystem (see provision.sh and testbed.py), with images served by a local registry.
These tests run only with --e2e (tests/conftest.py) and are all marked e2e.

Outside CI, without root, these tests are skipped with one line saying why. With CI=true a
missing test bed is a failure, never a skip. One run at a time has the test bed: a second run
started meanwhile says so and waits (testbed.taken)."""
import os
from pathlib import Path

import pytest

from compose2sif import forwarder, loopback
from testbed import Node, provision, registry, taken

CI = bool(os.environ.get("CI"))


def _unavailable(reason: str):
    if CI:
        pytest.fail(f"end-to-end test bed unavailable in CI: {reason}")
    pytest.skip(f"end-to-end tests need the Apptainer test bed: {reason}")


@pytest.fixture(scope="session")
def testbed(request):
    """The test bed's description (provision.sh's output), taken for this run, its registry serving."""
    if os.geteuid() != 0:
        _unavailable("run as root (it debootstraps a node and enters it with pivot_root)")
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def tell(line: str):  # on the terminal at once, past pytest's capture
        with capture.global_and_fixture_disabled():
            print(f"\n[e2e] {line}", flush=True)

    # the forwarder of published ports, which convert puts into bin/: the node has no C compiler (as
    # many compute nodes), so it is built here, as a user converting on a login node would have it
    if not forwarder.fresh() and not forwarder.build(forwarder.PREBUILT):
        pytest.fail(f"cannot build {forwarder.PREBUILT} (a C compiler with static libc is needed)")
    if not loopback.fresh() and not loopback.build(loopback.PREBUILT):  # the tracer (bin/c2s-loopback), likewise
        pytest.fail(f"cannot build {loopback.PREBUILT} (a C compiler with static libc is needed)")
    with taken(tell):
        try:
            info = provision()
            with registry(info):
                yield info
        except RuntimeError as exc:
            _unavailable(str(exc))


@pytest.fixture(scope="session")
def node(testbed):
    """The rootless node: Apptainer with user namespaces, as user `hpc`."""
    the_node = Node(Path(testbed["NODE"]), testbed["REGISTRY_PORT"], testbed["HPC_UID"])
    # a scratch file system outside the home directory, as HPC sites have: run.sh keeps
    # SIFs and build caches there (/scratch/$USER)
    the_node.scratch.mkdir(parents=True, exist_ok=True)
    os.chown(the_node.scratch, int(the_node.uid), int(the_node.uid))
    the_node.kill_all()
    yield the_node
    the_node.kill_all()


@pytest.fixture(scope="session")
def setuid_node(testbed):
    """The setuid node: Apptainer installed setuid, user namespaces blocked (provision.sh)."""
    the_node = Node(Path(testbed["SETUID_NODE"]), testbed["REGISTRY_PORT"], testbed["HPC_UID"], mode="setuid")
    the_node.kill_all()
    yield the_node
    the_node.kill_all()


@pytest.fixture(scope="session")
def slurm(testbed):
    """A real Slurm (slurmctld, two slurmd as two fake nodes, munge) on the Slurm node (slurmbed.py)."""
    from slurmbed import SlurmCluster
    if not testbed.get("SLURM_NODE"):
        _unavailable("provision.sh printed no SLURM_NODE (a test bed provisioned before the Slurm node)")
    cluster = SlurmCluster(Path(testbed["SLURM_NODE"]), testbed["HPC_UID"], testbed["REGISTRY_PORT"])
    try:
        cluster.start()
    except RuntimeError as exc:  # the bed is there: a cluster that does not come up is a failure
        cluster.stop()
        pytest.fail(str(exc))
    yield cluster
    cluster.stop()
