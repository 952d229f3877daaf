"""Stage 3: decisions. From typed services to a plan that the renderer writes out and run.sh runs.

For every service: its instance name, image (SIF), start level, where each port really listens
and how the service is told, the env file contents, binds (volumes, scratch dirs, rendered
configs), GPUs, healthcheck, restart policy, and a warning for everything Apptainer cannot do.
The plan is plain data (``Plan.to_json()`` is plan.json).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from compose2sif.errors import ComposeError
from compose2sif.load import Project
from compose2sif.model import Service, services as typed_services
from compose2sif.plan import nginx, secrets
from compose2sif.plan.images import ImageSource, plan_images
from compose2sif.plan.knowledge import ImageProfile, Setter, hint_setter, profile_for
from compose2sif.plan.ports import PortAssignment, PortRequest, References, allocate, default_base, listening_ports
from compose2sif.support import unsupported_warnings

STATE = "state"  # relative to the output directory; created private (0700) by run.sh


@dataclass
class Bind:
    source: str            # host path; relative paths are relative to the output directory
    target: str
    read_only: bool = False
    kind: str = "bind"     # bind | volume | scratch | tmpfs | config
    create: bool = False   # create the host directory when missing (Compose's create_host_path)


@dataclass
class PortPlan:
    container: int
    host: int
    address: str
    published: bool
    how: str               # env:NAME | flag:--port | nginx | fixed


@dataclass
class ServicePlan:
    name: str
    instance: str
    image: str                        # image key: definitions/<image>.def, sif/<image>.sif
    level: int
    oneshot: bool                     # something waits for it to complete successfully
    ports: List[PortPlan]
    environment: Dict[str, str]
    env_file: str
    launch: Optional[List[str]]       # argv run by the start script; None: the image's ENTRYPOINT+CMD
    workdir: Optional[str]
    binds: List[Bind]
    gpus: List[Dict[str, Any]]        # [{"count": N|-1, "device_ids": [...]}]
    nv: bool
    healthcheck: Optional[Dict[str, Any]]
    restart: str
    depends_on: List[Dict[str, Any]]
    stop_signal: str
    stop_grace_period: float
    ulimits: Dict[str, List[int]]
    writable_tmpfs: bool
    warnings: List[str] = field(default_factory=list)


@dataclass
class Plan:
    project: str
    compose_files: List[str]
    state_dir: str
    port_base: int
    host_names: List[str]
    extra_hosts: List[Tuple[str, str]]
    images: Dict[str, Dict[str, Any]]
    services: List[ServicePlan]
    configs: Dict[str, str]           # rendered config files: path in the output dir -> content
    warnings: List[str]
    tls: Optional[Dict[str, Any]] = None  # {"cert", "key": paths in the output dir, "source": given files or None}

    def service(self, name: str) -> ServicePlan:
        return next(s for s in self.services if s.name == name)

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data.pop("configs")
        data["configs"] = sorted(self.configs)
        for service in data["services"]:
            service["environment"] = sorted(service["environment"])  # names only: values are secrets
        return data


@dataclass
class PlanOptions:
    registry_mirror: Optional[str] = None
    image_sources: Dict[str, str] = field(default_factory=dict)   # service -> KIND:PATH
    port_base: Optional[int] = None
    uid: Optional[int] = None
    busy_ports: Optional[set] = None                              # default: what listens on this node
    image_configs: Dict[str, Any] = field(default_factory=dict)   # image ref -> registry.ImageConfig
    tls: bool = False                                             # HTTPS in front of each nginx service
    tls_files: Optional[Tuple[str, str]] = None                   # (cert, key); default: a self-signed pair


def _instance_name(project: str, service: Service) -> str:
    name = service.container_name or f"{project}-{service.name}"
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name)


def _levels(services: Dict[str, Service]) -> Dict[str, int]:
    levels: Dict[str, int] = {}

    def level(name: str) -> int:
        if name not in levels:
            levels[name] = 0  # cycles were rejected by the loader
            deps = [d.service for d in services[name].depends_on if d.service in services]
            levels[name] = 1 + max((level(d) for d in deps), default=-1)
        return levels[name]

    for name in services:
        level(name)
    return levels


def _hints(service: Service) -> Dict[str, Any]:
    hints = service.extensions.get("x-compose2sif") or {}
    if not isinstance(hints, dict):
        raise ComposeError("must be a mapping", path=f"services.{service.name}.x-compose2sif")
    return hints


def _port_requests(service: Service, profile: Optional[ImageProfile], exposed: List[int]) -> List[PortRequest]:
    hints = _hints(service)
    hinted: Dict[int, Optional[Setter]] = {}
    for key, spec in (hints.get("ports") or {}).items():
        if not str(key).isdigit() or hint_setter(spec) is None and not (isinstance(spec, dict) and spec.get("fixed")):
            raise ComposeError(f"expected \"PORT\": {{env: NAME}} or {{flag: --name}} or {{fixed: true}}, "
                               f"not {key}: {spec}", path=f"services.{service.name}.x-compose2sif.ports")
        hinted[int(key)] = hint_setter(spec)
    requests: Dict[int, PortRequest] = {}

    def setter_for(port: int) -> Optional[Setter]:
        if port in hinted:
            return hinted[port]
        if profile and port in profile.ports:
            return profile.ports[port]
        return None

    # A command line that says `--port N` can be told another port the same way.
    argv = (service.entrypoint or []) + (service.command or [])
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--port=") else (argv[i + 1] if arg == "--port" and i + 1 < len(argv) else None)
        if value and value.isdigit() and int(value) not in hinted:
            hinted[int(value)] = Setter("flag", "--port")

    for mapping in service.ports:
        if mapping.protocol != "tcp":
            continue
        published = mapping.published if mapping.published is not None else ""  # "": an ephemeral host port
        requests.setdefault(mapping.target, PortRequest(service.name, mapping.target, published,
                                                        mapping.host_ip, setter_for(mapping.target)))
    known = list(hinted) + list(profile.ports if profile else []) + exposed
    for port in known + [int(str(p).split("/")[0]) for p in service.raw.get("expose") or []
                         if str(p).split("/")[0].isdigit()]:
        if port not in requests:
            requests[port] = PortRequest(service.name, port, None, None, setter_for(port))
    return list(requests.values())


def _set_flag(argv: List[str], flag: str, value: str) -> List[str]:
    out = list(argv)
    for i, arg in enumerate(out):
        if arg.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
        if arg == flag and i + 1 < len(out):
            out[i + 1] = value
            return out
    return out + [flag, value]


def _sanitize(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", path.strip("/")) or "root"


def _binds(service: Service, project: Project, profile: Optional[ImageProfile]) -> Tuple[List[Bind], List[str]]:
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
    writable = list(profile.writable if profile else ()) + list(_hints(service).get("writable") or [])
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
        warnings.append(f"service {service.name!r}: networks are not isolated; every service shares the host "
                        "network and reaches the others through 127.0.0.1")
    if service.runtime not in (None, "nvidia"):
        warnings.append(f"service {service.name!r}: runtime {service.runtime!r} is ignored")
    deploy = service.raw.get("deploy") or {}
    if (deploy.get("replicas") or 1) > 1:
        warnings.append(f"service {service.name!r}: deploy.replicas {deploy['replicas']} becomes one instance")
    if ((deploy.get("resources") or {}).get("limits")):
        warnings.append(f"service {service.name!r}: deploy.resources.limits are not enforced (no cgroups); "
                        "the batch job's allocation is the limit")
    return warnings


def build_plan(project: Project, options: Optional[PlanOptions] = None) -> Plan:
    options = options or PlanOptions()
    services = typed_services(project)
    warnings: List[str] = list(project.warnings)
    images = plan_images(list(services.values()), project.working_dir, options.registry_mirror, options.image_sources,
                         options.image_configs)
    image_of = {name: key for key, source in images.items() for name in source.services}
    for source in images.values():
        warnings.extend(source.warnings)

    profiles = {name: profile_for(s.image) for name, s in services.items()}
    requests: List[PortRequest] = []
    for name, service in services.items():
        source = images[image_of[name]]
        config = options.image_configs.get(service.image or "")
        exposed = list(source.exposed) + (list(config.exposed) if config else [])
        requests += _port_requests(service, profiles[name], exposed)
    base = options.port_base if options.port_base is not None else default_base(project.name, options.uid)
    busy = listening_ports() if options.busy_ports is None else set(options.busy_ports)
    assignments = allocate(requests, base, busy, warnings)

    names: Dict[str, List[str]] = {}
    for name, service in services.items():
        names[name] = [n for n in [name, service.container_name, service.hostname, *service.aliases] if n]
    refs = References(names, assignments)
    levels = _levels(services)
    waited_on = {d.service for s in services.values() for d in s.depends_on
                 if d.condition == "service_completed_successfully"}
    configs: Dict[str, str] = {}
    plans: List[ServicePlan] = []
    unknown_workdir: List[str] = []
    tls_ports: Dict[str, int] = {}
    for name, service in services.items():
        profile = profiles[name]
        mine = {c: a for (s, c), a in assignments.items() if s == name}
        env = {k: v for k, v in refs.rewrite_environment(service.environment, name).items() if v is not None}
        command = [refs.rewrite(a, name) for a in service.command] if service.command is not None else None
        entrypoint = [refs.rewrite(a, name) for a in service.entrypoint] if service.entrypoint is not None else None
        svc_warnings = _unsupported_warnings(service)
        flags: List[Tuple[str, str]] = []
        port_plans: List[PortPlan] = []
        for container, assignment in sorted(mine.items()):
            setter = assignment.setter
            how = "fixed" if setter is None else (f"{setter.kind}:{setter.name}" if setter.name else setter.kind)
            port_plans.append(PortPlan(container, assignment.host, assignment.address, assignment.published, how))
            if setter is None or not assignment.moved and assignment.address == "0.0.0.0":
                continue
            if setter.kind == "env":
                env[setter.name] = setter.template.format(value=assignment.host, port=assignment.host,
                                                          address=assignment.address)
            elif setter.kind == "flag":
                flags.append((setter.name, str(assignment.host)))
        address = "0.0.0.0" if any(p.published for p in port_plans) else "127.0.0.1"
        bind_setter = (hint_setter(_hints(service).get("bind_address"))
                       if _hints(service).get("bind_address") else (profile.bind_address if profile else None))
        argv = (service.entrypoint or []) + (service.command or [])
        if bind_setter is None and any(a == "--host" or a.startswith("--host=") for a in argv):
            bind_setter = Setter("flag", "--host")
        if port_plans and bind_setter is not None:
            if bind_setter.kind == "env":
                env[bind_setter.name] = bind_setter.template.format(value=address, address=address, port="")
            elif bind_setter.kind == "flag":
                flags.append((bind_setter.name, address))
            elif bind_setter.kind == "postgres":
                flags.append(("-c", f"listen_addresses={address}"))
        elif port_plans and address == "127.0.0.1":
            svc_warnings.append(f"service {name!r}: compose2sif does not know how to make it listen on 127.0.0.1 "
                                "only; other users of the node may reach it (add x-compose2sif.bind_address)")
        launch: Optional[List[str]]
        if entrypoint is not None:
            launch = entrypoint + (command or [])
        elif command is not None:
            launch = ["/.singularity.d/runscript"] + command
        else:
            launch = None
        if flags:
            if launch is None:
                default = (profile.default_command if profile else None)
                if default is None:
                    svc_warnings.append(f"service {name!r}: cannot pass {' '.join(f for f, _ in flags)} without "
                                        "knowing the image's command; set `command:` in the compose file")
                else:
                    launch = ["/.singularity.d/runscript", *default]
            if launch is not None:
                for flag, value in flags:
                    launch = launch + [flag, value] if flag == "-c" else _set_flag(launch, flag, value)
        if launch and profile and "redis" in profile.match and "--requirepass" in launch:
            launch = _redis_password_to_file(name, launch, env, binds_extra := [], configs)
        else:
            binds_extra = []
        if launch and _secret_on_command_line(launch):
            svc_warnings.append(f"service {name!r}: its command line carries a secret ({_secret_on_command_line(launch)}); "
                                "every user of the node can read it with `ps`")
        healthcheck = None
        if service.healthcheck is not None and not service.healthcheck.disabled and service.healthcheck.test:
            test = [refs.rewrite(a, name) for a in service.healthcheck.test]
            if profile and "redis" in profile.match and 6379 in mine and mine[6379].moved:
                test = _redis_cli_port(test, mine[6379].host)
            if profile and "redis" in profile.match:
                test = _redis_cli_auth(test, env)
            healthcheck = {"test": test, "interval": service.healthcheck.interval,
                           "timeout": service.healthcheck.timeout, "retries": service.healthcheck.retries,
                           "start_period": service.healthcheck.start_period,
                           "start_interval": service.healthcheck.start_interval}
        binds, bind_warnings = _binds(service, project, profile)
        binds += binds_extra + secrets.mounts(service, project, configs, svc_warnings)
        svc_warnings += bind_warnings
        if profile and "nginx" in profile.match:
            rendered, binds, nginx_warnings = nginx.render_configs(service, env, mine, refs, binds)
            svc_warnings += nginx_warnings
            configs.update(rendered)
            if options.tls:
                binds = _add_tls(name, mine, port_plans, binds, configs, svc_warnings, tls_ports)
        source = images[image_of[name]]
        image_config = options.image_configs.get(service.image or "")
        workdir = service.working_dir or source.workdir or (image_config.workdir if image_config else None)
        if workdir is None and service.image and source.kind == "docker" and service.image not in options.image_configs:
            unknown_workdir.append(name)
        gpus = [{"count": g.count, "device_ids": list(g.device_ids)} for g in service.gpus]
        if service.runtime == "nvidia" and not gpus:
            gpus = [{"count": -1, "device_ids": []}]
        stop_grace = service.raw.get("stop_grace_period")
        plans.append(ServicePlan(
            name=name, instance=_instance_name(project.name, service), image=image_of[name], level=levels[name],
            oneshot=name in waited_on, ports=port_plans, environment=env, env_file=f"env/{name}.env",
            launch=launch, workdir=workdir, binds=binds, gpus=gpus, nv=bool(gpus),
            healthcheck=healthcheck, restart=service.restart,
            depends_on=[{"service": d.service, "condition": d.condition, "required": d.required}
                        for d in service.depends_on],
            stop_signal=str(service.raw.get("stop_signal") or "SIGTERM"),
            stop_grace_period=_seconds(stop_grace, 10.0),
            ulimits={k: [soft, hard] for k, (soft, hard) in service.ulimits.items()},
            writable_tmpfs=bool(_hints(service).get("writable_tmpfs")),
            warnings=svc_warnings))
        warnings.extend(svc_warnings)
    if unknown_workdir:
        warnings.append("the WORKDIR of the images of " + ", ".join(sorted(unknown_workdir)) + " is unknown (their "
                        "registry was not asked); they start in your home directory unless `working_dir` is set")
    plans.sort(key=lambda p: (p.level, p.name))
    host_names = sorted({n for ns in names.values() for n in ns} | {"host.docker.internal"})
    extra_hosts: List[Tuple[str, str]] = []
    for service in services.values():
        for entry in service.extra_hosts:
            host, _, ip = entry.replace("=", ":", 1).partition(":") if "=" in entry else entry.partition(":")
            if ip == "host-gateway":
                ip = "127.0.0.1"
            extra_hosts.append((host, ip))
    tls = None
    if options.tls:
        tls = {"cert": "tls/cert.pem", "key": "tls/key.pem", "ports": tls_ports,
               "source": list(options.tls_files) if options.tls_files else None}
        if not tls_ports:
            warnings.append("--tls: no nginx service to serve HTTPS; nothing was changed")
    return Plan(project=project.name, compose_files=project.files, state_dir=STATE, port_base=base, tls=tls,
                host_names=host_names, extra_hosts=sorted(set(extra_hosts)),
                images={k: {"kind": s.kind, "ref": s.ref, "services": s.services, "definition": f"definitions/{k}.def",
                            "sif": f"sif/{k}.sif", "digest": s.digest} for k, s in images.items()},
                services=plans, configs=configs, warnings=_dedupe(warnings))


def _add_tls(name: str, ports: Dict[int, PortAssignment], port_plans: List[PortPlan], binds: List[Bind],
             configs: Dict[str, str], warnings: List[str], tls_ports: Dict[str, int]) -> List[Bind]:
    """HTTPS for an nginx service: a TLS server on its port 443 plan, forwarding to its port 80."""
    http, tls = ports.get(80), ports.get(443)
    if http is None or tls is None:
        warnings.append(f"service {name!r}: --tls needs nginx listening on port 80; HTTPS not added")
        return binds
    published = http.published or tls.published
    address = "0.0.0.0" if published else "127.0.0.1"
    for port_plan in port_plans:
        if port_plan.container == 443:
            port_plan.how, port_plan.address, port_plan.published = "tls", address, published
    tls_ports[name] = tls.host
    extra = [Bind("tls", nginx.TLS_DIR, True, "config", False)]
    conf_d = next((b for b in binds if b.target == "/etc/nginx/conf.d" and b.kind == "config"), None)
    if conf_d is not None:  # our rendered conf.d is bound: the TLS server goes into it
        configs[f"{conf_d.source}/compose2sif-tls.conf"] = nginx.tls_config(address, tls.host, http.host)
    else:
        path = f"config/{name}/tls/compose2sif-tls.conf"
        configs[path] = nginx.tls_config(address, tls.host, http.host)
        extra.append(Bind(path, "/etc/nginx/conf.d/compose2sif-tls.conf", True, "config", False))
    return binds + extra


def image_definitions(project: Project, options: Optional[PlanOptions] = None) -> Dict[str, ImageSource]:
    options = options or PlanOptions()
    return plan_images(list(typed_services(project).values()), project.working_dir, options.registry_mirror,
                       options.image_sources, options.image_configs)


_SECRET_FLAG = re.compile(r"^-{1,2}[\w-]*(pass|secret|token|api-key|apikey)[\w-]*$|^-a$", re.IGNORECASE)


def _secret_on_command_line(argv: List[str]) -> Optional[str]:
    for i, arg in enumerate(argv[:-1]):
        if _SECRET_FLAG.match(arg.split("=", 1)[0]) and (argv[i + 1] or "=" in arg):
            return arg.split("=", 1)[0]
    return None


REDIS_SECRETS = "/etc/compose2sif/redis.conf"


def _redis_password_to_file(name: str, launch: List[str], env: Dict[str, str], binds: List[Bind],
                            configs: Dict[str, str]) -> List[str]:
    """`redis-server ... --requirepass SECRET` would show SECRET to every user of the node in `ps`.
    Move it into a private config file (which includes the service's own config file, if any)."""
    i = launch.index("--requirepass")
    if i + 1 >= len(launch):
        return launch
    secret = launch[i + 1]
    argv = launch[:i] + launch[i + 2:]
    server = next((k for k, a in enumerate(argv) if a.endswith("redis-server")), None)
    if server is None:
        return launch
    lines = []
    if server + 1 < len(argv) and not argv[server + 1].startswith("-"):
        lines.append(f"include {argv.pop(server + 1)}")
    quoted = secret.replace("\\", "\\\\").replace('"', '\\"')
    lines.append(f'requirepass "{quoted}"')
    path = f"config/{name}/redis/compose2sif.conf"
    configs[path] = "\n".join(lines) + "\n"
    binds.append(Bind(path, REDIS_SECRETS, True, "config", False))
    env.setdefault("REDISCLI_AUTH", secret)  # redis-cli (healthchecks, exec) authenticates from it
    return argv[:server + 1] + [REDIS_SECRETS] + argv[server + 1:]


def _redis_cli_auth(test: List[str], env: Dict[str, str]) -> List[str]:
    """`redis-cli -a SECRET` in a healthcheck: authenticate through REDISCLI_AUTH instead."""
    if test and test[0] == "CMD" and "-a" in test[:-1]:
        i = test.index("-a")
        env.setdefault("REDISCLI_AUTH", test[i + 1])
        return test[:i] + test[i + 2:]
    if test and test[0] == "CMD-SHELL":
        match = re.search(r"\s-a\s+(\"[^\"]*\"|'[^']*'|\S+)", test[1])
        if match:
            env.setdefault("REDISCLI_AUTH", shlex.split(match.group(1))[0])
            return [test[0], test[1][:match.start()] + test[1][match.end():]]
    return test


def _redis_cli_port(test: List[str], port: int) -> List[str]:
    if test and test[0] == "CMD-SHELL":
        return [test[0], re.sub(r"\bredis-cli\b(?!\s+-p\b)", f"redis-cli -p {port}", test[1])]
    out = []
    for arg in test:
        out.append(arg)
        if arg == "redis-cli" and "-p" not in test:
            out += ["-p", str(port)]
    return out


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
