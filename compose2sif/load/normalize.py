"""Compose's normalisation of a loaded model: the default network, build defaults and args, environment
values from the host, implicit dependencies, resource names (compose-go's loader/normalize.go)."""
from __future__ import annotations

import posixpath
from typing import Any, Dict, Optional

from compose2sif.errors import ComposeError


def resolve_list_environment(model: Dict[str, Any], environment: Dict[str, str]) -> None:
    for service in (model.get("services") or {}).values():
        if isinstance(service, dict) and isinstance(service.get("environment"), list):
            service["environment"] = [
                (f"{item}={environment[item]}" if isinstance(item, str) and item in environment else item)
                for item in service["environment"]]


def _environment_mapping(value: Any, path: str) -> Dict[str, Optional[str]]:
    """A service's environment (list or mapping) as a mapping; None marks a name without value."""
    from compose2sif.units import go_str
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): (None if v is None else v if isinstance(v, str) else go_str(v)) for k, v in value.items()}
    if isinstance(value, list):
        out: Dict[str, Optional[str]] = {}
        for item in value:
            key, sep, val = go_str(item).partition("=")
            if key and key[-1].isspace():
                raise ComposeError(f"environment variable {key!r} is declared with a trailing space", path=path)
            out[key] = val if sep else None
        return out
    raise ComposeError("environment must be a list or a mapping", path=path)


def _build_args(value: Any, environment: Dict[str, str], path: str) -> Dict[str, str]:
    """Build args as a mapping; a name without a value takes the environment's, or is left out
    (compose-go resolves them, then drops the unresolved ones)."""
    args = _environment_mapping(value, path)
    resolved = {k: (v if v is not None else environment.get(k)) for k, v in args.items()}
    return {k: v for k, v in resolved.items() if v is not None}


def normalize(model: Dict[str, Any], name: str, environment: Dict[str, str]) -> None:
    services = model.get("services") or {}
    uses_default = False
    for service in services.values():
        if "provider" in service or "network_mode" in service:
            continue
        networks = service.get("networks")
        if not networks:
            service["networks"] = {"default": None}
            uses_default = True
        elif "default" in networks:
            uses_default = True
    if uses_default:
        networks = model.get("networks") or {}
        networks.setdefault("default", None)
        model["networks"] = networks
    for sname, service in services.items():
        if service.get("pull_policy") == "if_not_present":  # compose-go's alias, printed as what it means
            service["pull_policy"] = "missing"
        build = service.get("build")
        if isinstance(build, dict):
            if build.get("context") is None:
                build["context"] = "."
            if build.get("dockerfile") is None and build.get("dockerfile_inline") is None:
                build["dockerfile"] = "Dockerfile"
            if "args" in build:
                build["args"] = _build_args(build["args"], environment, f"services.{sname}.build.args")
        env = _environment_mapping(service.get("environment"), f"services.{sname}.environment")
        if "environment" in service:
            service["environment"] = {k: (v if v is not None else environment.get(k)) for k, v in env.items()}
        depends_on = service.get("depends_on") or {}
        for link in service.get("links") or []:
            target = str(link).split(":")[0] if len(str(link).split(":")) == 2 else str(link)
            depends_on.setdefault(target, {"condition": "service_started", "restart": True, "required": True})
        for namespace in ("network_mode", "ipc", "pid", "uts", "cgroup"):
            ref = service.get(namespace)
            if isinstance(ref, str) and ref.startswith("service:"):
                depends_on.setdefault(ref[len("service:"):],
                                      {"condition": "service_started", "restart": True, "required": True})
        for volume in service.get("volumes") or []:
            if isinstance(volume, dict) and isinstance(volume.get("target"), str) and volume["target"]:
                volume["target"] = posixpath.normpath(volume["target"])
        for source in service.get("volumes_from") or []:
            if not str(source).startswith("container:"):
                depends_on.setdefault(str(source).split(":")[0],
                                      {"condition": "service_started", "restart": False, "required": True})
        if depends_on:
            service["depends_on"] = depends_on
        image = service.get("image")
        for hook in service.get("pre_start") or []:  # a step without an image runs the service's
            if isinstance(image, str) and image and isinstance(hook, dict) and "image" not in hook:
                hook["image"] = image
    for kind in ("networks", "volumes", "configs", "secrets"):
        section = model.get(kind)
        if not isinstance(section, dict):
            continue
        for key, resource in section.items():
            resource = resource if isinstance(resource, dict) else {}
            if resource.get("name") is None:
                external = str(resource.get("external", "")).lower() in ("true", "1", "t")
                resource["name"] = key if external else f"{name}_{key}"
            section[key] = resource
