"""The adapter interface: what the generic planner may ask of an image family."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from compose2sif.model import Service
from compose2sif.plan.knobs import Knob
from compose2sif.plan.network import Endpoint, References
from compose2sif.plan.types import Bind


@dataclass
class Draft:
    """One service while its adapter finishes it: the planner's decisions, and what may still change."""
    name: str
    service: Service
    own_address: str                  # its own loopback address (its names point here)
    address: str                      # the address it is told (own, 127.0.0.1, or 0.0.0.0)
    endpoints: Dict[int, Endpoint]    # container port -> where it listens
    environment: Dict[str, str]
    launch: Optional[List[str]]
    healthcheck: Optional[List[str]]  # ["CMD", ...] / ["CMD-SHELL", "..."]
    binds: List[Bind]
    configs: Dict[str, str]           # the plan's rendered files (shared by all services)
    refs: References
    tls: bool                         # --tls: put HTTPS in front of it if the adapter can
    tls_ports: Dict[str, int]         # services serving HTTPS -> port (filled by adapters)
    options: Dict[str, object] = field(default_factory=dict)  # user choices adapters read (ssrf_allow, ...)
    warnings: List[str] = field(default_factory=list)


@dataclass
class Adapter:
    """What compose2sif knows about one image family.

    ``ports``: the ports its images listen on by default, each with the knob that moves it;
    ``address``: the knob that tells it its listen address; ``default_command``: the image's CMD,
    needed when a knob is a flag and the compose file sets no command; ``writable``: directories
    it writes inside the image; ``per_port_address``: each port can get an address of its own;
    ``workdir``: the image's WORKDIR, known without asking its registry; ``preset``: the adapter
    applies only to projects of that family (Dify's nginx is not every nginx).
    """
    family: str
    images: str                       # regex on the image repository (no registry, no tag)
    ports: Dict[int, Knob] = field(default_factory=dict)
    address: Optional[Knob] = None
    default_command: Optional[Tuple[str, ...]] = None
    writable: Tuple[str, ...] = ()
    per_port_address: bool = False
    workdir: Optional[str] = None
    preset: Optional[str] = None
    model_server: bool = False        # serves models (an SSRF allow-list should let clients reach it)
    entry_path: Optional[str] = None  # a web front: the page a person opens first (printed by `up`)

    def matches(self, repository: str) -> bool:
        return re.search(self.images, repository) is not None

    def configurable(self, service: Service) -> bool:
        """Whether its ``config`` knobs work for this service (a config we render is mounted)."""
        return True

    def finish(self, draft: Draft) -> None:
        """Rewrites of the launch, healthcheck and config files once ports and address are decided."""
