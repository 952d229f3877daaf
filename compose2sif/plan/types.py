"""The plan's data: plain dataclasses that the renderer writes out (plan.json, run.sh, env files),
and nothing else: every file of the output directory comes from a Plan."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from compose2sif.types import Bind


@dataclass
class PortPlan:
    container: int
    host: int              # the port it listens on
    address: str           # the address it listens on (its own, 127.0.0.1, or 0.0.0.0 for all)
    published: bool
    how: str               # how it is told: env:NAME | flag:--port | config | tls | fixed (it cannot be told)
    evidence: List[str] = field(default_factory=list)  # where this port was seen
    required: bool = True  # False: seen only in the image's EXPOSE, so it may never be opened
    forward: Optional[str] = None  # ADDR:PORT where a forwarder publishes it (published on another port)
    traced_port: Optional[int] = None  # as written, a privileged port: where the tracer puts its bind


@dataclass
class PreStartPlan:
    """One pre_start step as run.sh runs it: `exec` of its image's SIF with its own env file (the
    service's environment and the step's, C2S_LAUNCH its command), the service's binds and flags."""
    index: int
    image: str                        # image key: sif/<image>.sif
    env_file: str                     # env/<service>.pre_start.<index>.env
    environment: Dict[str, str]
    launch: Optional[List[str]]       # argv; None: the image's ENTRYPOINT+CMD
    workdir: Optional[str]
    fingerprint: str                  # of everything the step is: run again when it changes


@dataclass
class ServicePlan:
    name: str
    instance: str
    image: str                        # image key: definitions/<image>.def, sif/<image>.sif
    level: int
    oneshot: bool                     # something waits for it to complete successfully
    address: str                      # the address it is told to listen on, or 0.0.0.0 where it cannot be told
    names: List[str]                  # its names in the hosts file
    ports: List[PortPlan]
    environment: Dict[str, str]
    env_file: str
    launch: Optional[List[str]]       # argv run by the start script; None: the image's ENTRYPOINT+CMD
    workdir: Optional[str]
    binds: List[Bind]
    gpus: List[Dict[str, Any]]        # [{"count": N|-1, "device_ids": [...]}]
    nv: bool
    healthcheck: Optional[Dict[str, Any]]  # its test carries no password: that is in probe_environment
    restart: str
    depends_on: List[Dict[str, Any]]
    stop_signal: str
    stop_signal_from: str             # where it comes from: the compose file, the image, the Dockerfile, or Docker's default
    stop_grace_period: float
    ulimits: Dict[str, List[int]]
    writable_tmpfs: bool
    # run.sh sets HOSTNAME to the node's host name, as Docker sets it to the container's: where
    # neither compose nor the image's ENV names it (an image's `HOSTNAME=0.0.0.0` wins, as in
    # Docker), and the image's ENV is known
    hostname_env: bool = False
    adapter: Optional[str] = None     # the image family whose adapter shaped it
    check: List[str] = field(default_factory=list)  # its adapter's check: why it would not start (`up` runs it)
    fakeroot: Optional[Dict[str, Any]] = None  # {"ids": N, "without": line}: --fakeroot where ids 0..N map
    warnings: List[str] = field(default_factory=list)
    probe_environment: Dict[str, str] = field(default_factory=dict)  # added for the healthcheck (a password)
    pre_start: List[PreStartPlan] = field(default_factory=list)      # run in order before its first start
    host_network: bool = False        # network_mode: host: the node's network as it is (never relocated)
    needs_loopback: str = ""          # why `up` refuses it where services cannot get a loopback of their own
    replica_of: Optional[str] = None  # one of the replicas NAME-1..NAME-N of this service (deploy.replicas)
    # who it may connect to, by its compose networks (plan/reach.py): networks, services, outside, mode
    reach: Dict[str, Any] = field(default_factory=dict)
    reach_limited: bool = False       # less than every service and beyond: the tracer is told (--reach)


@dataclass
class ImagePlan:
    kind: str                         # docker | docker-archive | oci-archive | sif | build
    ref: str                          # image reference, archive path, SIF path or build context
    services: List[str]
    definition: str                   # definitions/<key>.def
    sif: str                          # sif/<key>.sif
    digest: str                       # of the definition's text
    text: str = ""                    # the definition
    steps: List[str] = field(default_factory=list)  # the pre_start steps it runs: "SERVICE pre_start[I]"


@dataclass
class Plan:
    project: str
    compose_files: List[str]
    state_dir: str
    address_block: str                # 127.A.B: this user's and project's /24 of loopback addresses
    port_base: int
    hosts: List[Tuple[str, List[str]]]  # (address, names) lines of the hosts file
    images: Dict[str, ImagePlan]
    services: List[ServicePlan]
    configs: Dict[str, str]           # rendered config files: path in the output dir -> content
    warnings: List[str]
    tls: Optional[Dict[str, Any]] = None  # {"cert", "key": paths in the output dir, "source": given files or None}
    entry_points: List[Dict[str, Any]] = field(default_factory=list)  # published web endpoints `up` prints
    generated_secrets: Dict[str, str] = field(default_factory=dict)   # variable -> value, for secrets.env
    registry_mirrors: List[Dict[str, Any]] = field(default_factory=list)  # {registry, mirror, plain_http}
    # where services cannot get a loopback of their own: the plan-time knobs' plan (files under
    # fallback/), or the one line `up` refuses with there; neither where the output has no tracer
    fallback: Optional["Plan"] = None
    fallback_refusal: str = ""

    def service(self, name: str) -> ServicePlan:
        return next(s for s in self.services if s.name == name)

    def to_json(self) -> Dict[str, Any]:
        """plan.json: every decision, no secret (environments by name only)."""
        fallback = self.fallback
        self.fallback = None
        data = asdict(self)
        self.fallback = fallback
        data.pop("fallback")
        if fallback is not None or self.fallback_refusal:
            data["isolation"] = "as written, each service on a loopback of its own (bin/ARCH/c2s-loopback)"
            data["fallback"] = "fallback/plan.json" if fallback is not None else None
        else:
            data.pop("fallback_refusal")
        data.pop("configs")
        data.pop("generated_secrets")
        data["configs"] = sorted(self.configs)
        for image in data["images"].values():
            image.pop("text")
        for service in data["services"]:
            service["environment"] = sorted(service["environment"])
            service.pop("probe_environment")
            for step in service["pre_start"]:
                step["environment"] = sorted(step["environment"])
        return data
