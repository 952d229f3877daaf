"""build_plan in four phases, each a function of what the one before found:

    discover   the services, their images, their adapters, and what says where each listens
    place      every service's address and every port (network.py)
    draft      per service: binds, knobs told, references rewritten, its adapter's finish
    assemble   the Plan: what render writes, every decision, every warning
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Set, Tuple

from compose2sif import adapters as image_adapters
from compose2sif.adapters import Adapter, Draft
from compose2sif.errors import ComposeError
from compose2sif.load import Project
from compose2sif.model import HEALTHCHECK_FIELDS, Healthcheck, Service, scaled_to_zero, services as typed_services
from compose2sif.plan import knobs, secrets
from compose2sif.plan.binds import STATE, rewrite_bound_files, service_binds, texts_of
from compose2sif.plan.generated import Replacer
from compose2sif.plan.images import ImageSource, build_args, plan_images
from compose2sif.plan.knobs import RUNSCRIPT, Found
from compose2sif.plan.mirrors import Mirrors
from compose2sif.plan.network import (PORT_BLOCK, References, ServiceNet, default_address_block, default_port_base,
                                      dns_port, host_port_pairs, plan_as_written, plan_network)
from compose2sif.plan.pre_start import plan_pre_start
from compose2sif.plan.reach import plan_reach, restricted
from compose2sif.plan.types import ImagePlan, Plan, PortPlan, ServicePlan
from compose2sif.support import unsupported_warnings
from compose2sif.types import WILDCARD, WILDCARDS, NetworkPlan

_HOST_KEYS = ("_HOST", "_HOSTNAME", "_ADDR", "_SERVER")
_VALID_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # what an --env-file can carry


@dataclass
class PlanOptions:
    registry_mirrors: Mirrors = field(default_factory=Mirrors)       # registry -> its pull-through mirror
    image_sources: Dict[str, str] = field(default_factory=dict)   # service -> KIND:PATH
    port_base: Optional[int] = None                               # first port of the block moved ports go to
    address_block: Optional[str] = None                           # 127.A.B: the services' /24 of addresses
    uid: Optional[int] = None
    presets: Optional[Set[str]] = None                            # project-family presets; default: detected
    secrets: Optional[Replacer] = None                            # generated values for public default secrets
    ssrf_allow: List[str] = field(default_factory=list)           # private destinations SSRF proxies may reach
    image_configs: Dict[str, Any] = field(default_factory=dict)   # image ref -> registry.ImageConfig
    tls: bool = False                                             # HTTPS in front of each web front that can
    tls_files: Optional[Tuple[str, str]] = None                   # (cert, key); default: a self-signed pair
    loopback: bool = False                                        # bin/c2s-loopback is in the output (plan_network)


@dataclass
class Discovery:
    """What the project says before anything is decided."""
    services: Dict[str, Service]
    images: Dict[str, ImageSource]
    image_of: Dict[str, str]                        # service -> image key
    presets: Set[str]
    adapters: Dict[str, Optional[Adapter]]
    model_servers: Dict[str, str]                   # services that serve models -> their family
    names: Dict[str, List[str]]                     # service -> its names (service, container_name, hostname, aliases)
    launches: Dict[str, Optional[List[str]]]
    nets: Dict[str, ServiceNet]
    warnings: List[str]
    healthcheck_from: Dict[str, str] = field(default_factory=dict)  # service -> where its healthcheck comes from


# what the plan-time knobs cannot do, said by convert's fallback line (and by `up` and doctor there)
NOT_ISOLATED = ("nothing is isolated there: any user of the node reaches every port of every service, and "
                "networks (internal ones too) do not keep services apart")


def build_plan(project: Project, options: Optional[PlanOptions] = None) -> Plan:
    """The plan `up` runs. With bin/c2s-loopback in the output (options.loopback): the project as
    written (plan_as_written), and in ``plan.fallback`` the plan-time knobs' plan for a node where
    services cannot get a loopback of their own (or, where even that is refused, the line `up`
    prints there: ``plan.fallback_refusal``). Without it: the knobs' plan alone."""
    options = options or PlanOptions()
    found = discover(project, options)
    if not options.loopback:
        return _plan(project, found, options, as_written=False)
    plan = _plan(project, replace(found), options, as_written=True)
    try:
        plan.fallback = _as_fallback(plan, _plan(project, found, options, as_written=False))
    except ComposeError as exc:
        plan.fallback_refusal = str(exc)
        plan.warnings.append(f"where a node cannot give each service a loopback of its own, `up` refuses this "
                             f"project: {plan.fallback_refusal}")
        return plan
    moved = sorted(f"{s.name}:{p.container}->{p.host}" for s in plan.fallback.services for p in s.ports
                   if p.host != p.container)
    refused = [s.name for s in plan.fallback.services if s.needs_loopback]
    everywhere = sorted(f"{s.name} ({p.address}:{p.host})" for s in plan.fallback.services for p in s.ports
                        if p.address in WILDCARDS and not p.published)
    said = [f"ports moved {', '.join(moved)}"] if moved else []
    said += [f"refused there: {', '.join(refused)}"] if refused else []
    said += [f"listening on all interfaces there: {', '.join(everywhere)}"] if everywhere else []
    said += [NOT_ISOLATED]
    plan.warnings.append("where a node cannot give each service a loopback of its own, `up` falls back to the "
                         "plan-time knobs (fallback/plan.json): " + "; ".join(said))
    return plan


def _plan(project: Project, found: Discovery, options: PlanOptions, as_written: bool) -> Plan:
    network = place(project, found, options, as_written)
    refs = References(found.names, network)
    if not as_written:
        _rebuild_with_moved_ports(project, found, refs, options)
    configs: Dict[str, str] = {}
    drafts = {name: draft(name, project, found, network, refs, configs, options, as_written)
              for name in found.services}
    plan = assemble(project, found, network, drafts, configs, options)
    plan_pre_start(plan, found.services, found.images, refs, options.secrets)
    return plan


FALLBACK = "fallback/"  # where the fallback's own files go in the output directory


def _as_fallback(primary: Plan, fallback: Plan) -> Plan:
    """The knobs' plan as the fallback of ``primary``: its env files, and the rendered configs that
    differ (a moved port, a told address), under fallback/; the SIFs
    the primary's (one build serves both); a service whose image would need another build (a
    build argument naming a port that moves) is refused there, in one line."""
    differ = [path for path, text in fallback.configs.items() if primary.configs.get(path) != text]
    sources = {b.source for s in fallback.services for b in s.binds
               if any(path == b.source or path.startswith(b.source + "/") for path in differ)}
    for service in fallback.services:
        service.env_file = FALLBACK + service.env_file
        for step in service.pre_start:
            step.env_file = FALLBACK + step.env_file
        for bind in service.binds:
            bind.source = FALLBACK + bind.source if bind.source in sources else bind.source
        ours, theirs = primary.images[primary.service(service.name).image], fallback.images.get(service.image)
        if theirs is None or theirs.digest != ours.digest:
            service.needs_loopback = service.needs_loopback or (
                f"service {service.name!r}: its image's build arguments name a port of another service that the "
                "plan-time knobs move, so it would need another build; fix: give that service's port another "
                "number in the compose file")
        service.image = primary.service(service.name).image
    # the rendered files that differ, with every file beside them that a bind carries (the others: the primary's)
    fallback.configs = {FALLBACK + path: text for path, text in fallback.configs.items()
                        if any(path == source or path.startswith(source + "/") for source in sources)}
    fallback.images = primary.images
    return fallback


# ---- discover ----------------------------------------------------------------------------------

def discover(project: Project, options: PlanOptions) -> Discovery:
    services = typed_services(project)
    warnings: List[str] = list(project.warnings) + (options.secrets.notes if options.secrets else [])
    warnings += [f"service {name!r}: scaled to zero (deploy.replicas: 0 or scale: 0); not started, as under Compose"
                 for name, config in project.config["services"].items() if scaled_to_zero(config)]
    images = plan_images(list(services.values()), project.working_dir, options.registry_mirrors, options.image_sources,
                         options.image_configs)
    image_of = {name: key for key, source in images.items() for name in source.services}
    for source in images.values():
        warnings.extend(source.warnings)
    healthcheck_from: Dict[str, str] = {}
    for name, service in services.items():
        health, healthcheck_from[name] = _healthcheck(service, images[image_of[name]],
                                                      options.image_configs.get(service.image or ""))
        if health is not service.healthcheck:
            services[name] = replace(service, healthcheck=health)
    presets = options.presets if options.presets is not None else \
        image_adapters.presets_for(s.image for s in services.values())
    adapters = {name: image_adapters.adapter_for(s.image, presets, s) for name, s in services.items()}
    # a replica answers to its service's name (with the others: all of them resolve) and its container's
    names = {name: list(dict.fromkeys(n for n in ([s.replica_of, _instance_name(project.name, s)] if s.replica_of
                                                  else [name, s.container_name]) + [s.hostname, *s.aliases] if n))
             for name, s in services.items()}
    launches = {name: _launch(s) for name, s in services.items()}
    runs = {name: launches[name] or _built_launch(_image_cmd(s, images[image_of[name]], options))
            for name, s in services.items()}
    found = _evidence(services, adapters, names, runs, options.image_configs)
    nets: Dict[str, ServiceNet] = {}
    for name, service in services.items():
        config = options.image_configs.get(service.image or "")
        exposed = list(images[image_of[name]].exposed) + (list(config.exposed) if config else [])
        nets[name] = knobs.service_net(service, adapters[name], runs[name], exposed, found[name], names[name])
    model_servers = {name: a.family for name, a in adapters.items() if a is not None and a.model_server}
    return Discovery(services, images, image_of, presets, adapters, model_servers, names, launches, nets, warnings,
                     healthcheck_from)


def _launch(service: Service) -> Optional[List[str]]:
    """The argv the start script runs, as compose says it; None: the image's ENTRYPOINT and CMD."""
    if service.entrypoint is not None:
        return list(service.entrypoint) + list(service.command or [])
    if service.command is not None:
        return [RUNSCRIPT] + list(service.command)
    return None


def _image_cmd(service: Service, source: ImageSource, options: PlanOptions) -> Optional[List[str]]:
    """The image's CMD where known: its Dockerfile's (built here), or its registry configuration's."""
    config = options.image_configs.get(service.image or "") if source.kind != "build" else None
    return source.cmd if source.kind == "build" else (list(config.cmd) if config and config.cmd else None)


def _built_launch(cmd: Optional[List[str]]) -> Optional[List[str]]:
    """What an image runs without a command: its runscript given the image's CMD, as it would be
    without arguments. Where that CMD says `--port 9000`, the planner sees it and can tell it
    another (the launch then says it, else it stays the image's own)."""
    return [RUNSCRIPT, *cmd] if cmd else None


def _evidence(services: Dict[str, Service], adapters: Dict[str, Optional[Adapter]], names: Dict[str, List[str]],
              launches: Dict[str, Optional[List[str]]], image_configs: Dict[str, Any]) -> Dict[str, Found]:
    """Where each service listens, as its own settings, its image's ENV and its clients say. The
    image's ENV (`PORT=3000`, `HOSTNAME=0.0.0.0`) is what its author set for the program to read."""
    peers = {n.lower() for ns in names.values() for n in ns}
    shared = _shared_settings(services)
    found: Dict[str, Found] = {}
    for name, service in services.items():
        found[name] = Found()
        adapter = adapters[name]
        config = image_configs.get(service.image or "")
        environment = {**(config.env if config else {}), **service.environment}
        knobs.from_environment(environment, peers - {n.lower() for n in names[name]}, found[name],
                               knobs.read_by(adapter.address, adapter.ports) if adapter else None, shared)
        if launches[name] is not None:
            knobs.from_argv(launches[name], found[name])
        if service.healthcheck is not None:
            knobs.from_healthcheck(list(service.healthcheck.test), found[name])
    finder = References(names)
    replicas = {name: [n for n, s in services.items() if s.replica_of and s.replica_of == service.replica_of]
                for name, service in services.items() if service.replica_of}


    def each_replica(name: str) -> _Many:  # what a client says of one replica of a service, it says of each
        return _Many([found[n] for n in replicas.get(name, [name])])

    for name, service in services.items():  # what clients say: `db:5432`, `http://web/`, DB_HOST + DB_PORT
        pairs = [(host, port) for _, host, port in host_port_pairs(service.environment)]
        texts = [text for _, text in texts_of(service)]
        local = set().union(*(image_adapters.names_not_hosts(text) for text in texts))
        for server, port in [r for text in texts for r in finder.references(text, local)] + \
                [(finder.service_of[h], p) for h, p in pairs if h in finder.service_of]:
            each_replica(server).saw(port, "own settings" if server == name else f"referenced by {name}")
        for key, value in service.environment.items():  # CACHE_HOST=cache: a client on cache's default port
            server = finder.service_of.get(value or "") if key.endswith(_HOST_KEYS) else None
            if server is not None and server != name and adapters[server] is not None:
                if not any(k.endswith("_PORT") and k[:-5] == key.rsplit("_", 1)[0] for k in service.environment):
                    for port in adapters[server].ports:
                        each_replica(server).saw(port, f"named by {name} ({key})")
    return found


class _Many:
    """Several services' findings as one: what is seen is seen by each."""

    def __init__(self, each: List[Found]):
        self.each = each

    def saw(self, *args: Any) -> None:
        for found in self.each:
            found.saw(*args)


_SETTINGS_FILE = 10  # services with this many settings alike got them from one file (an env_file, an anchor)


def _shared_settings(services: Dict[str, Service]) -> Set[str]:
    """The variables a project hands many programs at once, through one env_file or YAML anchor:
    such a file carries every program's settings, so none of them says what one program reads.
    Services of one image (an api and its worker) share settings because they are one program."""
    settings = {name: {(k, v) for k, v in s.environment.items() if isinstance(v, str)} for name, s in services.items()}
    names = sorted(settings)
    shared: Set[str] = set()
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if _program(services[a]) == _program(services[b]):
                continue
            alike = settings[a] & settings[b]
            if len(alike) >= _SETTINGS_FILE:
                shared |= {k for k, _ in alike}
    return shared


def _program(service: Service) -> Any:
    build = service.raw.get("build")
    return service.image if not build else repr(build)


def _rebuild_with_moved_ports(project: Project, found: Discovery, refs: References, options: PlanOptions) -> None:
    """A build argument that names another service's port that moved (`API_URL=http://api:80`, baked
    into the image) is rewritten like the service's settings, and its image planned again."""
    changed = False
    services = dict(found.services)
    for name, service in found.services.items():
        args = build_args(service) if isinstance(service.build, dict) else {}
        rewritten = {k: refs.rewrite(v) if v is not None else v for k, v in args.items()}
        if rewritten != args:
            services[name] = replace(service, build={**service.build, "args": rewritten})
            changed = True
    if changed:
        found.images = plan_images(list(services.values()), project.working_dir, options.registry_mirrors,
                                   options.image_sources, options.image_configs)
        found.image_of = {name: key for key, source in found.images.items() for name in source.services}


# ---- place -------------------------------------------------------------------------------------

def place(project: Project, found: Discovery, options: PlanOptions, as_written: bool = False) -> NetworkPlan:
    block = options.address_block or default_address_block(project.name, options.uid)
    base = options.port_base if options.port_base is not None else default_port_base(project.name, options.uid)
    if as_written:
        return plan_as_written(list(found.nets.values()), block, base)
    return plan_network(list(found.nets.values()), block, base, loopback=options.loopback)


# ---- draft -------------------------------------------------------------------------------------

def draft(name: str, project: Project, found: Discovery, network: NetworkPlan, refs: References,
          configs: Dict[str, str], options: PlanOptions, as_written: bool = False) -> Draft:
    """One service with the network's decisions applied, finished by its adapter. ``as_written``:
    nothing is told (no knob, no reference rewritten): its tracer gives it a loopback of its own."""
    service, adapter = found.services[name], found.adapters[name]
    config = options.image_configs.get(service.image or "")
    image_volumes = list(found.images[found.image_of[name]].volumes) + (list(config.volumes) if config else [])
    binds, bind_warnings = service_binds(service, project, adapter, image_volumes)
    binds += secrets.mounts(service, project, configs, bind_warnings)
    health = service.healthcheck
    test = list(health.test) if health is not None and not health.disabled and health.test else None
    result = Draft(name=name, service=service, own_address=network.own[name], address=network.address[name],
                   endpoints=network.endpoints[name],
                   environment={k: v for k, v in service.environment.items() if v is not None},
                   launch=found.launches[name], healthcheck=test, binds=binds, configs=configs, refs=refs,
                   tls=options.tls, ssrf_allow=list(options.ssrf_allow), model_servers=found.model_servers,
                   docker_dns=as_written,
                   warnings=_unsupported_warnings(service, isolated=as_written) + bind_warnings)
    if not as_written:
        knobs.tell(result, found.nets[name], adapter,
                   _built_launch(_image_cmd(service, found.images[found.image_of[name]], options)))
        result.environment = {k: v for k, v in refs.rewrite_environment(result.environment, name).items()
                              if v is not None}
        if result.launch is not None:
            result.launch = [refs.rewrite(a, name) for a in result.launch]
        if result.healthcheck is not None:
            result.healthcheck = [refs.rewrite(a, name, own_host=True) for a in result.healthcheck]
    if options.secrets:
        replace = options.secrets
        result.environment = {k: replace(v, k) for k, v in result.environment.items()}
        result.launch = [replace(a) for a in result.launch] if result.launch is not None else None
        result.healthcheck = [replace(a) for a in result.healthcheck] if result.healthcheck is not None else None
    if adapter is not None:
        adapter.finish(result)
    rewrite_bound_files(result, options.secrets)
    flag = _secret_on_command_line(result.launch or [])
    if flag:
        result.warnings.append(f"service {name!r}: its command line carries a secret ({flag}); every user of the "
                               "node can read it with `ps`")
    return result


def _unsupported_warnings(service: Service, isolated: bool) -> List[str]:
    """``isolated``: its tracer keeps it to its networks (plan/reach.py); without one, nothing does."""
    warnings = unsupported_warnings(service.name, service.raw)
    if not isolated and (service.network_mode not in (None, "host") or len(service.networks) > 1):
        warnings.append(f"service {service.name!r}: networks are not isolated; every service has its own "
                        "loopback address on the node's network and reaches every other by name")
    if service.runtime not in (None, "nvidia"):
        warnings.append(f"service {service.name!r}: runtime {service.runtime!r} is ignored")
    if service.limits:
        warnings.append(f"service {service.name!r}: deploy.resources.limits are not enforced (no cgroups); "
                        "the batch job's allocation is the limit")
    return warnings


# a flag named for a secret (`--password`, `--auth-token`, `--api-key`), not `--max-num-batched-tokens`
_SECRET_FLAG = re.compile(r"^-{1,2}[\w-]*(pass(word|wd)?|secret|token|api-?key)(?![a-z])[\w-]*$|^-a$", re.IGNORECASE)


def _secret_on_command_line(argv: List[str]) -> Optional[str]:
    for i, arg in enumerate(argv[:-1]):
        if _SECRET_FLAG.match(arg.split("=", 1)[0]) and (argv[i + 1] or "=" in arg):
            return arg.split("=", 1)[0]
    return None


# ---- assemble ----------------------------------------------------------------------------------

def assemble(project: Project, found: Discovery, network: NetworkPlan, drafts: Dict[str, Draft],
             configs: Dict[str, str], options: PlanOptions) -> Plan:
    services = found.services
    warnings = found.warnings + network.warnings
    levels = _levels(services)
    waited_on = {d.service for s in services.values() for d in s.depends_on
                 if d.condition == "service_completed_successfully"}
    plans: List[ServicePlan] = []
    reach = plan_reach(services, project.config.get("networks") or {})
    unknown_workdir: List[str] = []
    tls_ports: Dict[str, int] = {}
    for name, service in services.items():
        result, adapter = drafts[name], found.adapters[name]
        if result.serves_https:
            tls = result.endpoints[adapter.tls_port]
            if result.docker_dns and tls.forward is None and tls.published:  # as written: a forwarder serves it
                tls.forward = f"{WILDCARD if tls.address in WILDCARDS else tls.address}:{_free_forward_port(network)}"
                warnings.append(f"service {name!r}: --tls: HTTPS is published on {tls.forward} (forwarded to its "
                                f"port {tls.container})")
            tls_ports[name] = int(tls.forward.rsplit(":", 1)[1]) if tls.forward else tls.host
        environment = _env_file_environment(result)
        healthcheck, probe_environment = None, {}
        if result.healthcheck is not None:
            test, probe_environment = _probe_password(name, result.healthcheck, result.warnings)
            healthcheck = {"test": test, "interval": service.healthcheck.interval,
                           "timeout": service.healthcheck.timeout, "retries": service.healthcheck.retries,
                           "start_period": service.healthcheck.start_period,
                           "start_interval": service.healthcheck.start_interval,
                           "from": found.healthcheck_from[name]}
        source = found.images[found.image_of[name]]
        image_config = options.image_configs.get(service.image or "")
        workdir = (service.working_dir or source.workdir or (image_config.workdir if image_config else None)
                   or (adapter.workdir if adapter else None))
        if workdir is None and service.image and source.kind == "docker" and service.image not in options.image_configs:
            unknown_workdir.append(name)
        stop_signal, stop_signal_from = _stop_signal(service, source, image_config)
        image_sets_hostname = ("HOSTNAME=" in source.definition if source.kind == "build" else
                               image_config is None or "HOSTNAME" in image_config.env)
        gpus = [{"count": g.count, "device_ids": list(g.device_ids)} for g in service.gpus]
        if service.runtime == "nvidia" and not gpus:
            gpus = [{"count": -1, "device_ids": []}]
        ports = []
        for port, endpoint in sorted(result.endpoints.items()):
            knob = found.nets[name].listens[port].knob
            how = "fixed" if knob is None else (f"{knob.kind}:{knob.name}" if knob.kind == "env" else
                                                 f"flag:{knob.name}" if knob.kind in ("flag", "argv") else "config")
            if name in tls_ports and port == adapter.tls_port:
                how = "tls"
            ports.append(PortPlan(port, endpoint.host, endpoint.address, endpoint.published, how,
                                  endpoint.evidence, endpoint.required, endpoint.forward))
        if result.docker_dns:
            _trace_privileged(ports, network.port_base)
        plans.append(ServicePlan(
            name=name, instance=_instance_name(project.name, service), image=found.image_of[name], level=levels[name],
            oneshot=name in waited_on, address=network.address[name], names=found.names[name], ports=ports,
            environment=environment, env_file=f"env/{name}.env", launch=result.launch, workdir=workdir,
            binds=result.binds, gpus=gpus, nv=bool(gpus), healthcheck=healthcheck, restart=service.restart,
            depends_on=[{"service": d.service, "condition": d.condition, "required": d.required}
                        for d in service.depends_on],
            stop_signal=stop_signal, stop_signal_from=stop_signal_from, stop_grace_period=service.stop_grace_period,
            ulimits={k: [soft, hard] for k, (soft, hard) in service.ulimits.items()},
            writable_tmpfs=bool(knobs.hints(service).get("writable_tmpfs")),
            hostname_env=not image_sets_hostname and "HOSTNAME" not in service.environment,
            adapter=adapter.family if adapter else None, check=list(adapter.check) if adapter else [],
            warnings=result.warnings,
            fakeroot=_fakeroot(service, adapter), probe_environment=probe_environment,
            host_network=service.network_mode == "host", needs_loopback=network.needs_loopback.get(name, ""),
            replica_of=service.replica_of, reach=reach[name].to_json(), reach_limited=restricted(reach, name)))
        warnings.extend(result.warnings)
    if found.presets:
        warnings.append("preset " + ", ".join(sorted(found.presets)) + ": its adapters shape "
                        + ", ".join(sorted(n for n, a in found.adapters.items() if a is not None and a.preset)))
    if unknown_workdir:
        warnings.append("the WORKDIR of the images of " + ", ".join(sorted(unknown_workdir)) + " is unknown (their "
                        "registry was not asked); they start in your home directory unless `working_dir` is set")
    plans.sort(key=lambda p: (p.level, p.name))
    tls = None
    if options.tls:
        tls = {"cert": "tls/cert.pem", "key": "tls/key.pem", "ports": tls_ports,
               "source": list(options.tls_files) if options.tls_files else None}
        if not tls_ports:
            warnings.append(f"--tls: no {' or '.join(image_adapters.tls_families())} service to serve HTTPS; "
                            "nothing was changed")
    images = {k: ImagePlan(s.kind, s.ref, s.services, f"definitions/{k}.def", f"sif/{k}.sif", s.digest, s.definition,
                           [f"{name} pre_start[{i}]" for name, i in s.steps])
              for k, s in found.images.items()}
    return Plan(project=project.name, compose_files=project.files, state_dir=STATE,
                address_block=network.address_block, port_base=network.port_base,
                hosts=_hosts(services, found.names, network, warnings), tls=tls, images=images, services=plans,
                configs=configs, warnings=list(dict.fromkeys(warnings)),
                entry_points=_entry_points(plans, found.adapters),
                generated_secrets=dict(options.secrets.chosen) if options.secrets else {},
                registry_mirrors=options.registry_mirrors.to_json())


def _free_forward_port(network: NetworkPlan) -> int:
    """A port of the block's lower half no forwarder of the plan publishes (nor the DNS server's)."""
    used = {int(e.forward.rsplit(":", 1)[1]) for endpoints in network.endpoints.values()
            for e in endpoints.values() if e.forward}
    return next(p for p in range(network.port_base, network.port_base + PORT_BLOCK)
                if p not in used and p != dns_port(network.port_base))


def _instance_name(project: str, service: Service) -> str:
    name = service.container_name or f"{project}-{service.name}"
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name)


def _levels(services: Dict[str, Service]) -> Dict[str, int]:
    """Start level: 0 for services that depend on nothing, else one above their deepest dependency.
    Iterative, so that a chain of thousands of services needs no deep recursion (cycles were
    rejected by the loader)."""
    levels: Dict[str, int] = {}
    for root in services:
        stack = [root]
        while stack:
            name = stack[-1]
            if name in levels:
                stack.pop()
                continue
            deps = [d.service for d in services[name].depends_on if d.service in services]
            missing = [d for d in deps if d not in levels]
            if missing:
                stack.extend(missing)
                continue
            levels[name] = 1 + max((levels[d] for d in deps), default=-1)
            stack.pop()
    return levels


# `sh -c _WITH_BASH compose2sif-env N NAME=VALUE... RUNSCRIPT ARGS...`: runs `env -- NAME=VALUE...
# bash RUNSCRIPT ARGS...` (without bash in the image, `env -- NAME=VALUE... RUNSCRIPT ARGS...`). The
# runscript is an sh script, and dash, Debian's sh, drops variables whose names are not shell names
# before it execs the program; bash passes them on. The values stay data: positional arguments.
_WITH_BASH = ('n=$1; shift; b=; command -v bash >/dev/null 2>&1 && b=bash; i=0; c=$#; '
              'while [ "$i" -lt "$c" ]; do a=$1; shift; set -- "$@" "$a"; i=$((i + 1)); '
              'if [ "$i" -eq "$n" ] && [ -n "$b" ]; then set -- "$@" "$b"; fi; done; exec env -- "$@"')


def _env_file_environment(result: Draft) -> Dict[str, str]:
    """The environment an --env-file can carry. The other names (`discovery.type`, which programs
    read as settings) reach the program through `env NAME=VALUE` in front of its launch line, each
    one word, quoted as data like the rest of the argv; only a name holding `=` cannot."""
    others = sorted(k for k in result.environment if not _VALID_NAME.match(k))
    carried = [f"{k}={result.environment[k]}" for k in others if k and "=" not in k and "\0" not in k]
    for key in others:
        if not key or "=" in key or "\0" in key:
            result.warnings.append(f"service {result.name!r}: environment variable {key!r} cannot be passed to a "
                                   "program (its name holds `=`); skipped")
    for key in others:
        if re.search(r"pass(word|wd)?|secret|token|api.?key", key, re.IGNORECASE):
            result.warnings.append(f"service {result.name!r}: environment variable {key!r} is not a shell name, so it "
                                   "reaches the program on `env`'s command line, which every user of the node can "
                                   "read with `ps` while it starts")
    if carried:
        launch = result.launch or [RUNSCRIPT]
        if launch[0] == RUNSCRIPT:  # run by bash where the image has it: its sh (dash) drops such names
            result.launch = ["/bin/sh", "-c", _WITH_BASH, "compose2sif-env", str(len(carried)), *carried, *launch]
        else:
            result.launch = ["env", "--", *carried, *launch]
    return {k: v for k, v in result.environment.items() if _VALID_NAME.match(k)}


def _probe_password(name: str, test: List[str], warnings: List[str]) -> Tuple[List[str], Dict[str, str]]:
    """A password on a healthcheck's command line is in the node's process list, for every user, at
    every probe. In the CMD form of a client that also reads it from a variable (the adapters'
    PasswordClients) it moves to that variable of the probe's own environment; in a CMD-SHELL it
    cannot be, and is warned about. Returns (test, the probe's added environment)."""
    if test[:1] == ["CMD"] and len(test) > 1:
        client = image_adapters.PASSWORD_CLIENTS.get(os.path.basename(test[1]))
        if client is not None:
            kept, secret = client.take_password(test[2:])
            if secret is not None:
                return ["CMD", test[1], *kept], {client.variable: secret}
    if test[:1] == ["CMD-SHELL"] and len(test) > 1:
        client = next((c for c in image_adapters.PASSWORD_CLIENTS.values()
                       if re.search(c.shell_pattern(), f" {test[1]} ")), None)
        if client is not None:
            warnings.append(f"service {name!r}: its healthcheck passes a password on a command line, which every user "
                            "of the node sees in the process list at each probe; write it in the CMD form (compose2sif "
                            f"then moves the password to the environment) or set {client.variable}")
    return test, {}


def _healthcheck(service: Service, source: ImageSource, image_config) -> Tuple[Optional[Healthcheck], str]:
    """The service's healthcheck and where it comes from. As Docker merges them: the compose file's
    fields, and what it leaves unset (its test, too, where it gives only timings) from the image's
    HEALTHCHECK (its registry config, or the Dockerfile of a build); no compose healthcheck at all:
    the image's. `disable: true` or a test of NONE: none."""
    image = source.healthcheck if source.kind == "build" else (image_config.healthcheck if image_config else None)
    where = "Dockerfile HEALTHCHECK" if source.kind == "build" else f"image config of {service.image}"
    own = service.healthcheck
    if own is None:
        return image, (where if image is not None else "")
    merged = own.inherit(image)
    if merged is own:
        return own, "compose file"
    taken = sorted(merged.given - own.given, key=HEALTHCHECK_FIELDS.index)
    return merged, f"compose file; {', '.join(taken)} from the {where}"


def _stop_signal(service: Service, source: ImageSource, image_config) -> Tuple[str, str]:
    """The signal `down` sends first, and where it comes from: the compose file's stop_signal, else
    the image's STOPSIGNAL (its registry config, or the Dockerfile of a build), else SIGTERM, as
    Docker chooses."""
    if service.stop_signal:
        return service.stop_signal, "compose file"
    if source.kind == "build" and source.stop_signal:
        return source.stop_signal, "Dockerfile STOPSIGNAL"
    if source.kind != "build" and image_config is not None and image_config.stop_signal:
        return image_config.stop_signal, f"image config of {service.image}"
    if source.kind == "build":
        return "SIGTERM", "default (the Dockerfile sets no STOPSIGNAL)"
    if image_config is None:
        return "SIGTERM", "default (the image's config was not read: convert without --offline reads its STOPSIGNAL)"
    return "SIGTERM", "default (the image sets no STOPSIGNAL)"


def _trace_privileged(ports: List[PortPlan], port_base: int) -> None:
    """As written, the tracer moves a privileged bind onto the block's upper half. Each privileged
    port the plan knows gets its place there now (c2s-loopback --map P:Q), the same for every
    service (each has its own address), so that its forwarders start before the bind happens and
    a published port the service never binds is served as Docker serves one: connections closed."""
    first = port_base + PORT_BLOCK // 2
    for i, port in enumerate(sorted((p for p in ports if p.host < 1024), key=lambda p: p.host)):
        port.traced_port = first + i


def _fakeroot(service: Service, adapter: Optional[Adapter]) -> Optional[Dict[str, Any]]:
    needs = adapter.fakeroot(service) if adapter else None
    if needs is None and _asks_for_root(service.user):
        # root's id or group inside (an entrypoint that checks `id -g` is 0, as Airflow's does, or
        # that chowns): `--fakeroot`, which needs no more than id 0 mapped to the user
        needs = (0, f"service {service.name!r}: `user: {service.user}` asks for root's "
                    f"{'user' if _asks_for_root(service.user.split(':')[0]) else 'group'} inside, which needs "
                    "apptainer --fakeroot, and this node does not give it; it runs as you, and an entrypoint "
                    "that checks for it may stop")
    return {"ids": needs[0], "without": needs[1]} if needs else None


def _asks_for_root(user: Optional[str]) -> bool:
    """`user: 0`, `root`, `X:0`, `X:root`: root's id or group."""
    return user is not None and any(part.strip() in ("0", "root") for part in user.split(":")[:2])


def _entry_points(plans: List[ServicePlan], adapters: Dict[str, Optional[Adapter]]) -> List[Dict[str, Any]]:
    """The published endpoints of web fronts, which `up` points people at."""
    def published(port: PortPlan) -> Tuple[str, int]:  # a forwarder's, where one publishes it
        if port.forward:
            address, number = port.forward.rsplit(":", 1)
            return address, int(number)
        return port.address, port.host
    return [{"service": p.name, "address": published(port)[0], "port": published(port)[1],
             "container": port.container, "scheme": "https" if port.how == "tls" else "http", "path": adapters[p.name].entry_path}
            for p in plans if adapters[p.name] is not None and adapters[p.name].entry_path
            for port in p.ports if port.published and (port.container == adapters[p.name].entry_port
                                                        or port.how == "tls")]


def _hosts(services: Dict[str, Service], names: Dict[str, List[str]], network: NetworkPlan, warnings: List[str]):
    """The hosts file: each service's names at its address; host.docker.internal and host-gateway
    at the node (network.gateway: 127.0.0.1 in the fallback; as written, the project's gateway
    127.A.B.1, since the tracer takes 127.0.0.1 for the service's own loopback); extra_hosts as given."""
    lines: List[Tuple[str, List[str]]] = []
    owner: Dict[str, str] = {}
    for name in sorted(services):
        mine = []
        for alias in names[name]:
            if alias in owner and services[owner[alias]].replica_of and \
                    services[owner[alias]].replica_of == services[name].replica_of:
                mine.append(alias)  # a replica's service name: each replica's address, as Docker's DNS has it
                continue
            if alias in owner:
                warnings.append(f"services {owner[alias]!r} and {name!r} share the name {alias!r}; it points at "
                                f"{owner[alias]!r}")
                continue
            owner[alias] = name
            mine.append(alias)
        lines.append((network.names_address(name), mine))
    lines.append((network.gateway, ["host.docker.internal"]))
    extra = set()
    for service in services.values():
        for entry in service.extra_hosts:
            host, _, ip = entry.partition("=") if "=" in entry else entry.partition(":")
            extra.add((host, network.gateway if ip == "host-gateway" else ip))
    lines += [(ip, [host]) for host, ip in sorted(extra)]
    return lines
