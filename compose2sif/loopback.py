"""The per-service virtual loopback (intercept/loopback*.c, loopback.h lists the files), for the output
directory's bin/.

run.sh binds it into every instance and starts each service's entry under it (run/lib/isolation.sh,
docs/interception.md), so it must run inside any image: one static binary, built where compose2sif
runs with ``intercept/build.sh`` (1-2 s; convert writes nothing outside its output directory, so
nothing is cached elsewhere); a binary built beforehand as ``compose2sif/intercept/c2s-loopback``
is used when it is newer than every one of its source files. Without a C
compiler and a static C library, convert says so in one warning and run.sh keeps to the plan-time
knobs (``port isolation: plan-time knobs only``).
"""
from __future__ import annotations

import glob
import os
import subprocess
from typing import List, Optional

from compose2sif import static_binary

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "intercept")
SOURCES = sorted(glob.glob(os.path.join(HERE, "loopback*.[ch]")))  # what build.sh compiles, and the headers
BUILD = os.path.join(HERE, "build.sh")
PREBUILT = os.path.join(HERE, "c2s-loopback")
OUTPUT = "bin/c2s-loopback"
MISSING = ("services cannot get a loopback of their own at run time: bin/c2s-loopback could not be built here "
           "(it needs `cc` and a static C library, glibc-static on RHEL, on x86_64 Linux); run.sh uses the "
           "plan-time port knobs only. Convert again where they are to have it")


def build(output: str) -> bool:
    """Compile the tracer into ``output`` (static; nothing else runs inside every image)."""
    try:
        done = subprocess.run(["sh", BUILD, output], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=180)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and os.path.isfile(output)


def fresh() -> bool:
    """Whether a tracer built beforehand is there, and built from the sources as they are now."""
    return static_binary.fresh(PREBUILT, SOURCES)


_compiled: List[Optional[bytes]] = []  # built (or found unbuildable) once per process


def binary() -> Optional[bytes]:
    """The tracer's bytes, or None where it is neither built nor buildable here."""
    return static_binary.binary(PREBUILT, SOURCES, build, _compiled)
