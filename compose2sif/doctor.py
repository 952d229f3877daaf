"""`compose2sif doctor`: what on this node would stop the project, one line each: ok, warn or fail,
with the fix. Reads the node (runtime and its features, namespaces, fuse, disk and quota where
SIFs and caches go) and, when there is one, the output directory's plan.json (its endpoints and
GPUs) and run.sh (where it keeps SIFs)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Dict, List, Optional, Tuple

from compose2sif import runtime
from compose2sif.plan.network import node_listeners, overlaps

Line = Tuple[str, str]  # (ok | warn | fail, text)
GIB = 1024 ** 3
QUOTA_TIMEOUT = 10  # seconds: a hung file system must not hang doctor


def _version_tuple(version: str) -> Tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version)[:3])


def runtime_lines() -> List[Line]:
    found = runtime.detect()
    if found is None:
        return [("fail", "no apptainer or singularity on PATH (fix: module load apptainer, or install Apptainer >= 1.1)")]
    name, version = found
    lines: List[Line] = [("ok", f"runtime: {name} {version} ({shutil.which(name)})")]
    flavour = "apptainer" if "apptainer" in os.path.basename(name) else "singularity"
    real = os.path.realpath(shutil.which(name) or name)
    starter = os.path.join(os.path.dirname(real), "..", "libexec", flavour, "bin", "starter-suid")
    if os.path.exists(starter) and os.stat(starter).st_mode & 0o4000:
        lines.append(("ok", "mode: setuid install (directory overlays are refused to users: the root stays "
                            "writable through --writable-tmpfs, in memory)"))
    else:
        try:
            with open("/proc/sys/user/max_user_namespaces", encoding="ascii") as fh:
                allowed = int(fh.read().strip() or 0)
        except (OSError, ValueError):
            allowed = -1
        if allowed == 0:
            lines.append(("fail", "mode: unprivileged, but user namespaces are off (user.max_user_namespaces=0; "
                                  "fix: ask the admins to enable them or install Apptainer setuid)"))
        else:
            lines.append(("ok", "mode: unprivileged (user namespaces)"))
    user = _user()
    if any(line.split(":")[0] == user for line in _read_lines("/etc/subuid")):
        lines.append(("ok", f"fakeroot: {user} has a subordinate uid range in /etc/subuid"))
    else:
        lines.append(("warn", f"fakeroot: {user} has no range in /etc/subuid; builds with RUN steps use the "
                              "root-mapped-user fakeroot, where some package installs fail (fix: ask the admins "
                              f"for a subuid/subgid range, or build elsewhere and copy the SIF)"))
    for tool, why in (("squashfuse", "SIFs are mounted without the setuid helper"),
                      ("fuse-overlayfs", "a writable root on disk (else --writable-tmpfs, in memory)")):
        if shutil.which(tool):
            lines.append(("ok", f"{tool}: {shutil.which(tool)}"))
        else:
            lines.append(("warn", f"{tool} not found: needed for {why} (fix: module load or install {tool})"))
    if os.access("/dev/fuse", os.R_OK | os.W_OK):
        lines.append(("ok", "/dev/fuse is usable"))
    else:
        lines.append(("warn", "/dev/fuse is missing or not usable: FUSE mounts (squashfuse, fuse-overlayfs) fail"))
    listing = subprocess.run([name, "instance", "list", "--json"], capture_output=True, text=True, timeout=60)
    if listing.returncode == 0:
        lines.append(("ok", f"instances: `{name} instance list` works"))
    else:
        lines.append(("fail", f"instances: `{name} instance list` failed: {(listing.stderr.strip() or '?').splitlines()[-1]}"))
    return lines


# What the generated run.sh asks of the runtime beyond instances themselves, and the Apptainer
# release that brought each to unprivileged users (its CHANGELOG, v1.1.0).
FEATURES = (("--no-eval", "compose values reach the services as written, not evaluated once more"),
            ("a writable root without setuid", "--writable-tmpfs and directory overlays through fuse-overlayfs "
                                               "or a kernel >= 5.11"),
            ("--fakeroot without /etc/subuid", "builds with RUN steps in a root-mapped user namespace"))


def feature_lines(name: str, version: str, plan: Optional[dict]) -> List[Line]:
    """The instance features of this runtime version that the planned project uses."""
    builds = plan is None or any(i.get("kind") == "build" for i in (plan.get("images") or {}).values())
    wanted = [f for f in FEATURES if builds or not f[0].startswith("--fakeroot")]
    flavour = "apptainer" if "apptainer" in os.path.basename(name) else "singularity"
    if flavour == "apptainer" and _version_tuple(version) >= (1, 1):
        return [("ok", f"features of {name} {version} used here: {', '.join(f[0] for f in wanted)} (Apptainer >= 1.1)")]
    lines: List[Line] = []
    for feature, why in wanted:
        if feature == "--no-eval" and flavour == "singularity":
            text = subprocess.run([name, "exec", "--help"], capture_output=True, text=True, timeout=60).stdout
            if "--no-eval" in text:
                lines.append(("ok", f"features of {name} {version}: --no-eval"))
                continue
        fix = {"--no-eval": "values go through the escaped env files instead"}.get(feature, "a setuid install has it")
        lines.append(("warn", f"{name} {version} lacks {feature}, which Apptainer >= 1.1 has: {why} ({fix}; "
                              "fix: module load a newer apptainer)"))
    return lines


def _places(out_dir: Optional[str]) -> Tuple[List[Tuple[str, str, str]], Optional[str]]:
    """(what, path, why) of the SIF cache, the runtime's cache and its build space: as the project's
    run.sh chooses them (`run.sh _storage`, which records the choice); without a project, what the
    environment sets. Second: an error line of run.sh, if it failed."""
    script = os.path.join(out_dir, "run.sh") if out_dir else None
    if script and os.path.isfile(script):
        try:
            proc = subprocess.run([script, "_storage"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            return [], f"{script} _storage: {exc}"
        if proc.returncode != 0:
            return [], (proc.stderr.strip() or "?").splitlines()[-1]
        rows = [line.split("\t") for line in proc.stdout.splitlines()]
        why = next((r[2] for r in rows if r[0] == "storage" and len(r) == 3), "")
        return [(r[0], r[1], r[2] or why) for r in rows if len(r) == 3 and r[0] != "storage"], None
    env = os.environ
    places = [("build tmp", env.get("APPTAINER_TMPDIR") or env.get("TMPDIR") or "/tmp", "the runtime's build space")]
    if env.get("APPTAINER_CACHEDIR"):
        places.insert(0, ("build cache", env["APPTAINER_CACHEDIR"], "set by APPTAINER_CACHEDIR"))
    if env.get("C2S_SIF_CACHE"):
        places.insert(0, ("SIF cache", env["C2S_SIF_CACHE"], "set by C2S_SIF_CACHE"))
    elif env.get("C2S_STORAGE"):
        places.insert(0, ("SIF cache", os.path.join(env["C2S_STORAGE"], "sif"), "set by C2S_STORAGE"))
    return places, None


def storage_lines(home: str, out_dir: Optional[str] = None) -> List[Line]:
    places, error = _places(out_dir)
    if error:
        return [("fail", f"storage: where SIFs go could not be read: {error}")]
    lines: List[Line] = []
    if not any(p[0] == "SIF cache" for p in places):
        lines.append(("ok", "storage: SIFs and build caches go where a project's first build chooses: C2S_STORAGE, "
                            "else $SCRATCH, $WORK, /scratch/$USER, /work/[GROUP/]$USER, /data/GROUP/$USER, else "
                            "its output directory (never ~/.cache)"))
    for what, path, why in places:
        existing = path
        while not os.path.exists(existing):
            existing = os.path.dirname(existing) or "/"
        free = shutil.disk_usage(existing).free
        text = f"{what}: {path} ({why}), {free / GIB:.1f} GiB free, {quota_text(existing)}"
        level = "ok"
        if free < 2 * GIB:
            level, text = "fail", text + " (a SIF needs more: point it elsewhere)"
        elif free < 20 * GIB:
            level, text = "warn", text + " (large images such as vLLM take 10-20 GiB)"
        if os.path.realpath(path).startswith(os.path.realpath(home) + os.sep):
            level = "fail" if level == "fail" else "warn"
            var = {"SIF cache": "C2S_STORAGE", "build cache": "APPTAINER_CACHEDIR"}.get(what, "APPTAINER_TMPDIR")
            text += f"; it is in your home directory, where quotas are small (fix: export {var}=/scratch/...)"
        lines.append((level, text))
    return lines


def _mount(path: str) -> Tuple[str, str, str]:
    """(mount point, source, type) of the file system PATH is on."""
    real, best = os.path.realpath(path), ("/", "", "")
    for line in _read_lines("/proc/self/mounts"):
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
            best = (point, fields[0], fields[2])
    return best


def quota_text(path: str) -> str:
    """The user's quota on PATH's file system, as `lfs quota` (Lustre), `mmlsquota` (GPFS) or `quota`
    tells; each asked with a timeout (a hung file system must not hang doctor)."""
    point, source, fstype = _mount(path)
    user = _user()
    tries = []
    if fstype == "lustre":
        tries.append((["lfs", "quota", "-h", "-u", user, point], 0))
    if fstype == "gpfs":
        tries.append((["mmlsquota", "-u", user, "--block-size", "auto"], 2))  # Filesystem Fileset type blocks ...
    tries.append((["quota", "-s"], 0))
    for argv, skip in tries:
        if not shutil.which(argv[0]):
            continue
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=QUOTA_TIMEOUT).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        tokens = out.split()
        for name in (point, source, os.path.basename(source)):
            if name and name in tokens:
                used, soft, hard = (tokens[tokens.index(name) + 1 + skip:] + ["?"] * 3)[:3]
                limit = hard if hard.rstrip("kKMGTPB*") not in ("0", "") else soft
                if limit.rstrip("kKMGTPB*") in ("0", ""):
                    return f"quota: {used.rstrip('*')} used, no limit ({argv[0]})"
                return f"quota: {used.rstrip('*')} used of {limit} ({argv[0]})"
        if argv[0] == "quota" and fstype not in ("lustre", "gpfs") and out.rstrip().endswith(": none"):
            return "quota: none (quota)"
    return "quota: unknown"


def plan_lines(out_dir: str) -> List[Line]:
    try:
        with open(os.path.join(out_dir, "plan.json"), encoding="utf-8") as fh:
            plan = json.load(fh)
    except (OSError, ValueError):
        return [("warn", f"no plan.json in {out_dir}: endpoints not checked (run `compose2sif convert` first)")]
    lines: List[Line] = []
    listening = node_listeners()
    instances = None  # pid -> name of the user's instances, read when a port is taken
    for service in plan.get("services", []):
        for port in service.get("ports", []):
            endpoint = (port["address"], port["host"])
            shown = f"{port['address']}:{port['host']}"
            if port["address"] in ("0.0.0.0", "::"):
                lines.append(("warn", f"service {service['name']} would listen on all interfaces ({shown}): anyone "
                                      "who reaches this node reaches it (fix: publish it on 127.0.0.1 in the compose file)"))
            taken = sorted(held for held in listening if overlaps(held, endpoint))
            if taken:
                holder, pid = _holder(endpoint)
                instances = _instances() if instances is None else instances
                if pid is not None and _instance_of(pid, instances) == service.get("instance"):
                    lines.append(("ok", f"service {service['name']}: {shown} is served by its own running "
                                        f"instance {service['instance']}"))
                    continue
                lines.append(("fail", f"service {service['name']}: {shown} is taken ({holder}; fix: "
                                      f"stop that, or convert again to move the port)"))
            else:
                lines.append(("ok", f"service {service['name']}: {shown} is free"))
    if any(s.get("nv") for s in plan.get("services", [])):
        smi = shutil.which("nvidia-smi")
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60) if smi else None
        if proc is not None and proc.returncode == 0 and proc.stdout.strip():
            lines.append(("ok", f"GPUs: {len(proc.stdout.strip().splitlines())} visible to nvidia-smi"))
        else:
            lines.append(("fail", "GPUs are requested but nvidia-smi finds none (fix: run on a GPU node, or "
                                  "module load the CUDA driver tools)"))
    return lines


def _holder(endpoint: Tuple[str, int]) -> Tuple[str, Optional[int]]:
    """Who listens where a client of ENDPOINT would land, as `ss -ltnp` tells (it names only the
    user's own processes): a text, and the pid where ss names one."""
    if shutil.which("ss"):
        out = subprocess.run(["ss", "-Hltnp", f"sport = :{endpoint[1]}"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            fields = line.split()
            local = fields[3] if len(fields) > 3 else ""
            address = local.rsplit(":", 1)[0].strip("[]").replace("*", "0.0.0.0")
            match = re.search(r'users:\(\("([^"]+)",pid=(\d+)', line)
            if match and overlaps((address, endpoint[1]), endpoint):
                return f"held by {match.group(1)}, pid {match.group(2)}", int(match.group(2))
    return "held by another user's process, or one ss cannot name", None


def _instances() -> Dict[int, str]:
    """The user's instances: the pid of each one's init, and its name."""
    found = runtime.detect()
    if found is None:
        return {}
    try:
        listing = subprocess.run([found[0], "instance", "list", "--json"], capture_output=True, text=True, timeout=60)
        entries = json.loads(listing.stdout or "{}").get("instances") or []
    except (OSError, ValueError, AttributeError, subprocess.TimeoutExpired):
        return {}
    return {int(e["pid"]): str(e["instance"]) for e in entries if isinstance(e, dict) and "pid" in e and "instance" in e}


def _instance_of(pid: int, instances: Dict[int, str]) -> Optional[str]:
    """The instance process PID runs in: the first of its ancestors that is an instance's init."""
    for _ in range(64):
        if pid in instances:
            return instances[pid]
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 1:
            return None
    return None


def _read_lines(path: str) -> List[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()
    except OSError:
        return []


def _user() -> str:
    import pwd
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _plan(out_dir: Optional[str]) -> Optional[dict]:
    try:
        with open(os.path.join(out_dir or "", "plan.json"), encoding="utf-8") as fh:
            plan = json.load(fh)
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) else None


def report(out_dir: Optional[str]) -> List[Line]:
    lines = runtime_lines()
    found = runtime.detect()
    if found is not None:
        lines += feature_lines(*found, _plan(out_dir))
    lines += storage_lines(os.path.expanduser("~"), out_dir)
    if out_dir:
        lines += plan_lines(out_dir)
    return lines
