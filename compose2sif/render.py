"""Stage 4: write the plan out as files. The output directory is self-contained: copy it to a
cluster and run ``./run.sh up`` there with nothing but bash and apptainer/singularity.

    definitions/<image>.def   one per distinct image source
    sif/                      where `build` puts the SIFs
    env/<service>.env         the resolved environment, shell-quoted for --env-file, mode 0600
    config/<service>/...      rendered config files (nginx)
    hosts.names               every service's names -> its own loopback address; host.docker.internal
    hosts                     /etc/hosts for the instances as it would be on this machine
    run.sh                    the orchestrator
    plan.json                 every decision and warning, for people and tools
"""
from __future__ import annotations

import json
import os
import re
import shlex
from typing import Dict, List

import jinja2

from compose2sif.plan import Plan, PortPlan, ServicePlan
from compose2sif.plan.images import ImageSource


def _templates_dir() -> str:
    """run/ beside the package in a checkout (also a second worktree of an editable install, whose
    compose2sif.runner would point at the first); the package compose2sif.runner once installed."""
    checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run")
    if os.path.isfile(os.path.join(checkout, "engine.sh")):
        return checkout
    from compose2sif import runner
    return os.path.dirname(os.path.abspath(runner.__file__))


_VALID_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ULIMIT_FLAGS = {"core": "c", "data": "d", "fsize": "f", "locks": "x", "memlock": "l", "msgqueue": "q",
                 "nice": "e", "nofile": "n", "nproc": "u", "rss": "m", "rtprio": "r", "sigpending": "i",
                 "stack": "s", "cpu": "t", "as": "v"}


def _environment(loader_dir: str) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(loader_dir), keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["oneline"] = lambda v: re.sub(r"[\x00-\x1f\x7f]", "?", str(v))  # comments end at a newline
    return env


def launch_line(service: ServicePlan) -> str:
    """The shell line the start script evals: cd, ulimits, run the command, record its exit code.
    The command runs as a child so the exit code can be kept for `ps` and restart policies; the
    signals `instance stop` sends are passed on to it."""
    parts: List[str] = []
    if service.workdir:
        parts.append(f"cd {shlex.quote(service.workdir)} 2>/dev/null")
    for name, (soft, hard) in sorted(service.ulimits.items()):
        flag = _ULIMIT_FLAGS.get(name)
        if flag:
            value = "unlimited" if soft < 0 else str(soft)
            parts.append(f"ulimit -S -{flag} {value} 2>/dev/null || ulimit -S -{flag} \"$(ulimit -H -{flag})\"")
    argv = service.launch or ["/.singularity.d/runscript"]
    parts += [
        "rm -f /tmp/.c2s-exit",
        " ".join(shlex.quote(a) for a in argv) + " </dev/null & c2s_pid=$!",
        'for c2s_sig in TERM INT HUP QUIT USR1 USR2; do trap "kill -$c2s_sig $c2s_pid 2>/dev/null" $c2s_sig; done',
        'while :; do wait "$c2s_pid"; c2s_rc=$?; kill -0 "$c2s_pid" 2>/dev/null || break; done',
        'echo "$c2s_rc" >/tmp/.c2s-exit',
        'exit "$c2s_rc"',
    ]
    return "; ".join(parts)


def env_file_text(service: ServicePlan, warnings: List[str], evaluated: bool = False) -> str:
    """The --env-file of a service. Runtimes with --no-eval pass values on literally. Older ones
    (Singularity 3.x, Apptainer 1.0) evaluate them once more inside the container, so for those
    (``evaluated``) `$` and backquotes are escaped."""
    def value(text: str) -> str:
        if evaluated:
            text = text.replace("$", "\\$").replace("`", "\\`")
        return shlex.quote(text)

    lines = [f"# environment of service {service.name} (compose2sif); read by apptainer --env-file"
             + (" on runtimes without --no-eval" if evaluated else " --no-eval")]
    for key in sorted(service.environment):
        if not _VALID_NAME.match(key):
            if not evaluated:
                warnings.append(f"service {service.name!r}: environment variable {key!r} is not a valid shell name "
                                "and cannot be passed through --env-file; skipped")
            continue
        lines.append(f"{key}={value(service.environment[key])}")
    lines.append(f"C2S_LAUNCH={value(launch_line(service))}")
    return "\n".join(lines) + "\n"


def _write(path: str, text: str, mode: int = 0o600) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_private(out_dir: str, name: str, text: str) -> None:
    """A file only its owner may read (generated secrets)."""
    _write(os.path.join(out_dir, name), text, 0o600)


def _tmp_source(service: ServicePlan) -> str:
    for bind in service.binds:
        if bind.target == "/tmp":
            return bind.source
    return f"{service.name}-tmp-missing"


def _endpoint(port: PortPlan) -> str:
    """ADDR:PORT the service listens on, for run.sh; suffixed `?` when it may never be opened (run.sh
    then checks only that it is free, not that it listens). With --tls, nginx's 443 is ours to open."""
    return f"{port.address}:{port.host}" + ("" if port.required or port.how == "tls" else "?")


def render_runner(plan: Plan) -> str:
    env = _environment(_templates_dir())
    services = []
    for s in plan.services:
        binds = []
        for b in s.binds:
            spec = f"{b.source}:{b.target}" + (":ro" if b.read_only else "")
            binds.append({"spec": spec, "host": b.source, "create": b.create or b.kind in ("volume", "scratch", "tmpfs"),
                          "kind": b.kind})
        # a function per service, named by its position: `a-b` and `a_b` must not share one
        services.append({**s.__dict__, "fn": f"{len(services)}_{re.sub(r'[^A-Za-z0-9_]', '_', s.name)}", "binds": binds,
                         "tmp": _tmp_source(s), "endpoints": [_endpoint(p) for p in s.ports]})
    header = env.get_template("run.sh.j2").render(project=plan.project, compose_files=plan.compose_files,
                                                  state_dir=plan.state_dir, services=services,
                                                  images=list(plan.images), entry_points=plan.entry_points)
    with open(os.path.join(_templates_dir(), "engine.sh"), encoding="utf-8") as fh:
        return header + fh.read()


def hosts_names(plan: Plan) -> str:
    """Each service's names at its own address (the plan's hosts lines)."""
    return "".join(f"{address} {' '.join(names)}\n" for address, names in plan.hosts if names)


def _tls_files(plan: Plan, out_dir: str) -> None:
    """The certificate and key for --tls: the given files, or a self-signed pair made once."""
    import shutil
    import socket
    import subprocess
    from compose2sif.errors import ComposeError
    cert, key = (os.path.join(out_dir, plan.tls["cert"]), os.path.join(out_dir, plan.tls["key"]))
    os.makedirs(os.path.dirname(cert), mode=0o700, exist_ok=True)
    if plan.tls["source"]:
        for source, target in zip(plan.tls["source"], (cert, key)):
            try:
                shutil.copyfile(source, target)
            except OSError as exc:
                raise ComposeError(f"--tls-cert/--tls-key: cannot read {source}: {exc.strerror}") from None
            os.chmod(target, 0o600)
        return
    if os.path.exists(cert) and os.path.exists(key):
        return
    if shutil.which("openssl") is None:
        raise ComposeError("--tls needs openssl to make a self-signed certificate (or pass --tls-cert and --tls-key)")
    host = socket.getfqdn()
    proc = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "825",
                           "-subj", f"/CN={host}", "-addext", f"subjectAltName=DNS:{host},DNS:localhost,IP:127.0.0.1",
                           "-keyout", key, "-out", cert], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ComposeError(f"openssl could not make a certificate: {proc.stderr.strip().splitlines()[-1:]}")
    os.chmod(key, 0o600)
    os.chmod(cert, 0o644)


def write(plan: Plan, images: Dict[str, ImageSource], out_dir: str) -> List[str]:
    """Write every file; returns the warnings found while writing."""
    warnings: List[str] = []
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    os.chmod(out_dir, 0o700)
    if plan.tls:
        _tls_files(plan, out_dir)
    for key, source in images.items():
        _write(os.path.join(out_dir, "definitions", f"{key}.def"), source.definition, 0o644)
    os.makedirs(os.path.join(out_dir, "sif"), exist_ok=True)
    for service in plan.services:
        _write(os.path.join(out_dir, service.env_file), env_file_text(service, warnings))
        _write(os.path.join(out_dir, service.env_file[:-len(".env")] + ".eval.env"),
               env_file_text(service, warnings, evaluated=True))
    for path, content in plan.configs.items():
        _write(os.path.join(out_dir, path), content)
    names = hosts_names(plan)
    _write(os.path.join(out_dir, "hosts.names"), names, 0o644)
    try:
        with open("/etc/hosts", encoding="utf-8") as fh:
            host_entries = fh.read()
    except OSError:
        host_entries = ""
    _write(os.path.join(out_dir, "hosts"), host_entries + f"# compose2sif: {plan.project}\n" + names, 0o644)
    _write(os.path.join(out_dir, "run.sh"), render_runner(plan), 0o755)
    data = plan.to_json()
    data["warnings"] = plan.warnings + warnings
    _write(os.path.join(out_dir, "plan.json"), json.dumps(data, indent=2) + "\n", 0o644)
    return warnings
