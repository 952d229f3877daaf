"""The end-to-end test bed: a real rootless Apptainer, as the unprivileged user `hpc` on a Debian
sid root filesystem (see provision.sh and testbed.py), with images served by a local registry.
These tests run only with --e2e (tests/conftest.py) and are all marked e2e.

Outside CI, without root, these tests are skipped with one line saying why. With CI=true a
missing test bed is a failure, never a skip. One run at a time has the test bed: a second run
started meanwhile says so and waits (testbed.taken)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import REPO, Node, install_compose2sif, provision, registry, taken

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

    with taken(tell):
        try:
            info = provision()
            with registry(info):
                yield info
        except RuntimeError as exc:
            _unavailable(str(exc))


STANDIN_COMPILERS = ("cc", "gcc", "clang", "ld", "musl-gcc")


@pytest.fixture(scope="session")
def package(tmp_path_factory):
    """compose2sif's sdist, and the wheel pip builds from it (a copy of the sdist's tree, a fresh zig
    cache): what every node installs. The C compilers on PATH are STAND-INS that record a call and
    fail, so the helpers in it can only come from the toolchain the build declares (PyPI's ziglang).
    Gives (sdist, wheel, the calls of a stand-in compiler: none expected)."""
    out = tmp_path_factory.mktemp("package")
    standins = out / "standin-compilers"
    standins.mkdir()
    for name in STANDIN_COMPILERS:
        (standins / name).write_text(f'#!/bin/sh\necho {name} "$@" >>"{out}/compiled"\nexit 1\n')
        (standins / name).chmod(0o755)
    env = {key: value for key, value in os.environ.items() if not key.startswith("ZIG_")}
    env.update(PATH=f"{standins}:{env['PATH']}", CC=str(standins / "cc"))
    for step in ([sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(REPO)],
                 [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                  "-w", str(out), "SDIST"]):
        step = [str(next(out.glob("compose2sif-*.tar.gz"))) if word == "SDIST" else word for word in step]
        built = subprocess.run(step, capture_output=True, text=True, env=env, timeout=1200)
        if built.returncode != 0:
            pytest.fail(f"building the package failed ({' '.join(step[:4])}...):\n{built.stdout[-3000:]}\n"
                        f"{built.stderr[-3000:]}")
    compiled = (out / "compiled").read_text() if (out / "compiled").exists() else ""
    return next(out.glob("compose2sif-*.tar.gz")), next(out.glob("compose2sif-*.whl")), compiled


@pytest.fixture(scope="session")
def wheel(package):
    return package[1]


@pytest.fixture(scope="session")
def node(testbed, wheel):
    """The rootless node: Apptainer with user namespaces, as user `hpc`, compose2sif pip-installed
    from the wheel."""
    the_node = Node(Path(testbed["NODE"]), testbed["REGISTRY_PORT"], testbed["HPC_UID"])
    # a scratch file system outside the home directory, as HPC sites have: run.sh keeps
    # SIFs and build caches there (/scratch/$USER)
    the_node.scratch.mkdir(parents=True, exist_ok=True)
    os.chown(the_node.scratch, int(the_node.uid), int(the_node.uid))
    the_node.kill_all()
    the_node.install_compose2sif(wheel)
    yield the_node
    the_node.kill_all()


@pytest.fixture(scope="session")
def setuid_node(testbed, wheel):
    """The setuid node: Apptainer installed setuid, user namespaces blocked (provision.sh)."""
    the_node = Node(Path(testbed["SETUID_NODE"]), testbed["REGISTRY_PORT"], testbed["HPC_UID"], mode="setuid")
    the_node.kill_all()
    the_node.install_compose2sif(wheel)
    yield the_node
    the_node.kill_all()


@pytest.fixture(scope="session")
def slurm(testbed, wheel):
    """A real Slurm (slurmctld, two slurmd as two fake nodes, munge) on the Slurm node (slurmbed.py)."""
    from slurmbed import SlurmCluster
    if not testbed.get("SLURM_NODE"):
        _unavailable("provision.sh printed no SLURM_NODE (a test bed provisioned before the Slurm node)")
    cluster = SlurmCluster(Path(testbed["SLURM_NODE"]), testbed["HPC_UID"], testbed["REGISTRY_PORT"])
    try:
        cluster.start()
        install_compose2sif(cluster.home, cluster.uid, wheel,
                            lambda command: cluster.run(command, rank=None, timeout=300, check=True))
    except RuntimeError as exc:  # the bed is there: a cluster that does not come up is a failure
        cluster.stop()
        pytest.fail(str(exc))
    yield cluster
    cluster.stop()
