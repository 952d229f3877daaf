#!/usr/bin/env python3
"""Build-time check, with no GPU, that a vLLM image gives a V100 (compute capability 7.0) code to run.

A V100 runs only sm_70 machine code (a cubin built for sm_75 or later does not load on it) or
PTX for compute_70 or lower, which no vLLM or torch wheel ships. So a pin on a release built
without sm_70 fails only on the V100, at the first request; this check fails the build instead.

    check-v100.py                  in an image's %post: the installed torch and vllm
    check-v100.py WHEEL...         on vllm-*.whl / torch-*.whl files, before building an image

Installed: torch's CUDA arch flags (torch._C._cuda_getArchFlags(), compiled in, readable without
a GPU) must include sm_70; vllm's _C and _moe_C modules must hold sm_70 cubins; `vllm serve
--help` must run (on vllm's CPU platform: without a GPU it detects none). Wheels: the same
cubin check on vllm's _C and _moe_C and on torch's libtorch_cuda.so. cuobjdump comes from PyPI's
nvidia-cuda-cuobjdump, installed to a temporary directory and removed (or --cuobjdump PATH).
Any failure: one line on stderr, exit status 1.
"""
import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Iterable, List, Optional, Set

TARGET = "sm_70"
CUOBJDUMP_PACKAGE = "nvidia-cuda-cuobjdump==13.5.37"  # CUDA 13's cuobjdump reads CUDA 12 and 13 binaries
VLLM_MODULES = ("_C", "_moe_C")  # paged attention, GPTQ, norms, rotary, custom all-reduce; MoE
TORCH_CUDA_LIBRARY = "torch/lib/libtorch_cuda.so"
PROG = "check-v100"


class CheckError(Exception):
    """A reason the check cannot pass; main() prints it as one line."""


def cubin_arches(listing: str) -> Set[str]:
    """The architectures of the cubins in `cuobjdump --list-elf` output, whose lines read
    `ELF file    1: _moe_C.abi3.1.sm_70.cubin`."""
    return set(re.findall(r"^ELF file\s+\d+:\s*\S*?\.(sm_\d+[a-z]?)\.cubin\s*$", listing, re.M))


def arch_flags(flags: str) -> Set[str]:
    """The architectures of torch's arch flags string, e.g. `sm_70 sm_75 sm_80 sm_86 sm_90`."""
    return set(flags.split())


def _by_number(arches: Iterable[str]) -> List[str]:
    return sorted(arches, key=lambda a: (int(re.sub(r"\D", "", a) or 0), a))


def missing_target(what: str, arches: Set[str], kind: str) -> Optional[str]:
    """None when `arches` include sm_70, else the problem in a few words."""
    if TARGET in arches:
        return None
    if not arches:
        return f"{what} has no CUDA {kind} at all"
    return f"{what} has no {TARGET} {kind} (only {' '.join(_by_number(arches))})"


def install_cuobjdump(into: Path) -> Path:
    """cuobjdump from PyPI, installed under `into` (a temporary directory) with pip or uv."""
    if importlib.util.find_spec("pip"):
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-deps"]
    elif shutil.which("uv"):
        command = ["uv", "pip", "install", "-q", "--no-cache", "--no-deps", "--python", sys.executable]
    else:
        raise CheckError("cannot install cuobjdump: neither pip nor uv is available")
    proc = subprocess.run(command + ["--target", str(into), CUOBJDUMP_PACKAGE], capture_output=True, text=True)
    found = sorted(into.glob("nvidia/*/bin/cuobjdump")) + sorted(into.glob("nvidia/cuda_cuobjdump/bin/cuobjdump"))
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no cuobjdump in the package"])[-1]
        raise CheckError(f"cannot install {CUOBJDUMP_PACKAGE}: {last}")
    found[0].chmod(0o755)
    return found[0]


def library_cubins(cuobjdump: Path, library: Path) -> Set[str]:
    proc = subprocess.run([str(cuobjdump), "--list-elf", str(library)], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise CheckError(f"cuobjdump cannot read {library.name}: {last}")
    return cubin_arches(proc.stdout)


def module_file(package_dir: Path, module: str) -> Path:
    """The shared object of extension module `module` (e.g. _C.abi3.so, not _C_stable_libtorch...)."""
    found = sorted(p for p in package_dir.glob(f"{module}.*so") if p.name.split(".")[0] == module)
    if not found:
        raise CheckError(f"vllm has no {module} extension module in {package_dir}")
    return found[0]


def check_installed(cuobjdump: Path) -> List[str]:
    """Problems of the installed torch and vllm (an empty list when a V100 has code to run)."""
    problems = []
    try:
        import torch
    except ImportError as exc:
        raise CheckError(f"cannot import torch: {exc}")
    flags = arch_flags(torch._C._cuda_getArchFlags())
    print(f"{PROG}: torch {torch.__version__}: arch flags {' '.join(_by_number(flags))}")
    problems.append(missing_target(f"torch {torch.__version__}", flags, "arch flag"))
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise CheckError("vllm is not installed")
    package_dir = Path(list(spec.submodule_search_locations)[0])
    for module in VLLM_MODULES:
        library = module_file(package_dir, module)
        arches = library_cubins(cuobjdump, library)
        print(f"{PROG}: vllm {library.name}: cubins for {' '.join(_by_number(arches)) or 'nothing'}")
        problems.append(missing_target(f"vllm's {library.name}", arches, "cubin"))
    return [p for p in problems if p]


# `vllm serve --help` as the `vllm` command runs it. With no GPU (and no driver: vllm._C needs
# libcuda.so.1), vllm finds no platform and cannot build its argument defaults ("Failed to infer
# device type"), so the CPU platform is set, as vllm's own `bench` command does.
SERVE_HELP = """import sys
from vllm import platforms
if platforms.current_platform.is_unspecified():
    from vllm.platforms.cpu import CpuPlatform
    platforms.current_platform = CpuPlatform()
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", "serve", "--help"]
main()
"""


def check_serve_help() -> None:
    """`vllm serve --help` runs: the command is installed and its imports work without a GPU."""
    beside = Path(sys.executable).parent / "vllm"
    if not (beside.exists() or shutil.which("vllm")):
        raise CheckError("no `vllm` command installed")
    proc = subprocess.run([sys.executable, "-c", SERVE_HELP], capture_output=True, text=True)
    if proc.returncode != 0 or "usage" not in proc.stdout.lower():
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise CheckError(f"`vllm serve --help` fails: {last}")
    print(f"{PROG}: vllm serve --help: runs")


def wheel_libraries(wheel: Path) -> List[str]:
    """Members of a vllm or torch wheel whose cubins are checked."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    if wheel.name.startswith("vllm-"):
        members = []
        for module in VLLM_MODULES:
            found = sorted(n for n in names if n.startswith("vllm/") and n.count("/") == 1
                           and n.endswith("so") and n[len("vllm/"):].split(".")[0] == module)
            if not found:
                raise CheckError(f"{wheel.name} has no vllm/{module} extension module")
            members.append(found[0])
        return members
    if wheel.name.startswith("torch-"):
        if TORCH_CUDA_LIBRARY not in names:
            raise CheckError(f"{wheel.name} has no {TORCH_CUDA_LIBRARY} (a CPU-only build)")
        return [TORCH_CUDA_LIBRARY]
    raise CheckError(f"{wheel.name} is neither a vllm nor a torch wheel")


def check_wheels(cuobjdump: Path, wheels: List[Path], scratch: Path) -> List[str]:
    problems = []
    for wheel in wheels:
        if not wheel.is_file():
            raise CheckError(f"no such wheel: {wheel}")
        for member in wheel_libraries(wheel):
            with zipfile.ZipFile(wheel) as archive:
                library = Path(archive.extract(member, scratch))
            arches = library_cubins(cuobjdump, library)
            library.unlink()
            print(f"{PROG}: {wheel.name} {member}: cubins for {' '.join(_by_number(arches)) or 'nothing'}")
            problems.append(missing_target(f"{wheel.name}'s {member}", arches, "cubin"))
    return [p for p in problems if p]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("wheels", nargs="*", type=Path, metavar="WHEEL",
                        help="vllm or torch wheels to check instead of the installed packages")
    parser.add_argument("--cuobjdump", type=Path, help="a cuobjdump to use instead of PyPI's")
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="check-v100.") as scratch:
            cuobjdump = args.cuobjdump or install_cuobjdump(Path(scratch) / "cuobjdump")
            if args.wheels:
                problems = check_wheels(cuobjdump, args.wheels, Path(scratch))
            else:
                problems = check_installed(cuobjdump)
        if problems:
            print(f"{PROG}: a V100 (sm_70) would have nothing to run: {'; '.join(problems)}", file=sys.stderr)
            return 1
        if not args.wheels:
            check_serve_help()
    except CheckError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    print(f"{PROG}: ok: {TARGET} code for a V100 is there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
