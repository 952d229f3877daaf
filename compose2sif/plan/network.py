"""The network plan: every service gets its own loopback address and keeps its ports.

Two plans (docs/ports.md). ``plan_as_written``: where each service gets a loopback of its own at
run time (bin/c2s-loopback), nothing is decided but the addresses and the forwarders of published
ports; this is the plan `up` runs wherever the tracer works. ``plan_network``, the rest of this
module: the plan-time fallback for nodes where it does not, which must guess, from static evidence,
where each program listens and move what clashes through knobs.

Rootless Apptainer instances share the node's network namespace, and every user of the node shares
it too. All of 127.0.0.0/8 is loopback on Linux and an unprivileged user may bind any address in it,
so each service listens on an address of its own in a /24 block that belongs to this user and
project, and the hosts file maps its names there. Its ports stay what the compose file says, so its
clients reach it however they learn the port. A port moves (into this user's and project's block
of 100 ports) only where that cannot work:

- it is privileged (<1024);
- the service cannot be told its address, so it holds the port on every address (0.0.0.0), while
  another service of the project, or something already on the node, uses that port.

A port published on its own number (``8080:8080``) is served where compose publishes it: the
service listens on the published address (``host_ip``, 0.0.0.0 by default). A port published on
another number (``[IP:]8080:80``) is served as Docker serves it: the service keeps its address and
port, and a forwarder (run.sh starts ``bin/c2s-forward`` beside the service, docs/ports.md) listens
on IP:8080 and relays to it. Published ports claim their place before internal ones, so an
internal port that clashes with a published one is the one that moves; a published port that
cannot be had (privileged, or held) moves its forwarder, with a warning.

A move needs a knob (knobs.py). Two services that cannot be separated, and a privileged port that
cannot move, are errors naming both sides, the evidence and the x-compose2sif hint that fixes it.
"""
from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from compose2sif import adapters
from compose2sif.errors import ComposeError
from compose2sif.types import WILDCARD, WILDCARDS, Endpoint, Knob, NetworkPlan

PORT_BLOCK = 100
EPHEMERAL = 0                     # a forwarder's port when compose gives no host side: run.sh picks a free one
FIRST_BLOCK_PORT = 20000
BLOCKS = 300                      # port blocks start at 20000 .. 49900
ADDRESS_BLOCKS = 254 * 256        # 127.1.0.0/24 .. 127.254.255.0/24
IMAGE_EXPOSE, IMAGE_DEFAULT = "image EXPOSE", "image default"
OPTIONAL_EVIDENCE = (IMAGE_EXPOSE, IMAGE_DEFAULT)  # an image may never open such a port: not checked at run time
DECLARED = ("ports", "expose")  # what the compose file declares (Docker publishes a port nobody opens, too)


def dns_port(port_base: int) -> int:
    """The port of the project's DNS server (Docker's 127.0.0.11 under the tracer): the last of the
    block's lower half, which moved published ports fill from the first."""
    return port_base + PORT_BLOCK // 2 - 1


def gateway_address(address_block: str) -> str:
    """The node as services on their own addresses reach it (Docker's gateway, host.docker.internal):
    the block's first address. Forwarders serve every port published on all interfaces there too,
    a listener on the node's wildcard answers there, and the project's DNS server listens there."""
    return f"{address_block}.1"


def default_port_base(project: str, uid: Optional[int] = None) -> int:
    """The first port of this user's and project's block of moved ports."""
    uid = os.getuid() if uid is None else uid
    return FIRST_BLOCK_PORT + (uid * 7919 + zlib.crc32(project.encode())) % BLOCKS * PORT_BLOCK


def default_address_block(project: str, uid: Optional[int] = None) -> str:
    """This user's and project's /24 of loopback addresses, as its first three octets (127.A.B)."""
    uid = os.getuid() if uid is None else uid
    index = (uid * 104729 + zlib.crc32(project.encode())) % ADDRESS_BLOCKS
    return f"127.{1 + index // 256}.{index % 256}"


def parse_address_block(text: str) -> str:
    """`127.45.3`, `127.45.3.0` or `127.45.3.0/24` -> `127.45.3`."""
    match = re.fullmatch(r"127\.(\d{1,3})\.(\d{1,3})(?:\.0)?(?:/24)?", text.strip())
    if not match or not 0 < int(match.group(1)) < 256 or int(match.group(2)) > 255:
        raise ComposeError(f"--address-block {text}: expected a /24 inside 127.0.0.0/8 other than 127.0.0.0/24, "
                           "such as 127.45.3.0/24")
    return f"127.{int(match.group(1))}.{int(match.group(2))}"


def _hex_address(text: str) -> str:
    if len(text) == 8:  # IPv4, little-endian
        return ".".join(str(int(text[i:i + 2], 16)) for i in (6, 4, 2, 0))
    words = [text[i:i + 8] for i in range(0, 32, 8)]
    if words[:2] == ["00000000", "00000000"] and words[2] == "FFFF0000":
        return _hex_address(words[3])  # ::ffff:a.b.c.d
    if all(w == "00000000" for w in words):
        return "::"
    return "::1" if words == ["00000000"] * 3 + ["01000000"] else "ipv6"


def node_listeners() -> Set[Tuple[str, int]]:
    """(address, port) of every TCP socket listening on this node, any user (/proc/net/tcp{,6})."""
    found: Set[Tuple[str, int]] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == "0A":
                        address, port = fields[1].rsplit(":", 1)
                        found.add((_hex_address(address), int(port, 16)))
        except OSError:
            continue
    return found


def overlaps(a: Tuple[str, int], b: Tuple[str, int]) -> bool:
    """Two listeners on one port collide when their addresses are equal or either is a wildcard."""
    return a[1] == b[1] and (a[0] == b[0] or a[0] in WILDCARDS or b[0] in WILDCARDS)


@dataclass
class Listen:
    """One port a service listens on, with what says so."""
    port: int
    evidence: List[str]
    knob: Optional[Knob]              # how to move it; None: it cannot be moved
    published: Optional[str] = None   # compose's published spec ("8080", "" for ephemeral) or None
    host_ip: Optional[str] = None
    weak: bool = False                # seen only in the image's EXPOSE or a `*_PORT` variable


@dataclass
class ServiceNet:
    """What the planner knows of one service's network before deciding."""
    name: str
    names: List[str]                  # service name, container_name, hostname, aliases
    listens: Dict[int, Listen]
    address_knobs: List[Knob]         # empty: it cannot be told an address and listens on all of them
    per_port_address: bool = False    # each port can listen on an address of its own (a config's `listen`)
    fixes: Dict[int, str] = field(default_factory=dict)  # port -> the fix its adapter knows, where it cannot move


def forwarded(listen: Listen) -> bool:
    """Published on another port number (``8080:80``): a forwarder serves the published port."""
    return bool(listen.published) and listen.published.isdigit() and int(listen.published) != listen.port


def kept(listen: Listen) -> bool:
    """Published on its own number (``8000:8000``): under the tracer the service binds it as written,
    on every address of the node (Docker's publication), so no other service can have that port
    on an address of its own. A privileged one is moved like any other (it cannot be bound)."""
    return listen.published is not None and not forwarded(listen) and listen.port >= 1024


def _port_variable(evidence: str) -> bool:
    """A `FOO_PORT` variable: projects hand every service one .env full of other servers' ports."""
    return evidence.startswith("variable ") and evidence != "variable PORT"


def strong(evidence: List[str]) -> bool:
    """The compose file, the service itself or a client says it listens there: a clash is refused,
    not only warned about."""
    return any(e not in OPTIONAL_EVIDENCE and not _port_variable(e) for e in evidence)


def _exposed_only(listen: Listen) -> bool:
    """Only the image's EXPOSE or the compose file's `expose:` name this port."""
    return bool(listen.evidence) and all(e in (IMAGE_EXPOSE, "expose") for e in listen.evidence)


def proves_listener(evidence: str) -> bool:
    """What `up` may hold a service to: not the image's defaults, not a declaration (`ports`,
    `expose`: Docker publishes ports nobody opens, too), not a `FOO_PORT` variable."""
    return evidence not in OPTIONAL_EVIDENCE + DECLARED and not _port_variable(evidence)


_VAR = ("VAR being the variable it reads its port from (for a flag: `{flag: --name}`, with "
        "`template: \"{address}:{port}\"` where it takes host:port)")


def _hint_for(s: "ServiceNet", port: int) -> str:
    """The fix for a port that cannot move: what the service's program shows (its adapter's), else
    the hint that names the variable (or flag) it reads its port from. Moving the port is the fix
    that always works; an address alone does not part two services from a third on 0.0.0.0."""
    return _fixes([(s, port)])


def _fixes(refused: List[Tuple["ServiceNet", int]]) -> str:
    """One fix for every port refused: each service's ports in one hint, its adapter's fix as given."""
    by_service: Dict[str, List[int]] = {}
    known: List[str] = []
    for s, port in refused:
        if port in s.fixes:
            known.append(s.fixes[port].removeprefix("fix: "))
        else:
            by_service.setdefault(s.name, []).append(port)
    hints = ["add to service %r `x-compose2sif: {ports: {%s}}`" % (name, ", ".join(
        f'"{port}": {{env: VAR}}' for port in sorted(set(ports)))) for name, ports in by_service.items()]
    parts = list(dict.fromkeys(known + hints))
    return "fix: " + "; ".join(parts) + (f", {_VAR}" if hints else "")


def _evidence(listen: Listen) -> str:
    return ", ".join(listen.evidence)


def plan_network(services: List[ServiceNet], address_block: str, port_base: int,
                 loopback: bool = False) -> NetworkPlan:
    """Decide every service's address and every endpoint. Deterministic for the same input, and
    the same on any machine: what listens on the node is found out where the stack runs (`up`
    and `doctor` name a holder), never here.
    ``loopback``: the output has bin/c2s-loopback, so a port that cannot move (a privileged one, two
    alike) is refused at run time only, where the node cannot give each service a loopback of its
    own (NetworkPlan.needs_loopback), instead of here."""
    if len(services) > 253:
        raise ComposeError(f"{len(services)} services do not fit the address block {address_block}.0/24")
    warnings: List[str] = []
    own = {s.name: f"{address_block}.{i + 2}" for i, s in enumerate(sorted(services, key=lambda s: s.name))}
    address: Dict[str, str] = {}
    for s in services:
        published = {(l.host_ip or WILDCARD) for l in s.listens.values()
                     if l.published is not None and not forwarded(l)}
        if not s.address_knobs:
            address[s.name] = WILDCARD
        elif s.per_port_address or not published:
            address[s.name] = own[s.name]
        elif WILDCARD in published or "::" in published:
            address[s.name] = WILDCARD
        else:
            address[s.name] = sorted(published)[0]

    # Where each port wants to be, before clashes: its own port, or the published one.
    wanted: List[Tuple[ServiceNet, Listen, str, int, str]] = []   # (service, listen, address, port, why it moved)
    refusals: List[Tuple[ServiceNet, int, str]] = []               # (service, port, why): refused all at once
    deferred: List[Tuple[ServiceNet, int, str]] = []               # the same, where the tracer makes them work
    for s in sorted(services, key=lambda s: s.name):
        for port, listen in sorted(s.listens.items()):
            direct = listen.published is not None and not forwarded(listen)
            where = (listen.host_ip or WILDCARD) if direct and s.per_port_address else address[s.name]
            host, why = port, ""
            if host < 1024:
                if listen.knob is None:
                    why = (f"service {s.name!r} listens on port {host} (seen in: {_evidence(listen)}), which an "
                           f"unprivileged user cannot bind, and compose2sif cannot move it")
                    if listen.weak:
                        warnings.append(f"{why}; {_hint_for(s, port)}")
                        continue
                    if not loopback:
                        refusals.append((s, port, why))
                        continue
                    deferred.append((s, port, why))
                    wanted.append((s, listen, where, host, ""))  # a fixed endpoint: the tracer moves it onto the block
                    continue
                host, why = -1, f"{host} is privileged"
            wanted.append((s, listen, where, host, why))

    # Fixed endpoints claim their place first; movable ones step aside when they clash.
    taken: List[Tuple[Tuple[str, int], str, Listen]] = []   # ((address, port), service, listen)
    endpoints: Dict[str, Dict[int, Endpoint]] = {s.name: {} for s in services}
    next_port = [port_base]

    def clash(point: Tuple[str, int]):
        return next(((svc, l) for p, svc, l in taken if overlaps(p, point)), None)

    def free_port(where: str) -> int:
        while any(overlaps((where, next_port[0]), p) for p, _, _ in taken):
            next_port[0] += 1
        if next_port[0] == port_base + PORT_BLOCK:
            warnings.append(f"the port block {port_base}-{port_base + PORT_BLOCK - 1} is full; using ports above it")
        next_port[0] += 1
        return next_port[0] - 1

    def record(s: ServiceNet, listen: Listen, where: str, host: int) -> None:
        taken.append(((where, host), s.name, listen))
        endpoints[s.name][listen.port] = Endpoint(
            listen.port, host, where, listen.published is not None, listen.knob, list(listen.evidence),
            required=any(proves_listener(e) for e in listen.evidence))

    for s, listen, where, host, why in [w for w in wanted if w[1].knob is None]:
        other = clash((where, host))
        if other is not None and (_exposed_only(listen) or _exposed_only(other[1])):
            other = None  # an EXPOSE or `expose:` port may never be opened: it refuses nothing (run.sh ignores it)
        if other is not None:
            svc, theirs = other
            why = (f"services {svc!r} and {s.name!r} both listen on port {host} "
                   f"({svc}: {_evidence(theirs)}; {s.name}: {_evidence(listen)})"
                   + (" on all interfaces" if WILDCARD in (where, address.get(svc)) else "")
                   + " and neither can be moved")
            if listen.weak or theirs.weak:
                warnings.append(f"{why}; {_hint_for(s, listen.port)}")
            elif loopback and not (kept(listen) or kept(theirs)):
                deferred.append((s, listen.port, why))
            else:
                refusals.append((s, listen.port, why))
        record(s, listen, where, host)

    if refusals:
        first = refusals[0][2]
        more = [f"{s.name!r} on port {port}" for s, port, _ in refusals[1:]]
        raise ComposeError(first + (f" (the same for {', '.join(more)})" if more else "") + "; "
                           + _fixes([(s, port) for s, port, _ in refusals]), path=f"services.{refusals[0][0].name}")
    needs_loopback: Dict[str, str] = {}
    for name in dict.fromkeys(s.name for s, _, _ in deferred):
        mine = [(s, port, why) for s, port, why in deferred if s.name == name]
        more = [f"port {port}" for _, port, _ in mine[1:]]
        needs_loopback[name] = (mine[0][2] + (f" (the same for {', '.join(more)})" if more else "")
                                + "; " + _fixes([(s, port) for s, port, _ in mine]))
        warnings.append(f"{needs_loopback[name]}. It runs where each service gets a loopback of its own at run "
                        f"time (bin/c2s-loopback); with the plan-time knobs only, `up` refuses it")

    # Forwarders of ports published on another number, before the internal ports that may move.
    forwards: Dict[Tuple[str, int], str] = {}
    for s, listen, where, host, why in [w for w in wanted if forwarded(w[1])]:
        at, published = listen.host_ip or WILDCARD, int(listen.published or 0)
        other = clash((at, published))
        if published >= 1024 and other is None:
            taken.append(((at, published), s.name, listen))
        else:
            reason = (f"{published} is privileged" if published < 1024 else
                      f"{published} is also used by service {other[0]!r}")
            new = free_port(at)
            taken.append(((at, new), s.name, listen))
            warnings.append(f"service {s.name!r}: published port {reason}; it is published on {at}:{new} instead "
                            f"(forwarded to its port {listen.port})")
            published = new
        forwards[(s.name, listen.port)] = f"{at}:{published}"

    # Published ports claim their place before internal ones: the internal port is the one that moves.
    movable = [w for w in wanted if w[1].knob is not None]
    movable.sort(key=lambda w: w[1].published is None or forwarded(w[1]))
    for s, listen, where, host, why in movable:
        if host != -1:
            other = clash((where, host))
            if _exposed_only(listen) or other is None:  # an EXPOSE port is never moved
                record(s, listen, where, host)
                continue
            why = f"{host} is also used by service {other[0]!r}"
        new = free_port(where)
        record(s, listen, where, new)
        if all(e in OPTIONAL_EVIDENCE for e in listen.evidence):
            continue  # a port only the image's defaults name: nothing to tell the user yet
        direct = listen.published is not None and not forwarded(listen)
        warnings.append(f"service {s.name!r}: {'published ' if direct else ''}port {why}; "
                        f"its port {listen.port} is served on {where}:{new}, told through {listen.knob.describe()}")

    for (name, port), at in forwards.items():
        endpoints[name][port].forward = at
        if at.rsplit(":", 1)[0] in WILDCARDS:
            warnings.append(f"service {name!r} is published on all interfaces: {at} (published in the compose file; "
                            f"a forwarder to its port {port})")
    for s in services:
        for endpoint in endpoints[s.name].values():
            if endpoint.address in WILDCARDS:
                if endpoint.published and endpoint.forward is None:
                    warnings.append(f"service {s.name!r} is published on all interfaces: {endpoint.address}:"
                                    f"{endpoint.host} (published in the compose file)")
                else:
                    where = " where services cannot get a loopback of their own" if loopback else ""
                    warnings.append(f"service {s.name!r} listens on all interfaces ({endpoint.address}:{endpoint.host}):"
                                    f" compose2sif cannot tell it an address, so other users of the node can reach "
                                    f"it{where} (add `x-compose2sif: {{bind_address: {{env: VAR}}}}`)")
    return NetworkPlan(address_block, port_base, own, address, endpoints, _dedupe(warnings), needs_loopback)


def plan_as_written(services: List[ServiceNet], address_block: str, port_base: int) -> NetworkPlan:
    """The plan where each service gets a loopback of its own at run time (bin/c2s-loopback): every
    service listens on its own address, on the ports its compose file and image give it, and
    nothing is told. Every published port is served by forwarders on the node's addresses, one by
    one (run.sh finds them when `up` runs), never on the node's wildcard, so any number of services
    keep port P on their own addresses beside a published P. Only a published port that cannot be
    had moves, onto the block's lower half (the tracer puts privileged ports in its upper half):
    a privileged one, or one that two services publish (Docker refuses that at run time), each
    with a warning. A port with no host side (`- "5432"`) gets a free port of the node when `up`
    runs (port 0 here), as Docker gives it an ephemeral one."""
    if len(services) > 253:
        raise ComposeError(f"{len(services)} services do not fit the address block {address_block}.0/24")
    own = {s.name: f"{address_block}.{i + 2}" for i, s in enumerate(sorted(services, key=lambda s: s.name))}
    endpoints: Dict[str, Dict[int, Endpoint]] = {s.name: {} for s in services}
    warnings: List[str] = []
    published_at: List[Tuple[Tuple[str, int], str]] = []   # ((address, port), service)
    next_port = port_base
    for s in sorted(services, key=lambda s: s.name):
        for port, listen in sorted(s.listens.items()):
            endpoint = Endpoint(port, port, own[s.name], listen.published is not None, listen.knob,
                                list(listen.evidence), required=any(proves_listener(e) for e in listen.evidence))
            endpoints[s.name][port] = endpoint
            if listen.published is None:
                continue
            at = listen.host_ip or WILDCARD
            if listen.published == "":  # no host side: a free port of the node, chosen when `up` runs, as Docker does
                endpoint.forward = f"{at}:{EPHEMERAL}"
                continue
            number = int(listen.published) if listen.published.isdigit() else port  # (a range: its own number)
            other = next((name for point, name in published_at if overlaps(point, (at, number))), None)
            if number < 1024 or other is not None:
                while any(overlaps(point, (at, next_port)) for point, _ in published_at) or next_port == dns_port(port_base):
                    next_port += 1
                reason = f"{number} is privileged" if number < 1024 else f"{number} is also published by service {other!r}"
                warnings.append(f"service {s.name!r}: published port {reason}; it is published on {at}:{next_port} "
                                f"instead (forwarded to its port {port})")
                number = next_port
                next_port += 1
            published_at.append(((at, number), s.name))
            endpoint.forward = f"{at}:{number}"
    return NetworkPlan(address_block, port_base, own, dict(own), endpoints, warnings, {},
                       gateway=gateway_address(address_block))


def _dedupe(items: List[str]) -> List[str]:
    return list(dict.fromkeys(items))


# ---- references ----------------------------------------------------------------------------

_SCHEME_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


class References:
    """Rewrites references to moved ports: ``name:port`` (also inside URLs with credentials),
    ``http://name/`` (port 80 implied), a service's own ``localhost:port``, and FOO_HOST/FOO_PORT pairs."""

    def __init__(self, names: Dict[str, List[str]], network: Optional[NetworkPlan] = None):
        """Without ``network``: only finds references (``references``), before the plan is made."""
        self.network = network
        self.service_of: Dict[str, str] = {}
        for service, aliases in names.items():
            for alias in aliases:
                self.service_of.setdefault(alias, service)
        self.moved: Dict[str, Dict[int, int]] = {}
        for service, endpoints in (network.endpoints if network else {}).items():
            for port, endpoint in endpoints.items():
                if endpoint.moved:
                    self.moved.setdefault(service, {})[port] = endpoint.host
        aliases = sorted(self.service_of, key=len, reverse=True)
        alternatives = "|".join(re.escape(n) for n in aliases)
        # `name:port`, but not an image's `repo/name:8.13.2` (a tag: a path word before it, a dot after)
        self._named = re.compile(r"(?<![\w.-])(?<!(?<![/:])/)(" + alternatives + r"):(\d{1,5})(?![\d.]*[\w-])(?!\.\d)")\
            if aliases else None
        self._bare = re.compile(r"\b(https?|wss?)://((?:[^\s/@'\"]*@)?)(" + alternatives + r")(?=[/\s'\";]|$)") \
            if aliases else None

    def port_of(self, name: str, port: int) -> Optional[int]:
        service = self.service_of.get(name)
        return self.moved.get(service or "", {}).get(port)

    def references(self, text: str, local: Set[str] = frozenset()) -> List[Tuple[str, int]]:
        """(service, port) of every ``name:port`` and bare ``http://name`` in the text; ``local``:
        names the service's other config files define for themselves (an upstream block)."""
        found = []
        if self._named is not None:
            local = set(local) | adapters.names_not_hosts(text)
            found += [(self.service_of[m.group(1)], int(m.group(2))) for m in self._named.finditer(text)]
            found += [(self.service_of[m.group(3)], _SCHEME_PORTS[m.group(1)]) for m in self._bare.finditer(text)
                      if m.group(3) not in local]
        return found

    def rewrite(self, text: str, service: Optional[str] = None, own_host: bool = False) -> str:
        """Rewrite references to other services' moved ports, and to the service's own ports through
        localhost: a service told its own address is not on 127.0.0.1, so its own scripts' and
        settings' ``localhost:PORT`` go to that address (as under Docker, where the container's
        loopback is its own). ``own_host`` (its healthcheck): also ``0.0.0.0:PORT`` and bare
        ``localhost``/``127.0.0.1``, which in a probe can only mean the service itself."""
        if self._named is not None and self.moved:
            text = self._named.sub(
                lambda m: f"{m.group(1)}:{self.port_of(m.group(1), int(m.group(2))) or m.group(2)}", text)
            local = adapters.names_not_hosts(text)
            text = self._bare.sub(lambda m: m.group(0) if m.group(3) in local else self._bare_url(m), text)
        if service is not None and self.network is not None:
            endpoints = self.network.endpoints.get(service, {})
            address = self.network.address.get(service, WILDCARD)

            def host_for(host: str, endpoint: Endpoint) -> str:
                if endpoint.address in WILDCARDS or (host == "0.0.0.0" and not own_host):
                    return host  # (a launch line's 0.0.0.0:PORT is where it binds: its knob's business)
                return endpoint.address

            def own(m: "re.Match[str]") -> str:
                endpoint = endpoints.get(int(m.group(2)))
                if endpoint is None:
                    return m.group(0)
                return f"{host_for(m.group(1), endpoint)}:{endpoint.host}"
            text = re.sub(r"(?<![\w.-])(localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\]):(\d{1,5})(?!\d)", own, text)

            def implied(m: "re.Match[str]") -> str:  # `http://127.0.0.1/health`: its port 80, which moved
                endpoint = endpoints.get(_SCHEME_PORTS[m.group(1)])
                if endpoint is None or not endpoint.moved:
                    return m.group(0)
                return f"{m.group(1)}://{host_for(m.group(2), endpoint)}:{endpoint.host}"
            text = re.sub(r"\b(https?|wss?)://(localhost|127\.0\.0\.1|\[::1\])(?=[/\s'\"]|$)", implied, text)
            if own_host and address not in WILDCARDS:
                text = re.sub(r"(?<![\w.-])(localhost|127\.0\.0\.1)(?![\w.:-])", address, text)
        return text

    def _bare_url(self, m: "re.Match[str]") -> str:
        port = self.port_of(m.group(3), _SCHEME_PORTS[m.group(1)])
        return f"{m.group(1)}://{m.group(2)}{m.group(3)}:{port}" if port else m.group(0)

    def rewrite_environment(self, env: Dict[str, Optional[str]], service: str) -> Dict[str, Optional[str]]:
        out = {k: (self.rewrite(v, service) if isinstance(v, str) else v) for k, v in env.items()}
        for key, host, port in host_port_pairs(env):
            new = self.port_of(host, port)
            if new is not None:
                out[key] = str(new)
        return out


def host_port_pairs(env: Dict[str, Optional[str]]) -> List[Tuple[str, str, int]]:
    """FOO_HOST=db + FOO_PORT=5432 name a server and its port in two variables: (port key, host, port)."""
    pairs = []
    for key, value in env.items():
        if not key.endswith("_PORT") or not isinstance(value, str) or not value.isdigit():
            continue
        prefix = key[: -len("_PORT")]
        for host_key in (f"{prefix}_HOST", f"{prefix}_HOSTNAME", f"{prefix}_ADDR", f"{prefix}_SERVER"):
            host = env.get(host_key)
            if isinstance(host, str) and host:
                pairs.append((key, host, int(value)))
                break
    return pairs
