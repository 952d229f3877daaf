"""The convert stage: load -> plan -> render, as one function (`convert` and `up` call it).

Between the stages it does what needs the outside world: it prepares what a preset's users
prepare by hand (an .env copied from .env.example), generates the secrets a preset's public defaults stand for and
loads the project again with them, asks registries for image configurations, and reads what an
earlier convert into the same output directory left (its secrets, its endpoints). A ComposeError
from any stage that names a service is pointed at that service's definition (one locator).
"""
from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Callable, Dict, Iterator, NamedTuple, Optional, Sequence, Tuple

from compose2sif.errors import ComposeError
from compose2sif.load import Project, ProjectOptions, load_project

if TYPE_CHECKING:
    from compose2sif.plan import Plan
    from compose2sif.plan.mirrors import Mirrors

# The planner, the adapters and the renderer are imported where they are used: every command loads
# the project through here, and `config` must stay quick (it is measured against Docker Compose).


class ConvertOptions(NamedTuple):
    """convert's options; each field is named as the command line's option (cli.py fills it by name).
    A NamedTuple, not a dataclass: every command imports this module, `config` too, and it races
    Docker Compose, which need not wait for dataclasses."""
    output: Optional[str] = None                                # default: ./compose2sif-PROJECT
    registry_mirror: Sequence[str] = ()                         # [REGISTRY=][http://]HOST[/PREFIX]
    image_sources: Sequence[str] = ()                           # SERVICE=KIND:PATH
    port_base: Optional[int] = None
    address_block: Optional[str] = None                         # 127.A.B.0/24 as the user wrote it
    offline: bool = False                                       # ask no registry
    tls: bool = False
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    preset: Optional[str] = None                                # default: detected from the images
    ssrf_allow: Sequence[str] = ()


@contextlib.contextmanager
def located(project: Project) -> Iterator[None]:
    """An error that names a service (`services.NAME...`) and no file gets the file and line where
    the service is defined."""
    try:
        yield
    except ComposeError as exc:
        if exc.file is None and exc.path and exc.path.startswith("services."):
            exc.file, exc.line = project.locate(exc.path.split(".")[1])
        raise


def load(options: ProjectOptions, warn: Callable[[str], None]) -> Project:
    """The project, loaded; where loading fails for want of what a preset's users prepare before the
    first start (an .env from .env.example), that is prepared and loading tried once more."""
    try:
        project = load_project(options)
    except ComposeError as exc:
        from compose2sif import adapters
        done = next((line for line in (p.prepare(exc) for p in adapters.PRESETS.values()) if line), None)
        if done is None:
            raise
        warn(done)
        project = load_project(options)
    for warning in project.warnings:
        warn(f"WARN {warning}")
    return project


def output_dir(project: Project, output: Optional[str]) -> str:
    return os.path.abspath(output or os.path.join(os.getcwd(), f"compose2sif-{project.name}"))


def convert(project_options: ProjectOptions, options: ConvertOptions,
            warn: Callable[[str], None]) -> Tuple["Plan", str]:
    """Load, plan and render the project; returns the plan and the output directory. ``warn`` gets
    each line for the user (warnings and notes), in order."""
    from compose2sif import adapters, helpers, render
    from compose2sif.plan import PlanOptions, build_plan, generated
    from compose2sif.plan.mirrors import Mirrors
    from compose2sif.plan.network import parse_address_block
    project = load(project_options, warn)
    out_dir = output_dir(project, options.output)
    sources = _image_sources(options.image_sources)
    mirrors = Mirrors.parse(options.registry_mirror, os.environ.get("C2S_REGISTRY_MIRRORS"))
    if bool(options.tls_cert) != bool(options.tls_key):
        raise ComposeError("--tls-cert and --tls-key go together")
    presets = {options.preset} if options.preset else \
        adapters.presets_for(s.get("image") for s in project.services.values())
    table = adapters.preset_secrets(presets)
    chosen = generated.choose(table, project.environment, generated.read_stored(out_dir)) if table else {}
    if chosen:  # load again as if the user had set them: interpolation puts each where it belongs
        environ = dict(os.environ if project_options.environ is None else project_options.environ)
        project = load_project(project_options._replace(environ={**environ, **chosen}))
    plan_options = PlanOptions(
        registry_mirrors=mirrors, image_sources=sources, port_base=options.port_base,
        address_block=parse_address_block(options.address_block) if options.address_block else None,
        tls=bool(options.tls or options.tls_cert),
        tls_files=(os.path.abspath(options.tls_cert), os.path.abspath(options.tls_key)) if options.tls_cert else None,
        presets=presets, secrets=generated.Replacer(table, chosen) if chosen else None,
        ssrf_allow=list(options.ssrf_allow), loopback=helpers.has(helpers.LOOPBACK))
    with located(project):
        if not options.offline:
            plan_options.image_configs = _image_configs(project, sources, mirrors, warn)
        plan = build_plan(project, plan_options)
        render.write(plan, out_dir)
    if chosen:
        warn(f"secrets: {len(chosen)} public default(s) replaced by generated values, kept in "
             f"{os.path.join(out_dir, generated.SECRETS_FILE)} (`compose2sif secrets` shows where each is used)")
    for warning in plan.warnings:
        if warning not in project.warnings:
            warn(f"WARN {warning}")
    return plan, out_dir


def _image_sources(items: Sequence[str]) -> Dict[str, str]:
    sources = {}
    for item in items:
        service, sep, spec = item.partition("=")
        if not sep:
            raise ComposeError(f"--image-source {item}: expected SERVICE=KIND:PATH")
        sources[service] = spec
    return sources


def _image_configs(project: Project, sources: Dict[str, str], mirrors: "Mirrors",
                   warn: Callable[[str], None]) -> Dict[str, object]:
    """What the registries say of the images the project may pull (WORKDIR, EXPOSE); an image that
    cannot be read is left out, with a warning where a service surely runs it."""
    from compose2sif import registry  # requests: slow to import, not needed offline
    from compose2sif.model import services as typed_services
    from compose2sif.plan.images import registry_questions
    plain = bool(os.environ.get("APPTAINER_NOHTTPS") or os.environ.get("SINGULARITY_NOHTTPS"))
    configs: Dict[str, object] = {}
    for image, pulled in registry_questions(list(typed_services(project).values()), sources):
        try:
            ref = mirrors.reference(image)
            insecure = plain or ref.split("/", 1)[0] in mirrors.plain_hosts()
            configs[image] = registry.fetch_config(ref, insecure=insecure)
        except Exception as exc:  # network, auth, odd registries: the plan just lacks it
            if pulled:
                warn(f"WARN could not read the configuration of image {image} from its registry "
                     f"({type(exc).__name__}); its WORKDIR and exposed ports are unknown")
    return configs

