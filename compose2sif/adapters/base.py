"""The adapter interface: what the generic code may ask of an image family, and nothing more.

An ``Adapter`` describes one family's images (ports and their knobs, the address knob, writable
paths...) and has hooks the planner calls; a ``Preset`` describes a family of projects (Dify) whose
adapters refine the general ones; a ``PasswordClient`` is a family's command-line client that can
read its password from a variable instead of its command line.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from compose2sif.errors import ComposeError
from compose2sif.model import Service
from compose2sif.types import Bind, Endpoint, Knob, ServiceReferences


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
    refs: ServiceReferences
    tls: bool = False                 # --tls: put HTTPS in front of it if the adapter can
    ssrf_allow: List[str] = field(default_factory=list)         # --ssrf-allow: private destinations to allow
    model_servers: Dict[str, str] = field(default_factory=dict)  # services that serve models -> their family
    serves_https: bool = False        # set by the adapter when it put HTTPS on its ``tls_port``
    docker_dns: bool = False          # Docker's DNS (127.0.0.11) answers the project's names: as written
    warnings: List[str] = field(default_factory=list)


@dataclass
class Adapter:
    """What compose2sif knows about one image family.

    ``ports``: the ports its images listen on by default, each with the knob that moves it;
    ``address``: the knob that tells it its listen address; ``default_command``: the image's CMD,
    needed when a knob is a flag and the compose file sets no command; ``writable``: directories
    it writes inside the image; ``per_port_address``: each port can get an address of its own;
    ``workdir``: the image's WORKDIR, known without asking its registry; ``preset``: the adapter
    applies only to projects of that family (Dify's web front is not every web front).
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
    entry_port: Optional[int] = None  # a web front: the port it serves plain HTTP on
    tls_port: Optional[int] = None    # it can serve HTTPS for --tls, on this port
    clients: Tuple["PasswordClient", ...] = ()  # its command-line clients that can take a password from a variable
    check: Tuple[str, ...] = ()       # a command that says why its program would not start (`up` runs it in the
                                      # image where the service exits at once and its output says nothing)

    def matches(self, repository: str) -> bool:
        return re.search(self.images, repository) is not None

    def shown_by(self, service: Service) -> bool:
        """Whether the project shows this program in the service whatever its image is called (a
        config mounted where it reads one, its name in the command)."""
        return False

    def fix(self, service: Service, port: int) -> Optional[str]:
        """Where its port cannot move as the service stands: the change that lets it (a line
        starting `fix:`), or None (the generic hint, naming the variable it reads its port from)."""
        return None

    def configurable(self, service: Service) -> bool:
        """Whether its ``config`` knobs work for this service (a config we render is mounted)."""
        return True

    def fakeroot(self, service: Service) -> Optional[Tuple[int, str]]:
        """(N, line): the service needs `--fakeroot` with container ids 0..N mapped (it changes to
        those ids); without such a mapping it starts plainly and `up` prints the line once."""
        return None

    def finish(self, draft: Draft) -> None:
        """Rewrites of the launch, healthcheck and config files once ports and address are decided."""

    def names_not_hosts(self, text: str) -> Set[str]:
        """Names that ``text`` (a config of this family) defines for itself, such as a block that a
        URL names: `http://NAME` then means that block, not a service called NAME."""
        return set()

    def parallel_size(self, argv: List[str], path: str) -> int:
        """How many GPUs one server spans, as its command line ``argv`` says (for a batch job);
        ``path`` names the command in an error."""
        return 1

    def across_nodes_problem(self, argv: List[str]) -> Optional[str]:
        """Why the server, as ``argv`` runs it, cannot span nodes over Ray (None: it can)."""
        return None


@dataclass(frozen=True)
class PasswordClient:
    """A command-line client that reads its password from ``variable`` as well as from its flags:
    ``flags`` take the password as the next word, ``attached`` prefixes carry it in the same word."""
    command: str
    variable: str
    flags: Tuple[str, ...] = ()
    attached: Tuple[str, ...] = ()

    def take_password(self, args: List[str]) -> Tuple[List[str], Optional[str]]:
        """(the arguments less the password and its flag, the password or None)."""
        kept: List[str] = []
        secret, i = None, 0
        while i < len(args):
            arg = args[i]
            prefix = next((p for p in self.attached if arg.startswith(p) and len(arg) > len(p)
                           or p.endswith("=") and arg.startswith(p)), None)
            if prefix is not None:
                secret = arg[len(prefix):]
            elif arg in self.flags and i + 1 < len(args):
                secret, i = args[i + 1], i + 1
            else:
                kept.append(arg)
            i += 1
        return kept, secret

    def shell_pattern(self) -> str:
        """A regex that finds the client with a password in a shell script."""
        forms = [re.escape(p) + ("" if p.endswith("=") else r"\S") for p in self.attached]
        forms += [re.escape(f) + r"\s" for f in self.flags]
        return rf"\b{re.escape(self.command)}\b.*\s({'|'.join(forms)})"


@dataclass(frozen=True)
class Preset:
    """A family of projects (Dify) recognised by its own images; its adapters apply only within it.

    ``secrets``: variables of the project's own settings and their public defaults, replaced by
    generated values; ``dotenv_example``: its users copy ``.env.example`` to ``.env`` before the
    first start, and convert does that for them when ``.env`` is missing."""
    name: str
    title: str                        # as its users write it
    image_prefix: str                 # repository prefix of its own images, e.g. `owner/project-`
    secrets: Dict[str, str] = field(default_factory=dict)
    dotenv_example: bool = False

    def matches(self, repository: str) -> bool:
        return re.search(r"(^|/)" + re.escape(self.image_prefix), repository) is not None

    def prepare(self, error: ComposeError) -> Optional[str]:
        """Do what the project's users do before its first start, when loading failed with ``error``
        for want of it; returns the line that says what was done, or None (nothing to do)."""
        if not self.dotenv_example:
            return None
        match = re.search(r"env file (\S+/\.env) not found", str(error))
        if match is None:
            return None
        dotenv = match.group(1)
        example = dotenv + ".example"
        folder = os.path.dirname(dotenv)
        composes = [os.path.join(folder, n) for n in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml")]
        if not os.path.isfile(example) or not any(os.path.isfile(c) and self._named_in(c) for c in composes):
            return None
        with open(os.open(dotenv, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as out, \
                open(example, encoding="utf-8") as source:
            out.write(source.read())
        return f"created {dotenv} from .env.example, as {self.title}'s setup does; edit it to change settings"

    def _named_in(self, path: str) -> bool:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return self.image_prefix in fh.read()


def flag_value(argv: List[str], *names: str) -> Optional[str]:
    """The value of the first of ``names`` on a command line: `NAME VALUE` or `NAME=VALUE`."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg[len(name) + 1:]
    return None
