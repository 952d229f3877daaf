"""The forwarder of published ports (intercept/forward.c), for the output directory's bin/.

It runs on the node, beside the service (run/lib/forward.sh), where nothing but bash and the
runtime may be installed: so it is one static binary that travels in the output directory, built
where compose2sif runs. A binary built beforehand (``compose2sif/intercept/build.sh`` style:
``cc -static -O2 -o compose2sif/intercept/c2s-forward compose2sif/intercept/forward.c``) is used
when it is newer than the source; else it is compiled now with $CC or cc. docs/ports.md says why.
"""
from __future__ import annotations

import os
import subprocess
from typing import List, Optional

from compose2sif import static_binary

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "intercept")
SOURCE = os.path.join(HERE, "forward.c")
PREBUILT = os.path.join(HERE, "c2s-forward")
OUTPUT = "bin/c2s-forward"
MISSING = ("published ports on another port number need the forwarder bin/c2s-forward, and no C compiler is "
           "here to build it: convert again where `cc` is (a login node), or build it once with "
           f"`cc -static -O2 -o {PREBUILT} {SOURCE}`; until then `up` fails those services")


def build(output: str) -> bool:
    """Compile the forwarder into ``output``: static where the C library allows, else dynamic
    (then it runs on nodes with the same C library, which a cluster's nodes share)."""
    compiler = os.environ.get("CC") or "cc"
    for static in (["-static"], []):
        try:
            done = subprocess.run([compiler, *static, "-O2", "-o", output, SOURCE],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return False
        if done.returncode == 0:
            return True
    return False


def fresh() -> bool:
    """Whether a forwarder built beforehand is there, and built from the source as it is now."""
    return static_binary.fresh(PREBUILT, SOURCE)


_compiled: List[Optional[bytes]] = []  # built (or found unbuildable) once per process


def binary() -> Optional[bytes]:
    """The forwarder's bytes, or None where it is neither built nor buildable here."""
    return static_binary.binary(PREBUILT, SOURCE, build, _compiled)
