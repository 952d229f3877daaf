"""Knobs: the places where a service can be told its listen address or one of its ports.

Every service keeps its ports on its own loopback address (see network.py). For that it must be
told the address, and a port that has to move must be told its new number. A knob is one way to
tell it: an environment variable, a flag on its command line (also inside an ``sh -c`` script), or
a config file we render (an adapter's business). Knobs come from the image's adapter, from
``x-compose2sif`` hints, and from the service itself (``HOST=0.0.0.0``, ``--port 8000``, ``-b :8000``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

WILDCARDS = ("0.0.0.0", "::", "[::]", "*", "")


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
class Found:
    """What a service's own settings say about where it listens."""
    addresses: List[Knob] = field(default_factory=list)            # address knobs (one per flag or variable)
    ports: Dict[int, Knob] = field(default_factory=dict)           # port -> the knob that sets it
    evidence: Dict[int, List[str]] = field(default_factory=dict)   # port -> where it was seen

    def saw(self, port: int, where: str, knob: Optional[Knob] = None) -> None:
        if not 0 < port < 65536:
            return
        self.evidence.setdefault(port, [])
        if where not in self.evidence[port]:
            self.evidence[port].append(where)
        if knob is not None:
            self.ports.setdefault(port, knob)


# Flags whose value is a listen address, possibly with a port (`0.0.0.0`, `:8000`, `[::]:8000`).
ADDRESS_FLAGS = ("--host", "--bind", "-b", "--listen", "--address", "--console-address", "--ip",
                 "--bind-address", "--listen-address", "--bind_ip", "--hostname-bind")
PORT_FLAGS = ("--port",)
_ADDRESS_VALUE = re.compile(r"^(?P<host>0\.0\.0\.0|::|\[::\]|\*|localhost|127\.0\.0\.1|)(?::(?P<port>\d{1,5}))?$")
# A client-side setting: FOO_PORT beside FOO_HOST=somewhere names another server's port.
_PEER_SUFFIXES = ("_HOST", "_HOSTNAME", "_ADDR", "_ADDRESS", "_SERVER", "_URL", "_URI", "_ENDPOINT", "_DSN")
_ADDRESS_ENV = re.compile(r"(^|_)(HOST|ADDR|ADDRESS|LISTEN|BIND|BIND_ADDRESS|LISTEN_ADDRESS|HOSTNAME)$")


def _address_value(value: str) -> Optional["re.Match[str]"]:
    match = _ADDRESS_VALUE.match(value)
    if match is None or (match.group("host") == "" and match.group("port") is None):
        return None
    return match


def _address_template(match: "re.Match[str]") -> str:
    return "{address}:{port}" if match.group("port") else "{address}"


def read_by(address: Optional[Knob], ports: Dict[int, Knob]) -> Set[str]:
    """The variables an image's adapter says the image reads to listen: its env knobs."""
    return {k.name for k in [address, *ports.values()] if k is not None and k.kind == "env"}


def from_environment(env: Dict[str, Optional[str]], peers: set, found: Found,
                     reads: Optional[Set[str]] = None) -> None:
    """`HOST=0.0.0.0`, `BIND_ADDRESS=0.0.0.0:8000`, `LISTEN_ADDR=:9000`, `PORT=8000`, `HTTP_PORT=3000`.
    ``peers``: lower-case names of the project's services (a `DB_PORT` beside service `db` is a client's).
    ``reads``: where the image's adapter says which variables it reads (``read_by``), only those are
    knobs. A variable that reaches many services through one shared env_file (Dify's
    DIFY_BIND_ADDRESS) is not every one's listen setting."""
    for key in sorted(env):
        value = env[key]
        if not isinstance(value, str):
            continue
        if reads is not None and key not in reads:
            continue
        if _ADDRESS_ENV.search(key):
            match = _address_value(value)
            if match is not None and match.group("host") != "localhost" and (match.group("host") or match.group("port")):
                knob = Knob("env", key, _address_template(match))
                found.addresses.append(knob)
                if match.group("port"):
                    found.saw(int(match.group("port")), f"env {key}", knob)
        if (key == "PORT" or key.endswith("_PORT")) and value.isdigit():
            prefix = key[: -len("_PORT")] if key != "PORT" else ""
            if prefix and (prefix.lower() in peers or _names_a_peer(env, prefix)):
                continue
            found.saw(int(value), f"variable {key}", Knob("env", key, "{port}"))


def _names_a_peer(env: Dict[str, Optional[str]], prefix: str) -> bool:
    for suffix in _PEER_SUFFIXES:
        value = env.get(prefix + suffix)
        if isinstance(value, str) and value and _address_value(value) is None:
            return True
    return False


_SCRIPT_FLAG = re.compile(r"(?<![\w-])(?P<flag>" + "|".join(re.escape(f) for f in ADDRESS_FLAGS + PORT_FLAGS)
                          + r")(?:=|\s+)(?P<quote>['\"]?)(?P<value>[^\s'\";&|]*)(?P=quote)")


def from_argv(argv: List[str], found: Found) -> None:
    """Flags on the launch command line, and inside the script of `sh -c SCRIPT`."""
    for i, arg in enumerate(argv):
        flag, value, start = None, None, 0
        if "=" in arg and arg.startswith("-") and arg.split("=", 1)[0] in ADDRESS_FLAGS + PORT_FLAGS:
            flag, value = arg.split("=", 1)
            start = len(flag) + 1
            index = i
        elif arg in ADDRESS_FLAGS + PORT_FLAGS and i + 1 < len(argv):
            flag, value, index = arg, argv[i + 1], i + 1
        if flag is not None:
            _flag(flag, value, (index, start, start + len(value)), found)
        elif i > 0 and argv[i - 1] == "-c" and _is_shell(argv[: i - 1]):
            for m in _SCRIPT_FLAG.finditer(arg):
                _flag(m.group("flag"), m.group("value"), (i, m.start("value"), m.end("value")), found)


def _is_shell(before: List[str]) -> bool:
    return any(re.search(r"(^|/)(ba|da|a|z)?sh$", a) for a in before[-3:])


def _flag(flag: str, value: str, where: Tuple[int, int, int], found: Found) -> None:
    if flag in PORT_FLAGS:
        if value.isdigit():
            found.saw(int(value), f"flag {flag}", Knob("argv", flag, "{port}", where))
        return
    match = _address_value(value)
    if match is None:
        return  # `--host db`: a client's setting, not a listen address
    knob = Knob("argv", flag, _address_template(match), where)
    found.addresses.append(knob)
    if match.group("port"):
        found.saw(int(match.group("port")), f"flag {flag}", knob)


_OWN = re.compile(r"(?<![\w.-])(?:localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\]):(\d{1,5})(?!\d)")


def from_healthcheck(test: List[str], found: Found) -> None:
    for arg in test:
        for m in _OWN.finditer(arg):
            found.saw(int(m.group(1)), "healthcheck")


def set_flag(argv: List[str], flag: str, value: str, append: bool = False) -> List[str]:
    out = list(argv)
    if not append:
        for i, arg in enumerate(out):
            if arg.startswith(flag + "="):
                out[i] = f"{flag}={value}"
                return out
            if arg == flag and i + 1 < len(out):
                out[i + 1] = value
                return out
    return out + [flag, value]


def apply_argv_edits(argv: List[str], edits: List[Tuple[Tuple[int, int, int], str]]) -> List[str]:
    """Replace text spans of argv, right to left so earlier spans keep their offsets."""
    out = list(argv)
    for (index, start, end), text in sorted(edits, key=lambda e: (e[0][0], -e[0][1])):
        out[index] = out[index][:start] + text + out[index][end:]
    return out
