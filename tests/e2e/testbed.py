"""The end-to-end test bed as Python objects, for the tests and for bench/: provision it, serve
its registry, and run commands as the unprivileged user `hpc` on its node."""
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def provision(timeout: float = 3000) -> Dict[str, str]:
    """Build (or find cached) the test bed; raises RuntimeError with the reason when it cannot."""
    proc = subprocess.run([str(HERE / "provision.sh")], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"provision.sh failed: {proc.stderr.strip()[-2000:]}")
    return dict(line.split("=", 1) for line in proc.stdout.strip().splitlines() if "=" in line)


@contextmanager
def registry(info: Dict[str, str]):
    """The local registry serving the test images, for the duration of the block."""
    server = subprocess.Popen(["docker-registry", "serve", info["REGISTRY_CONFIG"]],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if subprocess.run(["curl", "-fs", f"http://127.0.0.1:{info['REGISTRY_PORT']}/v2/"],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("the local registry did not start")
        yield
    finally:
        server.terminate()
        server.wait(timeout=10)


class Node:
    """Runs commands as `hpc` on the test bed's node (the repository is at /work there)."""

    def __init__(self, root: Path, registry_port: str, uid: str, mode: str = "rootless"):
        self.root = root
        self.mode = mode  # rootless | setuid (SETUID_NODE of provision.sh; hpc has no user namespaces there)
        self.uid = uid  # hpc's uid, on the node and (shared process table) on the host
        self.home = root / "home" / "hpc"
        self.scratch = root / "scratch" / "hpc"
        self.registry = f"127.0.0.1:{registry_port}"

    def run(self, command: str, timeout: float = 600, hide_python: bool = False, check: bool = False):
        env = dict(os.environ, C2S_HIDE_PYTHON="1" if hide_python else "0",
                   C2S_BLOCK_USERNS="1" if self.mode == "setuid" else "0")
        script = f"export APPTAINER_NOHTTPS=1 PYTHONPATH=/work PYTHONDONTWRITEBYTECODE=1; {command}"
        proc = subprocess.run([str(HERE / "enter.sh"), str(self.root), str(REPO), "bash", "-c", script],
                              capture_output=True, text=True, timeout=timeout, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(f"`{command}` failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def c2s(self, args: str, **kw):
        return self.run(f"cd ~ && python3 -m compose2sif {args}", **kw)

    def copy_stack(self, name: str, source: str = "stack") -> Path:
        target = self.home / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(HERE / source, target)
        if (target / "models").is_dir():  # the stack serves a model: write the tiny one
            subprocess.run([sys.executable, str(HERE / "tiny_model.py"), str(target / "models" / "tiny.gguf")],
                           check=True)
        subprocess.run(["chown", "-R", f"{self.uid}:{self.uid}", str(target)], check=True)
        return target

    def processes(self):
        """Command lines of every process of user hpc."""
        out = subprocess.run(["ps", "-u", self.uid, "-o", "pid=,args="], capture_output=True, text=True).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def kill_all(self) -> None:
        """Leftovers of an earlier run: every process of hpc (never a host account: see provision.sh)."""
        subprocess.run(["pkill", "-9", "-u", self.uid], capture_output=True)
