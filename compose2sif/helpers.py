"""The static helpers convert puts into the output's bin/, one directory per architecture:
bin/ARCH/c2s-forward (published ports on another number, run/lib/forward.sh, docs/ports.md) and
bin/ARCH/c2s-loopback (a loopback per service, run/lib/isolation.sh, docs/interception.md).

They run on the node, inside any image, where there may be no compiler: so they are built when the
package is built (setup.py: zig's C compiler from PyPI, static against musl, one build per
architecture), and shipped in it as compose2sif/helpers/ARCH/NAME with manifest.json. Nothing is
compiled here. run.sh picks the directory of the node's architecture; where the package has no
c2s-forward for it, the node's python3 runs bin/c2s-forward.py instead, and where it has no
c2s-loopback, run.sh keeps to the plan-time knobs (each said in one line, by `up` and `doctor`).
bin/helpers.json lists what was put there: version, sha256 and toolchain of each.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, NamedTuple, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGED = os.path.join(HERE, "helpers")  # ARCH/NAME and manifest.json, written by the package build
FALLBACK_FORWARDER = os.path.join(HERE, "c2s-forward.py")
FORWARD, LOOPBACK = "c2s-forward", "c2s-loopback"
OUTPUT_MANIFEST = "bin/helpers.json"
OUTPUT_FALLBACK = "bin/c2s-forward.py"
MISSING = ("this compose2sif carries no built helpers ({manifest} is missing: it was not installed by pip, "
           "whose package build compiles them): published ports on another number and a loopback per "
           "service will not work; install it with `python3 -m pip install .` (or `-e .` in a checkout)")


class Helper(NamedTuple):
    arch: str
    name: str
    version: str
    sha256: str
    path: str  # the binary in the package

    @property
    def output(self) -> str:
        """Its path in the output directory."""
        return f"bin/{self.arch}/{self.name}"


class Manifest(NamedTuple):
    toolchain: str
    built_by: str
    helpers: List[Helper]


def manifest() -> Optional[Manifest]:
    """What the package build put into compose2sif/helpers/, or None where nothing was built (a
    source tree not installed by pip). Read at each call: convert keeps nothing between calls."""
    try:
        with open(os.path.join(PACKAGED, "manifest.json"), encoding="utf-8") as fh:
            data = json.load(fh)
        helpers = [Helper(h["arch"], h["name"], h["version"], h["sha256"], os.path.join(PACKAGED, h["arch"], h["name"]))
                   for h in data["helpers"]]
        return Manifest(data["toolchain"], data["built_by"], [h for h in helpers if os.path.isfile(h.path)])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def missing_line() -> str:
    return MISSING.format(manifest=os.path.join(PACKAGED, "manifest.json"))


def has(name: str) -> bool:
    """Whether the package carries NAME for some architecture."""
    found = manifest()
    return found is not None and any(h.name == name for h in found.helpers)


def files(forwarder: bool) -> Dict[str, bytes]:
    """The output's bin/ files: each helper (the forwarder and its Python fallback only where
    FORWARDER: a port is published on another number) and bin/helpers.json."""
    found = manifest()
    if found is None:
        return {}
    chosen = [h for h in found.helpers if forwarder or h.name != FORWARD]
    out = {}
    for helper in chosen:
        with open(helper.path, "rb") as fh:
            out[helper.output] = fh.read()
    if forwarder:
        with open(FALLBACK_FORWARDER, "rb") as fh:
            out[OUTPUT_FALLBACK] = fh.read()
    listing = {"toolchain": found.toolchain, "built_by": found.built_by,
               "helpers": [{"arch": h.arch, "name": h.name, "version": h.version, "sha256": h.sha256}
                           for h in chosen]}
    out[OUTPUT_MANIFEST] = (json.dumps(listing, indent=2, sort_keys=True) + "\n").encode()
    return out
