"""`compose2sif doctor`: what on this node would stop the project, one line each: ok, warn or fail,
with the fix. Reads the node (runtime, namespaces, fuse, disk) and, when there is one, the output
directory's plan.json (its endpoints and GPUs)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import List, Optional, Tuple

from compose2sif import runtime
from compose2sif.plan.network import node_listeners, overlaps

Line = Tuple[str, str]  # (ok | warn | fail, text)
GIB = 1024 ** 3


def _version_tuple(version: str) -> Tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version)[:3])


def runtime_lines() -> List[Line]:
    found = runtime.detect()
    if found is None:
        return [("fail", "no apptainer or singularity on PATH (fix: module load apptainer, or install Apptainer >= 1.1)")]
    name, version = found
    lines: List[Line] = [("ok", f"runtime: {name} {version} ({shutil.which(name)})")]
    flavour = "apptainer" if "apptainer" in os.path.basename(name) else "singularity"
    if flavour == "apptainer" and _version_tuple(version) < (1, 1):
        lines.append(("warn", f"{name} {version} has no --no-eval: values go through the escaped env files "
                              "(fix: Apptainer >= 1.1 passes them on as Docker does)"))
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


def storage_lines(home: str) -> List[Line]:
    places = [("SIF cache", os.environ.get("C2S_SIF_CACHE")
               or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "compose2sif", "sif")),
              ("apptainer cache", os.environ.get("APPTAINER_CACHEDIR") or os.path.join(home, ".apptainer", "cache")),
              ("tmp", os.environ.get("APPTAINER_TMPDIR") or os.environ.get("TMPDIR") or "/tmp")]
    lines: List[Line] = []
    for what, path in places:
        existing = path
        while not os.path.exists(existing):
            existing = os.path.dirname(existing) or "/"
        free = shutil.disk_usage(existing).free
        text = f"{what}: {path}, {free / GIB:.1f} GiB free"
        level = "ok"
        if free < 2 * GIB:
            level, text = "fail", text + " (a SIF needs more: point it elsewhere)"
        elif free < 20 * GIB:
            level, text = "warn", text + " (large images such as vLLM take 10-20 GiB)"
        if os.path.realpath(path).startswith(os.path.realpath(home) + os.sep) and what != "tmp":
            level = "fail" if level == "fail" else "warn"
            var = "C2S_SIF_CACHE" if what == "SIF cache" else "APPTAINER_CACHEDIR"
            text += f"; it is in your home directory, where quotas are small (fix: export {var}=/scratch/...)"
        lines.append((level, text))
    return lines


def plan_lines(out_dir: str) -> List[Line]:
    try:
        with open(os.path.join(out_dir, "plan.json"), encoding="utf-8") as fh:
            plan = json.load(fh)
    except (OSError, ValueError):
        return [("warn", f"no plan.json in {out_dir}: endpoints not checked (run `compose2sif convert` first)")]
    lines: List[Line] = []
    listening = node_listeners()
    for service in plan.get("services", []):
        for port in service.get("ports", []):
            endpoint = (port["address"], port["host"])
            shown = f"{port['address']}:{port['host']}"
            if port["address"] in ("0.0.0.0", "::"):
                lines.append(("warn", f"service {service['name']} would listen on all interfaces ({shown}): anyone "
                                      "who reaches this node reaches it (fix: publish it on 127.0.0.1 in the compose file)"))
            taken = sorted(held for held in listening if overlaps(held, endpoint))
            if taken:
                lines.append(("fail", f"service {service['name']}: {shown} is taken ({_holder(port['host'])}; fix: "
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


def _holder(port: int) -> str:
    """Who listens on PORT, as `ss -ltnp` tells (only the user's own processes are named)."""
    if shutil.which("ss"):
        out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True).stdout
        match = re.search(r'users:\(\("([^"]+)",pid=(\d+)', out)
        if match:
            return f"held by {match.group(1)}, pid {match.group(2)}"
    return "held by another user's process, or one ss cannot name"


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


def report(out_dir: Optional[str]) -> List[Line]:
    lines = runtime_lines() + storage_lines(os.path.expanduser("~"))
    if out_dir:
        lines += plan_lines(out_dir)
    return lines
