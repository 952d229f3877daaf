"""Structural validation of a merged compose document, before normalisation.

Compose validates each merged file against the Compose Specification's JSON schema. We check the
same things for every service key (the key must exist, its value must have the right shape) and
word errors the way Compose does: ``services.web.healthcheck.interval must be a string``.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Dict

from compose2sif.errors import ComposeError
from compose2sif.load.yaml_source import is_timestamp
from compose2sif.support import SERVICE_KEYS, TOP_LEVEL_KEYS

Check = Callable[[Any, str], None]


def _fail(path: str, what: str) -> ComposeError:
    return ComposeError(f"must be {what}", path=path)


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool)) and not is_timestamp(v)


def string(v, p):
    if not isinstance(v, str) or is_timestamp(v):
        raise _fail(p, "a string")


def boolean(v, p):
    if not isinstance(v, bool):
        raise _fail(p, "a boolean")


def number(v, p):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(p, "a number")


def string_or_number(v, p):
    if isinstance(v, bool) or not isinstance(v, (str, int, float)) or is_timestamp(v):
        raise _fail(p, "a string or number")


def mapping(v, p):
    if not isinstance(v, dict):
        raise _fail(p, "a mapping")


def string_list(v, p):
    if not isinstance(v, list):
        raise _fail(p, "a list of strings")
    for i, item in enumerate(v):
        string(item, f"{p}.{i}")


def string_or_list(v, p):
    if isinstance(v, list):
        string_list(v, p)
    else:
        string(v, p)


def list_or_dict(v, p):
    """Compose's list_or_dict: a mapping of scalar values, or a list of unique strings."""
    if isinstance(v, dict):
        for k, item in v.items():
            if not _is_scalar(item):
                raise _fail(f"{p}.{k}", "a boolean, null, number or string")
    elif isinstance(v, list):
        string_list(v, p)
        seen = set()
        for item in v:
            if item in seen:
                raise ComposeError(f"has non-unique elements: {item!r}", path=p)
            seen.add(item)
    else:
        raise _fail(p, "a list or a mapping")


def command(v, p):
    if v is None or isinstance(v, str):
        return
    string_list(v, p)


def any_list(v, p):
    if not isinstance(v, list):
        raise _fail(p, "a list")


def list_or_mapping(v, p):
    if not isinstance(v, (list, dict)):
        raise _fail(p, "a list or a mapping")


def string_or_mapping(v, p):
    if not isinstance(v, (str, dict)):
        raise _fail(p, "a string or a mapping")


def ports(v, p):
    any_list(v, p)
    for i, item in enumerate(v):
        if isinstance(item, bool) or not isinstance(item, (str, int, dict)):
            raise _fail(f"{p}.{i}", "a number, a string or a mapping")


def volumes(v, p):
    any_list(v, p)
    for i, item in enumerate(v):
        if isinstance(item, dict):
            if "type" in item:
                string(item["type"], f"{p}.{i}.type")
                if item["type"] not in ("bind", "volume", "tmpfs", "npipe", "cluster", "image"):
                    raise ComposeError(f"unknown volume type {item['type']!r}", path=f"{p}.{i}.type")
            else:
                raise ComposeError("missing property 'type'", path=f"{p}.{i}")
        elif not isinstance(item, str):
            raise _fail(f"{p}.{i}", "a string or a mapping")


def depends_on(v, p):
    if isinstance(v, list):
        string_list(v, p)
    elif isinstance(v, dict):
        for name, dep in v.items():
            if not isinstance(dep, dict):
                raise _fail(f"{p}.{name}", "a mapping")
            cond = dep.get("condition")
            if cond is not None and cond not in ("service_started", "service_healthy",
                                                 "service_completed_successfully"):
                raise ComposeError(f"must be one of service_started, service_healthy, "
                                   f"service_completed_successfully, not {cond!r}", path=f"{p}.{name}.condition")
    else:
        raise _fail(p, "a list or a mapping")


def healthcheck(v, p):
    mapping(v, p)
    for key, item in v.items():
        where = f"{p}.{key}"
        if key == "test":
            string_or_list(item, where)
        elif key in ("interval", "timeout", "start_period", "start_interval"):
            string(item, where)
        elif key == "retries":
            number(item, where)
        elif key == "disable":
            boolean(item, where)
        elif not key.startswith("x-"):
            raise ComposeError(f"additional property {key!r} is not allowed", path=where)


def env_file(v, p):
    if isinstance(v, str):
        return
    any_list(v, p)
    for i, item in enumerate(v):
        if isinstance(item, dict):
            if "path" not in item:
                raise ComposeError("missing property 'path'", path=f"{p}.{i}")
            string(item["path"], f"{p}.{i}.path")
        else:
            string(item, f"{p}.{i}")


def gpus(v, p):
    if isinstance(v, str):
        if v != "all":
            raise ComposeError(f"must be 'all' or a list, not {v!r}", path=p)
        return
    any_list(v, p)


# The Compose Specification's patterns. Keys of these sections are anchored (patternProperties);
# container_name's pattern is not, and JSON Schema patterns match anywhere in the value.
_RESOURCE_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_NAMED_SECTIONS = ("services", "volumes", "secrets", "configs")
_CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+")


def container_name(v, p):
    string(v, p)
    if not _CONTAINER_NAME.search(v):
        raise ComposeError(f"{v!r} does not match pattern '{_CONTAINER_NAME.pattern}'", path=p)


_SERVICE_CHECKS: Dict[str, Check] = {
    "image": string, "container_name": container_name, "hostname": string, "domainname": string,
    "working_dir": string, "user": string, "ipc": string, "pid": string, "uts": string,
    "network_mode": string, "restart": string, "runtime": string, "platform": string,
    "pull_policy": string, "stop_signal": string, "stop_grace_period": string, "mac_address": string,
    "cgroup": string, "cgroup_parent": string, "userns_mode": string, "isolation": string,
    "init": boolean, "privileged": boolean, "read_only": boolean, "stdin_open": boolean, "tty": boolean,
    "oom_kill_disable": boolean,
    "shm_size": string_or_number, "mem_limit": string_or_number, "mem_reservation": string_or_number,
    "memswap_limit": string_or_number, "cpus": string_or_number,
    "command": command, "entrypoint": command,
    "environment": list_or_dict, "labels": list_or_dict, "annotations": list_or_dict,
    "sysctls": list_or_dict, "extra_hosts": list_or_mapping,
    "ports": ports, "volumes": volumes, "depends_on": depends_on, "healthcheck": healthcheck,
    "env_file": env_file, "profiles": string_list, "expose": any_list,
    "cap_add": string_list, "cap_drop": string_list, "security_opt": string_list,
    "links": string_list, "external_links": string_list, "volumes_from": string_list,
    "devices": any_list, "secrets": any_list, "configs": any_list,
    "dns": string_or_list, "dns_search": string_or_list, "tmpfs": string_or_list, "label_file": string_or_list,
    "deploy": mapping, "ulimits": mapping, "logging": mapping, "networks": list_or_mapping,
    "extends": string_or_mapping, "build": string_or_mapping, "gpus": gpus,
}


def validate(model: Dict[str, Any], filename: str, line_of) -> None:
    """Raise ComposeError for the first thing Compose's schema would reject."""
    for key in model:
        if key not in TOP_LEVEL_KEYS and not key.startswith("x-"):
            raise ComposeError(f"additional property {key!r} is not allowed at the top level",
                               file=filename, line=line_of(key))
    services = model.get("services")
    if services is not None and not isinstance(services, dict):
        raise _fail("services", "a mapping")
    for kind in _NAMED_SECTIONS:
        section = model.get(kind)
        for name in section if isinstance(section, dict) else ():
            if not _RESOURCE_NAME.fullmatch(str(name)):
                raise ComposeError(f"additional properties {go_quote(str(name), chr(39))} not allowed", path=kind,
                                   file=filename, line=line_of(kind, name))
    for name, service in (services or {}).items():
        if service is None:
            continue
        if not isinstance(service, dict):
            raise _fail(f"services.{name}", "a mapping")
        for key, value in service.items():
            path = f"services.{name}.{key}"
            if key.startswith("x-"):
                continue
            if key not in SERVICE_KEYS:
                raise ComposeError(f"additional property {key!r} is not allowed", path=path)
            check = _SERVICE_CHECKS.get(key)
            if check is not None:
                check(value, path)
    for kind in ("networks", "volumes", "secrets", "configs", "models"):
        section = model.get(kind)
        if section is not None and not isinstance(section, dict):
            raise _fail(kind, "a mapping")


def go_quote(text: str, quote: str = '"') -> str:
    """``text`` between quotes, with control characters escaped as Go's %q does, so a hostile value
    prints on one line."""
    escapes = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a", "\b": "\\b", "\f": "\\f",
               "\v": "\\v", "\\": "\\\\", quote: "\\" + quote}
    out = []
    for ch in text:
        if ch in escapes:
            out.append(escapes[ch])
        elif not ch.isprintable():
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x80 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return quote + "".join(out) + quote
