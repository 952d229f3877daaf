"""Who reaches whom, as Docker's networks decide it: a service reaches the services it shares a
network with, and beyond the project (the node, the gateway, other hosts) unless every network it
is on is `internal: true`.

- No `networks:` and no `network_mode`: the project's `default` network (the loader puts it there,
  as `docker compose config` does).
- `network_mode: service:X`: X's network stack, so X's networks and X's reach; the services that
  reach X reach it. `container:NAME` (a container outside the project): nothing of the project's,
  and beyond it.
- `network_mode: host`: the node's network: it reaches everything, and every service that may
  reach beyond the project reaches it.
- `network_mode: none`: nothing but itself. `bridge`: Docker's default bridge, shared by every
  service in that mode, and beyond.
- Replicas are services of their own here, on their service's networks.
- A per-network alias (`networks: {NET: {aliases: [...]}}`) resolves only on NET: a service that
  reaches its owner over other networks alone does not find it (`hidden`).

plan.json keeps the table (`reach` of each service); run.sh hands the tracer the addresses a
service may connect to wherever that is less than all of the project (docs/isolation.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from compose2sif.model import Service


@dataclass
class Reach:
    networks: List[str] = field(default_factory=list)   # the networks it is on
    services: List[str] = field(default_factory=list)   # the other services it may connect to
    outside: bool = True                                # it may connect beyond the project
    mode: str = "networks"                              # networks | host | none | service:X | container:X
    hidden: Dict[str, List[str]] = field(default_factory=dict)  # peer -> its aliases on networks it is not on

    def to_json(self) -> Dict[str, Any]:
        return {"networks": self.networks, "services": self.services, "outside": self.outside, "mode": self.mode,
                "hidden_names": self.hidden}


def _hidden(peers: List[str], mine: List[str], services: Dict[str, Service]) -> Dict[str, List[str]]:
    """Peer -> its aliases that only networks other than MINE give (not its other names)."""
    hidden = {}
    for peer in peers:
        other = services[peer]
        seen = {a for net in mine for a in other.network_aliases.get(net, [])}
        seen |= {peer, other.replica_of, other.container_name, other.hostname}
        names = sorted({a for aliases in other.network_aliases.values() for a in aliases} - seen)
        if names:
            hidden[peer] = names
    return hidden


def _stack_owner(name: str, services: Dict[str, Service], seen: Optional[List[str]] = None) -> str:
    """The service whose network stack NAME runs in (itself, or X of `service:X`, followed)."""
    seen = seen or []
    mode = services[name].network_mode or ""
    target = mode[len("service:"):] if mode.startswith("service:") else None
    if target is None or target not in services or target in seen:
        return name
    return _stack_owner(target, services, seen + [name])


def plan_reach(services: Dict[str, Service], networks: Dict[str, Any]) -> Dict[str, Reach]:
    """The reach of every service; NETWORKS: the project's top-level `networks` as loaded."""
    internal = {name for name, spec in (networks or {}).items() if isinstance(spec, dict) and spec.get("internal")}
    joined: Dict[str, List[str]] = {}
    for name, service in services.items():
        mode = service.network_mode or ""
        if mode == "bridge":
            joined[name] = ["bridge"]
        elif mode in ("host", "none") or mode.startswith("container:"):
            joined[name] = []
        elif not mode.startswith("service:"):
            joined[name] = list(service.networks)
    for name in services:
        owner = _stack_owner(name, services)
        joined.setdefault(name, list(joined.get(owner, [])))
    reach: Dict[str, Reach] = {}
    for name, service in services.items():
        owner = _stack_owner(name, services)
        mode = services[owner].network_mode or ""
        mine = joined[owner]
        if mode == "host":
            reach[name] = Reach([], sorted(n for n in services if n != name), True, "host")
            continue
        peers = sorted(other for other in services if other != name and (
            _stack_owner(other, services) == owner or set(mine) & set(joined[_stack_owner(other, services)])))
        outside = mode.startswith("container:") or (bool(mine) and any(n not in internal for n in mine))
        if outside:  # a host-network service is where the node is
            peers = sorted(set(peers) | {o for o in services if o != name and
                                         services[_stack_owner(o, services)].network_mode == "host"})
        if mode == "none" or mode.startswith("container:"):
            shown = mode
        else:
            shown = f"service:{owner}" if owner != name else "networks"
        reach[name] = Reach(list(mine), peers, outside, shown, _hidden(peers, mine, services))
    return reach


def restricted(reach: Dict[str, Reach], name: str) -> bool:
    """Whether NAME may reach less than every service of the project and beyond (the tracer is told),
    or finds fewer of their names (a hosts file and a DNS server of its own)."""
    mine = reach[name]
    return mine.mode != "host" and (not mine.outside or len(mine.services) < len(reach) - 1 or bool(mine.hidden))
