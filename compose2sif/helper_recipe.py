"""What the package build (setup.py) compiles into compose2sif/helpers/, and from which files: shared
by setup.py, which loads this file on its own (standard library only, no compose2sif import), and
the tests, which check that the installed helpers were built from the sources as they are now."""
import glob
import hashlib
import os

INTERCEPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "intercept")


def _sources(pattern: str):
    return sorted(glob.glob(os.path.join(INTERCEPT, pattern)))


# helper -> (the .c files compiled, every file its bytes depend on)
SOURCES = {
    "c2s-forward": (_sources("forward.c"), _sources("forward.c")),
    "c2s-loopback": (_sources("loopback*.c"), _sources("loopback*.[ch]")),
}
# architecture -> the helpers built for it. c2s-loopback reads and writes x86_64's registers only
# (loopback.h); aarch64 gets the forwarder.
HELPERS = {
    "x86_64": ["c2s-forward", "c2s-loopback"],
    "aarch64": ["c2s-forward"],
}
# zig cc, for TARGET-linux-musl: static, stripped (the same bytes wherever the sources lie)
FLAGS = ["-static", "-O2", "-s", "-Wall", "-Wextra", "-Werror"]


def source_digest(name: str) -> str:
    """sha256 over the files helper NAME is built from (names and bytes), as the manifest keeps it."""
    digest = hashlib.sha256()
    for path in SOURCES[name][1]:
        digest.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as fh:
            digest.update(fh.read() + b"\0")
    return digest.hexdigest()
