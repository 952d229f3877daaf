"""Merging compose documents with Docker Compose's override rules.

Used for several ``-f`` files, for ``extends`` and for ``include`` conflicts. Mappings merge key by
key, sequences append, scalars are replaced; some keys have their own rule (``command`` and
``entrypoint`` are replaced whole, ``environment`` and ``labels`` merge by variable name,
``volumes`` by target, ``ports`` without duplicates...). ``!reset`` and ``!override`` are honoured
by :func:`apply_resets` before the merge. Ported from compose-go's override package.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

from compose2sif.errors import ComposeError
from compose2sif.load.interpolate import PathTable, path_matches
from compose2sif.load.yaml_source import Override, Reset
from compose2sif.units import go_str

Path = Tuple[str, ...]


def _as_sequence(value: Any) -> List[Any]:
    if isinstance(value, dict):
        seq = []
        for k, v in value.items():
            if v is None:
                seq.append(k)
            elif isinstance(v, list):
                seq.extend(f"{k}={go_str(item)}" for item in v)
            else:
                seq.append(f"{k}={go_str(v)}")
        return sorted(seq)
    if isinstance(value, list):
        return list(value)
    if isinstance(value, str):
        return [value]
    return []


def _as_mapping(value: Any, default) -> Dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, list):
        return {str(item): (dict(default) if default is not None else None) for item in value}
    return {}


def _to_sequence(base, other, path):
    return _as_sequence(base) + _as_sequence(other)


def _extra_hosts(base, other, path):
    left = _as_sequence(base)
    return left + [v for v in _as_sequence(other) if v not in left]


def _replace(base, other, path):
    return other


def _build(base, other, path):
    def as_build(v):
        return {"context": v} if isinstance(v, str) else v
    return merge_mappings(as_build(base), as_build(other), path)


_DEPENDENCY = {"condition": "service_started", "required": True}


def _depends_on(base, other, path):
    return merge_mappings(_as_mapping(base, _DEPENDENCY), _as_mapping(other, _DEPENDENCY), path)


def _keyed_mapping(base, other, path):
    return merge_mappings(_as_mapping(base, None), _as_mapping(other, None), path)


def _logging(base, other, path):
    if not isinstance(base, dict) or not isinstance(other, dict):
        return other
    if "driver" not in base or "driver" not in other or base["driver"] == other["driver"]:
        return merge_mappings(base, other, path)
    return other


def _ulimit(base, other, path):
    return other


_SPECIAL: Dict[Path, Callable[[Any, Any, Path], Any]] = {
    ("networks", "*", "labels"): _to_sequence,
    ("volumes", "*", "labels"): _to_sequence,
    ("services", "*", "annotations"): _to_sequence,
    ("services", "*", "build"): _build,
    ("services", "*", "build", "args"): _to_sequence,
    ("services", "*", "build", "additional_contexts"): _to_sequence,
    ("services", "*", "build", "extra_hosts"): _extra_hosts,
    ("services", "*", "build", "labels"): _to_sequence,
    ("services", "*", "command"): _replace,
    ("services", "*", "depends_on"): _depends_on,
    ("services", "*", "deploy", "labels"): _to_sequence,
    ("services", "*", "dns"): _to_sequence,
    ("services", "*", "dns_opt"): _to_sequence,
    ("services", "*", "dns_search"): _to_sequence,
    ("services", "*", "entrypoint"): _replace,
    ("services", "*", "env_file"): _to_sequence,
    ("services", "*", "label_file"): _to_sequence,
    ("services", "*", "environment"): _to_sequence,
    ("services", "*", "extra_hosts"): _extra_hosts,
    ("services", "*", "healthcheck", "test"): _replace,
    ("services", "*", "labels"): _to_sequence,
    ("services", "*", "volumes", "*", "volume", "labels"): _to_sequence,
    ("services", "*", "logging"): _logging,
    ("services", "*", "models"): _keyed_mapping,
    ("services", "*", "networks"): _keyed_mapping,
    ("services", "*", "sysctls"): _to_sequence,
    ("services", "*", "tmpfs"): _to_sequence,
    ("services", "*", "ulimits", "*"): _ulimit,
}


_SPECIAL_TABLE = PathTable(_SPECIAL)


def merge(base: Any, other: Any, path: Path) -> Any:
    merger = _SPECIAL_TABLE.get(path)
    if merger is not None:
        return merger(base, other, path)
    if other is None:
        return base
    if isinstance(base, dict):
        if not isinstance(other, dict):
            raise ComposeError("cannot override with a value of another type", path=".".join(path))
        return merge_mappings(base, other, path)
    if isinstance(base, list):
        if not isinstance(other, list):
            raise ComposeError("cannot override with a value of another type", path=".".join(path))
        return base + other
    return other


def merge_mappings(base: Dict[str, Any], other: Dict[str, Any], path: Path) -> Dict[str, Any]:
    for key, value in other.items():
        if key not in base:
            base[key] = value
        else:
            base[key] = merge(base[key], value, path + (key,))
    return base


# ---- !reset / !override --------------------------------------------------------------------

def collect_resets(tree: Any) -> Tuple[Any, List[Path]]:
    """Strip !reset/!override markers from a document; return it and the paths they marked."""
    paths: List[Path] = []

    def walk(value: Any, path: Path) -> Any:
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                sub = path + (str(k),)
                if isinstance(v, Reset):
                    paths.append(sub)
                    continue
                if isinstance(v, Override):
                    paths.append(sub)
                    v = v.value
                out[k] = walk(v, sub)
            return out
        if isinstance(value, list):
            out_list = []
            for i, v in enumerate(value):
                if isinstance(v, Reset):
                    continue
                if isinstance(v, Override):
                    v = v.value
                out_list.append(walk(v, path + (str(i),)))
            return out_list
        return value

    return walk(tree, ()), paths


def apply_resets(target: Any, paths: List[Path], path: Path = ()) -> None:
    """Delete from ``target`` (what earlier files built) every key a !reset/!override names."""
    if not paths:
        return
    if isinstance(target, dict):
        for key in list(target):
            sub = path + (str(key),)
            if any(path_matches(sub, p) for p in paths):
                del target[key]
            else:
                apply_resets(target[key], paths, sub)
    elif isinstance(target, list):
        for i, item in enumerate(target):
            apply_resets(item, paths, path + (f"[{i}]",))


# ---- unicity: duplicates that merging produced ------------------------------------------------

def _key_value_index(value, path):
    if not isinstance(value, str):
        raise ComposeError(f"unexpected value {value!r}", path=".".join(path))
    return value.split("=", 1)[0]


def _volume_index(value, path):
    if isinstance(value, dict):
        target = value.get("target")
        if not isinstance(target, str):
            raise ComposeError("service volume is missing a mount target", path=".".join(path))
        return target
    if isinstance(value, str):
        from compose2sif.load.canonical import parse_volume
        return parse_volume(value, ".".join(path)).get("target", "")
    return ""


def _device_index(value, path):
    if isinstance(value, dict):
        return str(value.get("target"))
    if isinstance(value, str):
        parts = value.split(":")
        return parts[0] if len(parts) == 1 else parts[1]
    return ""


def _expose_index(value, path):
    return str(value)


def _mount_index(default_dir):
    def index(value, path):
        if isinstance(value, str):
            return f"{default_dir}/{value}"
        if isinstance(value, dict):
            if "target" in value:
                return str(value["target"])
            return f"{default_dir}/{value.get('source')}"
        raise ComposeError(f"unsupported value {value!r}", path=".".join(path))
    return index


def _port_index(value, path):
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dict):
        if "target" not in value:
            raise ComposeError("service port is missing a target port", path=".".join(path))
        return (f"{value.get('host_ip', '0.0.0.0')}:{value.get('published')}:{value['target']}"
                f"/{value.get('protocol', 'tcp')}")
    return str(value)


def _env_file_index(value, path):
    if isinstance(value, dict):
        if "path" not in value:
            raise ComposeError("env_file entry is missing its path", path=".".join(path))
        return str(value["path"])
    return str(value)


_UNIQUE = {
    ("networks", "*", "labels"): _key_value_index,
    ("networks", "*", "ipam", "options"): _key_value_index,
    ("services", "*", "annotations"): _key_value_index,
    ("services", "*", "build", "args"): _key_value_index,
    ("services", "*", "build", "additional_contexts"): _key_value_index,
    ("services", "*", "build", "platform"): _key_value_index,
    ("services", "*", "build", "tags"): _key_value_index,
    ("services", "*", "build", "labels"): _key_value_index,
    ("services", "*", "cap_add"): _key_value_index,
    ("services", "*", "cap_drop"): _key_value_index,
    ("services", "*", "configs"): _mount_index(""),
    ("services", "*", "deploy", "labels"): _key_value_index,
    ("services", "*", "dns"): _key_value_index,
    ("services", "*", "dns_opt"): _key_value_index,
    ("services", "*", "dns_search"): _key_value_index,
    ("services", "*", "environment"): _key_value_index,
    ("services", "*", "env_file"): _env_file_index,
    ("services", "*", "expose"): _expose_index,
    ("services", "*", "labels"): _key_value_index,
    ("services", "*", "links"): _key_value_index,
    ("services", "*", "networks", "*", "aliases"): _key_value_index,
    ("services", "*", "networks", "*", "link_local_ips"): _key_value_index,
    ("services", "*", "ports"): _port_index,
    ("services", "*", "profiles"): _key_value_index,
    ("services", "*", "secrets"): _mount_index("/run/secrets"),
    ("services", "*", "sysctls"): _key_value_index,
    ("services", "*", "tmpfs"): _key_value_index,
    ("services", "*", "volumes"): _volume_index,
    ("services", "*", "devices"): _device_index,
}


_UNIQUE_TABLE = PathTable(_UNIQUE)


def enforce_unicity(value: Any, path: Path = ()) -> Any:
    """Drop duplicates from lists that must be unique; a later entry replaces an earlier one."""
    if isinstance(value, dict):
        for k in value:
            sub = path + (str(k),)
            if _UNIQUE_TABLE.leads_somewhere(sub):
                value[k] = enforce_unicity(value[k], sub)
        return value
    if isinstance(value, list):
        indexer = _UNIQUE_TABLE.get(path)
        if indexer is not None:
            seq: List[Any] = []
            keys: Dict[str, int] = {}
            for i, entry in enumerate(value):
                key = indexer(entry, path + (f"[{i}]",))
                if key in keys:
                    seq[keys[key]] = entry
                else:
                    keys[key] = len(seq)
                    seq.append(entry)
            return seq
    return value
