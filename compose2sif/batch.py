"""A PJM or Slurm job script that runs a converted project (all its services, or those named) for the
length of a batch job: the runner `run.sh up` in the foreground on the first node, and where a
model server spans nodes (tensor x pipeline parallel size > GPUs per node, over Ray), Ray workers
on the other nodes.

The script is a header written here (scheduler directives, then every value as a quoted shell
assignment) followed by the fixed body in ``batch_job.sh``: no project value is ever spliced into
shell code, only into single-quoted words (``shlex.quote``). The job reads the output directory of
`compose2sif convert` (its plan.json) as the runner does; site conventions (resource groups, MPI
launchers) are data in ``batch_sites.py``.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from compose2sif import adapters
from compose2sif.batch_sites import MPI_STYLES, SITES
from compose2sif.errors import ComposeError

SCHEDULERS = ("pjm", "slurm")
BODY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "batch_job.sh")

_ELAPSE = re.compile(r"^(\d+):([0-5]\d):([0-5]\d)$")
_IFACE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
_PATH = re.compile(r"^[A-Za-z0-9_./%@+-]+$")
_GROUP = re.compile(r"^[A-Za-z0-9_.@-]+$")
_SIF = re.compile(r"^sif/[A-Za-z0-9_][A-Za-z0-9_.-]*\.sif$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_WORD = re.compile(r"^\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})$")


@dataclass
class BatchOptions:
    scheduler: str
    group: Optional[str] = None           # PJM resource group (rscgrp) / Slurm partition
    nodes: Optional[int] = None           # default: what the service spanning nodes needs, else 1
    gpus_per_node: Optional[int] = None   # default: the site's, else the largest GPU reservation
    elapse: str = "1:00:00"
    job_output: Optional[str] = None
    modules: List[str] = field(default_factory=list)
    interface: str = "ib0"
    launcher: Optional[str] = None        # default: the MPI style's
    mpi: Optional[str] = None             # a key of MPI_STYLES (default: the site's, srun, openmpi)
    site: Optional[str] = None            # a key of SITES (or of --site-file)
    site_file: Optional[str] = None
    ray_port: int = 6379
    stop_lead: int = 120                  # seconds before the time limit the job starts stopping


def _sif(plan: dict, out_dir: str, service: dict) -> str:
    """The path of the service's SIF, as plan.json names it: the one convert planned, sif/KEY.sif
    inside the output directory, its source one line; anything else in a plan.json that was edited
    or planted is refused, so no value sends the job to a file outside it."""
    name, key = service.get("name"), service.get("image")
    image = (plan.get("images") or {}).get(key) if isinstance(key, str) else None
    where = f"{os.path.join(out_dir, 'plan.json')}: services.{name}.image"
    if not isinstance(image, dict):
        raise ComposeError(f"{where}: {key!r} is not an image of the plan: convert again")
    sif, ref = image.get("sif"), image.get("ref")
    if not (isinstance(sif, str) and _SIF.match(sif) and sif == f"sif/{key}.sif") or not isinstance(ref, str) \
            or _CONTROL.search(ref):
        raise ComposeError(f"{where}: image {key!r} (sif {sif!r}, source {ref!r}) is not one convert plans "
                           "(sif/KEY.sif in the output directory, a one-line source): convert again")
    return os.path.join(out_dir, sif)


def _server_adapter(service: dict) -> Optional[adapters.Adapter]:
    """The adapter convert chose for the service (plan.json records its family: the compose image
    decides it, also where x-compose2sif.image gives a SIF)."""
    family = service.get("adapter")
    return next((a for a in adapters.ADAPTERS if family and a.family == family), None)


def load_plan(out_dir: str) -> dict:
    path = os.path.join(out_dir, "plan.json")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise ComposeError(f"{path} is missing: run `compose2sif convert -o {out_dir}` first, "
                           "or name the converted directory with --dir") from None
    except (OSError, ValueError) as exc:
        raise ComposeError(f"{path}: unreadable ({exc}): convert again") from None


def _sites(options: BatchOptions) -> Dict[str, dict]:
    sites = dict(SITES)
    if options.site_file:
        try:
            with open(options.site_file, encoding="utf-8") as fh:
                extra = json.load(fh)
            if not isinstance(extra, dict) or not all(isinstance(v, dict) for v in extra.values()):
                raise ValueError("expected {SITE: {scheduler, mpi, gpus_per_node, groups}}")
        except (OSError, ValueError) as exc:
            raise ComposeError(f"--site-file {options.site_file}: {exc}") from None
        sites.update(extra)
    return sites


def _closure(by_name: Dict[str, dict], names: List[str]) -> List[str]:
    """NAMES and what they depend on, in the plan's order."""
    wanted, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        for dep in by_name[name].get("depends_on") or []:
            todo.append(dep["service"] if isinstance(dep, dict) else str(dep))
    return [name for name in by_name if name in wanted]


def _seconds(elapse: str) -> int:
    h, m, s = (int(x) for x in _ELAPSE.match(elapse).groups())
    return h * 3600 + m * 60 + s


def _launcher_words(words: List[str], nodes: int) -> str:
    """Shell words of a launcher: `$NAME` is the job's variable at run time, the rest literal words."""
    out = []
    for word in words:
        word = word.replace("{nodes}", str(nodes))
        env = _ENV_WORD.match(word)
        out.append(f'"${env.group(1) or env.group(2)}"' if env else shlex.quote(word))
    return " ".join(out)


def _slurm_partition(group: Optional[str]) -> Optional[Tuple[str, int, str]]:
    """(partition, nodes, gres) from sinfo where this machine has it (the login node): else None."""
    sinfo = shutil.which("sinfo")
    if not sinfo:
        return None
    try:
        out = subprocess.run([sinfo, "-h", "-o", "%P %D %G"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows: Dict[str, List] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        name, count, gres = parts
        default = name.endswith("*")
        name = name.rstrip("*")
        row = rows.setdefault(name, [name, 0, set(), default])
        row[1] += int(count) if count.isdigit() else 0
        row[2].update(g for g in gres.split(",") if g != "(null)")
    chosen = rows.get(group) if group else next((r for r in rows.values() if r[3]), None)
    if group and chosen is None:
        raise ComposeError(f"--group {group}: no such Slurm partition (sinfo shows: {', '.join(rows) or 'none'})")
    return (chosen[0], chosen[1], ",".join(sorted(chosen[2]))) if chosen else None


def render(plan: dict, out_dir: str, names: List[str], options: BatchOptions) -> Tuple[str, List[str]]:
    """The job script, and warnings (one line each)."""
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
    project = plan["project"]
    by_name = {s["name"]: s for s in plan["services"]}
    for name in names:
        if name not in by_name:
            raise ComposeError(f"no service {name!r} in {out_dir} (services: {', '.join(by_name)})")
    chosen = _closure(by_name, names) if names else list(by_name)

    sites = _sites(options)
    site = None
    if options.site:
        if options.site not in sites:
            raise ComposeError(f"--site {options.site}: known sites: {', '.join(sites)} (add one with --site-file)")
        site = sites[options.site]
        if site.get("scheduler") not in (None, options.scheduler):
            raise ComposeError(f"--site {options.site} runs {site['scheduler']}, not {options.scheduler}")
    style_name = options.mpi or (site or {}).get("mpi") or ("srun" if options.scheduler == "slurm" else "openmpi")
    if style_name not in MPI_STYLES:
        raise ComposeError(f"--mpi {style_name}: expected one of {', '.join(MPI_STYLES)}")
    style = MPI_STYLES[style_name]
    if style["scheduler"] != options.scheduler:
        raise ComposeError(f"--mpi {style_name} is for {style['scheduler']}, not {options.scheduler}")

    # GPUs per node, and the one service that may span nodes
    counts = [g.get("count", 0) for name in chosen for g in by_name[name].get("gpus") or []]
    if options.gpus_per_node is not None:
        gpus = options.gpus_per_node
    elif site and site.get("gpus_per_node"):
        gpus = int(site["gpus_per_node"])
    elif counts and all(c > 0 for c in counts):
        gpus = max(counts)
    elif counts:
        raise ComposeError("a service asks for all GPUs (count: all): say how many a node has with --gpus-per-node")
    else:
        gpus = 0
    spanning = []
    for name in chosen:
        service = by_name[name]
        if not service.get("gpus") or not gpus:
            continue
        adapter = _server_adapter(service)
        size = adapter.parallel_size(service.get("launch") or [], f"services.{name}.command") if adapter else 1
        if size > gpus:
            spanning.append((name, math.ceil(size / gpus)))
    if len(spanning) > 1:
        raise ComposeError(f"services {', '.join(n for n, _ in spanning)} each span nodes: one Ray cluster per job; "
                           "submit them as separate jobs (name the services)")
    ray = by_name[spanning[0][0]] if spanning else None
    nodes = options.nodes or (spanning[0][1] if spanning else 1)
    if ray:
        problem = _server_adapter(ray).across_nodes_problem(ray["launch"])
        if problem:
            raise ComposeError(f"it spans {spanning[0][1]} nodes of {gpus} GPUs: {problem}",
                               path=f"services.{ray['name']}.command")
    if nodes > 1 and not ray:
        raise ComposeError(f"--nodes {nodes}: no service spans nodes (a model server whose parallel size is more "
                           f"than the {gpus} GPUs of a node); everything else runs on the first node: leave --nodes out")
    if ray and spanning[0][1] > nodes:
        raise ComposeError(f"--nodes {nodes}: service {ray['name']} needs {spanning[0][1]} nodes of {gpus} GPUs")

    # every SIF the job uses, present now (and checked again in the job's first lines)
    sifs = sorted({_sif(plan, out_dir, by_name[n]) for n in chosen})
    missing = [s for s in sifs if not os.path.exists(s)]
    if missing:
        raise ComposeError(f"{missing[0]} is missing: run {os.path.join(out_dir, 'run.sh')} build first "
                           f"({len(missing)} SIF(s) missing)")

    # the scheduler's side: what it accepts, checked where we can
    group_rule = None
    if site and options.group:
        group_rule = (site.get("groups") or {}).get(options.group)
        if group_rule is None:
            warnings.append(f"--group {options.group}: not in site {options.site}'s table "
                            f"({', '.join(site.get('groups') or {}) or 'empty'}): GPU and node limits not checked")
    gpu_directive = gpus > 0
    if options.scheduler == "pjm":
        if not options.group:
            raise ComposeError("--group: PJM needs the resource group (rscgrp) to submit to")
        if group_rule is not None:
            gpu_directive = gpus > 0 and bool(group_rule.get("gpu"))
            limit = group_rule.get("max_nodes")
            if limit is not None and nodes > int(limit):
                raise ComposeError(f"--group {options.group} holds at most {limit} node(s), the job needs {nodes}: "
                                   "use a group for multi-node jobs (see your site's resource group table)")
        elif site and gpus > 0:
            gpu_directive = False  # the site's other groups give whole nodes
    else:
        partition = _slurm_partition(options.group)
        if partition:
            name, count, gres = partition
            if gpus > 0 and "gpu" not in gres:
                raise ComposeError(f"partition {name} defines no GPU gres (sinfo: {gres or 'none'}), so sbatch "
                                   "rejects --gpus-per-node: use a GPU partition (--group) or --gpus-per-node 0")
            if nodes > count:
                raise ComposeError(f"partition {name} has {count} node(s), the job needs {nodes}: "
                                   "use a larger partition (--group)")

    # what the job passes on
    ray_binds: List[str] = []
    ray_grace = 10
    if ray:
        for bind in ray.get("binds") or []:
            if bind.get("kind") == "scratch" or bind["target"] == "/tmp":
                continue  # the node's own /tmp
            source = os.path.normpath(os.path.join(out_dir, bind["source"]))
            for path in (source, bind["target"]):
                if "," in path or ":" in path:
                    raise ComposeError(f"{path!r}: apptainer --bind cannot take a path with ',' or ':'",
                                       path=f"services.{ray['name']}.volumes")
            ray_binds += ["--bind", f"{source}:{bind['target']}" + (":ro" if bind.get("read_only") else "")]
        ray_grace = max(1, math.ceil(float(ray.get("stop_grace_period") or 10)))
    levels: Dict[int, float] = {}
    for name in chosen:
        service = by_name[name]
        level = int(service.get("level") or 0)
        levels[level] = max(levels.get(level, 0), float(service.get("stop_grace_period") or 10))
    runner_grace = math.ceil(sum(levels.values())) + 10 * len(levels)
    stop_lead = max(options.stop_lead, runner_grace + ray_grace * 2 + 30)
    published = [p.get("forward") or f"{p['address']}:{p['host']}" for name in chosen
                 for p in by_name[name].get("ports") or [] if p.get("published")]

    q = shlex.quote
    if options.launcher:
        try:
            launcher_words = shlex.split(options.launcher)
        except ValueError as exc:
            raise ComposeError(f"--launcher {options.launcher!r}: {exc}") from None
        if not launcher_words:
            raise ComposeError("--launcher: empty")
    else:
        launcher_words = style["launcher"]
    multi = nodes > 1
    if options.scheduler == "pjm":
        directives = [f"#PJM -L rscgrp={options.group}",
                      f"#PJM -L node={nodes}",
                      *([f"#PJM -L gpu={gpus}"] if gpu_directive else []),
                      f"#PJM -L elapse={options.elapse}",
                      *([d.replace("{nodes}", str(nodes)) for d in style["directives"]] if multi else []),
                      "#PJM -j",  # stderr into the output file
                      *([f"#PJM -o {options.job_output}"] if options.job_output else [])]
    else:
        directives = [*([f"#SBATCH --partition={options.group}"] if options.group else []),
                      f"#SBATCH --nodes={nodes}",
                      "#SBATCH --ntasks-per-node=1",
                      *([f"#SBATCH --gpus-per-node={gpus}"] if gpu_directive else []),
                      f"#SBATCH --time={options.elapse}",
                      f"#SBATCH --signal=B:TERM@{stop_lead}",  # the batch step stops everything first
                      f"#SBATCH --output={options.job_output or project + '.%j.out'}",
                      f"#SBATCH --job-name={project}"]  # [a-z0-9_-] (Compose's rules)
    modules = [f"module load {q(m)}" for m in options.modules]
    style_env = [f"export {k}={q(v)}" for k, v in (style["env"].items() if multi else ())]
    what = ", ".join(chosen)
    header = [
        "#!/bin/bash",
        *directives,
        f"# compose2sif batch: project {project} ({what}) on {nodes} node(s) x {gpus} GPU(s)"
        + (f", {ray['name']} over Ray across the nodes ({style_name})." if ray else ", on one node."),
        f"# Submit with: {'pjsub' if options.scheduler == 'pjm' else 'sbatch'} THIS_FILE. "
        "Every value below was quoted by compose2sif; edit them here if you need to.",
        "",
        *(["if type module >/dev/null 2>&1; then", *("    " + m for m in modules), "else",
           f"    echo {q('no module command on this node; not loaded: ' + ' '.join(options.modules))} >&2", "fi", ""]
          if modules else []),
        *style_env,
        f"nodes={nodes}",
        f"gpus_per_node={gpus}",
        f"run_dir={q(out_dir)}",
        f"services=({' '.join(q(n) for n in names)})  # run.sh up: these and what they depend on (none: all)",
        f"sifs=({' '.join(q(s) for s in sifs)})",
        f"published=({' '.join(q(p) for p in published)})",
        f"elapse_s={_seconds(options.elapse)}",
        f"stop_lead={stop_lead}  # seconds before the time limit the job stops itself",
        f"ray_service={q(ray['name']) if ray else ''}",
        f"ray_sif={q(_sif(plan, out_dir, ray)) if ray else ''}",
        f"ray_env={q(os.path.join(out_dir, 'env', ray['name'])) if ray else ''}",
        f"ray_instance={q(ray['instance']) if ray else ''}  # where the service's Ray driver runs",
        f"ray_binds=({' '.join(q(b) for b in ray_binds)})",
        f"ray_grace={ray_grace}  # seconds: {ray['name'] + chr(39) + 's' if ray else 'the'} stop_grace_period",
        f"iface={q(options.interface)}",
        f"ray_port={int(options.ray_port)}",
        "cluster_timeout=600  # seconds for every node's Ray worker to join",
        f"launcher=({_launcher_words(launcher_words, nodes)})",
        "",
    ]
    with open(BODY, encoding="utf-8") as fh:
        body = fh.read()
    return "\n".join(header) + body, warnings
