"""The loaded project as `docker compose config` prints it.

Compose decodes its model into Go types and prints those: durations as ``1m30s``, sizes as byte
counts in strings, ``command`` split like a shell, ``count: all`` as -1, empty deploy sections kept
as ``{}``. This module applies the same typing to the keys compose2sif supports; other keys are
printed as loaded (in long syntax).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from compose2sif.errors import ComposeError
from compose2sif.load import shellwords
from compose2sif.units import float32, format_duration, go_str, parse_bytes, parse_duration


def _fail(path: str, message: str) -> ComposeError:
    return ComposeError(message, path=path)


def _string(value: Any, path: str) -> str:
    if isinstance(value, (dict, list)) or value is None:
        raise _fail(path, f"must be a string, not {type(value).__name__}")
    return value if isinstance(value, str) else go_str(value)


def _int(value: Any, path: str) -> int:
    if isinstance(value, bool):
        raise _fail(path, f"must be an integer, not {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    raise _fail(path, f"must be an integer, not {value!r}")


def _duration(value: Any, path: str) -> str:
    try:
        return format_duration(parse_duration(go_str(value)))
    except ValueError as exc:
        raise _fail(path, str(exc)) from None


def _bytes(value: Any, path: str) -> str:
    try:
        return str(parse_bytes(value))
    except ValueError as exc:
        raise _fail(path, str(exc)) from None


def shell_command(value: Any, path: str) -> Optional[List[str]]:
    """A command or entrypoint: a list stays a list; a string is split as Compose splits it."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return shellwords.split(value)
        except shellwords.ShellwordsError as exc:
            raise _fail(path, str(exc)) from None
    if isinstance(value, list):
        return [_string(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise _fail(path, "must be a string or a list of strings")


def _ports(value: Any, path: str) -> List[Dict[str, Any]]:
    ports = []
    for i, port in enumerate(value or []):
        where = f"{path}[{i}]"
        if not isinstance(port, dict):
            raise _fail(where, "invalid port")
        out: Dict[str, Any] = {}
        for key, item in port.items():
            if key == "target":
                target = _int(item, f"{where}.target")
                if not 0 <= target <= 65535:
                    raise _fail(f"{where}.target", f"invalid port {target}")
                out[key] = target
            elif key == "published":
                if item not in (None, ""):
                    out[key] = go_str(item)
            elif key in ("host_ip", "protocol", "mode", "name", "app_protocol"):
                if item not in (None, ""):
                    out[key] = _string(item, f"{where}.{key}")
            elif not key.startswith("x-"):
                raise _fail(f"{where}.{key}", "unknown port attribute")
        if "target" not in out:
            raise _fail(where, "a port needs a target")
        ports.append(out)
    return ports


def _volumes(value: Any, path: str) -> List[Dict[str, Any]]:
    volumes = []
    for i, volume in enumerate(value or []):
        where = f"{path}[{i}]"
        out: Dict[str, Any] = {}
        for key, item in volume.items():
            if key == "read_only":
                if item:
                    out[key] = True
            elif key == "bind" and isinstance(item, dict):
                bind = {k: v for k, v in item.items() if v not in (None, "", False)}
                out[key] = bind
            elif key == "tmpfs" and isinstance(item, dict):
                tmpfs = {}
                if item.get("size") not in (None, 0, ""):
                    tmpfs["size"] = _bytes(item["size"], f"{where}.tmpfs.size")
                if item.get("mode"):
                    tmpfs["mode"] = _int(item["mode"], f"{where}.tmpfs.mode")
                out[key] = tmpfs
            elif key == "volume" and isinstance(item, dict):
                out[key] = {k: v for k, v in item.items() if v not in (None, "", False)}
            elif item not in (None, ""):
                out[key] = item
        volumes.append(out)
    return volumes


def _healthcheck(value: Any, path: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, "must be a mapping")
    out: Dict[str, Any] = {}
    for key, item in value.items():
        where = f"{path}.{key}"
        if key == "test":
            if isinstance(item, str):
                out[key] = ["CMD-SHELL", item]
            elif isinstance(item, list):
                out[key] = [_string(x, where) for x in item]
            else:
                raise _fail(where, "must be a string or a list")
        elif key in ("interval", "timeout", "start_period", "start_interval"):
            if item is not None:
                out[key] = _duration(item, where)
        elif key == "retries":
            if item is not None:
                out[key] = _int(item, where)
        elif key == "disable":
            if item:
                out[key] = True
        elif not key.startswith("x-"):
            raise _fail(where, "unknown healthcheck attribute")
    return out


def _device_request(value: Any, path: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, "a device request must be a mapping")
    out: Dict[str, Any] = {}
    for key, item in value.items():
        where = f"{path}.{key}"
        if key == "count":
            if isinstance(item, str) and item.lower() == "all":
                count = -1
            else:
                try:
                    count = _int(item, where)
                except ComposeError:
                    raise _fail(where, f"invalid value {item!r}, the only value allowed is 'all' or a number") \
                        from None
            if count:
                out[key] = count
        elif key in ("capabilities", "device_ids"):
            if item:
                out[key] = [_string(x, where) for x in item]
        elif item not in (None, "", {}, []):
            out[key] = item
    return out


def _json_number(value: float) -> Any:
    """Go's JSON encoder prints a whole float without a fraction (2, not 2.0)."""
    return int(value) if value.is_integer() else value


def _cpus(value: Any, path: str) -> Any:
    try:
        return _json_number(float32(float(value)))
    except (TypeError, ValueError):
        raise _fail(path, f"invalid cpus value {value!r}") from None


def _resource(value: Any, path: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, item in (value or {}).items():
        where = f"{path}.{key}"
        if key == "cpus":
            try:
                cpus = float32(float(item))
            except (TypeError, ValueError):
                raise _fail(where, f"invalid cpus value {item!r}") from None
            if cpus:
                out[key] = _json_number(cpus)
        elif key == "memory":
            memory = _bytes(item, where)
            if memory != "0":
                out[key] = memory
        elif key == "pids":
            if item:
                out[key] = _int(item, where)
        elif key == "devices":
            if item:
                out[key] = [_device_request(d, f"{where}[{i}]") for i, d in enumerate(item)]
        elif item not in (None, "", {}, []):
            out[key] = item
    return out


def _deploy(value: Any, path: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, "must be a mapping")
    out: Dict[str, Any] = {}
    for key, item in value.items():
        where = f"{path}.{key}"
        if key == "resources":
            resources = {}
            for part in ("limits", "reservations"):
                if (item or {}).get(part) is not None:
                    resources[part] = _resource(item[part], f"{where}.{part}")
            out[key] = resources
        elif key == "restart_policy" and isinstance(item, dict):
            policy = {}
            for k, v in item.items():
                if k in ("delay", "window") and v is not None:
                    policy[k] = _duration(v, f"{where}.{k}")
                elif k == "max_attempts" and v is not None:
                    policy[k] = _int(v, f"{where}.{k}")
                elif v not in (None, ""):
                    policy[k] = v
            out[key] = policy
        elif key == "replicas":
            if item is not None:
                out[key] = _int(item, where)
        elif key == "labels":
            if item:
                out[key] = _labels(item, where)
        elif item not in (None, ""):
            out[key] = item
    out.setdefault("resources", {})
    out.setdefault("placement", {})
    return out


def _ulimits(value: Any, path: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, "must be a mapping")
    out: Dict[str, Any] = {}
    for name, limit in value.items():
        where = f"{path}.{name}"
        if isinstance(limit, dict):
            pair = {k: _int(limit[k], f"{where}.{k}") for k in ("soft", "hard") if limit.get(k)}
            out[name] = pair
        else:
            out[name] = _int(limit, where)
    return out


def _depends_on(value: Any, path: str) -> Dict[str, Any]:
    out = {}
    for name, dep in (value or {}).items():
        entry = {"condition": dep.get("condition") or "service_started", "required": bool(dep.get("required", True))}
        if dep.get("restart"):
            entry["restart"] = True
        out[name] = entry
    return out


def _environment(value: Any, path: str) -> Dict[str, Optional[str]]:
    return {k: v for k, v in (value or {}).items()}


def _optional_string(value: Any, path: str) -> Optional[str]:
    if value is None:
        return None
    return _string(value, path) or None


def extra_hosts(value: Any, path: str) -> List[str]:
    """compose-go's HostsList: ``host=ip`` or ``host:ip`` items (or a mapping), printed sorted as
    ``host=ip``; an IP may be a comma-separated list and may be bracketed (``[::1]``)."""
    pairs: List[Any] = []
    if isinstance(value, dict):
        for host, ips in value.items():
            ips = "" if ips is None else ips
            pairs += [(str(host), go_str(ip)) for ip in ips] if isinstance(ips, list) else [(str(host), go_str(ips))]
    elif isinstance(value, list):
        for item in value:
            text = go_str(item)
            for separator in ("=", ":"):
                host, found, ips = text.partition(separator)
                if found:
                    pairs += [(host, ip) for ip in ips.split(",")]
                    break
            else:
                raise _fail(path, f"invalid additional host, missing IP: {text}")
    else:
        raise _fail(path, "must be a list or a mapping")
    out = []
    for host, ip in pairs:
        if not host or ":" in host or "=" in host:
            raise _fail(path, f"bad host name '{host}'")
        if len(ip) > 2 and ip[0] == "[" and ip[-1] == "]":
            ip = ip[1:-1]
        out.append(f"{host}={ip}")
    return sorted(out)


def _omit_empty(value: Any, path: str) -> Any:
    """Keys Compose decodes into plain Go fields: their zero value is not printed."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if not _is_zero(v)}
    return value


def _is_zero(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, bool):
        return value is False
    if isinstance(value, (int, float)):
        return value == 0
    return value in ("", [], {})


def _labels(value: Any, path: str) -> Dict[str, str]:
    """compose-go's Labels: a list of ``k=v`` (``k`` alone means an empty value) or a mapping; strings."""
    if isinstance(value, list):
        out = {}
        for item in value:
            key, _, val = go_str(item).partition("=")
            out[key] = val
        return out
    if isinstance(value, dict):
        return {str(k): ("" if v is None else go_str(v)) for k, v in value.items()}
    return value


def _strings(value: Any, path: str) -> Any:
    """A string-or-list key (dns, tmpfs...) as a list of strings."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return [go_str(value)]
    if isinstance(value, list):
        return [go_str(item) for item in value]
    return value


def _logging(value: Any, path: str) -> Any:
    if isinstance(value, dict) and isinstance(value.get("options"), dict):
        options = {k: (None if v is None else go_str(v)) for k, v in value["options"].items()}
        return {**value, "options": options}
    return value


def _file_mode(references: Any, path: str) -> Any:
    """secrets/configs of a service: a mode is printed as an octal string ("0440")."""
    if not isinstance(references, list):
        return references
    out = []
    for ref in references:
        if isinstance(ref, dict) and isinstance(ref.get("mode"), int) and not isinstance(ref["mode"], bool):
            ref = {**ref, "mode": "0" + format(ref["mode"], "o") if ref["mode"] else "0"}
        out.append(ref)
    return out


def _build(value: Any, path: str) -> Any:
    if not isinstance(value, dict):
        return value
    out = _omit_empty(value, path)
    if "labels" in out:
        out["labels"] = _labels(out["labels"], f"{path}.labels")
    if "extra_hosts" in out:
        out["extra_hosts"] = extra_hosts(out["extra_hosts"], f"{path}.extra_hosts")
    if "shm_size" in out:
        out["shm_size"] = _bytes(out["shm_size"], f"{path}.shm_size")
    return out


def _develop(value: Any, path: str) -> Any:
    """Each watch rule carries an `exec` hook in Compose's model, printed even when unset."""
    if isinstance(value, dict) and isinstance(value.get("watch"), list):
        watch = [{**rule, "exec": _watch_exec(rule.get("exec"), f"{path}.watch[{i}].exec")}
                 if isinstance(rule, dict) else rule for i, rule in enumerate(value["watch"])]
        return {**value, "watch": watch}
    return value


def _watch_exec(value: Any, path: str) -> Any:
    """A watch rule's `exec` hook, read as a service hook (Compose prints its command even when unset)."""
    if not isinstance(value, dict) or not value:
        return {"command": None}
    return {"command": None, **_hooks([value], path)[0]}


def _provider(value: Any, path: str) -> Any:
    """Compose holds each provider option as a list of strings (a scalar becomes a list of one)."""
    if not isinstance(value, dict) or not isinstance(value.get("options"), dict):
        return value
    options = {key: [go_str(v) for v in (item if isinstance(item, list) else [item])]
               for key, item in value["options"].items()}
    return {**value, "options": options}


def _hooks(value: Any, path: str) -> Any:
    """pre_start / post_start / pre_stop: each command split like `command`, its environment a mapping."""
    if not isinstance(value, list):
        return value
    hooks = []
    for i, hook in enumerate(value):
        if isinstance(hook, dict):
            hook = {k: v for k, v in hook.items() if not _is_zero(v)}
            if "command" in hook:
                hook["command"] = shell_command(hook["command"], f"{path}[{i}].command")
            if isinstance(hook.get("environment"), list):
                hook["environment"] = {k: (v if sep else None) for k, sep, v in
                                       (go_str(item).partition("=") for item in hook["environment"])}
        hooks.append(hook)
    return hooks


def _blkio(value: Any, path: str) -> Any:
    """compose-go's ThrottleDevice has no JSON tags, so its fields print as Path and Rate."""
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for key in ("device_read_bps", "device_write_bps", "device_read_iops", "device_write_iops"):
        if isinstance(out.get(key), list):
            out[key] = [{"Path": d.get("path"), "Rate": _bytes(d.get("rate", 0), f"{path}.{key}")}
                        if isinstance(d, dict) else d for d in out[key]]
    return out


_ENCODERS: Dict[str, Callable[[Any, str], Any]] = {
    "pre_start": _hooks, "post_start": _hooks, "pre_stop": _hooks, "blkio_config": _blkio, "provider": _provider,
    "develop": _develop, "cpus": _cpus, "stop_grace_period": _duration,
    "labels": _labels, "annotations": _labels, "sysctls": _labels, "logging": _logging,
    "dns": _strings, "dns_search": _strings, "dns_opt": _strings, "tmpfs": _strings, "expose": _strings,
    "group_add": _strings, "mem_limit": _bytes, "mem_reservation": _bytes, "memswap_limit": _bytes,
    "secrets": _file_mode, "configs": _file_mode,
    "command": shell_command, "entrypoint": shell_command,
    "environment": _environment, "ports": _ports, "volumes": _volumes,
    "healthcheck": _healthcheck, "deploy": _deploy, "ulimits": _ulimits,
    "depends_on": _depends_on, "shm_size": _bytes, "extra_hosts": extra_hosts, "build": _build,
    "gpus": lambda v, p: [_device_request(d, f"{p}[{i}]") for i, d in enumerate(v or [])],
    "image": _optional_string, "working_dir": _optional_string, "user": _optional_string,
    "ipc": _optional_string, "network_mode": _optional_string, "restart": _optional_string,
    "profiles": lambda v, p: [_string(x, p) for x in v or []] or None,
}
_ALWAYS = ("command", "entrypoint")  # Compose prints these as null when unset
# Service keys Compose holds as Go pointers: a zero value (init: false, scale: 0) is still printed.
_POINTERS = ("attach", "init", "scale", "stop_grace_period", "build", "develop", "blkio_config", "credential_spec",
             "deploy", "provider", "extends", "healthcheck", "logging")


def encode_service(name: str, service: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in service.items():
        encoder = _ENCODERS.get(key)
        encoded = encoder(value, f"services.{name}.{key}") if encoder else value
        if key in _ALWAYS or key in _POINTERS:
            if encoded is None and key not in _ALWAYS:
                continue
        elif _is_zero(encoded) or (key == "shm_size" and encoded == "0"):
            continue
        out[key] = encoded
    for key in _ALWAYS:
        out.setdefault(key, None)
    return out


def _used_resources(services: Dict[str, Any]) -> Dict[str, set]:
    """What the active services refer to (compose-go's WithoutUnnecessaryResources)."""
    used: Dict[str, set] = {"networks": set(), "volumes": set(), "secrets": set(), "configs": set(), "models": set()}
    for service in services.values():
        used["networks"].update(service.get("networks") or ())
        used["models"].update(service.get("models") or ())
        for volume in service.get("volumes") or ():
            if volume.get("type") == "volume" and volume.get("source"):
                used["volumes"].add(volume["source"])
        for kind in ("secrets", "configs"):
            for ref in service.get(kind) or ():
                used[kind].add(ref.get("source") if isinstance(ref, dict) else ref)
        for ref in (service.get("build") or {}).get("secrets") or ():
            used["secrets"].add(ref.get("source") if isinstance(ref, dict) else ref)
    return used


# Fields of top-level resources that Compose holds as pointers: printed even when false.
_RESOURCE_POINTERS = ("enable_ipv4", "enable_ipv6")


def _resource_entry(kind: str, value: Dict[str, Any]) -> Dict[str, Any]:
    """A network, volume, secret or config as Compose prints it: zero values of plain fields left
    out, labels as a mapping, driver options as strings; a network always has an `ipam` section."""
    out = {k: v for k, v in value.items() if k in _RESOURCE_POINTERS or not _is_zero(v)}
    if "labels" in out:
        out["labels"] = _labels(out["labels"], f"{kind}.labels")
    if isinstance(out.get("driver_opts"), dict):
        out["driver_opts"] = {k: (None if v is None else go_str(v)) for k, v in out["driver_opts"].items()}
    if kind == "networks":
        ipam = out.get("ipam") if isinstance(out.get("ipam"), dict) else {}
        out["ipam"] = {k: v for k, v in ipam.items() if k in ("driver", "config") and not _is_zero(v)}
    return out


def encode_project(model: Dict[str, Any]) -> Dict[str, Any]:
    """The whole project as `docker compose config --format json` prints it."""
    out: Dict[str, Any] = {"name": model.get("name")}
    services = model.get("services", {})
    out["services"] = {name: encode_service(name, svc) for name, svc in sorted(services.items())}
    used = _used_resources(services)
    for key in ("networks", "volumes", "secrets", "configs", "models"):
        kept = {k: _resource_entry(key, v) if isinstance(v, dict) else v
                for k, v in (model.get(key) or {}).items() if k in used[key]}
        if kept:
            out[key] = kept
    out.update((k, v) for k, v in model.items() if k not in out and k not in ("include", *used))
    return out

