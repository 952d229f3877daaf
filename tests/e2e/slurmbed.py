"""A real Slurm on the test bed: Debian's slurmctld, two slurmd and munge, all in provision.sh's Slurm
node (its root filesystem, entered with slurm_enter.sh). Each slurmd is a fake node: a network
namespace of its own (joined to the other by a veth pair) and a host name of its own; slurmctld and
munged run on the first. Jobs run as `hpc`, with the node's apptainer."""
import shutil
import subprocess
import time
from pathlib import Path
from typing import List, Optional

from testbed import HERE, REPO

# (Slurm node name, network namespace, address): as slurm.conf in provision.sh has them
NODES = [("c2s-slurm0", "c2s-sl0", "10.251.0.1"), ("c2s-slurm1", "c2s-sl1", "10.251.0.2")]


def _sh(*args, check=True):
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


class SlurmCluster:
    def __init__(self, root: Path, uid: str, registry_port: str):
        self.root = root
        self.uid = uid
        self.home = root / "home" / "hpc"
        self.registry = f"127.0.0.1:{registry_port}"
        self.daemons: List[subprocess.Popen] = []

    def argv(self, command: str, rank: Optional[int] = 0, user: str = "hpc") -> List[str]:
        """COMMAND as USER on fake node RANK (None: the host's network, where the registry is)."""
        enter = [str(HERE / "slurm_enter.sh"), str(self.root), str(REPO), user, command]
        if rank is None:
            return enter
        host, ns, _ = NODES[rank]
        return ["ip", "netns", "exec", ns, "unshare", "--uts", "--", "sh", "-c", 'hostname "$1" && shift && exec "$@"',
                "-", host, *enter]

    def run(self, command: str, rank: Optional[int] = 0, user: str = "hpc", timeout: float = 600,
            check: bool = False) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.argv(command, rank, user), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"`{command}` failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def _daemon(self, rank: int, command: str) -> None:
        log = open(self.root / "var" / "log" / "slurm" / f"{command.split()[0].rsplit('/', 1)[-1]}-{rank}.out", "w")
        self.daemons.append(subprocess.Popen(self.argv(command, rank, "root"), stdout=log, stderr=subprocess.STDOUT))
        log.close()

    def start(self) -> None:
        self.stop()
        for _, ns, _ in NODES:
            _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", "c2s-sl-a", "type", "veth", "peer", "name", "c2s-sl-b")
        for (_, ns, addr), end in zip(NODES, ("c2s-sl-a", "c2s-sl-b")):
            _sh("ip", "link", "set", end, "netns", ns)
            _sh("ip", "-n", ns, "link", "set", end, "name", "eth0")
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        # a fresh cluster each session: no state, job ids from 1
        for path in ("run/munge", "run/slurm", "var/spool/slurmd", "var/spool/slurmctld", "var/lib/munge",
                     "var/log/munge"):
            shutil.rmtree(self.root / path, ignore_errors=True)
        setup = ("mkdir -p /run/munge /var/lib/munge /var/log/munge /run/slurm /var/spool/slurmctld "
                 "/var/spool/slurmd/c2s-slurm0 /var/spool/slurmd/c2s-slurm1 /var/log/slurm && "
                 "chown munge:munge /run/munge /var/lib/munge /var/log/munge && chmod 0755 /run/munge")
        self.run(setup, rank=None, user="root", check=True)
        self._daemon(0, "exec runuser -u munge -- /usr/sbin/munged --foreground")
        self._daemon(0, "exec /usr/sbin/slurmctld -D")
        for rank in range(len(NODES)):
            self._daemon(rank, "exec /usr/sbin/slurmd -D")
        deadline = time.time() + 90
        while True:
            states = self.run("sinfo -h -N -o '%N %T'", timeout=30).stdout.split()
            if states.count("idle") == len(NODES):
                return
            if time.time() > deadline or any(d.poll() is not None for d in self.daemons):
                raise RuntimeError(f"the Slurm test cluster did not come up: sinfo says {' '.join(states) or 'nothing'}"
                                   f"; {self.logs()}")
            time.sleep(2)

    def processes(self, user: Optional[str] = None) -> str:
        """`ps` lines of the processes in the fake nodes' network namespaces (of USER's uid only)."""
        pids = [p for _, ns, _ in NODES for p in _sh("ip", "netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            return ""
        argv = ["ps", "-o", "pid,user:12,args", "--no-headers", "-p", ",".join(pids)]
        lines = _sh(*argv, check=False).stdout.splitlines()
        return "\n".join(line for line in lines if user is None or line.split()[1] in (user, self.uid))

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                         for p in sorted((self.root / "var" / "log" / "slurm").glob("*")) if p.is_file())

    def stop(self) -> None:
        for daemon in self.daemons:
            daemon.terminate()
        for daemon in self.daemons:
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
        self.daemons = []
        for _, ns, _ in NODES:  # whatever is left in the fake nodes (job steps, a job's leftovers)
            pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
            if pids:
                _sh("kill", "-9", *pids, check=False)
            _sh("ip", "netns", "del", ns, check=False)
