"""definitions/check-v100.py, the build-time sm_70 check of the vLLM images, and the definitions
that run it. The cuobjdump listings here are fabricated in the format of CUDA 13.5's cuobjdump
(lines copied from its output on vllm 0.19.1's _moe_C.abi3.so, trimmed); the check on the real
wheels and a real build is in docs/vllm-v100.md and tests/e2e/test_vllm_build.py."""
import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

DEFINITIONS = Path(__file__).resolve().parent.parent / "definitions"
CHECK = DEFINITIONS / "check-v100.py"
spec = importlib.util.spec_from_file_location("check_v100", CHECK)
check_v100 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_v100)

FABRICATED_LISTING_WITH_SM70 = """\
ELF file    1: _moe_C.abi3.1.sm_70.cubin
ELF file    2: _moe_C.abi3.2.sm_75.cubin
ELF file    3: _moe_C.abi3.3.sm_80.cubin
ELF file    4: _moe_C.abi3.4.sm_89.cubin
ELF file    5: _moe_C.abi3.5.sm_90.cubin
ELF file   10: _moe_C.abi3.10.sm_90a.cubin
ELF file   11: _moe_C.abi3.11.sm_100a.cubin
"""
FABRICATED_LISTING_WITHOUT_SM70 = """\
ELF file    1: _C.abi3.1.sm_75.cubin
ELF file    2: _C.abi3.2.sm_80.cubin
ELF file    3: _C.abi3.3.sm_120.cubin
"""


def test_cubin_arches_reads_cuobjdump_list_elf():
    assert check_v100.cubin_arches(FABRICATED_LISTING_WITH_SM70) == {
        "sm_70", "sm_75", "sm_80", "sm_89", "sm_90", "sm_90a", "sm_100a"}
    # PTX and other lines are not cubins; a file without device code lists nothing
    assert check_v100.cubin_arches("PTX file    1: _C.abi3.1.sm_70.ptx\n") == set()
    assert check_v100.cubin_arches("cuobjdump info    : File 'x.so' does not contain device code\n") == set()


def test_arch_flags_of_torch():
    # torch 2.10.0+cu128's torch._C._cuda_getArchFlags()
    assert check_v100.arch_flags("sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120") >= {"sm_70", "sm_120"}
    assert "sm_70" not in check_v100.arch_flags("sm_75 sm_80 sm_86 sm_90 sm_100 sm_120")


def test_missing_target_names_what_is_there_in_order():
    assert check_v100.missing_target("vllm's _C.abi3.so", {"sm_70", "sm_80"}, "cubin") is None
    assert check_v100.missing_target("vllm's _C.abi3.so", {"sm_120", "sm_75", "sm_90a", "sm_90"}, "cubin") == (
        "vllm's _C.abi3.so has no sm_70 cubin (only sm_75 sm_90 sm_90a sm_120)")
    assert check_v100.missing_target("torch 2.11.0", set(), "arch flag") == "torch 2.11.0 has no CUDA arch flag at all"
    # a cubin for a later sm_7x does not run on a V100
    assert check_v100.missing_target("x", {"sm_72", "sm_75"}, "cubin") is not None


@pytest.fixture
def standin_cuobjdump(tmp_path):
    """A stand-in for cuobjdump: `--list-elf FILE` prints FILE, whose content is a fabricated listing."""
    tool = tmp_path / "standin-cuobjdump"
    tool.write_text('#!/bin/sh\n[ "$1" = --list-elf ] && exec cat "$2"\nexit 2\n')
    tool.chmod(0o755)
    return tool


def _fabricated_wheel(path: Path, members: dict) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)
    return path


def _run(args):
    return subprocess.run([sys.executable, str(CHECK), *map(str, args)], capture_output=True, text=True)


def test_a_wheel_with_sm70_cubins_passes(tmp_path, standin_cuobjdump):
    wheel = _fabricated_wheel(tmp_path / "vllm-0.19.1-cp38-abi3-manylinux_2_31_x86_64.whl", {
        "vllm/_C.abi3.so": FABRICATED_LISTING_WITH_SM70,
        "vllm/_C_stable_libtorch.abi3.so": FABRICATED_LISTING_WITHOUT_SM70,  # not vllm's _C: not checked
        "vllm/_moe_C.abi3.so": FABRICATED_LISTING_WITH_SM70,
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": FABRICATED_LISTING_WITHOUT_SM70})
    proc = _run(["--cuobjdump", standin_cuobjdump, wheel])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert re.findall(r"vllm/(\S+): cubins for sm_70 sm_75 ", proc.stdout) == ["_C.abi3.so", "_moe_C.abi3.so"]
    assert proc.stdout.splitlines()[-1] == "check-v100: ok: sm_70 code for a V100 is there"


def test_a_wheel_without_sm70_fails_with_one_line(tmp_path, standin_cuobjdump):
    good = _fabricated_wheel(tmp_path / "torch-2.10.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                             {"torch/lib/libtorch_cuda.so": FABRICATED_LISTING_WITH_SM70})
    bad = _fabricated_wheel(tmp_path / "vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl", {
        "vllm/_C.abi3.so": FABRICATED_LISTING_WITHOUT_SM70, "vllm/_moe_C.abi3.so": FABRICATED_LISTING_WITH_SM70})
    proc = _run(["--cuobjdump", standin_cuobjdump, good, bad])
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "check-v100: a V100 (sm_70) would have nothing to run: vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl's "
        "vllm/_C.abi3.so has no sm_70 cubin (only sm_75 sm_80 sm_120)"]
    assert "torch/lib/libtorch_cuda.so: cubins for sm_70" in proc.stdout


@pytest.mark.parametrize("name, members, message", [
    ("vllm-0.19.1-x.whl", {"vllm/_C.abi3.so": ""}, "vllm-0.19.1-x.whl has no vllm/_moe_C extension module"),
    ("torch-2.10.0-x.whl", {"torch/lib/libtorch_cpu.so": ""}, "has no torch/lib/libtorch_cuda.so (a CPU-only build)"),
    ("numpy-2.0-x.whl", {"numpy/core.so": ""}, "numpy-2.0-x.whl is neither a vllm nor a torch wheel"),
    ("vllm-0.19.1-y.whl", {"vllm/_C.abi3.so": "no device code\n", "vllm/_moe_C.abi3.so": "no device code\n"},
     "vllm/_C.abi3.so has no CUDA cubin at all"),
])
def test_unusable_wheels_fail_with_one_line(tmp_path, standin_cuobjdump, name, members, message):
    proc = _run(["--cuobjdump", standin_cuobjdump, _fabricated_wheel(tmp_path / name, members)])
    assert proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_cuobjdump_that_fails_is_one_line(tmp_path):
    failing = tmp_path / "standin-cuobjdump-failing"
    failing.write_text("#!/bin/sh\necho 'cuobjdump fatal   : Could not open input file' >&2\nexit 1\n")
    failing.chmod(0o755)
    wheel = _fabricated_wheel(tmp_path / "vllm-0.19.1-z.whl", {"vllm/_C.abi3.so": "", "vllm/_moe_C.abi3.so": ""})
    proc = _run(["--cuobjdump", failing, wheel])
    assert proc.returncode == 1
    assert proc.stderr == "check-v100: cuobjdump cannot read _C.abi3.so: cuobjdump fatal   : Could not open input file\n"


def _sections(definition: Path) -> dict:
    sections, name = {"header": []}, "header"
    for line in definition.read_text().splitlines():
        if line.startswith("%"):
            name = line.split()[0]
            sections[name] = []
        elif not line.startswith("#"):
            sections[name].append(line.strip())
    return {k: [line for line in v if line] for k, v in sections.items()}


VLLM_DEFINITIONS = sorted(DEFINITIONS.glob("vllm*.def"))


def test_the_vllm_definitions_are_there():
    assert [d.name for d in VLLM_DEFINITIONS] == ["vllm-v100-registry.def", "vllm-v100.def"]


@pytest.mark.parametrize("definition", VLLM_DEFINITIONS, ids=lambda d: d.name)
def test_every_vllm_definition_runs_the_check_in_post(definition):
    sections = _sections(definition)
    assert sections["%files"] == ["check-v100.py /opt/check-v100.py"]
    assert any(re.fullmatch(r"(/opt/vllm/bin/)?python3 /opt/check-v100.py", line) for line in sections["%post"])


def test_both_definitions_set_the_same_v100_environment():
    pypi, registry = (_sections(DEFINITIONS / n)["%environment"] for n in ("vllm-v100.def", "vllm-v100-registry.def"))
    assert pypi == ['export PATH="/opt/vllm/bin:$PATH"'] + registry
    environment = "\n".join(registry)
    assert "VLLM_USE_FLASHINFER_SAMPLER=0" in environment
    for cache in ("HF_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert re.search(rf'export {cache}="\${{{cache}:-/cache/', environment), cache


def test_the_pypi_definition_pins_vllm_0_19_1_on_a_base_given_at_build_time():
    sections = _sections(DEFINITIONS / "vllm-v100.def")
    assert sections["header"] == ["Bootstrap: docker", "From: {{ BASE }}"]
    assert sections["%arguments"] == ["BASE=ubuntu:24.04", "PIP_INDEX_URL=https://pypi.org/simple"]
    post = "\n".join(sections["%post"])
    assert re.findall(r'"vllm==[^"]*"', post) == ['"vllm==0.19.1"']
    assert '"ray[cgraph]>=2.48,<3"' in post
    assert "--no-cache-dir" in post
