"""definitions/vllm-v100.def built for real on the test bed, from PyPI (several GB downloaded and
squashed: about half an hour), on a local Debian bookworm base image (Python 3.11, within vllm
0.19.1's range; the test bed's own images are Debian sid, whose Python 3.14 is not). The build's
%post runs check-v100.py, so this test fails if the pin moves to a release without sm_70 code.
No GPU: what a V100 would run is checked in the binaries, nothing is served.

Opt-in, never in the default run:
    nice -n 19 flock /tmp/c2s-e2e.lock env PYTHONPATH=$PWD python3 -m pytest tests/e2e/test_vllm_build.py -m vllm_build -s
"""
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.vllm_build]

BASE_TAG = "c2s/bookworm:vllm-test"
MIRROR = os.environ.get("C2S_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SIF_LIMIT = 20 * 10**9  # the notes' 10-20 GB for the registry image; the PyPI one must not be larger


def _run(command, **kw):
    return subprocess.run(command, check=True, capture_output=True, text=True, **kw)


@pytest.fixture
def bookworm_base(node):
    """A plain Debian bookworm (minbase, Python comes from the definition's apt-get) in the test
    bed's registry; its root filesystem is cached beside the test bed's."""
    cache = node.root.parent / "vllm-base-bookworm"
    rootfs, layout = cache / "rootfs", cache / "oci"
    if not (cache / ".done").exists():
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        _run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), MIRROR], timeout=1800)
        _run(["chroot", str(rootfs), "apt-get", "clean"])
        _run(["umoci", "init", "--layout", str(layout)])
        _run(["umoci", "new", "--image", f"{layout}:bookworm"])
        bundle = cache / "bundle"
        _run(["umoci", "unpack", "--rootless", "--image", f"{layout}:bookworm", str(bundle)])
        shutil.rmtree(bundle / "rootfs")
        _run(["cp", "-a", str(rootfs), str(bundle / "rootfs")])
        _run(["umoci", "repack", "--image", f"{layout}:bookworm", str(bundle)])
        _run(["umoci", "config", "--image", f"{layout}:bookworm", "--tag", "bookworm", "--config.cmd", "bash"])
        shutil.rmtree(bundle)
        shutil.rmtree(rootfs)
        (cache / ".done").touch()
    _run(["skopeo", "copy", "-q", "--dest-tls-verify=false", f"oci:{layout}:bookworm",
          f"docker://{node.registry}/{BASE_TAG}"], timeout=600)
    return f"{node.registry}/{BASE_TAG}"


def test_the_pypi_definition_builds_with_sm70_code_for_v100(request):
    if "vllm_build" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("opt-in (downloads and squashes several GB): run with -m vllm_build")
    node, bookworm_base = request.getfixturevalue("node"), request.getfixturevalue("bookworm_base")
    work = "/scratch/hpc/vllm-build"  # the node's /tmp is a RAM tmpfs: the build space goes to scratch
    sif = f"{work}/vllm-v100.sif"
    node.run(f"rm -rf {work} && mkdir -p {work}/tmp {work}/cache", check=True)
    started = time.monotonic()
    try:
        build = node.run(f"cd /work/definitions && APPTAINER_TMPDIR={work}/tmp APPTAINER_CACHEDIR={work}/cache "
                         f"apptainer build --build-arg BASE={bookworm_base} {sif} vllm-v100.def", timeout=5400)
        minutes = (time.monotonic() - started) / 60
        log = build.stdout + build.stderr
        assert build.returncode == 0, log[-6000:]
        # the build-time check ran in %post and passed, on the installed torch and vllm
        assert "check-v100: torch 2.10.0+cu128: arch flags sm_70 " in log, log[-6000:]
        assert "check-v100: vllm _C.abi3.so: cubins for sm_70 " in log
        assert "check-v100: vllm _moe_C.abi3.so: cubins for sm_70 " in log
        assert "check-v100: vllm serve --help: runs" in log
        assert "check-v100: ok: sm_70 code for a V100 is there" in log

        size = (node.scratch / "vllm-build" / "vllm-v100.sif").stat().st_size
        print(f"\nvllm-v100.sif: {size / 10**9:.2f} GB ({size} bytes), built in {minutes:.1f} min")
        assert size < SIF_LIMIT

        version = node.run(f"apptainer exec {sif} vllm --version", check=True, timeout=600).stdout.split()
        assert version[-1] == "0.19.1", version
        node.run(f'apptainer exec {sif} python3 -c "import ray"', check=True, timeout=600)
        flags = node.run(f"apptainer exec {sif} python3 -c 'import torch; print(torch._C._cuda_getArchFlags())'",
                         check=True, timeout=600).stdout.split()
        assert "sm_70" in flags, flags
        # the image's own check on the wheel of the first release without sm_70: one line, exit 1
        wheels = f"{work}/wheels"
        node.run(f"apptainer exec -B {work} {sif} pip download -q --no-deps --no-cache-dir vllm==0.20.0 -d {wheels}",
                 check=True, timeout=1200)
        moved = node.run(f"apptainer exec -B {work} {sif} sh -c 'python3 /opt/check-v100.py {wheels}/vllm-0.20.0-*.whl'",
                         timeout=600)
        assert moved.returncode == 1, moved.stdout + moved.stderr
        assert len(moved.stderr.splitlines()) == 1, moved.stderr
        assert moved.stderr.startswith("check-v100: a V100 (sm_70) would have nothing to run: vllm-0.20.0-")
        assert "_C.abi3.so has no sm_70 cubin" in moved.stderr and "_moe_C.abi3.so has no sm_70 cubin" in moved.stderr
        print(moved.stdout + moved.stderr)
    finally:
        node.run(f"rm -rf {work}")
