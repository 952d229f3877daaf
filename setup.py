"""Builds compose2sif's static helpers into the package as the package is built.

c2s-forward (published ports on another number, docs/ports.md) and c2s-loopback (a loopback per
service, docs/interception.md) run on the node, inside any image, where there may be no compiler:
so they are compiled here, when the wheel is built (`pip wheel .`, `pip install .`, `pip install
-e .`), by zig's C compiler from PyPI (`ziglang`, pinned in pyproject.toml's [build-system]
requires), against the musl C library zig carries, static and stripped. Nothing is compiled where
compose2sif runs. Each architecture in HELPERS gets its own build (zig cross-compiles), so one wheel
serves a login node and compute nodes of another architecture. The builds are reproducible: the same
sources and zig give the same bytes, wherever the checkout lies (tests/test_helpers_package.py).

zig keeps its build of the C library in a cache: a fresh temporary one per build (nothing left in the
home directory), or ZIG_GLOBAL_CACHE_DIR where that is set. compose2sif/helpers/manifest.json lists
what was built: architecture, name, version, sha256, toolchain (compose2sif/helpers.py reads it).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
HELPERS_DIR = os.path.join("compose2sif", "helpers")  # in the package: ARCH/NAME and manifest.json


def _recipe():
    """compose2sif/helper_recipe.py, loaded on its own (the build environment has none of compose2sif's
    dependencies)."""
    spec = importlib.util.spec_from_file_location("helper_recipe", os.path.join(HERE, "compose2sif", "helper_recipe.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


recipe = _recipe()
HELPERS, SOURCES, FLAGS, source_digest = recipe.HELPERS, recipe.SOURCES, recipe.FLAGS, recipe.source_digest


def zig(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ziglang", *args], capture_output=True, text=True, env=env)


def build_helpers(target_dir: str, version: str) -> None:
    """Compiles every helper of HELPERS into TARGET_DIR/ARCH/NAME and writes TARGET_DIR/manifest.json."""
    found = zig("version")
    if found.returncode != 0:
        raise SystemExit("compose2sif: cannot build the helpers: zig's C compiler (PyPI's ziglang, in "
                         f"[build-system] requires) does not run: {(found.stderr or found.stdout).strip()}")
    toolchain = f"zig {found.stdout.strip()} (PyPI ziglang)"
    with tempfile.TemporaryDirectory(prefix="c2s-helpers-") as scratch:
        env = dict(os.environ, ZIG_LOCAL_CACHE_DIR=os.path.join(scratch, "local"))
        env.setdefault("ZIG_GLOBAL_CACHE_DIR", os.path.join(scratch, "global"))

        def one_architecture(arch: str):
            built = []
            for name in HELPERS[arch]:
                output = os.path.join(target_dir, arch, name)
                os.makedirs(os.path.dirname(output), exist_ok=True)
                helper_version = f"{version}+{source_digest(name)[:12]}"
                done = zig("cc", "-target", f"{arch}-linux-musl", *FLAGS, f'-DC2S_VERSION="{helper_version}"',
                           "-o", output + ".partial", *SOURCES[name][0], env=env)
                if done.returncode != 0:
                    raise SystemExit(f"compose2sif: building {name} for {arch} failed:\n{done.stderr.strip()}")
                os.replace(output + ".partial", output)
                os.chmod(output, 0o755)
                with open(output, "rb") as fh:
                    data = fh.read()
                built.append({"arch": arch, "name": name, "version": helper_version,
                              "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                              "source_sha256": source_digest(name)})
            return built

        # one architecture a thread: each builds its own copy of the C library first (most of the time)
        with ThreadPoolExecutor(max_workers=len(HELPERS)) as pool:
            helpers = [entry for built in pool.map(one_architecture, sorted(HELPERS)) for entry in built]
    manifest = {"toolchain": toolchain, "flags": " ".join(FLAGS), "built_by": f"compose2sif {version} package build",
                "helpers": helpers}
    with open(os.path.join(target_dir, "manifest.json"), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2, sort_keys=True)
        fh.write("\n")


class BuildPyWithHelpers(build_py):
    """build_py, then the helpers: into the build (a wheel), or beside the sources (`pip install -e`)."""

    def run(self):
        super().run()
        target = os.path.join(HERE, HELPERS_DIR) if self.editable_mode else \
            os.path.join(self.build_lib, HELPERS_DIR)
        build_helpers(target, self.distribution.get_version())

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not self.editable_mode:
            helpers = os.path.join(self.build_lib, HELPERS_DIR)
            outputs += [os.path.join(helpers, arch, name) for arch, names in HELPERS.items() for name in names]
            outputs.append(os.path.join(helpers, "manifest.json"))
        return outputs


def platform_tag() -> str:
    """The wheel's platform: the building machine's architecture (Linux). The helpers are static and
    link nothing, so any glibc (manylinux2014: RHEL 7's 2.17 and later) or musl system takes them."""
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    if machine in HELPERS:
        return f"manylinux_2_17_{machine}.manylinux2014_{machine}.musllinux_1_1_{machine}"
    return f"linux_{machine}"


class PlatformWheel(bdist_wheel):
    """Tagged py3-none-PLATFORM, not `any`: the wheel carries executables (no Python extension:
    any Python 3 takes it)."""

    def get_tag(self):
        return "py3", "none", platform_tag()


setup(cmdclass={"build_py": BuildPyWithHelpers, "bdist_wheel": PlatformWheel})
