"""The helpers ship in the package (issue 36): the sdist and the wheel this run built (conftest.py's
`package`: pip, PyPI's ziglang, the C compilers on PATH stand-ins that fail), and the login node,
which has Python and pip and no C compiler, with compose2sif installed there from that wheel."""
import hashlib
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from compose2sif import helper_recipe, helpers

pytestmark = pytest.mark.e2e


def wheel_files(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_the_package_build_used_no_c_compiler_of_the_machine(package):
    _, _, compiled = package
    assert compiled == ""


def test_the_wheel_is_platform_tagged_and_carries_every_helper_of_the_recipe(wheel):
    assert wheel.name.endswith("-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.musllinux_1_1_x86_64.whl")
    files = wheel_files(wheel)
    manifest = json.loads(files["compose2sif/helpers/manifest.json"])
    assert manifest["toolchain"].startswith("zig 0.17.1 ") and manifest["flags"] == " ".join(helper_recipe.FLAGS)
    expected = {(arch, name) for arch, names in helper_recipe.HELPERS.items() for name in names}
    assert {(h["arch"], h["name"]) for h in manifest["helpers"]} == expected
    machine = {"x86_64": b"\x3e\x00", "aarch64": b"\xb7\x00"}  # ELF e_machine
    for helper in manifest["helpers"]:
        data = files[f"compose2sif/helpers/{helper['arch']}/{helper['name']}"]
        assert hashlib.sha256(data).hexdigest() == helper["sha256"]
        assert data[:4] == b"\x7fELF" and data[18:20] == machine[helper["arch"]]
        assert b"PT_INTERP" not in data and b"ld-linux" not in data  # static: no dynamic loader named
        assert helper["source_sha256"] == helper_recipe.source_digest(helper["name"])


def test_the_sdist_holds_the_sources_and_no_built_helper(package):
    sdist, _, _ = package
    with tarfile.open(sdist) as tf:
        names = {name.split("/", 1)[1] for name in tf.getnames() if "/" in name}
    sources = {str(Path(p).relative_to(helper_recipe.INTERCEPT.rsplit("/compose2sif/", 1)[0]))
               for kind in helper_recipe.SOURCES.values() for p in kind[1]}
    assert sources <= names and {"setup.py", "compose2sif/helper_recipe.py", "compose2sif/c2s-forward.py"} <= names
    assert not any(name.startswith("compose2sif/helpers/") for name in names)


def test_the_helpers_are_reproducible(wheel):
    """The same sources and zig give the same bytes: the wheel's helpers (built from the sdist's tree
    in a temporary directory, a fresh zig cache) against this checkout's (`pip install -e .`: built
    in the repository, another build and cache)."""
    files = wheel_files(wheel)
    for helper in helpers.manifest().helpers:
        assert files[f"compose2sif/helpers/{helper.arch}/{helper.name}"] == Path(helper.path).read_bytes(), helper


def test_the_login_node_has_no_c_compiler_and_compose2sif_comes_from_the_wheel(node, wheel):
    found = node.run("command -v cc gcc clang zig musl-gcc; ls /usr/lib/*/libc.a /usr/lib/libc.a 2>/dev/null; "
                     "cd ~ && python3 -c 'import compose2sif, os; print(os.path.realpath(compose2sif.__file__))'")
    assert found.stdout.splitlines() == ["/home/hpc/c2s-venv/lib/python3." + found.stdout.split("python3.")[1]
                                         .split("/")[0] + "/site-packages/compose2sif/__init__.py"], found.stdout
    files = wheel_files(wheel)
    installed = node.home / "c2s-venv"
    for helper in json.loads(files["compose2sif/helpers/manifest.json"])["helpers"]:
        on_node = next(installed.glob(f"lib/python3*/site-packages/compose2sif/helpers/{helper['arch']}/{helper['name']}"))
        assert on_node.read_bytes() == files[f"compose2sif/helpers/{helper['arch']}/{helper['name']}"]


def test_convert_and_doctor_on_the_node_use_the_wheels_helpers(node, wheel):
    """convert on the node writes the wheel's helpers into bin/ARCH/; they run there, and doctor
    names each one's version and where it came from."""
    stack = node.copy_stack("helpers-stack", "plain-stack")
    node.run(f"cd ~ && python3 -m compose2sif -f {stack.name}/compose.yaml convert --offline -o helpers-out",
             check=True, timeout=300)
    manifest = json.loads(wheel_files(wheel)["compose2sif/helpers/manifest.json"])
    out = node.home / "helpers-out"
    for helper in manifest["helpers"]:
        if helper["name"] == "c2s-forward" and not (out / "bin" / "c2s-forward.py").exists():
            continue  # no port published on another number: no forwarder
        data = (out / "bin" / helper["arch"] / helper["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == helper["sha256"], helper
    said = node.run("cd ~ && helpers-out/bin/x86_64/c2s-loopback --version && "
                    "helpers-out/bin/x86_64/c2s-loopback --check", check=True)
    version = next(h["version"] for h in manifest["helpers"] if h["name"] == "c2s-loopback")
    assert said.stdout.splitlines()[0] == f"c2s-loopback {version}"
    doctor = node.run("cd ~ && python3 -m compose2sif doctor -o helpers-out", timeout=300).stdout
    assert (f"ok   helper c2s-loopback {version} (x86_64): built with zig 0.17.1 (PyPI ziglang) by the compose2sif "
            f"0.1.0 package build") in doctor, doctor
