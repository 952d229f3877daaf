"""The end-to-end test bed: a real rootless Apptainer, as the unprivileged user `hpc` on a Debian
sid root filesystem (see provision.sh), with images served by a local registry.

Outside CI, without root, these tests are skipped with one line saying why. With CI=true a
missing test bed is a failure, never a skip."""
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CI = bool(os.environ.get("CI"))


class Node:
    """Runs commands as `hpc` on the test bed's node (the repository is at /work there)."""

    def __init__(self, root: Path, registry_port: str):
        self.root = root
        self.home = root / "home" / "hpc"
        self.registry = f"127.0.0.1:{registry_port}"

    def run(self, command: str, timeout: float = 600, hide_python: bool = False, check: bool = False):
        env = dict(os.environ, C2S_HIDE_PYTHON="1" if hide_python else "0")
        script = f"export APPTAINER_NOHTTPS=1 PYTHONPATH=/work PYTHONDONTWRITEBYTECODE=1; {command}"
        proc = subprocess.run([str(HERE / "enter.sh"), str(self.root), str(REPO), "bash", "-c", script],
                              capture_output=True, text=True, timeout=timeout, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(f"`{command}` failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def c2s(self, args: str, **kw):
        return self.run(f"cd ~ && python3 -m compose2sif {args}", **kw)

    def copy_stack(self, name: str) -> Path:
        target = self.home / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(HERE / "stack", target)
        subprocess.run([sys.executable, str(HERE / "tiny_model.py"), str(target / "models" / "tiny.gguf")], check=True)
        subprocess.run(["chown", "-R", "1000:1000", str(target)], check=True)
        return target

    def processes(self):
        """Command lines of every process of user hpc (uid 1000)."""
        out = subprocess.run(["ps", "-u", "1000", "-o", "pid=,args="], capture_output=True, text=True).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]


def _unavailable(reason: str):
    if CI:
        pytest.fail(f"end-to-end test bed unavailable in CI: {reason}")
    pytest.skip(f"end-to-end tests need the Apptainer test bed: {reason}")


@pytest.fixture(scope="session")
def node():
    if os.geteuid() != 0:
        _unavailable("run as root (it debootstraps a node and enters it with pivot_root)")
    proc = subprocess.run([str(HERE / "provision.sh")], capture_output=True, text=True, timeout=3000)
    if proc.returncode != 0:
        _unavailable(f"provision.sh failed: {proc.stderr.strip()[-2000:]}")
    info = dict(line.split("=", 1) for line in proc.stdout.strip().splitlines() if "=" in line)
    registry = subprocess.Popen(["docker-registry", "serve", info["REGISTRY_CONFIG"]],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if subprocess.run(["curl", "-fs", f"http://127.0.0.1:{info['REGISTRY_PORT']}/v2/"],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        else:
            _unavailable("the local registry did not start")
        the_node = Node(Path(info["NODE"]), info["REGISTRY_PORT"])
        subprocess.run(["pkill", "-9", "-u", "1000"], capture_output=True)  # leftovers of an earlier run
        yield the_node
        subprocess.run(["pkill", "-9", "-u", "1000"], capture_output=True)
    finally:
        registry.terminate()
        registry.wait(timeout=10)


def q(text: str) -> str:
    return shlex.quote(text)
