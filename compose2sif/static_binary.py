"""The static helper binaries convert puts in the output directory's bin/ (the published-port
forwarder, the per-service loopback): each taken from a copy built beforehand beside its source
when that copy is newer than every file it is built from, else compiled once per process into a temporary
directory (convert writes nothing outside its output directory)."""
from __future__ import annotations

import os
import tempfile
from typing import Callable, List, Optional, Sequence, Union

Sources = Union[str, Sequence[str]]  # the one source file, or every file the binary is built from


def fresh(prebuilt: str, sources: Sources) -> bool:
    """Whether a binary built beforehand is there, and built from its sources as they are now."""
    paths = [sources] if isinstance(sources, str) else sources
    return os.path.isfile(prebuilt) and all(os.path.getmtime(prebuilt) >= os.path.getmtime(path) for path in paths)


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def binary(prebuilt: str, sources: Sources, build: Callable[[str], bool],
           compiled: List[Optional[bytes]]) -> Optional[bytes]:
    """The binary's bytes, or None where it is neither built nor buildable here. COMPILED keeps
    this process's one compile (or its failure)."""
    if fresh(prebuilt, sources):
        return _read(prebuilt)
    if not compiled:
        with tempfile.TemporaryDirectory(prefix="c2s-build-") as tmp:
            output = os.path.join(tmp, os.path.basename(prebuilt))
            compiled.append(_read(output) if build(output) else None)
    return compiled[0]
