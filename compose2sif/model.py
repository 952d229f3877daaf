"""Stage 2: typed, normalised services, built from the loaded project.

Everything here is already in long syntax and resolved: ports are single mappings with integer
targets, mounts have absolute sources, durations are seconds, commands are argument lists, GPU
requests are explicit. The planner works on these types and never looks at raw compose data.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

from compose2sif.errors import ComposeError
from compose2sif.load import Project
from compose2sif.units import parse_duration

ALL = -1  # a GPU count of "all"


@dataclass(frozen=True)
class PortMapping:
    target: int                      # the port the service listens on inside the container
    published: Optional[str] = None  # "8080", a range "8000-8010", or None (not published)
    host_ip: Optional[str] = None
    protocol: str = "tcp"


@dataclass(frozen=True)
class Mount:
    type: str                        # bind | volume | tmpfs
    target: str
    source: Optional[str] = None     # absolute host path (bind), volume name (volume), None (tmpfs/anonymous)
    read_only: bool = False
    create_host_path: bool = True    # bind: create a missing source directory as Compose does
    subpath: Optional[str] = None
    nocopy: bool = False             # volume: not filled from the image


@dataclass(frozen=True)
class Dependency:
    service: str
    condition: str = "service_started"  # service_started | service_healthy | service_completed_successfully
    required: bool = True


HEALTHCHECK_FIELDS = ("test", "interval", "timeout", "retries", "start_period", "start_interval")


@dataclass(frozen=True)
class Healthcheck:
    test: Tuple[str, ...]            # ("CMD", ...), ("CMD-SHELL", "..."), or ("NONE",)
    interval: float = 30.0           # seconds; Compose's defaults
    timeout: float = 30.0
    retries: int = 3
    start_period: float = 0.0
    start_interval: float = 5.0
    # the fields the compose file (or the image) set; the others are Docker's defaults, which an
    # image's HEALTHCHECK fills in first, as Docker merges them (see inherit)
    given: FrozenSet[str] = field(default=frozenset(), compare=False)

    @property
    def disabled(self) -> bool:
        return not self.test or self.test[0] == "NONE"

    def inherit(self, image: Optional["Healthcheck"]) -> "Healthcheck":
        """This healthcheck with what it does not set taken from the image's HEALTHCHECK, field by
        field, as Docker merges a container's healthcheck with its image's."""
        if image is None or self.test[:1] == ("NONE",):
            return self
        taken = {f: getattr(image, f) for f in HEALTHCHECK_FIELDS if f not in self.given and f in image.given}
        return replace(self, **taken, given=self.given | frozenset(taken)) if taken else self


@dataclass(frozen=True)
class GpuRequest:
    count: int = ALL                 # ALL, or a number of GPUs
    device_ids: Tuple[str, ...] = ()


@dataclass(frozen=True)
class PreStartStep:
    """One `pre_start` step: a one-off container run to completion before the service first starts."""
    image: Optional[str] = None          # None: the service's own image
    command: Optional[List[str]] = None  # None: the image's ENTRYPOINT and CMD
    environment: Dict[str, Optional[str]] = field(default_factory=dict)  # added to the service's
    working_dir: Optional[str] = None    # None: the service's
    user: Optional[str] = None
    privileged: bool = False


@dataclass
class Service:
    name: str
    image: Optional[str]
    build: Optional[Dict[str, Any]]
    command: Optional[List[str]]     # None: the image's CMD
    entrypoint: Optional[List[str]]  # None: the image's ENTRYPOINT
    environment: Dict[str, Optional[str]]
    ports: List[PortMapping]
    mounts: List[Mount]
    depends_on: List[Dependency]
    healthcheck: Optional[Healthcheck]
    working_dir: Optional[str]
    restart: str
    gpus: List[GpuRequest]
    container_name: Optional[str]
    hostname: Optional[str]
    aliases: List[str]               # network aliases, of all its networks: more names for its address
    extra_hosts: List[str]
    tmpfs: List[str]
    ulimits: Dict[str, Tuple[int, int]]  # name -> (soft, hard)
    runtime: Optional[str]
    expose: List[str] = field(default_factory=list)           # "9000", "7000-7002", "53/udp"
    stop_signal: Optional[str] = None  # the compose file's; None: the image's STOPSIGNAL, else SIGTERM
    user: Optional[str] = None         # `user: UID[:GID]` (names too), as the compose file gives it
    stop_grace_period: float = 10.0                           # seconds
    pull_policy: str = "missing"
    network_mode: Optional[str] = None
    networks: List[str] = field(default_factory=list)         # the names of the networks it joins
    network_aliases: Dict[str, List[str]] = field(default_factory=dict)  # network -> its aliases there
    replicas: Optional[int] = None                            # deploy.replicas
    limits: Dict[str, Any] = field(default_factory=dict)      # deploy.resources.limits
    extensions: Dict[str, Any] = field(default_factory=dict)  # x-* keys, e.g. x-compose2sif
    pre_start: List[PreStartStep] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict)          # every key as loaded, for warnings
    replica_of: Optional[str] = None  # one of N replicas (deploy.replicas, scale): the service it is of
    replica: int = 0                  # its index, 1..N, as Compose numbers containers


def _seconds(value: Optional[str], default: float) -> float:
    return default if value is None else parse_duration(value) / 1e9


def healthcheck_of(test: List[str], seconds: Dict[str, float], retries: int) -> Healthcheck:
    """A healthcheck from its fields (compose's, a registry config's or a Dockerfile's): TEST as
    Docker stores it, SECONDS by field name; zero or empty means unset, as in Docker."""
    values = {"test": tuple(test), "retries": retries, **seconds}
    given = frozenset(f for f, v in values.items() if v)
    defaults = Healthcheck(test=())
    return Healthcheck(**{f: values[f] if f in given else getattr(defaults, f) for f in HEALTHCHECK_FIELDS},
                       given=given)


def _healthcheck(config: Optional[Dict[str, Any]]) -> Optional[Healthcheck]:
    if config is None:
        return None
    if config.get("disable"):
        return Healthcheck(test=("NONE",), given=frozenset({"test"}))
    # Docker counts a zero (or empty) field as unset: the image's, else its default, applies
    seconds = {f: _seconds(config.get(f), 0.0) for f in ("interval", "timeout", "start_period", "start_interval")}
    return healthcheck_of(list(config.get("test") or ()), seconds, int(config.get("retries") or 0))


def _gpu(request: Dict[str, Any]) -> GpuRequest:
    return GpuRequest(count=int(request.get("count", 0)) or (ALL if not request.get("device_ids") else 0),
                      device_ids=tuple(request.get("device_ids") or ()))


def _gpu_requests(config: Dict[str, Any]) -> List[GpuRequest]:
    requests = [_gpu(g) for g in config.get("gpus") or []]
    devices = ((((config.get("deploy") or {}).get("resources") or {}).get("reservations") or {})
               .get("devices") or [])
    for device in devices:
        if "gpu" in (device.get("capabilities") or []) or device.get("driver") == "nvidia":
            requests.append(_gpu(device))
    return requests


def _mount(volume: Dict[str, Any]) -> Mount:
    return Mount(type=volume["type"], target=volume["target"], source=volume.get("source"),
                 read_only=bool(volume.get("read_only")),
                 create_host_path=bool((volume.get("bind") or {}).get("create_host_path", False)),
                 subpath=(volume.get("volume") or {}).get("subpath"),
                 nocopy=bool((volume.get("volume") or {}).get("nocopy")))


def _ulimits(config: Dict[str, Any]) -> Dict[str, Tuple[int, int]]:
    out = {}
    for name, limit in (config.get("ulimits") or {}).items():
        if isinstance(limit, dict):
            out[name] = (int(limit.get("soft", 0)), int(limit.get("hard", limit.get("soft", 0))))
        else:
            out[name] = (int(limit), int(limit))
    return out


def _network_aliases(config: Dict[str, Any]) -> Dict[str, List[str]]:
    """Network -> the service's aliases there (networks without any left out)."""
    return {net: list((spec or {}).get("aliases") or [])
            for net, spec in (config.get("networks") or {}).items() if (spec or {}).get("aliases")}


def _extra_hosts(value: Any) -> List[str]:
    if isinstance(value, dict):
        return [f"{host}={ip}" for host, ip in value.items()]
    return [str(v) for v in value or []]


def _restart(service: str, policy: str) -> str:
    """Docker's restart policies; anything else would be refused by the engine when it starts."""
    if not re.fullmatch(r"no|always|unless-stopped|on-failure(:[0-9]{1,6})?", str(policy)):
        raise ComposeError(f"invalid restart policy {policy!r} (no, always, on-failure[:N], unless-stopped)",
                           path=f"services.{service}.restart")
    return str(policy)


def _pre_start_step(step: Dict[str, Any]) -> PreStartStep:
    privileged = step.get("privileged", False)
    return PreStartStep(image=step.get("image"), command=step.get("command"),
                        environment=dict(step.get("environment") or {}), working_dir=step.get("working_dir"),
                        user=None if step.get("user") is None else str(step["user"]),
                        privileged=str(privileged).lower() in ("true", "1", "t"))


def build_service(name: str, config: Dict[str, Any]) -> Service:
    """One service of ``Project.config`` (the encoded, long-syntax form) as a typed Service."""
    deploy = config.get("deploy") or {}
    return Service(
        name=name,
        image=config.get("image"),
        build=config.get("build"),
        command=config.get("command"),
        entrypoint=config.get("entrypoint"),
        environment=dict(config.get("environment") or {}),
        ports=[PortMapping(target=p["target"], published=p.get("published"), host_ip=p.get("host_ip"),
                           protocol=p.get("protocol", "tcp"))
               for p in config.get("ports") or []],
        mounts=[_mount(v) for v in config.get("volumes") or []],
        depends_on=[Dependency(service=dep, condition=d["condition"], required=d["required"])
                    for dep, d in (config.get("depends_on") or {}).items()],
        healthcheck=_healthcheck(config.get("healthcheck")),
        working_dir=config.get("working_dir"),
        restart=_restart(name, config.get("restart") or "no"),
        gpus=_gpu_requests(config),
        container_name=config.get("container_name"),
        hostname=config.get("hostname"),
        aliases=list(dict.fromkeys(a for aliases in _network_aliases(config).values() for a in aliases)),
        extra_hosts=_extra_hosts(config.get("extra_hosts")),
        tmpfs=[config["tmpfs"]] if isinstance(config.get("tmpfs"), str) else list(config.get("tmpfs") or []),
        ulimits=_ulimits(config),
        runtime=config.get("runtime"),
        expose=[str(item) for item in config.get("expose") or []],
        stop_signal=str(config["stop_signal"]) if config.get("stop_signal") else None,
        user=None if config.get("user") is None else str(config["user"]),
        stop_grace_period=_seconds(config.get("stop_grace_period"), 10.0),
        pull_policy=str(config.get("pull_policy") or "missing"),
        network_mode=config.get("network_mode"),
        networks=list(config.get("networks") or {}),
        network_aliases=_network_aliases(config),
        replicas=deploy.get("replicas") if deploy.get("replicas") is not None else config.get("scale"),
        limits=(deploy.get("resources") or {}).get("limits") or {},
        extensions={k: v for k, v in config.items() if k.startswith("x-")},
        pre_start=[_pre_start_step(step) for step in config.get("pre_start") or []],
        raw=config,
    )


def services(project: Project) -> Dict[str, Service]:
    """The active services, typed. A depends_on on a service that profiles disabled and that is
    not required is dropped here (Compose keeps it in `config` output but never starts it), and so
    is a service scaled to zero (`deploy.replicas: 0` or `scale: 0`: Compose creates no container)."""
    active = {name: config for name, config in project.config["services"].items() if not scaled_to_zero(config)}
    out: Dict[str, Service] = {}
    for name, config in active.items():
        service = build_service(name, config)
        service.depends_on = [d for d in service.depends_on if d.service in active]
        out[name] = service
    return _replicas(out)


def _replicas(services: Dict[str, Service]) -> Dict[str, Service]:
    """A service of N > 1 replicas becomes N services NAME-1..NAME-N (Compose's container numbers),
    each of them everything the service is; what depends on it depends on each. Where Compose's
    second replica would fail (a fixed published port: "port is already allocated"), refused."""
    counts = {name: s.replicas or 1 for name, s in services.items() if (s.replicas or 1) > 1}
    if not counts:
        return services
    for name, n in counts.items():
        taken = next((f"{name}-{i}" for i in range(1, n + 1) if f"{name}-{i}" in services), None)
        if taken is not None:
            raise ComposeError(f"its replica {taken} has the name of another service; rename that one",
                               path=f"services.{name}.deploy.replicas")
    out: Dict[str, Service] = {}
    for name, service in services.items():
        deps = [replace(d, service=f"{d.service}-{i}") for d in service.depends_on if d.service in counts
                for i in range(1, counts[d.service] + 1)] + [d for d in service.depends_on if d.service not in counts]
        service.depends_on = deps
        if name not in counts:
            out[name] = service
            continue
        fixed = next((p for p in service.ports if p.published and p.published.isdigit()), None)
        if fixed is not None:
            raise ComposeError(f"{counts[name]} replicas cannot all publish port {fixed.published} (under Docker the "
                               "second fails: port is already allocated); fix: publish the container port alone "
                               f'(`- "{fixed.target}"`), or run one replica', path=f"services.{name}.ports")
        for i in range(1, counts[name] + 1):
            out[f"{name}-{i}"] = replace(service, name=f"{name}-{i}", replica_of=name, replica=i)
    return out


def scaled_to_zero(config: Dict[str, Any]) -> bool:
    deploy = config.get("deploy") if isinstance(config.get("deploy"), dict) else {}
    return config.get("scale") == 0 or deploy.get("replicas") == 0
