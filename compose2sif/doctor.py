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
from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

from compose2sif import runtime
from compose2sif.plan.network import node_listeners, overlaps

Line = Tuple[str, str]  # (ok | warn | fail, text)
GIB = 1024 ** 3
QUOTA_TIMEOUT = 10  # seconds: a hung file system must not hang doctor


def _version_tuple(version: str) -> Tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version)[:3])


@dataclass
class RuntimeMode:
    """How the runtime runs containers for this user, as it says itself (`buildcfg` and its config
    file), never guessed from where its binary lies (Debian puts libexec under /usr/lib/TRIPLET)."""
    mode: str                 # setuid | unprivileged | root
    flavour: str              # apptainer | singularity (SingularityCE, Singularity 3.x)
    why: str                  # what decided it, for the report
    config_path: str          # apptainer.conf / singularity.conf
    config: Dict[str, str]    # its settings, keys lower case (the last of a repeated key wins)


def read_config(path: str) -> Dict[str, str]:
    """`key = value` lines of apptainer.conf / singularity.conf, keys lower case."""
    settings: Dict[str, str] = {}
    for line in _read_lines(path):
        key, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#"):
            settings[" ".join(key.lower().split())] = value.strip()
    return settings


def runtime_mode(binary: str, uid: Optional[int] = None) -> RuntimeMode:
    """Apptainer >= 1.0 prints APPTAINER_SUID_INSTALL, LIBEXECDIR and SYSCONFDIR in `buildcfg`;
    SingularityCE and Singularity 3.x print SINGULARITY_SUID_INSTALL (`singularity` may also be
    Apptainer's compatibility link: the keys, not the name, say which). The install is setuid when
    it was built so, its starter-suid is root-owned and setuid, and `allow setuid` is not `no`."""
    try:
        out = subprocess.run([binary, "buildcfg"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    cfg = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    flavour = "apptainer" if "APPTAINER_SUID_INSTALL" in cfg else "singularity"
    config_path = os.path.join(cfg.get("SYSCONFDIR", "/etc"), flavour, f"{flavour}.conf")
    config = read_config(config_path)
    suid_key = f"{flavour.upper()}_SUID_INSTALL"
    starter = os.path.join(cfg.get("LIBEXECDIR", "/usr/libexec"), flavour, "bin", "starter-suid")
    if (os.getuid() if uid is None else uid) == 0:
        return RuntimeMode("root", flavour, "you are root", config_path, config)
    if cfg.get(suid_key) != "1":
        why = f"`{binary} buildcfg` says {suid_key}={cfg.get(suid_key, '?')}"
        return RuntimeMode("unprivileged", flavour, why, config_path, config)
    try:
        info = os.stat(starter)
        starter_ok = info.st_uid == 0 and bool(info.st_mode & 0o4000)
    except OSError:
        starter_ok = False
    if not starter_ok:
        return RuntimeMode("unprivileged", flavour, f"{starter} is not root-owned setuid", config_path, config)
    if config.get("allow setuid", "yes").lower() == "no":
        return RuntimeMode("unprivileged", flavour, f"`allow setuid = no` in {config_path}", config_path, config)
    return RuntimeMode("setuid", flavour, f"{suid_key}=1, {starter} setuid root, allow setuid = "
                                 f"{config.get('allow setuid', 'yes')} in {config_path}", config_path, config)


def user_namespaces() -> Tuple[bool, str]:
    """Whether this user can make a user namespace: tried (`unshare --user`), as sysctls, seccomp
    filters and distribution switches all decide it; else user.max_user_namespaces."""
    if shutil.which("unshare"):
        try:
            proc = subprocess.run(["unshare", "--user", "true"], capture_output=True, text=True, timeout=30)
            if proc.returncode == 0:
                return True, "`unshare --user` works"
            return False, f"`unshare --user` fails: {(proc.stderr.strip() or '?').splitlines()[-1]}"
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        with open("/proc/sys/user/max_user_namespaces", encoding="ascii") as fh:
            allowed = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return True, "user.max_user_namespaces unreadable"
    return allowed > 0, f"user.max_user_namespaces={allowed}"


def sessiondir_line(mode: RuntimeMode) -> Line:
    # when the key is absent, the built-in default: 64 MiB in Apptainer, 16 MiB in Singularity 3.x
    size = mode.config.get("sessiondir max size", "64" if mode.flavour == "apptainer" else "16")
    raise_it = ("only the admins can raise it (the config must be root-owned)" if mode.mode == "setuid" else
                "a service that writes more gets a directory overlay on disk, or `--config` with a larger value")
    return ("ok", f"session directory: --writable-tmpfs is held in memory, at most {size} MiB (sessiondir max "
                  f"size in {mode.config_path}); {raise_it}")


def runtime_lines() -> List[Line]:
    found = runtime.detect()
    if found is None:
        return [("fail", "no apptainer or singularity on PATH (fix: module load apptainer, or install Apptainer >= 1.1)")]
    name, version = found
    lines: List[Line] = [("ok", f"runtime: {name} {version} ({shutil.which(name)})")]
    mode = runtime_mode(name)
    userns, userns_why = user_namespaces()
    user = _user()
    subuid = any(line.split(":")[0] == user for line in _read_lines("/etc/subuid"))
    if mode.mode == "unprivileged" and not userns:
        lines.append(("fail", f"mode: unprivileged ({mode.why}), but user namespaces are off ({userns_why}; fix: "
                              "ask the admins to enable them or to install Apptainer setuid)"))
    else:
        lines.append(("ok", f"mode: {mode.mode} ({mode.why})"))
    # a definition file: Apptainer >= 1.1 builds it with fakeroot for a non-root user, which needs
    # a user namespace (a subuid range, or the root-mapped one); images from a registry need none
    if mode.mode == "root":
        lines.append(("ok", "definition files (Dockerfile builds, curated definitions) build here: you are root"))
    elif not userns:
        lines.append(("warn", f"definition files (Dockerfile builds, curated definitions) cannot be built here: "
                              f"fakeroot needs a user namespace ({userns_why}); registry images build from "
                              "docker:// (fix: build those SIFs on a machine with user namespaces or root and copy "
                              "them to the path `up` names, or use --remote where the site has a build service)"))
    elif subuid:
        lines.append(("ok", f"definition files build here with fakeroot ({user} has a range in /etc/subuid)"))
    else:
        lines.append(("warn", f"definition files build here with the root-mapped fakeroot ({user} has no range in "
                              "/etc/subuid), where some package installs fail (fix: ask the admins for a "
                              "subuid/subgid range, or build elsewhere and copy the SIF)"))
    if mode.mode == "setuid" and mode.flavour == "apptainer":  # run.sh's writable root (run/lib/runtime.sh)
        lines.append(("ok", "writable root: a directory overlay on disk, mounted by the setuid starter with the "
                            "kernel's overlayfs, holding user-owned copies of the image's directories"))
    else:
        lines.append(sessiondir_line(mode))
    if mode.mode == "setuid":
        # the starter mounts SIFs and overlays with the kernel; squashfuse only where the admins
        # keep the kernel's squashfs mount from users (Apptainer >= 1.2: allow setuid-mount squashfs)
        squashfs = mode.config.get("allow setuid-mount squashfs", "")
        limited = any(mode.config.get(k, "NULL").upper() != "NULL" for k in
                      ("limit container owners", "limit container groups", "limit container paths"))
        fuse_tools = ([("squashfuse", "SIFs are mounted with squashfuse (allow setuid-mount squashfs = "
                                      f"{squashfs})")]
                      if squashfs == "no" or (squashfs == "iflimited" and not limited) else [])
        if mode.config.get("enable overlay", "yes").lower() == "no":
            lines.append(("warn", f"`enable overlay = no` in {mode.config_path}: no writable root (--writable-tmpfs); "
                                  "images that write outside their volumes fail (fix: ask the admins for "
                                  "`enable overlay = try`)"))
    elif mode.mode == "root":
        fuse_tools = []  # root mounts with the kernel
    else:
        fuse_tools = [("squashfuse", "SIFs are mounted without the setuid helper (else each start extracts the "
                                     "image to a temporary directory)"),
                      ("fuse-overlayfs", "a writable root on disk (else --writable-tmpfs, in memory)")]
    for tool, why in fuse_tools:
        if shutil.which(tool):
            lines.append(("ok", f"{tool}: {shutil.which(tool)}"))
        else:
            lines.append(("warn", f"{tool} not found: needed for {why} (fix: module load or install {tool})"))
    if fuse_tools:
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


FALLBACK_PLAN = "fallback/plan.json"  # the plan-time knobs' plan, beside the plan as written (plan.json)


def node_addresses() -> List[str]:
    """Where run.sh serves a port published on all interfaces: 127.0.0.1, ::1, and the node's IPv4
    addresses (its local routes; run/lib/endpoints.sh's node_addresses)."""
    found = ["127.0.0.1"]
    try:
        with open("/proc/net/fib_trie", encoding="ascii") as fh:
            previous = ""
            for line in fh:
                line = line.strip()
                if line.startswith("|-- "):
                    previous = line[4:]
                elif line == "/32 host LOCAL" and not previous.startswith("127.") and previous not in found:
                    found.append(previous)
    except OSError:
        pass
    return found + ["::1"] if os.path.exists("/proc/net/if_inet6") else found


def plan_lines(out_dir: str, fallback: bool = False) -> List[Line]:
    """Each planned endpoint: free, served by its own service or forwarder, or taken (by whom).
    ``fallback``: the plan-time knobs' plan, where `up` falls back to it here."""
    try:
        with open(os.path.join(out_dir, "plan.json"), encoding="utf-8") as fh:
            plan = json.load(fh)
    except (OSError, ValueError):
        return [("warn", f"no plan.json in {out_dir}: endpoints not checked (run `compose2sif convert` first)")]
    if fallback and plan.get("fallback"):
        plan = _plan(out_dir, FALLBACK_PLAN) or plan
    written = bool(plan.get("isolation"))  # as written: every port on the service's own address
    lines: List[Line] = []
    listening = node_listeners()
    instances = None  # pid -> name of the user's instances, read when a port is taken
    rundir = os.path.join(out_dir, str(plan.get("state_dir", "state")), "run")
    for service in plan.get("services", []):
        forwarders = _forwarder_pids(os.path.join(rundir, f"{service['name']}.forward"))
        for port in service.get("ports", []):
            endpoint = (port["address"], port["host"])
            shown = f"{port['address']}:{port['host']}"
            if port["address"] in ("0.0.0.0", "::"):
                lines.append(("warn", f"service {service['name']} would listen on all interfaces ({shown}): anyone "
                                      "who reaches this node reaches it (fix: publish it on 127.0.0.1 in the compose file)"))
            checks = [(endpoint, shown)]
            if port.get("forward"):  # published through a forwarder: its endpoint too
                address, number = port["forward"].rsplit(":", 1)
                if written and address in ("0.0.0.0", "::"):  # served on each address of the node, one by one
                    checks += [((a, int(number)), f"published {a}:{number}") for a in node_addresses()]
                else:
                    checks.append(((address, int(number)), f"published {port['forward']}"))
            for point, text in checks:
                taken = sorted(held for held in listening if overlaps(held, point))
                if not taken:
                    lines.append(("ok", f"service {service['name']}: {text} is free"))
                    continue
                holder, pid = _holder(point)
                instances = _instances() if instances is None else instances
                if pid is not None and pid in forwarders:
                    lines.append(("ok", f"service {service['name']}: {text} is served by its forwarder (pid {pid})"))
                elif pid is not None and _instance_of(pid, instances) == service.get("instance"):
                    lines.append(("ok", f"service {service['name']}: {text} is served by its own running "
                                        f"instance {service['instance']}"))
                else:
                    lines.append(("fail", f"service {service['name']}: {text} is taken ({holder}; fix: "
                                          f"stop that, or change that port in the compose file and convert again)"))
        # what `up` found it really listens on, where the plan says otherwise (run.sh's record_truth)
        for truth in _read_lines(os.path.join(rundir, f"{service['name']}.truth")):
            lines.append(("warn", f"service {service['name']} at run time: {truth}"))
    if any(s.get("nv") for s in plan.get("services", [])):
        smi = shutil.which("nvidia-smi")
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60) if smi else None
        if proc is not None and proc.returncode == 0 and proc.stdout.strip():
            lines.append(("ok", f"GPUs: {len(proc.stdout.strip().splitlines())} visible to nvidia-smi"))
        else:
            lines.append(("fail", "GPUs are requested but nvidia-smi finds none (fix: run on a GPU node, or "
                                  "module load the CUDA driver tools)"))
    return lines


def _forwarder_pids(record: str) -> Set[int]:
    """The pids run.sh recorded for a service's forwarders ("PID START LISTEN TARGET" lines)."""
    return {int(line.split()[0]) for line in _read_lines(record) if line.split() and line.split()[0].isdigit()}


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


def _plan(out_dir: Optional[str], name: str = "plan.json") -> Optional[dict]:
    try:
        with open(os.path.join(out_dir or "", name), encoding="utf-8") as fh:
            plan = json.load(fh)
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) else None


def isolation_line(out_dir: str) -> Optional[Line]:
    """How services of the project get their ports apart on this node, as its run.sh decides
    (`run.sh _isolation`: `c2s-loopback --check` in an image, kept for `up`): a loopback per service
    where ptrace and seccomp work, else the plan-time knobs only, and why (docs/interception.md)."""
    script = os.path.join(out_dir, "run.sh")
    if not os.path.isfile(script):
        return None
    try:
        proc = subprocess.run([script, "_isolation"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return ("warn", f"port isolation: unknown ({script} _isolation: {exc})")
    mode, _, why = proc.stdout.strip().partition("\t")
    if proc.returncode != 0 or mode not in ("intercept", "plan"):
        return ("warn", f"port isolation: unknown ({(proc.stderr.strip() or '?').splitlines()[-1]})")
    if mode == "intercept":
        return ("ok", f"port isolation: per-service loopback ({why})")
    return ("warn", f"port isolation: plan-time knobs only ({why}); nothing is isolated: any user of the node "
                    "reaches every port of every service, and networks (internal ones too) do not keep services apart")


def untraceable_lines(out_dir: str) -> List[Line]:
    """Where services get no loopback of their own: each service whose ports only one makes work
    (plan.json's needs_loopback) and whose image is built, which `up` refuses here."""
    plan = _plan(out_dir) or {}
    if plan.get("fallback_refusal"):
        return [("fail", f"`up` refuses the project on this node: {plan['fallback_refusal']}")]
    plan = _plan(out_dir, FALLBACK_PLAN) or plan
    return [("fail", f"service {s['name']}: `up` refuses it on this node: {s['needs_loopback']}")
            for s in plan.get("services") or [] if isinstance(s, dict) and s.get("needs_loopback")
            and os.path.isfile(os.path.join(out_dir, "sif", f"{s.get('image')}.sif"))]


def node_architecture() -> str:
    """The node's architecture as run.sh names it (bash's HOSTTYPE: uname -m on Linux)."""
    import platform
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def helper_lines(out_dir: str) -> List[Line]:
    """Each helper of the output for this node's architecture: its version, where it came from, and
    that it runs here; where one is missing, what then happens and to which services."""
    from compose2sif import helpers
    arch = node_architecture()
    try:
        with open(os.path.join(out_dir, helpers.OUTPUT_MANIFEST), encoding="utf-8") as fh:
            listing = json.load(fh)
        built = {h["name"]: h for h in listing["helpers"] if h["arch"] == arch}
        origin = f"built with {listing['toolchain']} by the {listing['built_by']}"
        archs = sorted({h["arch"] for h in listing["helpers"]})
    except (OSError, ValueError, KeyError, TypeError):
        listing, built, origin, archs = None, {}, "", []
    lines: List[Line] = []
    for name in (helpers.FORWARD, helpers.LOOPBACK):
        helper = built.get(name)
        path = os.path.join(out_dir, "bin", arch, name)
        if helper is None or not os.path.isfile(path):
            continue
        try:
            said = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
            runs = said.returncode == 0 and said.stdout.split()[1:2] == [helper["version"]]
            why = (said.stderr or said.stdout).strip()
        except (OSError, subprocess.SubprocessError, IndexError) as exc:
            runs, why = False, str(exc)
        if runs:
            lines.append(("ok", f"helper {name} {helper['version']} ({arch}): {origin}, sha256 {helper['sha256'][:16]}"))
        else:
            lines.append(("fail", f"helper {name} ({arch}, bin/{arch}/{name}) does not run here: {why or 'no version'}"))
    why = (f"compose2sif's package has no {{name}} for this node's architecture, {arch} (only for {', '.join(archs)})"
           if listing is not None else
           f"no bin/{arch}/{{name}}: the compose2sif that converted this was not installed by pip, which builds its helpers")
    plan = _plan(out_dir) or {}
    forwarded = [s for s in plan.get("services") or [] if isinstance(s, dict)
                 and any(isinstance(p, dict) and p.get("forward") for p in s.get("ports") or [])]
    if forwarded and helpers.FORWARD not in built:
        python = shutil.which("python3")
        if python and os.path.isfile(os.path.join(out_dir, helpers.OUTPUT_FALLBACK)):
            lines.append(("warn", f"published ports: {why.format(name=helpers.FORWARD)}; the node's {python} "
                                  f"serves them ({helpers.OUTPUT_FALLBACK})"))
        else:
            lines += [("fail", f"service {s['name']}: `up` will fail it: its published ports need a forwarder: "
                               f"{why.format(name=helpers.FORWARD)}, and the node has no python3 to run "
                               f"{helpers.OUTPUT_FALLBACK} instead") for s in forwarded]
    return lines


def mirror_lines(out_dir: str, timeout: float = 5.0) -> List[Line]:
    """Each registry mirror the project's images are pulled through (plan.json), and whether it
    answers the registry API's base endpoint (`/v2/`: 200, or 401 asking for a token)."""
    import urllib.error
    import urllib.request
    lines: List[Line] = []
    for mirror in (_plan(out_dir) or {}).get("registry_mirrors") or []:
        if not isinstance(mirror, dict):
            continue
        scheme = "http" if mirror.get("plain_http") else "https"
        host = str(mirror.get("mirror", "")).split("/")[0]
        said = f"registry mirror: {mirror.get('registry')} images from {mirror.get('mirror')} ({scheme})"
        try:
            with urllib.request.urlopen(f"{scheme}://{host}/v2/", timeout=timeout):
                pass
        except urllib.error.HTTPError as exc:
            if exc.code != 401:
                lines.append(("warn", f"{said}: {host} answers /v2/ with HTTP {exc.code}; is it a registry?"))
                continue
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            lines.append(("warn", f"{said}: {host} does not answer ({reason}); build and pull will fail "
                                  "for these images"))
            continue
        lines.append(("ok", said))
    return lines


def report(out_dir: Optional[str]) -> List[Line]:
    lines = runtime_lines()
    found = runtime.detect()
    if found is not None:
        lines += feature_lines(*found, _plan(out_dir))
    lines += storage_lines(os.path.expanduser("~"), out_dir)
    if out_dir:
        lines += helper_lines(out_dir)
        lines += mirror_lines(out_dir)
        isolation = isolation_line(out_dir)
        lines += [isolation] if isolation else []
        fallback = bool(isolation and isolation[0] != "ok")  # not a loopback per service here
        if fallback:
            lines += untraceable_lines(out_dir)
        lines += plan_lines(out_dir, fallback)
    return lines
