"""Short syntax to long syntax, defaults, and normalisation (compose-go's transform and normalize).

``"127.0.0.1:8000-8001:80-81/udp"`` becomes two port mappings, ``./data:/data:ro`` a bind mount,
``depends_on: [db]`` a mapping with conditions, ``env_file: a.env`` a list of ``{path, required}``.
"""
from __future__ import annotations

import posixpath
from typing import Any, Callable, Dict, List, Tuple

from compose2sif.errors import ComposeError
from compose2sif.load.interpolate import PathTable

Path = Tuple[str, ...]


# ---- ports -----------------------------------------------------------------------------------

def _port_range(text: str, what: str, spec: str) -> Tuple[int, int]:
    def number(part: str) -> int:
        if not part.isdigit() or int(part) > 65535:
            raise ComposeError(f"invalid {what}: {text}")
        return int(part)
    if text == "":
        raise ComposeError(f"empty port in {spec!r}")
    if "-" not in text:
        n = number(text)
        return n, n
    start, end = text.split("-", 1)
    s, e = number(start), number(end)
    if e < s:
        raise ComposeError(f"invalid range specified for port: {text}")
    return s, e


def parse_port(spec: str) -> List[Dict[str, Any]]:
    """Docker's port syntax ``[[ip:]host:]container[/proto]`` to Compose's long syntax."""
    parts = spec.split(":")
    container = parts[-1]
    if len(parts) == 1:
        ip, host = "", ""
    elif len(parts) == 2:
        ip, host = "", parts[0]
    elif len(parts) == 3:
        ip, host = parts[0], parts[1]
    else:
        ip, host = ":".join(parts[:-2]), parts[-2]
    container, _, proto = container.partition("/")
    proto = proto or "tcp"
    if ip.startswith("[") and ip.endswith("]"):
        ip = ip[1:-1]
    if ip:
        import ipaddress  # here: most projects publish no address, and the module costs ~2 ms to import
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ComposeError(f"invalid IP address: {ip}") from None
    if container == "":
        raise ComposeError(f"no port specified: {spec}<empty>")
    start, end = _port_range(container, "containerPort", spec)
    host_start = host_end = 0
    if host:
        host_start, host_end = _port_range(host, "hostPort", spec)
        if end - start != host_end - host_start and end != start:
            raise ComposeError(f"invalid ranges specified for container and host Ports: {container} and {host}")
    if proto.lower() not in ("tcp", "udp", "sctp"):
        raise ComposeError(f"invalid proto: {proto}")
    mappings = []
    for i in range(end - start + 1):
        published = str(host_start + i) if host else ""
        if start == end and host_start != host_end:
            published = f"{published}-{host_end}"
        mapping: Dict[str, Any] = {"mode": "ingress"}
        if ip:
            mapping["host_ip"] = ip
        mapping["target"] = start + i
        if published:
            mapping["published"] = published
        mapping["protocol"] = proto.lower()
        mappings.append((f"{start + i}/{proto.lower()}", mapping))
    # Docker collects the mappings in a map and sorts its keys as strings.
    return [m for _, m in sorted(mappings, key=lambda kv: kv[0])]


# ---- volumes ---------------------------------------------------------------------------------

def _is_file_path(source: str) -> bool:
    if not source:
        return False
    if source[0] in "./~" or source.startswith("\\\\"):
        return True
    return len(source) > 1 and source[0].isalpha() and source[1] == ":"


def parse_volume(spec: str, where: str = "") -> Dict[str, Any]:
    """Docker's ``[source:]target[:options]`` volume syntax to Compose's long syntax."""
    volume: Dict[str, Any] = {}
    if len(spec) == 0:
        raise ComposeError("invalid empty volume spec", path=where or None)
    if len(spec) <= 2:
        return {"type": "volume", "target": spec}
    buffer: List[str] = []
    depth = 0
    source = target = None
    options: List[str] = []
    end = "\0"
    text = spec + end
    for i, ch in enumerate(text):
        if ch == "$" and i + 1 < len(spec) and spec[i + 1] == "{":
            depth += 1
            buffer.append(ch)
            continue
        if ch == "}" and depth > 0:
            depth -= 1
            buffer.append(ch)
            continue
        if ch == ":" and len(buffer) == 1 and buffer[0].isalpha():  # Windows drive letter
            buffer.append(ch)
        elif ch in (":", end) and depth == 0:
            chunk = "".join(buffer)
            if not chunk:
                raise ComposeError(f"invalid spec: {spec}: empty section between colons", path=where or None)
            if source is None and ch == end:
                target = chunk
            elif source is None:
                source = chunk
            elif target is None:
                target = chunk
            elif ch == ":":
                raise ComposeError(f"invalid spec: {spec}: too many colons", path=where or None)
            else:
                options = chunk.split(",")
            buffer = []
        else:
            buffer.append(ch)
    bind: Dict[str, Any] = {}
    read_only = False
    nocopy = False
    for option in options:
        if option == "ro":
            read_only = True
        elif option == "rw":
            read_only = False
        elif option == "nocopy":
            nocopy = True
        elif option in ("rprivate", "private", "rshared", "shared", "rslave", "slave"):
            bind["propagation"] = option
        elif option in ("z", "Z"):
            bind["selinux"] = option
    if source and _is_file_path(source):
        volume["type"] = "bind"
        bind["create_host_path"] = True
    else:
        volume["type"] = "volume"
    if source:
        volume["source"] = source
    if target is not None:
        volume["target"] = posixpath.normpath(target) if target else ""
    if read_only:
        volume["read_only"] = True
    if volume["type"] == "bind":
        volume["bind"] = bind
    else:
        if bind:
            volume["bind"] = bind
        volume["volume"] = {"nocopy": True} if nocopy else {}
    return volume


# ---- canonical form --------------------------------------------------------------------------

def _err(path: Path, message: str) -> ComposeError:
    return ComposeError(message, path=".".join(path))


def _string_or_list(value, path):
    return [value] if isinstance(value, str) else value


def _key_value(value, path):
    if isinstance(value, list):
        out = {}
        for item in value:
            key, sep, val = str(item).partition("=")
            if not sep:
                raise _err(path, f"invalid value {item}, expected key=value")
            out[key] = val
        return out
    return value


def _depends_on(value, path):
    if isinstance(value, list):
        return {str(name): {"condition": "service_started", "required": True} for name in value}
    if isinstance(value, dict):
        for name, dep in value.items():
            if not isinstance(dep, dict):
                raise _err(path + (name,), f"unsupported value {dep!r}")
            dep.setdefault("condition", "service_started")
            dep.setdefault("required", True)
        return value
    raise _err(path, f"invalid type {type(value).__name__} for depends_on")


def _env_file(value, path):
    def one(item):
        if isinstance(item, str):
            return {"path": item, "required": True}
        if isinstance(item, dict):
            item.setdefault("required", True)
            return item
        raise _err(path, f"invalid env_file entry {item!r}")
    if isinstance(value, str):
        return [one(value)]
    if isinstance(value, list):
        return [one(item) for item in value]
    raise _err(path, f"invalid type {type(value).__name__} for env_file")


def _extends(value, path):
    return {"service": value} if isinstance(value, str) else value


def _gpus(value, path):
    if isinstance(value, str):
        return [{"count": "all"}]
    if isinstance(value, list):
        return value
    raise _err(path, f"invalid type {type(value).__name__} for gpus")


def _slice_to_map(value, path):
    if isinstance(value, list):
        return {str(item): None for item in value}
    return value


def _volume(value, path):
    if isinstance(value, str):
        return parse_volume(value, ".".join(path[:3]))
    if isinstance(value, dict):
        return value
    raise _err(path, f"invalid type {type(value).__name__} for a service volume")


def _device(value, path):
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) > 3:
            raise _err(path, f"confusing device mapping, please use long syntax: {value}")
        src = parts[0]
        dst = parts[1] if len(parts) > 1 and parts[1] else src
        return {"source": src, "target": dst, "permissions": parts[2] if len(parts) == 3 else "rwm"}
    return value


def _file_mount(value, path):
    return {"source": value} if isinstance(value, str) else value


def _ports(value, path):
    if not isinstance(value, list):
        raise _err(path, f"invalid type {type(value).__name__} for ports")
    ports = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, str, dict)):
            raise _err(path, f"invalid port {item!r}")
        if isinstance(item, dict):
            ports.append(item)
            continue
        try:
            ports.extend(parse_port(str(item)))
        except ComposeError as exc:
            raise _err(path, exc.message) from None
    return ports


def _build(value, path):
    if isinstance(value, str):
        return {"context": value}
    if isinstance(value, dict):
        return value
    raise _err(path, f"invalid type {type(value).__name__} for build")


def _ulimit(value, path):
    if isinstance(value, (dict, int)) and not isinstance(value, bool):
        return value
    raise _err(path, f"invalid type {type(value).__name__} for ulimit")


def _maybe_external(value, path):
    if value is None:
        return None
    if isinstance(value, dict) and isinstance(value.get("external"), dict):
        external = value["external"]
        value["external"] = True
        if "name" in external:
            if "name" in value and value["name"] != external["name"]:
                raise _err(path, "name and external.name conflict; only use name")
            value.setdefault("name", external["name"])
    return value


def _include(value, path):
    return {"path": value} if isinstance(value, str) else value


_TRANSFORMS: Dict[Path, Callable[[Any, Path], Any]] = {
    ("services", "*", "build", "secrets", "*"): _file_mount,
    ("services", "*", "build", "additional_contexts"): _key_value,
    ("services", "*", "depends_on"): _depends_on,
    ("services", "*", "env_file"): _env_file,
    ("services", "*", "label_file"): _string_or_list,
    ("services", "*", "extends"): _extends,
    ("services", "*", "gpus"): _gpus,
    ("services", "*", "networks"): _slice_to_map,
    ("services", "*", "models"): _slice_to_map,
    ("services", "*", "volumes", "*"): _volume,
    ("services", "*", "dns"): _string_or_list,
    ("services", "*", "devices", "*"): _device,
    ("services", "*", "secrets", "*"): _file_mount,
    ("services", "*", "configs", "*"): _file_mount,
    ("services", "*", "ports"): _ports,
    ("services", "*", "build"): _build,
    ("services", "*", "ulimits", "*"): _ulimit,
    ("services", "*", "build", "ulimits", "*"): _ulimit,
    ("services", "*", "develop", "watch", "*", "ignore"): _string_or_list,
    ("services", "*", "develop", "watch", "*", "include"): _string_or_list,
    ("volumes", "*"): _maybe_external,
    ("networks", "*"): _maybe_external,
    ("secrets", "*"): _maybe_external,
    ("configs", "*"): _maybe_external,
    ("include", "*"): _include,
}
# Transforms whose result must still be walked (children may have their own transform).
_DESCEND = {("services", "*", "build"), ("volumes", "*"), ("networks", "*"), ("secrets", "*"),
            ("configs", "*"), ("services", "*", "extends")}


_TABLE = PathTable({pattern: (transform, pattern in _DESCEND) for pattern, transform in _TRANSFORMS.items()})


def canonical(value: Any, path: Path = ()) -> Any:
    found = _TABLE.get(path)
    if found is not None:
        transform, descend = found
        value = transform(value, path)
        if not descend:
            return value
    if isinstance(value, dict):
        for k in list(value):
            sub = path + (str(k),)
            if _TABLE.leads_somewhere(sub):
                value[k] = canonical(value[k], sub)
    elif isinstance(value, list) and _TABLE.leads_somewhere(path + ("*",)):
        for i, item in enumerate(value):
            value[i] = canonical(item, path + ("*",))
    return value


# ---- defaults --------------------------------------------------------------------------------

def set_defaults(model: Dict[str, Any]) -> None:
    for service in (model.get("services") or {}).values():
        if not isinstance(service, dict):
            continue
        build = service.get("build")
        if isinstance(build, dict):
            build.setdefault("context", ".")
        for secret in service.get("secrets") or []:
            if isinstance(secret, dict) and "target" not in secret:
                secret["target"] = f"/run/secrets/{secret.get('source')}"
        for port in service.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "tcp")
                port.setdefault("mode", "ingress")
        devices = (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices")
        for request in list(devices or []) + list(service.get("gpus") or []):
            if isinstance(request, dict) and "count" not in request and "device_ids" not in request:
                request["count"] = "all"
