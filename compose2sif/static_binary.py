"""The static helper binaries convert puts in the output directory's bin/ (the published-port
forwarder, the per-service loopback): each taken from a copy built beforehand beside its source
when that copy is newer than the source, else compiled once per process into a temporary
directory (convert writes nothing outside its output directory)."""
from __future__ import annotations

import os
import tempfile
from typing import Callable, List, Optional


def fresh(prebuilt: str, source: str) -> bool:
    """Whether a binary built beforehand is there, and built from the source as it is now."""
    return os.path.isfile(prebuilt) and os.path.getmtime(prebuilt) >= os.path.getmtime(source)


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def binary(prebuilt: str, source: str, build: Callable[[str], bool], compiled: List[Optional[bytes]]) -> Optional[bytes]:
    """The binary's bytes, or None where it is neither built nor buildable here. COMPILED keeps
    this process's one compile (or its failure)."""
    if fresh(prebuilt, source):
        return _read(prebuilt)
    if not compiled:
        with tempfile.TemporaryDirectory(prefix="c2s-build-") as tmp:
            output = os.path.join(tmp, os.path.basename(prebuilt))
            compiled.append(_read(output) if build(output) else None)
    return compiled[0]
