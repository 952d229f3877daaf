"""Faults and races on the test bed (issue 38), for tests/e2e/test_faults.py.

FaultRun: SIGKILL at a moment drawn by a seeded random.Random, of one of
  up       `run.sh up -d` starting the stack from `down` (its whole process group)
  down     `run.sh down` of the running stack (its whole process group)
  restart  `run.sh restart` of every service (its whole process group)
  supervisor  the supervisor's process group, a moment after a service with a restart policy was
           killed (so that it may be in the middle of that restart)
  service  every process of a service (its instance's init's descendants); `up -d` follows a moment
           later (racing the supervisor's restart)
  c2s-up   `compose2sif up -d` (convert, build, `run.sh up -d`) from `down` (its whole process group);
           the same command again then recovers (issue 38's first measurement: 2 of 6 recovered)
then `up -d`, which must bring every service back healthy (recovered: the time from its start to
every service healthy), with the counter that a service keeps in a named volume never lower than
last seen. Every few rounds and at the end, `down` must leave no process of the user, no instance,
no FUSE mount. One line per round, a summary at the end.

OneImageRun: twelve services of one image started together from no SIF, ROUNDS times: `build`,
`up -d` (no error line; every service healthy; every file under state/ whole), `down -v`.
"""
import json
import os
import random
import re
import signal
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict, List, Optional

TARGETS = ("up", "down", "restart", "supervisor", "service", "c2s-up")
# the window a moment is drawn from, in seconds after the start of what is killed (measured here,
# 2 CPUs shared: `up -d` from `down` took 6-9 s, `down` 1-2 s, `restart` of the stack 7-10 s)
WINDOW = {"up": (0.05, 9.0), "down": (0.02, 2.5), "restart": (0.05, 10.0), "supervisor": (0.0, 2.5),
          "service": (0.0, 1.5), "c2s-up": (0.15, 10.0)}
# what the recovering `up -d` says it found left (run/lib/state.sh: clean_stale, tell_stale)
FOUND = {"records of killed services": "ended without `down`", "half-started instances": "started by a run.sh that",
         "lost root filesystems": "its root filesystem is gone", "a dead supervisor": "has gone without `down`"}
HEALTHY_WITHIN = 120  # s: after `up -d` returned, every service healthy by then, or the round failed


class RoundFailed(AssertionError):
    pass


def descendants(pid: int) -> List[int]:
    """Every live descendant of process PID (the host's /proc: the node shares its pid namespace)."""
    children: Dict[int, List[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            rest = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if rest[0] != "Z":
            children.setdefault(int(rest[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Stack:
    """A converted and built project in the home of `hpc` on NODE, and its run.sh."""

    def __init__(self, node, out: str, project: str, files: str = "", options: str = ""):
        self.node, self.out, self.project = node, out, project
        self.dir = node.home / out
        # `compose2sif -p PROJECT FILES up -d OPTIONS` converts, builds and starts it
        self.files, self.options = files, options

    def c2s_up(self) -> str:
        return f"python3 -m compose2sif -p {self.project} {self.files} up -d {self.options} -o {self.out}"

    def sh(self, args: str, timeout: float = 600):
        return self.node.run(f"cd ~ && {self.out}/run.sh {args}", timeout=timeout)

    def ps(self) -> Dict[str, dict]:
        proc = self.sh("ps --format json", timeout=120)
        if proc.returncode != 0:
            raise RoundFailed(f"`ps --format json` failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return {s["service"]: s for s in json.loads(proc.stdout)}

    def instances(self) -> Dict[str, int]:
        out = self.node.run("apptainer instance list --json", timeout=60, check=True).stdout
        return {i["instance"]: i["pid"] for i in json.loads(out)["instances"]}

    def wait_healthy(self, services: Dict[str, bool], within: float = HEALTHY_WITHIN) -> Dict[str, dict]:
        """Until every service in SERVICES runs, healthy where True; the last `ps` (raises after WITHIN s)."""
        deadline = time.monotonic() + within
        while True:
            state = self.ps()
            if all(name in state and state[name]["state"] == "running"
                   and (not health or state[name]["health"] == "healthy") for name, health in services.items()):
                return state
            if time.monotonic() > deadline:
                rows = {n: (s["state"], s["health"]) for n, s in state.items()}
                raise RoundFailed(f"not every service healthy {within:.0f} s after `up -d`: {rows}")
            time.sleep(0.2)

    def processes(self) -> List[str]:
        return [p for p in self.node.processes() if "<defunct>" not in p and not re.search(r"\bps -u\b", p)]

    def nothing_left(self) -> None:
        """After `down`: no process of the user, no instance, no FUSE mount (the host's mounts, and
        the node's as a fresh command there sees them)."""
        for _ in range(50):
            left = self.processes()
            if not left:
                break
            time.sleep(0.2)
        if left:
            raise RoundFailed(f"processes of hpc left after `down`: {left[:8]}")
        instances = self.instances()
        if instances:
            raise RoundFailed(f"instances left after `down`: {instances}")
        mounts = [line for line in Path("/proc/mounts").read_text().splitlines()
                  if re.search(r"fuse|squashfuse", line) or f"/{self.out}/" in line]
        if mounts:
            raise RoundFailed(f"mounts left after `down`: {mounts[:5]}")
        seen = self.node.run(f"grep -c -e fuse -e '/{self.out}/' /proc/self/mountinfo", timeout=60).stdout.strip()
        if seen != "0":
            raise RoundFailed(f"{seen} mounts of FUSE or of the stack on the node after `down`")

    def stray_partials(self) -> List[str]:
        """Files beside a state file under a name of its writer's own (NAME.PID) that a kill left."""
        run = self.dir / "state" / "run"
        return sorted(p.name for p in run.iterdir() if re.search(r"\.[0-9]+(\.tmp)?$", p.name)) if run.is_dir() else []


class FaultRun:
    """ROUNDS rounds under SEED on STACK (compose.yaml of tests/e2e/faults-stack), told through SAY."""

    SERVICES = {"db": True, "cache": False, "counter": True, "web": True}  # name: has a healthcheck
    RESTARTING = ("cache", "counter", "web")  # restart: always / unless-stopped
    PUBLISHED = "http://127.0.0.1:18190/health"  # web's port 8000, published on 18190 (a forwarder)

    def __init__(self, stack: Stack, rounds: int, seed: int, say: Callable[[str], None] = print,
                 down_every: int = 5, keep_going: bool = False):
        self.stack, self.rounds, self.seed, self.say = stack, rounds, seed, say
        self.down_every, self.keep_going = down_every, keep_going
        self.rng = random.Random(seed)
        self.counter = 0
        self.results: List[dict] = []
        self.failures: List[str] = []
        self.is_up = False
        self.found: List[str] = []

    # ---- the pieces of a round ----
    def read_counter(self) -> int:
        path = self.stack.dir / "state" / "volumes" / "counts" / "counter"
        text = path.read_text()
        try:
            return int(text)
        except ValueError:
            raise RoundFailed(f"the counter file holds {text!r}: not a whole number") from None

    def check_counter(self) -> int:
        value = self.read_counter()
        if value < self.counter:
            raise RoundFailed(f"the counter went back: {value} after {self.counter}")
        self.counter = value
        return value

    def supervisors(self) -> List[str]:
        """The sessions of this project's supervisors (a supervisor's own forks share its session)."""
        out = subprocess.run(["ps", "-u", self.stack.node.uid, "-ww", "-o", "sid=,args="], capture_output=True,
                             text=True).stdout
        return sorted({line.split()[0] for line in out.splitlines() if f"{self.stack.out}/run.sh _supervise" in line})

    def up(self, how: str = "run.sh") -> float:
        """`up -d` (of run.sh, or of compose2sif), then every service healthy: the seconds that took."""
        started = time.monotonic()
        if how == "compose2sif":
            proc = self.stack.node.run(f"cd ~ && {self.stack.c2s_up()}", timeout=900)
        else:
            proc = self.stack.sh("up -d", timeout=600)
        if proc.returncode != 0:
            raise RoundFailed(f"`{how} up -d` failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        self.found = [tag for tag, words in FOUND.items() if words in proc.stderr]
        self.stack.wait_healthy(self.SERVICES)
        took = time.monotonic() - started
        self.is_up = True
        sups = self.supervisors()
        if len(sups) != 1:
            raise RoundFailed(f"{len(sups)} supervisors after `up -d`: {sups}")
        try:
            with urllib.request.urlopen(self.PUBLISHED, timeout=10) as response:
                if response.status != 200:
                    raise RoundFailed(f"{self.PUBLISHED} answered {response.status}")
        except OSError as exc:
            raise RoundFailed(f"{self.PUBLISHED} (web's published port) does not answer: {exc}") from None
        return took

    def down(self) -> None:
        proc = self.stack.sh("down", timeout=600)
        if proc.returncode != 0:
            raise RoundFailed(f"`down` failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        self.is_up = False
        self.stack.nothing_left()

    def killed_verb(self, verb: str, moment: float, command: str = "") -> str:
        """run.sh VERB (or COMMAND) in a session of its own, SIGKILLed (its process group) MOMENT s after
        its start: what it last said by then, or how it had ended."""
        log = f"fault-{verb.split()[0]}.log"
        command = command or f"{self.stack.out}/run.sh {verb}"
        script = (f"cd ~ || exit 1; setsid {command} </dev/null >{log} 2>&1 & pid=$!; "
                  f"sleep {moment:.3f}; read -r st </proc/$pid/stat; st=${{st##*) }}; "
                  f"said=$(tail -n 1 {log}); kill -KILL -- -$pid 2>/dev/null; wait $pid; rc=$?; "
                  f"echo \"state=${{st%% *}} rc=$rc\"; echo \"$said\"")
        proc = self.stack.node.run(script, timeout=600)
        first, _, said = proc.stdout.partition("\n")
        said = said.strip().replace(f"[{self.stack.project}] ", "")
        if "state=Z" in first:
            return f"after it ended ({first.split()[-1]})"
        return f"at: {said[:90] or '(nothing said yet)'}"

    def kill_service(self, name: str) -> int:
        """SIGKILL to every process of service NAME (its instance's init's descendants): how many."""
        ipid = self.stack.instances().get(f"{self.stack.project}-{name}")
        if ipid is None:
            raise RoundFailed(f"{name} has no instance to kill")
        pids = descendants(ipid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def play(self, target: str, moment: float) -> str:
        """Bring the stack where TARGET is killed, kill it at MOMENT: what was hit."""
        if target in ("up", "c2s-up"):
            if self.is_up:
                self.down()
            if target == "c2s-up":
                return self.killed_verb("c2s-up", moment, self.stack.c2s_up())
            return self.killed_verb("up -d", moment)
        if not self.is_up:
            self.up()
        self.check_counter()
        if target in ("down", "restart"):
            return self.killed_verb(target, moment)
        victim = self.rng.choice(self.RESTARTING if target == "supervisor" else tuple(self.SERVICES))
        n = self.kill_service(victim)
        time.sleep(moment)
        if target == "service":
            return f"{victim} ({n} processes), `up -d` {moment:.2f} s later"
        record = (self.stack.dir / "state" / "run" / "supervisor.pid").read_text().split()
        log = self.stack.dir / "state" / "logs" / "supervisor.log"
        said = (log.read_text().strip().splitlines() or ["(nothing said yet)"])[-1]
        said = said.replace(f"[{self.stack.project}] ", "")
        try:
            os.killpg(int(record[0]), signal.SIGKILL)
        except ProcessLookupError:
            return f"{victim} killed; supervisor already gone"
        return f"{victim} killed, then at: {said[:70]}"

    # ---- the run ----
    def targets(self) -> List[str]:
        """Every target once in the first len(TARGETS) rounds (shuffled), then drawn at random."""
        first = list(TARGETS)
        self.rng.shuffle(first)
        return [first[i] if i < len(first) else self.rng.choice(TARGETS) for i in range(self.rounds)]

    def run(self) -> None:
        self.say(f"fault injection: {self.rounds} rounds, seed {self.seed}, `down` every {self.down_every} rounds")
        took = self.up()
        self.say(f"  start: up -d from nothing, healthy in {took:.1f} s, counter {self.check_counter()}")
        for number, target in enumerate(self.targets(), 1):
            low, high = WINDOW[target]
            moment = round(self.rng.uniform(low, high), 2)
            started = time.monotonic()
            try:
                hit = self.play(target, moment)
                took = self.up("compose2sif" if target == "c2s-up" else "run.sh")
                value = self.check_counter()
                partials = self.stack.stray_partials()
                checked = ""
                if number % self.down_every == 0 or number == self.rounds:
                    self.down()
                    checked = "; down: nothing left"
                found = f" (found {', '.join(self.found)})" if self.found else ""
                line = (f"round {number:3d}  {target:10s} {moment:5.2f} s  {hit}  ->  recovered in {took:5.1f} s"
                        f"{found}, counter {value}{checked}")
                if partials:
                    line += f"  (partial files left by kills: {' '.join(partials)})"
                self.say(line)
                self.results.append(dict(round=number, target=target, moment=moment, hit=hit, recovered=took,
                                         counter=value, found=self.found, round_s=time.monotonic() - started))
            except (RoundFailed, subprocess.TimeoutExpired) as exc:
                message = f"round {number:3d}  {target:10s} {moment:5.2f} s  FAILED: {exc}"
                self.say(message)
                self.say(self.diagnosis())
                self.failures.append(message)
                if not self.keep_going:
                    raise RoundFailed(message + "\n" + self.diagnosis()) from None
                self.reset()
        self.summary()

    def reset(self) -> None:
        """After a failed round (keep_going): everything of the user killed, state as after a reboot."""
        self.stack.node.kill_all()
        time.sleep(1)
        self.stack.sh("down", timeout=600)
        self.is_up = False

    def diagnosis(self) -> str:
        parts = []
        for name in ("fault-up.log", "fault-down.log", "fault-restart.log", "fault-c2s-up.log"):
            path = self.stack.node.home / name
            if path.exists():
                parts.append(f"--- ~/{name}:\n" + "\n".join(path.read_text().splitlines()[-15:]))
        log = self.stack.dir / "state" / "logs" / "supervisor.log"
        if log.exists():
            parts.append("--- supervisor.log:\n" + "\n".join(log.read_text().splitlines()[-15:]))
        parts.append("--- processes of hpc:\n" + "\n".join(p[:200] for p in self.stack.processes()[:30]))
        run = self.stack.dir / "state" / "run"
        if run.is_dir():
            statuses = {p.stem: p.read_text().strip() for p in run.glob("*.status")}
            parts.append(f"--- statuses: {statuses}")
        return "\n".join(parts)

    def summary(self) -> None:
        times = [r["recovered"] for r in self.results]
        hits: Dict[str, int] = {}
        for r in self.results:
            hits[r["target"]] = hits.get(r["target"], 0) + 1
        found: Dict[str, int] = {}
        for r in self.results:
            for tag in r["found"]:
                found[tag] = found.get(tag, 0) + 1
        self.say(f"summary: {self.rounds} rounds (seed {self.seed}): {len(self.results)} recovered, "
                 f"{len(self.failures)} failed; targets {hits}; the recovering `up -d` found {found or 'nothing'}")
        if times:
            self.say(f"  recovery (up -d until every service healthy): median {statistics.median(times):.1f} s, "
                     f"max {max(times):.1f} s, min {min(times):.1f} s; counter {self.counter}")


# ---- twelve services of one image (OneImageRun) ---------------------------------------------------

# A line of `build`, `up -d` or `down -v` that is not one of its notes, or a note that says
# something went wrong (`mv: cannot stat ...` of two writers of one temporary file, among others).
BAD_WORDS = re.compile(r"cannot|No such file|failed|error|\bmv:|\brm:|\bcp:|unbound variable|syntax", re.I)


class OneImageRun:
    """ROUNDS rounds of twelve services of one image (tests/e2e/faults-stack/one-image.yaml)."""

    def __init__(self, stack: Stack, rounds: int, say: Callable[[str], None] = print, cache: Optional[str] = None):
        self.stack, self.rounds, self.say, self.cache = stack, rounds, say, cache
        self.names = [f"s{i:02d}" for i in range(1, 13)]
        self.results: List[dict] = []

    def bad_lines(self, verb: str, proc) -> List[str]:
        prefix = f"[{self.stack.project}] "
        return [f"{verb}: {line}" for line in (proc.stdout + proc.stderr).splitlines()
                if line.strip() and (not line.startswith(prefix) or BAD_WORDS.search(line))]

    def startscript(self) -> str:
        """The start script the definition gives (what RUNDIR/KEY.startscript and KEY.entry hold)."""
        text = (self.stack.dir / "definitions" / "c2s-python-test.def").read_text()
        return "#!/bin/sh\n\n" + text.split("%startscript\n", 1)[1]

    def whole_state(self) -> List[str]:
        """What is not whole under state/ (volumes, overlays and logs aside: the services' own)."""
        state = self.stack.dir / "state"
        bad = []
        script = self.startscript()
        for path in sorted(state.rglob("*")):
            rel = path.relative_to(state)
            if rel.parts[0] in ("volumes", "overlay", "logs", "services", "anonymous", "pre_start") \
                    or path.is_symlink() or not path.is_file():
                continue
            name = path.name
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                bad.append(f"{rel}: unreadable ({exc})")
                continue
            lines = text.splitlines()
            if re.search(r"\.[0-9]+(\.tmp)?$", name):
                bad.append(f"{rel}: a writer's partial file left behind")
            elif name.endswith(".dirs"):  # the image's directories, each ended by a NUL
                if not (text.endswith("\0") and all(d.startswith("/") for d in text[:-1].split("\0"))):
                    bad.append(f"{rel}: not a whole directory list: ...{text[-60:]!r}")
            elif text and not text.endswith("\n"):
                bad.append(f"{rel}: its last line is cut ({text[-40:]!r})")
            elif name.endswith(".status") and not (len(lines) == 1 and re.fullmatch(
                    r"starting|started|healthy|completed \d+|failed .+", lines[0])):
                bad.append(f"{rel}: not a status: {text[:80]!r}")
            elif name.endswith(".timeline") and not all(re.fullmatch(r"\d+\.\d+ \w+", x) for x in lines):
                bad.append(f"{rel}: not a timeline: {text[:120]!r}")
            elif name.endswith(".helpers") and not (len(lines) == 1 and re.fullmatch(r"\d+ \d+( \d+)* ?", lines[0])):
                bad.append(f"{rel}: not a helpers record: {text[:80]!r}")
            elif name.endswith(".health") and not (len(lines) == 1 and re.fullmatch(r"\d+ \d+ \w+.*", lines[0])):
                bad.append(f"{rel}: not a health record: {text[:80]!r}")
            elif name.endswith((".startscript", ".entry")) and text != script:
                bad.append(f"{rel}: not the definition's start script: {text[:120]!r}")
            elif name == "supervisor.pid" and not re.fullmatch(r"\d+ \d+\n", text):
                bad.append(f"{rel}: not a pid record: {text!r}")
            elif name == "hosts" and not all(f" {n}" in text for n in self.names):
                bad.append(f"{rel}: a service's name is missing")
        return bad

    def run(self) -> None:
        self.say(f"twelve services of one image: {self.rounds} rounds, each from no SIF"
                 f"{' (round 1 from an empty SIF cache: a pull)' if self.cache else ''}")
        env = f"C2S_SIF_CACHE={self.cache} " if self.cache else ""
        for number in range(1, self.rounds + 1):
            if number == 1 and self.cache:
                self.stack.node.run(f"rm -rf {self.cache}", timeout=120, check=True)
            self.stack.node.run(f"cd ~ && rm -rf {self.stack.out}/sif", timeout=120, check=True)
            started = time.monotonic()
            build = self.stack.node.run(f"cd ~ && {env}{self.stack.out}/run.sh build", timeout=1500)
            built = time.monotonic() - started
            assert build.returncode == 0, "\n".join(self.bad_lines("build", build)) + "\n" + build.stderr[-3000:]
            started = time.monotonic()
            up = self.stack.node.run(f"cd ~ && {env}{self.stack.out}/run.sh up -d", timeout=900)
            bad = self.bad_lines("build", build) + self.bad_lines("up", up)
            assert up.returncode == 0, f"round {number}: `up -d` failed ({up.returncode}); its lines that are not " \
                "notes, or that say something went wrong:\n" + "\n".join(bad)
            self.stack.wait_healthy({n: True for n in self.names})
            healthy = time.monotonic() - started
            bad += self.whole_state()
            down = self.stack.sh("down -v", timeout=600)
            assert down.returncode == 0, down.stderr
            bad += self.bad_lines("down", down) + self.whole_state()
            self.stack.nothing_left()
            self.say(f"round {number:2d}: build {built:5.1f} s, up -d until 12 healthy {healthy:5.1f} s: "
                     f"{'no error line, every state file whole' if not bad else 'FOUND: ' + '; '.join(bad[:5])}")
            self.results.append(dict(round=number, build=built, healthy=healthy, bad=bad))
            assert bad == [], "\n".join(bad)
        times = [r["healthy"] for r in self.results]
        self.say(f"summary: {self.rounds} rounds, none with an error line or a state file not whole; "
                 f"up -d until healthy: median {statistics.median(times):.1f} s, max {max(times):.1f} s")
