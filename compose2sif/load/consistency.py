"""Compose's consistency checks on the project, once profiles are applied: references to undefined
services, networks, volumes, secrets and configs, mounts on one target, distinct settings that must agree,
dependency cycles (compose-go's loader/validate.go)."""
from __future__ import annotations

import ipaddress
import re
from typing import Any, Dict, List

from compose2sif.errors import ComposeError
from compose2sif.load.validate import go_quote


def check_consistency(model: Dict[str, Any], disabled: Dict[str, Any]) -> None:
    services = model.get("services") or {}
    for name, service in services.items():
        where = f"services.{name}"
        if not service.get("image") and "build" not in service and "provider" not in service:
            raise ComposeError("has neither an image nor a build context specified", path=where)
        if service.get("network_mode") and "networks" in service:
            raise ComposeError("declares mutually exclusive `network_mode` and `networks`", path=where)
        for network in service.get("networks") or {}:
            if network not in (model.get("networks") or {}):
                raise ComposeError(f"refers to undefined network {network!r}", path=f"{where}.networks")
        test = (service.get("healthcheck") or {}).get("test")
        if isinstance(test, list) and test and test[0] not in ("CMD", "CMD-SHELL", "NONE"):
            raise ComposeError('healthcheck.test must start with "CMD", "CMD-SHELL" or "NONE"',
                               path=f"{where}.healthcheck.test")
        for dep, cfg in (service.get("depends_on") or {}).items():
            if dep in services:
                continue
            if dep in disabled and not cfg.get("required", True):
                continue
            state = "is disabled by profiles" if dep in disabled else "is not defined"
            raise ComposeError(f"depends on service {dep!r}, which {state}", path=f"{where}.depends_on")
        for volume in service.get("volumes") or []:
            if volume.get("type") == "volume" and volume.get("source"):
                if volume["source"] not in (model.get("volumes") or {}):
                    raise ComposeError(f"refers to undefined volume {volume['source']!r}", path=f"{where}.volumes")
        for model_name in service.get("models") or {}:
            if model_name not in (model.get("models") or {}):
                raise ComposeError(f"refers to undefined model {model_name!r}", path=f"{where}.models")
        for kind in ("secrets", "configs"):
            for ref in service.get(kind) or []:
                source = ref.get("source") if isinstance(ref, dict) else ref
                if source not in (model.get(kind) or {}):
                    raise ComposeError(f"refers to undefined {kind[:-1]} {source!r}", path=f"{where}.{kind}")
        mounts: Dict[str, str] = {}
        for i, tmpfs in enumerate(_string_list(service.get("tmpfs"))):
            target = tmpfs.split(":")[0]
            if target in mounts:
                raise ComposeError(f"target {target} already mounted as {mounts[target]}", path=f"{where}.tmpfs")
            mounts[target] = f"{where}.tmpfs[{i}]"
        for i, volume in enumerate(service.get("volumes") or []):
            target = volume.get("target")
            if target in mounts:
                raise ComposeError(f"target {target} already mounted as {mounts[target]}", path=f"{where}.volumes")
            mounts[target] = f"{where}.volumes[{i}]"
        _check_resource_duplicates(name, service)
        build = service.get("build") if isinstance(service.get("build"), dict) else {}
        platform = service.get("platform")
        if platform and build.get("platforms") and platform not in build["platforms"]:
            raise ComposeError(f"build.platforms must include the service's platform {go_quote(platform)}",
                               path=f"{where}.build.platforms")
        replicas = service.get("scale") if service.get("scale") is not None else \
            (service.get("deploy") or {}).get("replicas") if isinstance(service.get("deploy"), dict) else None
        if service.get("container_name") and isinstance(replicas, int) and replicas > 1:
            attribute = "scale" if service.get("scale") is not None else "deploy.replicas"
            raise ComposeError(f"can't set container_name and {attribute} as container name must be unique",
                               path=where)
    _check_container_names(services)
    for name, service in services.items():
        _check_names(model.get("name") or "", name, service)
    for name, secret in (model.get("secrets") or {}).items():
        if isinstance(secret, dict) and not secret.get("external") and not secret.get("file") \
                and not secret.get("environment"):
            raise ComposeError(f"secret {go_quote(name)} must declare either `file` or `environment`",
                               path=f"secrets.{name}")
    _check_cycles(services)


def _check_container_names(services: Dict[str, Any]) -> None:
    """Two services may not name their containers alike (compose-go's checkConsistency)."""
    owners: Dict[str, str] = {}
    for name, service in services.items():
        container = service.get("container_name")
        if not container:
            continue
        if container in owners:
            raise ComposeError(f"container name {go_quote(container)} is already in use by service "
                               f"{go_quote(owners[container])}", path=f"services.{name}.container_name")
        owners[container] = name


# Docker Engine anchors the pattern Compose's schema gives container_name (the schema's own is unanchored:
# `--all` passes `config`, then the engine refuses it); Apptainer's instance names are a subset of it.
CONTAINER_NAME = "[a-zA-Z0-9][a-zA-Z0-9_.-]+"
# Host names go to the hosts file and to options on a command line: no leading '-' or '.', no blank.
HOST_NAME = "[a-zA-Z0-9_][a-zA-Z0-9_.-]*"
SERVICE_NAME_MAX = 200     # a service's name names files under the output directory (NAME_MAX 255 with suffixes)
INSTANCE_NAME_MAX = 250    # Apptainer keeps an instance in NAME/NAME.json (NAME_MAX 255)
HOSTNAME_MAX = 64          # the kernel's HOST_NAME_MAX: sethostname refuses more
ALIAS_MAX = 253            # a DNS name


def _refuse_pattern(path: str, value: str, pattern: str) -> ComposeError:
    """Worded as the schema's own refusal of container_name (validate.py prints it so)."""
    return ComposeError(f"{go_quote(value, chr(39))} does not match pattern {chr(39)}{pattern}{chr(39)}", path=path)


def _check_names(project: str, name: str, service: Dict[str, Any]) -> None:
    """Names Docker's engine or Apptainer would refuse when the service starts, refused now; what
    reaches the hosts file is a host name."""
    where = f"services.{name}"
    if len(name) > SERVICE_NAME_MAX:
        raise ComposeError(f"service name is {len(name)} characters long; at most {SERVICE_NAME_MAX} "
                           "(it names files under the output directory)", path=where)
    container = service.get("container_name")
    if isinstance(container, str) and container:
        if not re.fullmatch(CONTAINER_NAME, container):
            raise _refuse_pattern(f"{where}.container_name", container, CONTAINER_NAME)
        instance = container
    else:
        instance = f"{project}-{name}"
    if len(instance) > INSTANCE_NAME_MAX:
        raise ComposeError(f"instance name {go_quote(instance[:40] + '...')} is {len(instance)} characters long; "
                           f"Apptainer takes at most {INSTANCE_NAME_MAX}", path=f"{where}.container_name"
                           if isinstance(container, str) and container else where)
    hostnames = [("hostname", service.get("hostname"), HOSTNAME_MAX)]
    for network, config in (service.get("networks") or {}).items():
        for alias in (config or {}).get("aliases") or [] if isinstance(config, dict) else []:
            hostnames.append((f"networks.{network}.aliases", alias, ALIAS_MAX))
    for host, ip in _extra_host_pairs(service.get("extra_hosts")):
        hostnames.append(("extra_hosts", host, ALIAS_MAX))
        for address in (ip if isinstance(ip, list) else str(ip).split(",")):
            address = str(address).strip("[]")
            if address and address != "host-gateway":
                try:
                    ipaddress.ip_address(address)
                except ValueError:
                    raise ComposeError(f"invalid IP address in add-host: {go_quote(address)}",
                                       path=f"{where}.extra_hosts") from None
    for key, value, limit in hostnames:
        if not isinstance(value, str) or not value and key == "hostname":
            continue
        if not re.fullmatch(HOST_NAME, value):
            raise _refuse_pattern(f"{where}.{key}", value, HOST_NAME)
        if len(value) > limit:
            raise ComposeError(f"{go_quote(value[:40] + '...')} is {len(value)} characters long; at most {limit}",
                               path=f"{where}.{key}")


def _extra_host_pairs(extra: Any) -> List[Any]:
    """(host, ip or list of ips) of extra_hosts in either syntax; other shapes are encode's to refuse."""
    if isinstance(extra, dict):
        return list(extra.items())
    pairs = []
    for item in extra if isinstance(extra, list) else []:
        if isinstance(item, str):
            separator = "=" if "=" in item else ":"
            host, _, ip = item.partition(separator)
            pairs.append((host, ip))
    return pairs


def _check_resource_duplicates(name: str, service: Dict[str, Any]) -> None:
    """Keys that Compose reads as another spelling of a deploy setting must agree with it
    (compose-go's checkConsistency); values that do not parse are left to the encoder's errors."""
    from compose2sif.units import parse_bytes
    deploy = service.get("deploy")
    if not isinstance(deploy, dict):
        return
    resources = deploy.get("resources") if isinstance(deploy.get("resources"), dict) else {}

    def size(value):
        return parse_bytes(value) if value not in (None, "") else 0

    checks = (("scale", "deploy.replicas", deploy, "replicas", int),
              ("cpus", "deploy.resources.limits.cpus", resources.get("limits"), "cpus", float),
              ("mem_limit", "deploy.resources.limits.memory", resources.get("limits"), "memory", size),
              ("mem_reservation", "deploy.resources.reservations.memory", resources.get("reservations"), "memory",
               size),
              ("pids_limit", "deploy.resources.limits.pids", resources.get("limits"), "pids", int))
    for key, other, section, field_name, parse in checks:
        if service.get(key) is None or not isinstance(section, dict):
            continue
        try:
            mine = parse(service[key])
            theirs = parse(section.get(field_name) or 0)
        except (TypeError, ValueError):
            continue
        if key == "scale":
            if section.get(field_name) is not None and mine != theirs:
                raise ComposeError(f"can't set distinct values on '{key}' and '{other}'", path=f"services.{name}")
        elif mine and mine != theirs:
            raise ComposeError(f"can't set distinct values on '{key}' and '{other}'", path=f"services.{name}")


def _string_list(value: Any) -> List[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _check_cycles(services: Dict[str, Any]) -> None:
    """Depth-first over depends_on, without recursion (a chain may be thousands of services long)."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    for start in services:
        if start in state:
            continue
        path = [start]
        pending = [iter(services[start].get("depends_on") or {})]
        state[start] = 1
        while pending:
            dep = next(pending[-1], None)
            if dep is None:
                state[path.pop()] = 2
                pending.pop()
                continue
            if dep not in services:
                continue
            if state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                raise ComposeError("dependency cycle detected: " + " -> ".join(cycle),
                                   path=f"services.{path[-1]}.depends_on")
            if dep not in state:
                state[dep] = 1
                path.append(dep)
                pending.append(iter(services[dep].get("depends_on") or {}))
