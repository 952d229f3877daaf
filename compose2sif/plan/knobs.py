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
from typing import Any, Dict, List, Optional, Set, Tuple

from compose2sif.adapters import Adapter, Draft
from compose2sif.errors import ComposeError
from compose2sif.model import Service
from compose2sif.plan.network import DECLARED, IMAGE_DEFAULT, IMAGE_EXPOSE, Listen, ServiceNet, proves_listener, strong
from compose2sif.types import WILDCARDS, Knob

RUNSCRIPT = "/.singularity.d/runscript"

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
                     reads: Optional[Set[str]] = None, shared: Set[str] = frozenset()) -> None:
    """`HOST=0.0.0.0`, `BIND_ADDRESS=0.0.0.0:8000`, `LISTEN_ADDR=:9000`, `PORT=8000`, `HTTP_PORT=3000`.
    ``peers``: lower-case names of the project's services (a `DB_PORT` beside service `db` is a client's).
    ``reads``: where the image's adapter says which variables it reads (``read_by``), only those are
    knobs. A variable that reaches many services through one shared env_file (a project-wide
    BIND_ADDRESS, ``shared``) is not every one's listen setting: only the adapter can say a
    program reads it; otherwise it is neither evidence nor a knob, and the service listens where
    it does (on all addresses, which the plan then says)."""
    for key in sorted(env):
        value = env[key]
        if not isinstance(value, str):
            continue
        if reads is not None and key not in reads or reads is None and key in shared:
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
    at = _options_end(out)
    return out[:at] + [flag, value] + out[at:]


def _options_end(argv: List[str]) -> int:
    """Where a new option goes: after the options already there (and their values), before the
    positional arguments after them (`server --console-address :9090 /data`: before `/data`, where
    many programs stop parsing options). Without options: before the paths after the first
    argument (`server /data`), else at the end (`node server.js`: the script comes first)."""
    options = [i for i, arg in enumerate(argv) if i > 0 and arg.startswith("-") and arg not in ("-", "--")]
    if options:
        last = options[-1]
        takes_value = "=" not in argv[last] and last + 1 < len(argv) and not argv[last + 1].startswith("-")
        return last + 2 if takes_value else last + 1
    for i in range(2, len(argv)):
        if argv[i].startswith(("/", "./", "../", "~")):
            return i
    return len(argv)


def apply_argv_edits(argv: List[str], edits: List[Tuple[Tuple[int, int, int], str]]) -> List[str]:
    """Replace text spans of argv, right to left so earlier spans keep their offsets."""
    out = list(argv)
    for (index, start, end), text in sorted(edits, key=lambda e: (e[0][0], -e[0][1])):
        out[index] = out[index][:start] + text + out[index][end:]
    return out


# ---- one service: what it listens on, and telling it ---------------------------------------------

def hints(service: Service) -> Dict[str, Any]:
    """The service's x-compose2sif mapping."""
    path = f"services.{service.name}.x-compose2sif"
    found = service.extensions.get("x-compose2sif") or {}
    if not isinstance(found, dict):
        raise ComposeError("must be a mapping", path=path)
    writable = found.get("writable")
    if writable is not None and not (isinstance(writable, list) and all(
            isinstance(p, str) and p.startswith("/") and "\0" not in p for p in writable)):
        raise ComposeError("must be a list of absolute paths", path=f"{path}.writable")
    return found


def _hint_knob(spec: Any, what: str, path: str) -> Optional[Knob]:
    """{env: NAME[, template: ...]}, {flag: --name} or {fixed: true} (None: known, cannot be told)."""
    if isinstance(spec, dict) and spec.get("fixed") is True and len(spec) == 1:
        return None
    if isinstance(spec, dict) and (isinstance(spec.get("env"), str) and spec["env"] or
                                   isinstance(spec.get("flag"), str) and spec["flag"].startswith("-")):
        template = spec.get("template", "{%s}" % what)
        try:  # tell() fills it with these three
            str(template).format(address="", port=0, value="")
        except (ValueError, KeyError, IndexError, AttributeError, TypeError) as exc:
            raise ComposeError(f"template {template!r}: not a template of {{address}}, {{port}} and {{value}} "
                               f"({exc})", path=f"{path}.template") from None
        if isinstance(spec.get("env"), str) and spec["env"]:
            return Knob("env", spec["env"], str(template))
        return Knob("flag", spec["flag"], str(template))
    raise ComposeError(f"expected {{env: NAME}}, {{flag: --name}} or {{fixed: true}}, not {spec!r}", path=path)


def _shaped(knob: Optional[Knob], env: Dict[str, Optional[str]]) -> Optional[Knob]:
    """A port variable that holds `:9000` or `host:9000` keeps that shape: only its port changes."""
    value = env.get(knob.name) if knob is not None and knob.kind == "env" and knob.template == "{port}" else None
    match = re.fullmatch(r"(.*):(\d{1,5})", value) if isinstance(value, str) else None
    if match is None:
        return knob
    host = match.group(1).replace("{", "{{").replace("}", "}}")
    return Knob("env", knob.name, host + ":{port}")


def service_net(service: Service, adapter: Optional[Adapter], launch: Optional[List[str]], exposed: List[int],
                found: Found, names: List[str]) -> ServiceNet:
    """Everything that says where the service listens, and the knobs that can tell it otherwise."""
    path = f"services.{service.name}.x-compose2sif"
    hinted_all = hints(service)
    flags_work = launch is not None or (adapter is not None and adapter.default_command is not None)

    def usable(knob: Optional[Knob]) -> Optional[Knob]:
        if knob is None or (knob.kind == "flag" and not flags_work):
            return None
        if knob.kind == "config" and adapter is not None and not adapter.configurable(service):
            return None
        return knob

    evidence: Dict[int, List[str]] = {}
    port_knobs: Dict[int, Optional[Knob]] = {}
    fixed: Set[int] = set()

    def saw(port: int, where: str) -> None:
        evidence.setdefault(port, [])
        if where not in evidence[port]:
            evidence[port].append(where)

    hinted = hinted_all.get("ports") or {}
    if not isinstance(hinted, dict):
        raise ComposeError("must be a mapping of port numbers", path=f"{path}.ports")
    for key, spec in hinted.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and 0 < int(key) < 65536):
            raise ComposeError(f"{key!r} is not a port number", path=f"{path}.ports")
        knob = _shaped(_hint_knob(spec, "port", f"{path}.ports.{key}"), service.environment)
        saw(int(key), "x-compose2sif")
        if knob is None:
            fixed.add(int(key))
        port_knobs.setdefault(int(key), knob)
    for port, knob in (adapter.ports if adapter else {}).items():
        if knob.kind == "config":  # the adapter renders the config: its `listen` is the knob
            port_knobs.setdefault(port, knob)
    for port, where in found.evidence.items():
        for w in where:
            saw(port, w)
        if port in found.ports:
            port_knobs.setdefault(port, found.ports[port])
    for port, knob in (adapter.ports if adapter else {}).items():
        saw(port, IMAGE_DEFAULT)
        port_knobs.setdefault(port, knob)
    listens: Dict[int, Listen] = {}
    for mapping in service.ports:
        if mapping.protocol != "tcp":
            continue
        saw(mapping.target, "ports")
        listens.setdefault(mapping.target, Listen(mapping.target, [], None, mapping.published or "", mapping.host_ip))
    for item in service.expose:
        first, _, last = item.split("/")[0].partition("-")  # "9000", "7000-7002", "53/udp"
        if first.isdigit() and (last or first).isdigit() and not item.endswith("/udp"):
            for port in range(int(first), min(int(last or first), int(first) + 100) + 1):
                saw(port, "expose")
    for port in exposed:
        saw(port, IMAGE_EXPOSE)
    for port, where in sorted(evidence.items()):
        if all(e.startswith("variable ") for e in where) and not strong(where):
            continue  # only a FOO_PORT variable says so: it knows the port, it does not prove a listener
        listen = listens.setdefault(port, Listen(port, [], None))
        listen.evidence = where
        listen.knob = None if port in fixed else usable(port_knobs.get(port))
        listen.weak = not strong(where)
    # A published port says where clients go, not that the program opens it: where the service's
    # own settings or its clients show the ports it listens on, one only published is not refused.
    if any(proves_listener(e) for listen in listens.values() for e in listen.evidence):
        for listen in listens.values():
            if all(e in DECLARED for e in listen.evidence):
                listen.weak = True
    address_hint = hinted_all.get("bind_address")
    if address_hint is not None:
        address_knobs = [_hint_knob(address_hint, "address", f"{path}.bind_address")]
    elif adapter is not None and adapter.address is not None and adapter.address.kind == "config":
        address_knobs = [adapter.address]
    else:  # the service's own settings, and the adapter's knob where they do not name it
        address_knobs = list(found.addresses)
        if adapter is not None and adapter.address is not None and \
                all(k.name != adapter.address.name for k in address_knobs):
            address_knobs.append(adapter.address)
    fixes = {port: adapter.fix(service, port) for port, listen in listens.items()
             if adapter is not None and listen.knob is None and port in adapter.ports and port not in fixed}
    return ServiceNet(service.name, names, listens, [k for k in map(usable, address_knobs) if k is not None],
                      per_port_address=bool(adapter and adapter.per_port_address),
                      fixes={port: text for port, text in fixes.items() if text})


def _port_in(knob: Knob, draft: Draft, launch: Optional[List[str]]) -> str:
    """The port an address setting holds now (`LISTEN_ADDR=0.0.0.0:8888`), kept when only the
    address is told: a port the plan does not know of is not the planner's to drop."""
    if knob.kind == "env":
        value = draft.environment.get(knob.name) or ""
    elif knob.kind == "argv" and launch is not None and knob.where is not None:
        index, start, end = knob.where
        value = launch[index][start:end]
    else:
        value = ""
    match = re.search(r":(\d{1,5})$", value)
    return match.group(1) if match else ""


def tell(draft: Draft, net: ServiceNet, adapter: Optional[Adapter], built: Optional[List[str]] = None) -> None:
    """Set the knobs: the service's address (unless it listens on all), and each moved port.
    ``built``: the image's own launch (its CMD), where knobs were seen when compose sets no command."""
    values: List[Tuple[Knob, Dict[str, Any]]] = []   # knob, {address, port, value}
    if draft.address not in WILDCARDS:
        for knob in net.address_knobs:
            port = next((e.host for e in draft.endpoints.values() if net.listens[e.container].knob == knob),
                        _port_in(knob, draft, draft.launch or built))
            values.append((knob, {"address": draft.address, "port": port, "value": draft.address}))
    told = {knob for knob, _ in values}
    for endpoint in draft.endpoints.values():
        knob = net.listens[endpoint.container].knob
        if endpoint.moved and knob is not None and knob not in told:  # an address knob too: `--address :9001`
            values.append((knob, {"address": endpoint.address, "port": endpoint.host, "value": endpoint.host}))
    edits, flags = [], []
    for knob, value in values:
        text = knob.template.format(**value)
        if knob.kind == "env":
            draft.environment[knob.name] = text
        elif knob.kind == "argv":
            edits.append((knob.where, text))
        elif knob.kind == "flag":
            flags.append((knob, text))
    if edits:
        draft.launch = apply_argv_edits(draft.launch or built, edits)
    if flags:
        if draft.launch is None:
            draft.launch = built or [RUNSCRIPT, *adapter.default_command]
        for knob, text in flags:
            draft.launch = set_flag(draft.launch, knob.name, text, knob.append)
