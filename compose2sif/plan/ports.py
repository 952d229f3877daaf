"""The port plan: where each service listens on the shared host network, and how its clients learn it.

Rootless Apptainer instances all share the node's network namespace, and every user on a node shares
its 127.0.0.1. So a port a service can be told about is moved into a block of 100 ports that belongs
to this user and project (deterministic: the same project gets the same ports again), and every
``name:port`` reference to it in other services is rewritten. A published port (``8080:80``) is
served on the host's 8080 directly; one below 1024 cannot be bound unprivileged and moves too.
"""
from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set, Tuple

from compose2sif.plan.knowledge import Setter

PORT_BLOCK = 100
FIRST_BLOCK_PORT = 20000
BLOCKS = 300  # blocks start at 20000 .. 49900


@dataclass
class PortRequest:
    service: str
    container: int
    published: Optional[str]        # compose's published spec ("8080", "8000-8010", "") or None
    host_ip: Optional[str]
    setter: Optional[Setter]        # None: the service cannot be told another port


@dataclass
class PortAssignment:
    container: int
    host: int
    address: str                    # the address it should listen on: 127.0.0.1 unless published
    published: bool
    setter: Optional[Setter]

    @property
    def moved(self) -> bool:
        return self.host != self.container


def default_base(project: str, uid: Optional[int] = None) -> int:
    """The first port of this user's and project's block."""
    uid = os.getuid() if uid is None else uid
    block = (uid * 7919 + zlib.crc32(project.encode())) % BLOCKS
    return FIRST_BLOCK_PORT + block * PORT_BLOCK


def listening_ports() -> Set[int]:
    """TCP ports something on this node listens on (any user), from /proc/net/tcp{,6}."""
    ports: Set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == "0A":  # LISTEN
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return ports


def _published_port(spec: Optional[str]) -> Optional[int]:
    if spec and spec.isdigit():
        return int(spec)
    return None


def allocate(requests: List[PortRequest], base: int, busy: Set[int],
             warnings: List[str]) -> Dict[Tuple[str, int], PortAssignment]:
    """Give every (service, container port) a host port. Deterministic for the same input."""
    result: Dict[Tuple[str, int], PortAssignment] = {}
    taken: Set[int] = set()
    fixed = [r for r in requests if r.setter is None]
    movable = [r for r in requests if r.setter is not None]

    # Ports we cannot move stay where they are; clashes are reported, not hidden.
    for r in sorted(fixed, key=lambda r: (r.service, r.container)):
        address = (r.host_ip or "0.0.0.0") if r.published is not None else "127.0.0.1"
        published = _published_port(r.published)
        if published is not None and published != r.container:
            warnings.append(f"service {r.service!r}: port {r.container} is published as {published}, but compose2sif "
                            f"does not know how to move this service's port; it stays on {r.container} "
                            "(add x-compose2sif.ports hints to move it)")
        if r.container in taken:
            warnings.append(f"service {r.service!r}: port {r.container} is also used by another service and "
                            "cannot be moved (add x-compose2sif.ports hints); one of them will fail to start")
        elif r.container < 1024:
            warnings.append(f"service {r.service!r}: port {r.container} is privileged and cannot be bound by an "
                            "unprivileged user; add x-compose2sif.ports hints so compose2sif can move it")
        elif r.container in busy:
            warnings.append(f"service {r.service!r}: port {r.container} is already in use on this node")
        taken.add(r.container)
        result[(r.service, r.container)] = PortAssignment(r.container, r.container, address,
                                                          r.published is not None, None)

    # Published ports keep their host port when it can be bound.
    for r in sorted(movable, key=lambda r: (r.service, r.container)):
        published = _published_port(r.published)
        if published is None:
            continue
        if published < 1024:
            warnings.append(f"service {r.service!r}: published port {published} is privileged; "
                            "it is served on another port (see plan.json)")
            continue
        if published in taken or published in busy:
            warnings.append(f"service {r.service!r}: published port {published} is taken; "
                            "it is served on another port (see plan.json)")
            continue
        taken.add(published)
        result[(r.service, r.container)] = PortAssignment(r.container, published, r.host_ip or "0.0.0.0", True,
                                                          r.setter)

    # Everything else movable goes into the project's block.
    candidate = base
    for r in sorted(movable, key=lambda r: (r.service, r.container)):
        if (r.service, r.container) in result:
            continue
        while candidate in taken or candidate in busy:
            candidate += 1
        if candidate >= base + PORT_BLOCK:
            warnings.append(f"the port block {base}-{base + PORT_BLOCK - 1} is full; using ports above it")
        taken.add(candidate)
        address = (r.host_ip or "0.0.0.0") if r.published is not None else "127.0.0.1"
        result[(r.service, r.container)] = PortAssignment(r.container, candidate, address,
                                                          r.published is not None, r.setter)
        candidate += 1
    return result


# ---- references ----------------------------------------------------------------------------

class References:
    """Rewrites ``name:port`` (also inside URLs with credentials) to the planned host port."""

    def __init__(self, names: Dict[str, List[str]], assignments: Dict[Tuple[str, int], PortAssignment]):
        self.by_name: Dict[str, Dict[int, int]] = {}
        for service, aliases in names.items():
            for alias in aliases:
                ports = self.by_name.setdefault(alias, {})
                for (svc, container), assignment in assignments.items():
                    if svc == service and assignment.moved:
                        ports[container] = assignment.host
        self.by_name = {n: p for n, p in self.by_name.items() if p}
        self.own: Dict[str, Dict[int, int]] = {}
        for (svc, container), assignment in assignments.items():
            if assignment.moved:
                self.own.setdefault(svc, {})[container] = assignment.host
        self._pattern = self._compile(self.by_name)

    @staticmethod
    def _compile(names: Iterable[str]) -> Optional["re.Pattern[str]"]:
        names = sorted(names, key=len, reverse=True)
        if not names:
            return None
        return re.compile(r"(?<![\w.-])(" + "|".join(re.escape(n) for n in names) + r"):(\d{1,5})(?!\d)")

    def rewrite(self, text: str, service: Optional[str] = None) -> str:
        """Rewrite references to other services, and `localhost:PORT` to the service's own port."""
        if self._pattern is not None:
            text = self._pattern.sub(
                lambda m: f"{m.group(1)}:{self.by_name[m.group(1)].get(int(m.group(2)), m.group(2))}", text)
        own = self.own.get(service or "")
        if own:
            text = re.sub(r"(?<![\w.-])(localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\]):(\d{1,5})(?!\d)",
                          lambda m: f"{m.group(1)}:{own.get(int(m.group(2)), m.group(2))}", text)
        return text

    def port_of(self, name: str, port: int) -> Optional[int]:
        return self.by_name.get(name, {}).get(port)

    def rewrite_environment(self, env: Dict[str, Optional[str]], service: str) -> Dict[str, Optional[str]]:
        out = {k: (self.rewrite(v, service) if isinstance(v, str) else v) for k, v in env.items()}
        # FOO_HOST=db + FOO_PORT=5432 name a service and its port in two variables.
        for key, value in env.items():
            if not key.endswith("_PORT") or not isinstance(value, str) or not value.isdigit():
                continue
            prefix = key[: -len("_PORT")]
            for host_key in (f"{prefix}_HOST", f"{prefix}_HOSTNAME", f"{prefix}_ADDR", f"{prefix}_SERVER"):
                host = env.get(host_key)
                if isinstance(host, str) and self.port_of(host, int(value)) is not None:
                    out[key] = str(self.port_of(host, int(value)))
                    break
        return out
