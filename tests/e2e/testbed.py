"""The end-to-end test bed as Python objects, for the tests and for bench/: take it for this run,
provision it, serve its registry, and run commands as the unprivileged user `hpc` on its node."""
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BASE = Path(os.environ.get("C2S_TESTBED", "/var/cache/compose2sif-testbed"))  # as provision.sh has it
# what every command as hpc on a node starts with: compose2sif is the one pip installed in ~/c2s-venv
# (install_compose2sif), never the repository at /work
NODE_ENV = 'export APPTAINER_NOHTTPS=1 PYTHONDONTWRITEBYTECODE=1 PATH="$HOME/c2s-venv/bin:$PATH";'


@contextmanager
def taken(tell: Callable[[str], None] = print):
    """The test bed for this run alone, for the duration of the block: one node, one user `hpc`
    whose processes a run kills, one registry port, so a second run waits here until the first
    is done (tell says so, naming the holder)."""
    BASE.mkdir(parents=True, exist_ok=True)
    path = BASE / "in-use.lock"
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            tell(f"waiting for the end-to-end test bed: in use by {lock.read().strip() or 'another run'} ({path})")
            started = time.monotonic()
            fcntl.flock(lock, fcntl.LOCK_EX)
            tell(f"took the end-to-end test bed after {time.monotonic() - started:.0f} s")
        lock.seek(0)
        lock.truncate()
        command = " ".join(Path("/proc/self/cmdline").read_bytes().decode(errors="replace").split())
        lock.write(f"pid {os.getpid()} since {time.strftime('%H:%M:%S')}: {command[:200]}\n")
        lock.flush()
        yield


def provision(timeout: float = 3000) -> Dict[str, str]:
    """Build (or find cached) the test bed; raises RuntimeError with the reason when it cannot."""
    proc = subprocess.run([str(HERE / "provision.sh")], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"provision.sh failed: {proc.stderr.strip()[-2000:]}")
    return dict(line.split("=", 1) for line in proc.stdout.strip().splitlines() if "=" in line)


@contextmanager
def registry(info: Dict[str, str]):
    """The local registry serving the test images, for the duration of the block."""
    url = f"http://127.0.0.1:{info['REGISTRY_PORT']}/v2/"
    answers = lambda: subprocess.run(["curl", "-fs", url], capture_output=True).returncode == 0  # noqa: E731
    if answers():
        raise RuntimeError(f"{url} answers before our registry starts: a registry left by an earlier run? "
                           "(stop it: it may serve other images)")
    log = tempfile.TemporaryFile()
    server = subprocess.Popen(["docker-registry", "serve", info["REGISTRY_CONFIG"]], stdout=log, stderr=log)
    try:
        for _ in range(50):
            if server.poll() is not None or answers():
                break
            time.sleep(0.2)
        if server.poll() is not None or not answers():
            log.seek(0)
            said = " | ".join(log.read().decode(errors="replace").strip().splitlines()[-3:])
            raise RuntimeError(f"the local registry did not start ({url}): {said or 'no answer in 10 s'}")
        yield
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def install_compose2sif(home: Path, uid: str, wheel: Path, run: Callable[[str], object]) -> None:
    """Installs WHEEL into HOME/c2s-venv on a node (NODE_ENV puts it first on PATH), by RUN as hpc."""
    wheels = home / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    shutil.copy(wheel, wheels)
    subprocess.run(["chown", "-R", f"{uid}:{uid}", str(wheels)], check=True)
    run(f"rm -rf ~/c2s-venv && /usr/bin/python3 -m venv --system-site-packages ~/c2s-venv && "
        f"~/c2s-venv/bin/python3 -m pip install -q --no-index --disable-pip-version-check ~/wheels/{wheel.name}")


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
        script = f"{NODE_ENV} {command}"
        proc = subprocess.run([str(HERE / "enter.sh"), str(self.root), str(REPO), "bash", "-c", script],
                              capture_output=True, text=True, timeout=timeout, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(f"`{command}` failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def c2s(self, args: str, **kw):
        return self.run(f"cd ~ && python3 -m compose2sif {args}", **kw)

    def install_compose2sif(self, wheel: Path) -> None:
        """compose2sif as a user installs it on a login node that has Python and pip and no C
        compiler: a venv of the node's python3 (which sees its PyYAML and requests), then pip
        install of the wheel this run built (conftest.py), from a file, no index."""
        install_compose2sif(self.home, self.uid, wheel, lambda command: self.run(command, timeout=300, check=True))

    def copy_stack(self, name: str, source: str = "stack") -> Path:
        target = self.home / name
        if target.exists() or target.is_symlink():
            try:
                shutil.rmtree(target)
            except OSError as exc:  # say why, and what may hold it
                left = "; ".join(self.processes()[:5]) or "none"
                raise RuntimeError(f"cannot remove the previous copy of {name} ({exc}); processes of hpc now: "
                                   f"{left}") from exc
        shutil.copytree(HERE / source, target)
        if (target / "models").is_dir():  # the stack serves a model: write the tiny one
            subprocess.run([sys.executable, str(HERE / "tiny_model.py"), str(target / "models" / "tiny.gguf")],
                           check=True)
        subprocess.run(["chown", "-R", f"{self.uid}:{self.uid}", str(target)], check=True)
        return target

    def processes(self):
        """Command lines of every process of user hpc, whole (-ww: not cut at a terminal's width)."""
        out = subprocess.run(["ps", "-u", self.uid, "-ww", "-o", "pid=,args="], capture_output=True, text=True).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def kill_all(self) -> None:
        """Leftovers of an earlier run: every process of hpc (never a host account: see provision.sh)."""
        subprocess.run(["pkill", "-9", "-u", self.uid], capture_output=True)


# A DNS query for an A record of argv[1] to Docker's DNS (127.0.0.11:53), run inside a service (its
# tracer sends it to the project's DNS server): prints the addresses found, or the answer's rcode.
DNS_QUERY = """
import socket, struct, sys
q = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0) + bytes([len(sys.argv[1])]) + sys.argv[1].encode() + b"\\0\\0\\1\\0\\1"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(10)
s.sendto(q, ("127.0.0.11", 53))
r = s.recv(4096)
at, found = len(q), []
for _ in range(struct.unpack(">H", r[6:8])[0]):
    found.append(socket.inet_ntoa(r[at + 12:at + 16]))
    at += 16
print(" ".join(sorted(found)) or "rcode %d" % (r[3] & 15))
"""
