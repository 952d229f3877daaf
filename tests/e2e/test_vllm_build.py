"""definitions/vllm-v100.def built for real on the test bed (several GB of wheels squashed: about
half an hour), on a local Debian bookworm base image (Python 3.11, within vllm 0.19.1's range; the
test bed's own images are Debian sid, whose Python 3.14 is not). The build's %post runs
check-v100.py, so this test fails if the pin moves to a release without sm_70 code. No GPU: what a
V100 would run is checked in the binaries, nothing is served.

The wheels are PyPI's, fetched by the host's pip (its index, proxy and CA settings: the build
cannot verify this network's TLS interception) and served to the build as a PyPI mirror on
127.0.0.1 through the definition's PIP_INDEX_URL build argument, as a site's mirror would be.

Opt-in, never in the default run:
    nice -n 19 flock /tmp/c2s-e2e.lock env PYTHONPATH=$PWD python3 -m pytest --e2e -m vllm_build tests/e2e/test_vllm_build.py -s
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.vllm_build]

BASE_TAG = "c2s/bookworm:vllm-test"
MIRROR = os.environ.get("C2S_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SIF_LIMIT = 20 * 10**9  # the notes' 10-20 GB for the registry image; the PyPI one must not be larger
REQUIREMENTS = ["vllm==0.19.1", "ray[cgraph]>=2.48,<3", "nvidia-cuda-cuobjdump==13.5.37"]  # as the .def
NO_SM70 = "vllm==0.20.0"  # the first release without sm_70 code
VLLM_VERSION = ("import sys; from vllm import platforms; from vllm.platforms.cpu import CpuPlatform; "
                "platforms.current_platform = CpuPlatform(); from vllm.entrypoints.cli.main import main; "
                "sys.argv = ['vllm', '--version']; main()")


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


@pytest.fixture
def pypi_mirror(node):
    """PyPI's wheels for the definition's requirements (Python 3.11, x86_64), cached beside the test
    bed, laid out as a simple index (one directory per project) and served on 127.0.0.1."""
    cache = node.root.parent / "vllm-wheelhouse"
    wheels, index = cache / "wheels", cache / "index"
    if not (cache / ".done").exists():  # pip download keeps the wheels an interrupted run left
        shutil.rmtree(index, ignore_errors=True)
        wheels.mkdir(parents=True, exist_ok=True)
        platforms = ["manylinux2014_x86_64", "linux_x86_64"] + [f"manylinux_2_{v}_x86_64" for v in range(17, 37)]
        _run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--implementation", "cp",
              "--python-version", "3.11", *[f"--platform={p}" for p in platforms], "-d", str(wheels), *REQUIREMENTS],
             timeout=3600)
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(cache / "no-sm70"), NO_SM70],
             timeout=1800)
        for wheel in wheels.iterdir():
            project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
            (index / project).mkdir(parents=True, exist_ok=True)
            os.link(wheel, index / project / wheel.name)
        (cache / ".done").touch()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(index),
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if subprocess.run(["curl", "-fs", f"http://127.0.0.1:{port}/vllm/"], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/", next((cache / "no-sm70").glob("vllm-0.20.0-*.whl"))
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_the_pypi_definition_builds_with_sm70_code_for_v100(request):
    if "vllm_build" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("opt-in (downloads and squashes several GB): run with -m vllm_build")
    node, bookworm_base = request.getfixturevalue("node"), request.getfixturevalue("bookworm_base")
    index_url, no_sm70_wheel = request.getfixturevalue("pypi_mirror")
    work = "/scratch/hpc/vllm-build"  # the node's /tmp is a RAM tmpfs: the build space goes to scratch
    sif = f"{work}/vllm-v100.sif"
    node.run(f"rm -rf {work} && mkdir -p {work}/tmp {work}/cache", check=True)
    started = time.monotonic()
    try:
        build = node.run(f"cd /work/definitions && APPTAINER_TMPDIR={work}/tmp APPTAINER_CACHEDIR={work}/cache "
                         f"apptainer build --build-arg BASE={bookworm_base} --build-arg PIP_INDEX_URL={index_url} "
                         f"{sif} vllm-v100.def", timeout=5400)
        minutes = (time.monotonic() - started) / 60
        log = build.stdout + build.stderr
        assert build.returncode == 0, log[-6000:]
        # the build-time check ran in %post and passed, on the installed torch and vllm
        # (sm_70 anywhere in the list: _C's starts at sm_52)
        assert re.search(r"^check-v100: torch 2\.10\.0\+cu128: arch flags .*\bsm_70\b", log, re.MULTILINE), log[-6000:]
        assert re.search(r"^check-v100: vllm _C\.abi3\.so: cubins for .*\bsm_70\b", log, re.MULTILINE)
        assert re.search(r"^check-v100: vllm _moe_C\.abi3\.so: cubins for .*\bsm_70\b", log, re.MULTILINE)
        assert "check-v100: vllm serve --help: runs" in log
        assert "check-v100: ok: sm_70 code for a V100 is there" in log

        size = (node.scratch / "vllm-build" / "vllm-v100.sif").stat().st_size
        print("", *(line for line in log.splitlines() if line.startswith("check-v100:")), sep="\n")
        print(f"vllm-v100.sif: {size / 10**9:.2f} GB ({size} bytes), built in {minutes:.1f} min")
        assert size < SIF_LIMIT

        # `vllm --version` builds every subcommand's parser first, and `serve`'s needs a platform: with no
        # GPU, vllm's CLI runs on its CPU platform, as check-v100.py runs `vllm serve --help`
        # the image keeps its caches on /cache (its %environment): bound to scratch, as its users do
        run = f"apptainer exec -B {work}/vllm-cache:/cache"
        node.run(f"mkdir -p {work}/vllm-cache", check=True)
        version = node.run(f"{run} {sif} python3 -c \"{VLLM_VERSION}\"", check=True, timeout=600).stdout.split()
        assert version[-1] == "0.19.1", version
        node.run(f'{run} {sif} python3 -c "import ray"', check=True, timeout=600)
        flags = node.run(f"{run} {sif} python3 -c 'import torch; print(torch._C._cuda_getArchFlags())'",
                         check=True, timeout=600).stdout.split()
        assert "sm_70" in flags, flags
        # the image's own check on the wheel of the first release without sm_70: one line, exit 1
        shutil.copy(no_sm70_wheel, node.scratch / "vllm-build")
        moved = node.run(f"{run} -B {work} --env PIP_INDEX_URL={index_url},TMPDIR={work}/tmp {sif} "
                         f"python3 /opt/check-v100.py {work}/{no_sm70_wheel.name}", timeout=600)
        assert moved.returncode == 1, moved.stdout + moved.stderr
        # the check's own stderr, without Apptainer's INFO lines (e.g. "gocryptfs not found")
        said = [line for line in moved.stderr.splitlines() if not line.startswith("INFO:")]
        assert len(said) == 1, moved.stderr
        assert said[0].startswith("check-v100: a V100 (sm_70) would have nothing to run: vllm-0.20.0-")
        assert "_C.abi3.so has no sm_70 cubin" in said[0] and "_moe_C.abi3.so has no sm_70 cubin" in said[0]
        print(moved.stdout + moved.stderr)
    finally:
        node.run(f"rm -rf {work}")
