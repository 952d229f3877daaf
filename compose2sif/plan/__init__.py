"""Stage 3: decisions. From typed services to a plan that the renderer writes out and run.sh runs.

For every service: its instance name, image (SIF), start level, its own loopback address and
where each of its ports listens (network.py), how it is told (knobs.py and the image's adapter),
the env file contents, binds (volumes, scratch dirs, rendered configs), GPUs, healthcheck, restart
policy, and a warning for everything Apptainer cannot do. The plan is plain data (types.py;
``Plan.to_json()`` is plan.json). Knowledge of particular images lives in compose2sif.adapters.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from compose2sif import adapters as image_adapters  # a module: adapters import plan.knobs, plan.network
from compose2sif.errors import ComposeError
from compose2sif.load import Project
from compose2sif.model import Service, services as typed_services
from compose2sif.plan import knobs, secrets
from compose2sif.plan.images import ImageSource, plan_images
from compose2sif.plan.knobs import Found, Knob
from compose2sif.plan.network import (IMAGE_DEFAULT, IMAGE_EXPOSE, Listen, References, ServiceNet,
                                      default_port_base, free_address_block, host_port_pairs, node_listeners,
                                      plan_network, strong)
from compose2sif.plan.generated import Replacer
from compose2sif.plan.types import Bind, Plan, PortPlan, ServicePlan
from compose2sif.support import unsupported_warnings

_HOST_KEYS = ("_HOST", "_HOSTNAME", "_ADDR", "_SERVER")
STATE = "state"  # relative to the output directory; created private (0700) by run.sh
RUNSCRIPT = "/.singularity.d/runscript"

__all__ = ["Bind", "Plan", "PlanOptions", "PortPlan", "ServicePlan", "build_plan", "image_definitions"]


@dataclass
class PlanOptions:
    registry_mirror: Optional[str] = None
    image_sources: Dict[str, str] = field(default_factory=dict)   # service -> KIND:PATH
    port_base: Optional[int] = None                               # first port of the block moved ports go to
    address_block: Optional[str] = None                           # 127.A.B: the services' /24 of addresses
    uid: Optional[int] = None
    busy: Optional[Set[Tuple[str, int]]] = None                   # (address, port) listening on the node
    presets: Optional[Set[str]] = None                            # image-family presets (dify); default: detected
    secrets: Optional[Replacer] = None                            # generated values for public default secrets
    ssrf_allow: List[str] = field(default_factory=list)           # private destinations SSRF proxies may reach
    image_configs: Dict[str, Any] = field(default_factory=dict)   # image ref -> registry.ImageConfig
    tls: bool = False                                             # HTTPS in front of each nginx service
    tls_files: Optional[Tuple[str, str]] = None                   # (cert, key); default: a self-signed pair


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


def _hints(service: Service) -> Dict[str, Any]:
    hints = service.extensions.get("x-compose2sif") or {}
    if not isinstance(hints, dict):
        raise ComposeError("must be a mapping", path=f"services.{service.name}.x-compose2sif")
    return hints


def _hint_knob(spec: Any, what: str, path: str) -> Optional[Knob]:
    """{env: NAME[, template: ...]}, {flag: --name} or {fixed: true} (None: known, cannot be told)."""
    if isinstance(spec, dict) and spec.get("fixed") is True and len(spec) == 1:
        return None
    if isinstance(spec, dict) and isinstance(spec.get("env"), str) and spec["env"]:
        return Knob("env", spec["env"], str(spec.get("template", "{%s}" % what)))
    if isinstance(spec, dict) and isinstance(spec.get("flag"), str) and spec["flag"].startswith("-"):
        return Knob("flag", spec["flag"], "{%s}" % what)
    raise ComposeError(f"expected {{env: NAME}}, {{flag: --name}} or {{fixed: true}}, not {spec!r}", path=path)


def _launch(service: Service) -> Optional[List[str]]:
    """The argv the start script runs, as compose says it; None: the image's ENTRYPOINT and CMD."""
    if service.entrypoint is not None:
        return list(service.entrypoint) + list(service.command or [])
    if service.command is not None:
        return [RUNSCRIPT] + list(service.command)
    return None


def _service_net(service: Service, adapter: Optional[image_adapters.Adapter], launch: Optional[List[str]], exposed: List[int],
                 found: Found, peers: Set[str], names: List[str]) -> ServiceNet:
    """Everything that says where the service listens, and the knobs that can tell it otherwise."""
    path = f"services.{service.name}.x-compose2sif"
    hints = _hints(service)
    flags_work = launch is not None or (adapter is not None and adapter.default_command is not None)

    def usable(knob: Optional[Knob]) -> Optional[Knob]:
        if knob is None or (knob.kind == "flag" and not flags_work):
            return None
        if knob.kind == "config" and adapter is not None and not adapter.configurable(service):
            return None
        return knob

    evidence: Dict[int, List[str]] = {}
    port_knobs: Dict[int, Optional[Knob]] = {}
    fixed: Set[int] = set()

    def saw(port: int, where: str) -> None:
        evidence.setdefault(port, [])
        if where not in evidence[port]:
            evidence[port].append(where)

    hinted = hints.get("ports") or {}
    if not isinstance(hinted, dict):
        raise ComposeError("must be a mapping of port numbers", path=f"{path}.ports")
    for key, spec in hinted.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and 0 < int(key) < 65536):
            raise ComposeError(f"{key!r} is not a port number", path=f"{path}.ports")
        knob = _hint_knob(spec, "port", f"{path}.ports.{key}")
        saw(int(key), "x-compose2sif")
        if knob is None:
            fixed.add(int(key))
        port_knobs.setdefault(int(key), knob)
    for port, knob in (adapter.ports if adapter else {}).items():
        if knob.kind == "config":  # the adapter renders the config: its `listen` is the knob
            port_knobs.setdefault(port, knob)
    for port, where in found.evidence.items():
        for w in where:
            saw(port, w)
        if port in found.ports:
            port_knobs.setdefault(port, found.ports[port])
    for port, knob in (adapter.ports if adapter else {}).items():
        saw(port, IMAGE_DEFAULT)
        port_knobs.setdefault(port, knob)
    listens: Dict[int, Listen] = {}
    for mapping in service.ports:
        if mapping.protocol != "tcp":
            continue
        saw(mapping.target, "ports")
        listens.setdefault(mapping.target, Listen(mapping.target, [], None, mapping.published or "", mapping.host_ip))
    for item in service.raw.get("expose") or []:
        first, _, last = str(item).split("/")[0].partition("-")  # "9000", "7000-7002", "53/udp"
        if first.isdigit() and (last or first).isdigit() and not str(item).endswith("/udp"):
            for port in range(int(first), min(int(last or first), int(first) + 100) + 1):
                saw(port, "expose")
    for port in exposed:
        saw(port, IMAGE_EXPOSE)
    for port, where in sorted(evidence.items()):
        if all(e.startswith("variable ") for e in where) and not strong(where):
            continue  # only a FOO_PORT variable says so: it knows the port, it does not prove a listener
        listen = listens.setdefault(port, Listen(port, [], None))
        listen.evidence = where
        listen.knob = None if port in fixed else usable(port_knobs.get(port))
        listen.weak = not strong(where)
    address_hint = hints.get("bind_address")
    if address_hint is not None:
        address_knobs = [_hint_knob(address_hint, "address", f"{path}.bind_address")]
    elif adapter is not None and adapter.address is not None and adapter.address.kind == "config":
        address_knobs = [adapter.address]
    else:  # the service's own settings, and the adapter's knob where they do not name it
        address_knobs = list(found.addresses)
        if adapter is not None and adapter.address is not None and \
                all(k.name != adapter.address.name for k in address_knobs):
            address_knobs.append(adapter.address)
    return ServiceNet(service.name, names, listens, [k for k in map(usable, address_knobs) if k is not None],
                      per_port_address=bool(adapter and adapter.per_port_address))


def _tell(draft: image_adapters.Draft, net: ServiceNet, adapter: Optional[image_adapters.Adapter]) -> None:
    """Set the knobs: the service's address (unless it listens on all), and each moved port."""
    values: List[Tuple[Knob, Dict[str, Any]]] = []   # knob, {address, port, value}
    if draft.address not in ("0.0.0.0", "::"):
        for knob in net.address_knobs:
            port = next((e.host for e in draft.endpoints.values() if net.listens[e.container].knob == knob), "")
            values.append((knob, {"address": draft.address, "port": port, "value": draft.address}))
    for endpoint in draft.endpoints.values():
        knob = net.listens[endpoint.container].knob
        if endpoint.moved and knob is not None and knob not in net.address_knobs:
            values.append((knob, {"address": endpoint.address, "port": endpoint.host, "value": endpoint.host}))
    edits, flags = [], []
    for knob, value in values:
        text = knob.template.format(**value)
        if knob.kind == "env":
            draft.environment[knob.name] = text
        elif knob.kind == "argv":
            edits.append((knob.where, text))
        elif knob.kind == "flag":
            flags.append((knob, text))
    if edits:
        draft.launch = knobs.apply_argv_edits(draft.launch, edits)
    if flags:
        if draft.launch is None:
            draft.launch = [RUNSCRIPT, *adapter.default_command]
        for knob, text in flags:
            draft.launch = knobs.set_flag(draft.launch, knob.name, text, knob.append)


_TEXT_LIMIT = 256 * 1024


def _bound_texts(bind: Bind) -> List[Tuple[str, str, str]]:
    """(host path, path in the instance, text) of the small text files a bind mount brings in."""
    files: List[Tuple[str, str]] = []
    if os.path.isfile(bind.source):
        files = [(bind.source, bind.target)]
    elif os.path.isdir(bind.source):
        for folder, dirs, names in os.walk(bind.source):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))[:20]
            for name in sorted(names):
                path = os.path.join(folder, name)
                files.append((path, os.path.join(bind.target, os.path.relpath(path, bind.source))))
                if len(files) >= 200:
                    break
    texts = []
    for path, target in files:
        try:
            if os.path.getsize(path) > _TEXT_LIMIT:
                continue
            with open(path, "rb") as fh:
                data = fh.read()
            if b"\0" in data:
                continue
            texts.append((path, target, data.decode("utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return texts


def _rewrite_bound_files(draft: image_adapters.Draft, secrets: Optional[Replacer]) -> None:
    """A bound text config that names a moved port, or a public default secret, gets a rewritten
    copy bound over it."""
    extra: List[Bind] = []
    for path, content in list(draft.configs.items()):
        if secrets and path.startswith(f"config/{draft.name}/"):
            draft.configs[path] = secrets(content)
    for bind in draft.binds:
        if bind.kind != "bind":
            continue
        for _, target, text in _bound_texts(bind):
            rewritten = draft.refs.rewrite(text, draft.name)
            if secrets:
                rewritten = secrets(rewritten)
            if rewritten != text:
                path = f"config/{draft.name}/files{target}"
                draft.configs[path] = rewritten
                if target == bind.target:
                    bind.source, bind.kind, bind.read_only, bind.create = path, "config", True, False
                else:
                    extra.append(Bind(path, target, True, "config", False))
                draft.warnings.append(f"service {draft.name!r}: {target} names a moved port or a public default "
                                      f"secret; a rewritten copy is bound there ({path})")
    draft.binds.extend(extra)


def _texts_of(service: Service) -> List[Tuple[str, str]]:
    """(where, text) of everything of a service that may name another service's port."""
    texts = [(f"env {k}", v) for k, v in service.environment.items() if isinstance(v, str)]
    texts += [("command", a) for a in (service.entrypoint or []) + (service.command or [])]
    if service.healthcheck is not None:
        texts += [("healthcheck", a) for a in service.healthcheck.test]
    for mount in service.mounts:
        if mount.type == "bind" and mount.source:
            texts += [(target, text) for _, target, text in _bound_texts(Bind(mount.source, mount.target))]
    return texts


def build_plan(project: Project, options: Optional[PlanOptions] = None) -> Plan:
    options = options or PlanOptions()
    services = typed_services(project)
    warnings: List[str] = list(project.warnings) + (options.secrets.notes if options.secrets else [])
    images = plan_images(list(services.values()), project.working_dir, options.registry_mirror, options.image_sources,
                         options.image_configs)
    image_of = {name: key for key, source in images.items() for name in source.services}
    for source in images.values():
        warnings.extend(source.warnings)

    presets = options.presets if options.presets is not None else \
        image_adapters.presets_for(s.image for s in services.values())
    adapters = {name: image_adapters.adapter_for(s.image, presets) for name, s in services.items()}
    model_servers = {name: a.family for name, a in adapters.items() if a is not None and a.model_server}
    names = {name: list(dict.fromkeys(n for n in [name, s.container_name, s.hostname, *s.aliases] if n))
             for name, s in services.items()}
    launches = {name: _launch(s) for name, s in services.items()}
    peers = {n.lower() for ns in names.values() for n in ns}
    found: Dict[str, Found] = {}
    for name, service in services.items():
        found[name] = Found()
        adapter = adapters[name]
        knobs.from_environment(service.environment, peers - {n.lower() for n in names[name]}, found[name],
                               knobs.read_by(adapter.address, adapter.ports) if adapter else None)
        if launches[name] is not None:
            knobs.from_argv(launches[name], found[name])
        if service.healthcheck is not None:
            knobs.from_healthcheck(list(service.healthcheck.test), found[name])
    finder = References(names)
    for name, service in services.items():  # what clients say: `db:5432`, `http://web/`, DB_HOST + DB_PORT
        texts = _texts_of(service)
        pairs = [(host, port) for _, host, port in host_port_pairs(service.environment)]
        for server, port in [r for _, text in texts for r in finder.references(text)] + \
                [(finder.service_of[h], p) for h, p in pairs if h in finder.service_of]:
            found[server].saw(port, "own settings" if server == name else f"referenced by {name}")
        for key, value in service.environment.items():  # REDIS_HOST=cache: a client on cache's default port
            server = finder.service_of.get(value or "") if key.endswith(_HOST_KEYS) else None
            if server is not None and server != name and adapters[server] is not None:
                if not any(k.endswith("_PORT") and k[:-5] == key.rsplit("_", 1)[0] for k in service.environment):
                    for port in adapters[server].ports:
                        found[server].saw(port, f"named by {name} ({key})")
    nets: Dict[str, ServiceNet] = {}
    for name, service in services.items():
        source = images[image_of[name]]
        config = options.image_configs.get(service.image or "")
        exposed = list(source.exposed) + (list(config.exposed) if config else [])
        nets[name] = _service_net(service, adapters[name], launches[name], exposed, found[name], peers, names[name])

    busy = node_listeners() if options.busy is None else set(options.busy)
    block = options.address_block or free_address_block(project.name, busy, options.uid)
    base = options.port_base if options.port_base is not None else default_port_base(project.name, options.uid)
    network = plan_network(list(nets.values()), block, base, busy)
    warnings += network.warnings
    refs = References(names, network)

    levels = _levels(services)
    waited_on = {d.service for s in services.values() for d in s.depends_on
                 if d.condition == "service_completed_successfully"}
    configs: Dict[str, str] = {}
    plans: List[ServicePlan] = []
    unknown_workdir: List[str] = []
    tls_ports: Dict[str, int] = {}
    for name, service in services.items():
        adapter = adapters[name]
        binds, bind_warnings = _binds(service, project, adapter)
        binds += secrets.mounts(service, project, configs, bind_warnings)
        test = list(service.healthcheck.test) if (service.healthcheck is not None and not service.healthcheck.disabled
                                                  and service.healthcheck.test) else None
        draft = image_adapters.Draft(name=name, service=service, own_address=network.own[name], address=network.address[name],
                      endpoints=network.endpoints[name],
                      environment={k: v for k, v in service.environment.items() if v is not None},
                      launch=launches[name], healthcheck=test, binds=binds, configs=configs, refs=refs,
                      tls=options.tls, tls_ports=tls_ports,
                      options={"ssrf_allow": options.ssrf_allow, "model_servers": model_servers},
                      warnings=_unsupported_warnings(service) + bind_warnings)
        _tell(draft, nets[name], adapter)
        draft.environment = {k: v for k, v in refs.rewrite_environment(draft.environment, name).items()
                             if v is not None}
        if draft.launch is not None:
            draft.launch = [refs.rewrite(a, name) for a in draft.launch]
        if draft.healthcheck is not None:
            draft.healthcheck = [refs.rewrite(a, name, own_host=True) for a in draft.healthcheck]
        if options.secrets:
            replace = options.secrets
            draft.environment = {k: replace(v, k) for k, v in draft.environment.items()}
            draft.launch = [replace(a) for a in draft.launch] if draft.launch is not None else None
            draft.healthcheck = [replace(a) for a in draft.healthcheck] if draft.healthcheck is not None else None
        if adapter is not None:
            adapter.finish(draft)
        _rewrite_bound_files(draft, options.secrets)
        if draft.launch and _secret_on_command_line(draft.launch):
            draft.warnings.append(f"service {name!r}: its command line carries a secret "
                                  f"({_secret_on_command_line(draft.launch)}); every user of the node can read it "
                                  "with `ps`")
        healthcheck = None
        if draft.healthcheck is not None:
            healthcheck = {"test": draft.healthcheck, "interval": service.healthcheck.interval,
                           "timeout": service.healthcheck.timeout, "retries": service.healthcheck.retries,
                           "start_period": service.healthcheck.start_period,
                           "start_interval": service.healthcheck.start_interval}
        source = images[image_of[name]]
        image_config = options.image_configs.get(service.image or "")
        workdir = (service.working_dir or source.workdir or (image_config.workdir if image_config else None)
                   or (adapter.workdir if adapter else None))
        if workdir is None and service.image and source.kind == "docker" and service.image not in options.image_configs:
            unknown_workdir.append(name)
        gpus = [{"count": g.count, "device_ids": list(g.device_ids)} for g in service.gpus]
        if service.runtime == "nvidia" and not gpus:
            gpus = [{"count": -1, "device_ids": []}]
        ports = []
        for port, endpoint in sorted(draft.endpoints.items()):
            knob = nets[name].listens[port].knob
            how = "fixed" if knob is None else (f"{knob.kind}:{knob.name}" if knob.kind == "env" else
                                                 f"flag:{knob.name}" if knob.kind in ("flag", "argv") else "config")
            if name in tls_ports and port == 443:
                how = "tls"
            ports.append(PortPlan(port, endpoint.host, endpoint.address, endpoint.published, how,
                                  endpoint.evidence, endpoint.required))
        stop_grace = service.raw.get("stop_grace_period")
        plans.append(ServicePlan(
            name=name, instance=_instance_name(project.name, service), image=image_of[name], level=levels[name],
            oneshot=name in waited_on, address=network.address[name], names=names[name], ports=ports,
            environment=draft.environment, env_file=f"env/{name}.env", launch=draft.launch, workdir=workdir,
            binds=draft.binds, gpus=gpus, nv=bool(gpus), healthcheck=healthcheck, restart=service.restart,
            depends_on=[{"service": d.service, "condition": d.condition, "required": d.required}
                        for d in service.depends_on],
            stop_signal=str(service.raw.get("stop_signal") or "SIGTERM"),
            stop_grace_period=_seconds(stop_grace, 10.0),
            ulimits={k: [soft, hard] for k, (soft, hard) in service.ulimits.items()},
            writable_tmpfs=bool(_hints(service).get("writable_tmpfs")),
            adapter=adapter.family if adapter else None, warnings=draft.warnings,
            fakeroot=_fakeroot(service, adapter)))
        warnings.extend(draft.warnings)
    if presets:
        warnings.append("preset " + ", ".join(sorted(presets)) + ": its adapters shape "
                        + ", ".join(sorted(n for n, a in adapters.items() if a is not None and a.preset)))
    if unknown_workdir:
        warnings.append("the WORKDIR of the images of " + ", ".join(sorted(unknown_workdir)) + " is unknown (their "
                        "registry was not asked); they start in your home directory unless `working_dir` is set")
    plans.sort(key=lambda p: (p.level, p.name))
    entry_points = [{"service": p.name, "address": port.address, "port": port.host,
                     "scheme": "https" if port.how == "tls" else "http", "path": adapters[p.name].entry_path}
                    for p in plans if adapters[p.name] is not None and adapters[p.name].entry_path
                    for port in p.ports if port.published and (port.container == 80 or port.how == "tls")]
    tls = None
    if options.tls:
        tls = {"cert": "tls/cert.pem", "key": "tls/key.pem", "ports": tls_ports,
               "source": list(options.tls_files) if options.tls_files else None}
        if not tls_ports:
            warnings.append("--tls: no nginx service to serve HTTPS; nothing was changed")
    return Plan(project=project.name, compose_files=project.files, state_dir=STATE, address_block=block,
                port_base=base, hosts=_hosts(services, names, network, warnings), tls=tls,
                images={k: {"kind": s.kind, "ref": s.ref, "services": s.services, "definition": f"definitions/{k}.def",
                            "sif": f"sif/{k}.sif", "digest": s.digest} for k, s in images.items()},
                services=plans, configs=configs, warnings=_dedupe(warnings), entry_points=entry_points)


def _hosts(services: Dict[str, Service], names: Dict[str, List[str]], network, warnings: List[str]):
    """The hosts file: each service's names at its address; host.docker.internal and host-gateway
    at the node's 127.0.0.1; extra_hosts as given."""
    lines: List[Tuple[str, List[str]]] = []
    owner: Dict[str, str] = {}
    for name in sorted(services):
        mine = []
        for alias in names[name]:
            if alias in owner:
                warnings.append(f"services {owner[alias]!r} and {name!r} share the name {alias!r}; it points at "
                                f"{owner[alias]!r}")
                continue
            owner[alias] = name
            mine.append(alias)
        lines.append((network.names_address(name), mine))
    lines.append(("127.0.0.1", ["host.docker.internal"]))
    extra = set()
    for service in services.values():
        for entry in service.extra_hosts:
            host, _, ip = entry.partition("=") if "=" in entry else entry.partition(":")
            extra.add((host, "127.0.0.1" if ip == "host-gateway" else ip))
    lines += [(ip, [host]) for host, ip in sorted(extra)]
    return lines

def _sanitize(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", path.strip("/")) or "root"


def _fakeroot(service: Service, adapter: Optional[image_adapters.Adapter]) -> Optional[Dict[str, Any]]:
    needs = adapter.fakeroot(service) if adapter else None
    return {"ids": needs[0], "without": needs[1]} if needs else None


def _binds(service: Service, project: Project, adapter: Optional[image_adapters.Adapter]) -> Tuple[List[Bind], List[str]]:
    warnings: List[str] = []
    binds: List[Bind] = []
    scratch = f"{STATE}/services/{service.name}"
    for mount in service.mounts:
        if mount.type == "bind":
            binds.append(Bind(mount.source or "", mount.target, mount.read_only, "bind", mount.create_host_path))
        elif mount.type == "volume":
            name = mount.source or f"_anonymous_{service.name}_{_sanitize(mount.target)}"
            if mount.source:
                volume = (project.model.get("volumes") or {}).get(mount.source) or {}
                if volume.get("external"):
                    warnings.append(f"service {service.name!r}: external volume {mount.source!r} becomes "
                                    f"{STATE}/volumes/{mount.source}")
                if volume.get("driver") not in (None, "local"):
                    warnings.append(f"service {service.name!r}: volume driver {volume['driver']!r} is ignored")
            source = f"{STATE}/volumes/{name}" + (f"/{mount.subpath}" if mount.subpath else "")
            binds.append(Bind(source, mount.target, mount.read_only, "volume", True))
        elif mount.type == "tmpfs":
            binds.append(Bind(f"{scratch}/tmpfs/{_sanitize(mount.target)}", mount.target, False, "tmpfs", True))
        else:
            warnings.append(f"service {service.name!r}: {mount.type} mount at {mount.target} is not supported; skipped")
    for path in service.tmpfs:
        target = path.split(":", 1)[0]
        binds.append(Bind(f"{scratch}/tmpfs/{_sanitize(target)}", target, False, "tmpfs", True))
    targets = {b.target for b in binds}
    writable = list(adapter.writable if adapter else ()) + list(_hints(service).get("writable") or [])
    if "/tmp" not in targets:
        writable.append("/tmp")
    for path in writable:
        if path not in targets and not any(path.startswith(t.rstrip("/") + "/") for t in targets):
            binds.append(Bind(f"{scratch}/scratch/{_sanitize(path)}", path, False, "scratch", True))
            targets.add(path)
    return binds, warnings


def _unsupported_warnings(service: Service) -> List[str]:
    warnings = unsupported_warnings(service.name, service.raw)
    if service.raw.get("network_mode") not in (None, "host") or len(service.raw.get("networks") or {}) > 1:
        warnings.append(f"service {service.name!r}: networks are not isolated; every service has its own "
                        "loopback address on the node's network and reaches every other by name")
    if service.runtime not in (None, "nvidia"):
        warnings.append(f"service {service.name!r}: runtime {service.runtime!r} is ignored")
    deploy = service.raw.get("deploy") or {}
    if (deploy.get("replicas") or 1) > 1:
        warnings.append(f"service {service.name!r}: deploy.replicas {deploy['replicas']} becomes one instance")
    if ((deploy.get("resources") or {}).get("limits")):
        warnings.append(f"service {service.name!r}: deploy.resources.limits are not enforced (no cgroups); "
                        "the batch job's allocation is the limit")
    return warnings


def image_definitions(project: Project, options: Optional[PlanOptions] = None) -> Dict[str, ImageSource]:
    options = options or PlanOptions()
    return plan_images(list(typed_services(project).values()), project.working_dir, options.registry_mirror,
                       options.image_sources, options.image_configs)


# a flag named for a secret (`--password`, `--auth-token`, `--api-key`), not `--max-num-batched-tokens`
_SECRET_FLAG = re.compile(r"^-{1,2}[\w-]*(pass(word|wd)?|secret|token|api-?key)(?![a-z])[\w-]*$|^-a$", re.IGNORECASE)


def _secret_on_command_line(argv: List[str]) -> Optional[str]:
    for i, arg in enumerate(argv[:-1]):
        if _SECRET_FLAG.match(arg.split("=", 1)[0]) and (argv[i + 1] or "=" in arg):
            return arg.split("=", 1)[0]
    return None


def _seconds(value: Any, default: float) -> float:
    from compose2sif.units import parse_duration
    if value is None:
        return default
    try:
        return parse_duration(str(value)) / 1e9
    except ValueError:
        return default


def _dedupe(items: List[str]) -> List[str]:
    seen, out = set(), []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out
