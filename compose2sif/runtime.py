"""Stage 5: the container runtime. Finds apptainer or singularity and drives the generated run.sh,
which is the one implementation of build/up/down/ps/logs/exec (the same one a user runs by hand
on a cluster without Python)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import List, Optional, Tuple

from compose2sif.errors import ComposeError


def detect() -> Optional[Tuple[str, str]]:
    """(binary, version) of the runtime on PATH, apptainer first; None when there is none."""
    for name in (os.environ.get("C2S_RUNTIME"), "apptainer", "singularity"):
        if name and shutil.which(name):
            try:
                line = subprocess.run([name, "--version"], capture_output=True, text=True, timeout=30).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            match = re.search(r"version\s+(\S+)", line)
            return name, match.group(1) if match else line.strip()
    return None


def run_script(out_dir: str, args: List[str]) -> int:
    """Run ``out_dir/run.sh ARGS`` with the caller's terminal and environment."""
    script = os.path.join(out_dir, "run.sh")
    if not os.path.isfile(script):
        raise ComposeError(f"{script} does not exist: run `compose2sif convert` first")
    try:
        return subprocess.call([script, *args])
    except KeyboardInterrupt:
        return 130
