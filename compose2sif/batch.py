"""A PJM or Slurm job script that serves one service of a compose project (a model server) for the
length of a batch job, on one node or across several over Ray.

The script is a header written here (scheduler directives, then every value taken from the compose
project as a quoted shell assignment) followed by the fixed body in ``batch_job.sh``: no compose
value is ever spliced into shell code, only into single-quoted words (``shlex.quote``).
"""
from __future__ import annotations

import math
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from compose2sif import adapters
from compose2sif.adapters.base import flag_value
from compose2sif.errors import ComposeError
from compose2sif.model import Service

SCHEDULERS = ("pjm", "slurm")
BODY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "batch_job.sh")

# keys of a service the job script honours; every other key present gets a warning
USED_KEYS = {"image", "command", "entrypoint", "environment", "volumes", "ports", "deploy", "healthcheck",
             "x-compose2sif", "working_dir"}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ELAPSE = re.compile(r"^\d+:[0-5]\d:[0-5]\d$")
_IFACE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
_PATH = re.compile(r"^[A-Za-z0-9_./%@+-]+$")
_GROUP = re.compile(r"^[A-Za-z0-9_.@-]+$")


@dataclass
class BatchOptions:
    scheduler: str
    group: Optional[str] = None           # PJM resource group (rscgrp) / Slurm partition
    nodes: Optional[int] = None           # default: from the server's parallel size and the GPUs
    gpus_per_node: Optional[int] = None   # default: the service's GPU reservation, else 0
    elapse: str = "1:00:00"
    job_output: Optional[str] = None
    modules: List[str] = field(default_factory=list)
    sif: Optional[str] = None             # default: x-compose2sif.image.sif
    cache_dir: Optional[str] = None       # bound on /cache (model servers', Triton, Inductor, HF caches)
    interface: str = "ib0"
    launcher: Optional[str] = None        # default: srun ... / mpiexec ...
    ray_port: int = 6379
    ready_path: str = "/health"


def _without_flag(args: List[str], name: str) -> List[str]:
    """args less `NAME VALUE` / `NAME=VALUE`: the job decides the address the server listens on."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out


def pick_service(services: Dict[str, Service], name: Optional[str]) -> Service:
    if name:
        if name not in services:
            raise ComposeError(f"no service {name!r} (services: {', '.join(services)})")
        return services[name]
    gpu = [s for s in services.values() if s.gpus]
    if len(gpu) == 1:
        return gpu[0]
    if len(services) == 1:
        return next(iter(services.values()))
    raise ComposeError("the job serves one service: name it with --service "
                       f"(services: {', '.join(services)})")


def _binds(service: Service, warnings: List[str]) -> List[str]:
    binds = []
    for mount in service.mounts:
        where = f"services.{service.name}.volumes"
        if mount.type == "tmpfs":
            warnings.append(f"{where}: tmpfs {mount.target} is not mounted in the batch job (the node's own /tmp is)")
            continue
        if mount.type != "bind":
            raise ComposeError(f"{mount.type} {mount.source or ''} {mount.target}: a batch job on compute nodes takes "
                               "bind mounts of shared directories only", path=where)
        for path in (mount.source, mount.target):
            if "," in path or ":" in path:
                raise ComposeError(f"{path!r}: apptainer --bind cannot take a path with ',' or ':'", path=where)
        binds.append(f"{mount.source}:{mount.target}" + (":ro" if mount.read_only else ""))
    return binds


def _sif(service: Service, options: BatchOptions, working_dir: str) -> str:
    path = options.sif
    if not path:
        hint = (service.extensions.get("x-compose2sif") or {}).get("image")
        path = hint.get("sif") if isinstance(hint, dict) else None
    if not path:
        raise ComposeError("the job needs the service's SIF: pass --sif FILE or set x-compose2sif.image.sif",
                           path=f"services.{service.name}.image")
    return os.path.normpath(os.path.join(working_dir, os.path.expanduser(str(path))))


def _gpus(service: Service) -> int:
    counts = [g.count for g in service.gpus]
    return max(counts) if counts and all(c > 0 for c in counts) else (4 if counts else 0)


def render(project_name: str, working_dir: str, service: Service, options: BatchOptions) -> Tuple[str, List[str]]:
    """The job script and the warnings (one line each) about keys it does not honour."""
    if options.scheduler not in SCHEDULERS:
        raise ComposeError(f"--scheduler {options.scheduler}: expected one of {', '.join(SCHEDULERS)}")
    if not _ELAPSE.match(options.elapse):
        raise ComposeError(f"--elapse {options.elapse!r}: expected H:MM:SS")
    if options.group is not None and not _GROUP.match(options.group):
        raise ComposeError(f"--group {options.group!r}: expected a resource group or partition name")
    if options.job_output is not None and not _PATH.match(options.job_output):
        raise ComposeError(f"--job-output {options.job_output!r}: a scheduler directive takes a plain path "
                           "(letters, digits, / . _ - % @ +)")
    if not _IFACE.match(options.interface):
        raise ComposeError(f"--interface {options.interface!r}: expected an interface name such as ib0")
    warnings: List[str] = []
    name = service.name
    unused = set(service.raw) - USED_KEYS
    if service.networks == ["default"]:
        unused.discard("networks")  # the project's default network: the job uses the nodes' network
    for key in sorted(unused):
        warnings.append(f"services.{name}.{key}: not used by the batch job (only this service runs, in its SIF)")

    args = list(service.command or [])
    serve_verb = ["run"]
    if service.entrypoint:
        serve_verb, args = ["exec"], list(service.entrypoint) + args
    port = flag_value(args, "--port")
    if port is None:
        port = str(service.ports[0].target) if service.ports else "8000"
    if not port.isdigit():
        raise ComposeError(f"--port {port!r} is not a port number", path=f"services.{name}.command")
    args = _without_flag(args, "--host")
    for mapping in service.ports:
        if mapping.published and (mapping.published != port or mapping.host_ip):
            warnings.append(f"services.{name}.ports: {mapping.host_ip + ':' if mapping.host_ip else ''}"
                            f"{mapping.published}:{mapping.target} is not used: the job serves on the head node's "
                            f"{options.interface} address, port {port}")

    gpus = options.gpus_per_node if options.gpus_per_node is not None else _gpus(service)
    adapter = adapters.adapter_for(service.image)
    ranks = adapter.parallel_size(args, f"services.{name}.command") if adapter else 1
    nodes = options.nodes or (max(1, math.ceil(ranks / gpus)) if gpus else 1)
    if nodes < 1:
        raise ComposeError(f"--nodes {nodes}: at least 1")

    env_lines = []
    for key, value in service.environment.items():
        if value is None:
            continue
        if not _NAME.match(key):
            raise ComposeError(f"{key!r} is not a variable name a job script can pass",
                               path=f"services.{name}.environment")
        env_lines.append(f"pass_env {key} {shlex.quote(value)}")

    sif = _sif(service, options, working_dir)
    binds = _binds(service, warnings)
    bound = [m.source for m in service.mounts if m.type == "bind" and m.target == "/cache"]
    if bound and not options.cache_dir:
        cache_dir = bound[0]  # the stack binds its own cache directory
    else:
        cache_dir = os.path.normpath(os.path.join(working_dir, options.cache_dir or "cache"))
        binds = [b for b in binds if b.split(":")[1] != "/cache"] + [f"{cache_dir}:/cache"]
    binds = [word for spec in binds for word in ("--bind", spec)]
    if service.working_dir:
        binds += ["--pwd", service.working_dir]
    start_period = service.healthcheck.start_period if service.healthcheck else 0
    ready_timeout = int(start_period) if start_period >= 60 else 1800
    if options.launcher:
        launcher = shlex.split(options.launcher)
    elif options.scheduler == "slurm":
        launcher = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    else:
        launcher = ["mpiexec", "-n", str(nodes), "-ppn", "1"]

    q = shlex.quote
    if options.scheduler == "pjm":
        if not options.group:
            raise ComposeError("--group: PJM needs the resource group (rscgrp) to submit to")
        directives = [f"#PJM -L rscgrp={options.group}",
                      f"#PJM -L node={nodes}",
                      *([f"#PJM -L gpu={gpus}"] if gpus else []),
                      f"#PJM -L elapse={options.elapse}",
                      "#PJM -j",  # stderr into the output file
                      *([f"#PJM -o {options.job_output}"] if options.job_output else [])]
    else:
        directives = [*([f"#SBATCH --partition={options.group}"] if options.group else []),
                      f"#SBATCH --nodes={nodes}",
                      "#SBATCH --ntasks-per-node=1",
                      *([f"#SBATCH --gpus-per-node={gpus}"] if gpus else []),
                      f"#SBATCH --time={options.elapse}",
                      f"#SBATCH --output={options.job_output or project_name + '-' + name + '.%j.out'}",
                      f"#SBATCH --job-name={project_name}-{name}"]  # both [a-z0-9_-] (Compose's rules)
    modules = [f"module load {q(m)}" for m in options.modules]
    header = [
        "#!/bin/bash",
        *directives,
        f"# compose2sif batch: service {name} of project {project_name} on {nodes} node(s) x {gpus} GPU(s), "
        f"{'Ray across nodes' if nodes > 1 else 'no Ray'}.",
        f"# Submit with: {'pjsub' if options.scheduler == 'pjm' else 'sbatch'} THIS_FILE. "
        "Every value below was quoted by compose2sif; edit them here if you need to.",
        "",
        *(["if type module >/dev/null 2>&1; then", *("    " + m for m in modules), "else",
           f"    echo {q('no module command on this node; not loaded: ' + ' '.join(options.modules))} >&2", "fi", ""]
          if modules else []),
        f"nodes={nodes}",
        f"gpus_per_node={gpus}",
        f"sif={q(sif)}",
        f"serve_verb=({' '.join(q(v) for v in serve_verb)})",
        f"serve_args=({' '.join(q(a) for a in args)})",
        f"port={port}",
        f"ready_path={q(options.ready_path)}",
        f"ready_timeout={ready_timeout}  # seconds: the healthcheck's start_period",
        f"sif_opts=({' '.join(q(b) for b in binds)})",
        f"cache_dir={q(cache_dir)}",
        f"iface={q(options.interface)}",
        f"ray_port={int(options.ray_port)}",
        "cluster_timeout=600  # seconds for every node's Ray worker to join",
        "stop_grace=10  # seconds for what was started to stop after SIGTERM (twice), before SIGKILL",
        f"launcher=({' '.join(q(a) for a in launcher)})",
        "",
    ]
    with open(BODY, encoding="utf-8") as fh:
        body = fh.read()
    # the environment is passed after the body's helpers exist: insert it where the body says
    body = body.replace("# ENVIRONMENT\n", "\n".join(env_lines) + "\n" if env_lines else "")
    return "\n".join(header) + body, warnings
