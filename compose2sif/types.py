"""The words the planner and the image adapters share: knobs, binds, endpoints, the network plan.

The planner (compose2sif.plan) imports the adapters; the adapters import only this module and
compose2sif.model, so the arrows between them run one way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Protocol, Tuple

WILDCARD = "0.0.0.0"
WILDCARDS = (WILDCARD, "::")  # a listener on one of these holds the port on every address


@dataclass(frozen=True)
class Knob:
    """How to tell a service a value. ``template`` uses {address} and {port}.

    kind ``env``: set the variable ``name``; ``flag``: put ``name VALUE`` on the command line,
    replacing an existing one (``append``: add one more, for repeatable flags such as ``-c``);
    ``argv``: replace the text at ``where`` = (argument index, start, end) of the launch argv;
    ``config``: an adapter rewrites a config file it renders.
    """
    kind: str
    name: str = ""
    template: str = "{value}"
    where: Optional[Tuple[int, int, int]] = None
    append: bool = False

    def describe(self) -> str:
        if self.kind == "env":
            return f"env {self.name}"
        if self.kind in ("flag", "argv"):
            return f"flag {self.name}"
        return self.name or self.kind


@dataclass
class Bind:
    source: str            # host path; relative paths are relative to the output directory
    target: str
    read_only: bool = False
    kind: str = "bind"     # bind | volume | scratch | tmpfs | config
    create: bool = False   # create the host directory when missing (Compose's create_host_path)
    fill: bool = False     # volume: filled from the image's content at target when empty (Docker's rule)
    anonymous: bool = False  # volume: renewed after `down`
    host_path: bool = False  # bind of a host path outside the project: checked by `up` before anything starts
    socket: bool = False   # the Docker socket: bound only where a socket exists at `up`, never created
    mount_points: List[str] = field(default_factory=list)  # paths in source where a child bind is mounted


@dataclass
class Endpoint:
    container: int
    host: int                         # the port it listens on
    address: str                      # the address it listens on
    published: bool
    knob: Optional[Knob]
    evidence: List[str]
    required: bool                    # something says it listens there (not only the image's EXPOSE)
    forward: Optional[str] = None     # ADDR:PORT a forwarder serves it on (published on another port)

    @property
    def moved(self) -> bool:
        return self.host != self.container


@dataclass
class NetworkPlan:
    address_block: str
    port_base: int
    own: Dict[str, str]                             # service -> its own loopback address
    address: Dict[str, str]                         # service -> the address it is told (or 0.0.0.0)
    endpoints: Dict[str, Dict[int, Endpoint]]       # service -> container port -> endpoint
    warnings: List[str] = field(default_factory=list)
    needs_loopback: Dict[str, str] = field(default_factory=dict)  # service -> why `up` refuses it without the tracer
    gateway: str = "127.0.0.1"                      # the node as services reach it: host.docker.internal, host-gateway

    def names_address(self, service: str) -> str:
        """Where the service's names point: its address, or its own one when it listens on all."""
        address = self.address[service]
        return self.own[service] if address in WILDCARDS else address


class ServiceReferences(Protocol):
    """What an adapter may ask about other services (plan.network.References implements it)."""
    network: Optional[NetworkPlan]
    service_of: Dict[str, str]        # each name of a service (alias, hostname...) -> the service

    def port_of(self, name: str, port: int) -> Optional[int]:
        """Where the service called ``name`` now listens for its ``port``, if that moved."""

    def rewrite(self, text: str, service: Optional[str] = None, own_host: bool = False) -> str:
        """``text`` with references to moved ports (and, for ``service``, its own) rewritten."""
