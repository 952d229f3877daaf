"""Relative paths made absolute against the project directory (compose-go's paths/)."""
from __future__ import annotations

import os
from typing import Any, Dict

from compose2sif.errors import ComposeError


def _abs_path(value: Any, base: str, windows_aware: bool = False) -> Any:
    """``value`` made absolute against ``base``. Where Compose accepts a Windows client's paths (bind
    sources, secret and config files, ssh keys), a Windows absolute path (``C:\\data``) is kept as written."""
    if not isinstance(value, str) or value == "":
        return value
    if value.startswith("~"):  # Compose cleans a path it expanded or joined, and keeps an absolute one as written
        return os.path.normpath(os.path.expanduser(value))
    if os.path.isabs(value) or windows_aware and is_windows_absolute(value):
        return value
    return os.path.normpath(os.path.join(base, value))


def is_windows_absolute(path: str) -> bool:
    """A drive letter then a separator (``C:\\``, ``C:/``), or a UNC or device path (``\\\\host\\share``)."""
    separators = "\\/"
    if len(path) >= 3 and path[1] == ":" and path[2] in separators:
        return True
    return len(path) > 2 and path[0] in separators and path[1] in separators


def _ssh_keys(value: Any, base: str) -> Any:
    """build.ssh as a list of ``id=path`` (``default`` alone forwards the agent), each path absolute.
    The mapping form ``{id: path}`` is written the same way."""
    if isinstance(value, dict):
        value = [str(k) if v is None else f"{k}={v}" for k, v in value.items()]
    if not isinstance(value, list):
        return value
    keys = []
    for entry in value:
        key, found, path = str(entry).partition("=")
        keys.append(f"{key}={_abs_path(path, base, windows_aware=True)}" if found and path else str(entry))
    return keys


def _is_remote_context(value: str) -> bool:
    return ("://" in value or value.startswith("service:") or
            value.startswith(("https://", "http://", "git://", "ssh://", "github.com/", "git@")))


def resolve_paths(model: Dict[str, Any], base: str) -> None:
    for service in (model.get("services") or {}).values():
        if not isinstance(service, dict):
            continue
        build = service.get("build")
        if isinstance(build, dict):
            ctx = build.get("context")
            if isinstance(ctx, str) and not _is_remote_context(ctx):
                build["context"] = _abs_path(ctx, base)
            if "ssh" in build:
                build["ssh"] = _ssh_keys(build["ssh"], base)
            extra = build.get("additional_contexts")
            if isinstance(extra, dict):
                for key, value in extra.items():
                    if isinstance(value, str) and not _is_remote_context(value):
                        extra[key] = _abs_path(value, base)
        for env_file in service.get("env_file") or []:
            if isinstance(env_file, dict):
                env_file["path"] = _abs_path(env_file.get("path"), base)
        if isinstance(service.get("label_file"), list):
            service["label_file"] = [_abs_path(p, base) for p in service["label_file"]]
        extends = service.get("extends")
        if isinstance(extends, dict) and isinstance(extends.get("file"), str):
            extends["file"] = _abs_path(extends["file"], base)
        develop = service.get("develop")
        for watch in (develop.get("watch") or []) if isinstance(develop, dict) else ():
            if isinstance(watch, dict) and isinstance(watch.get("path"), str):
                watch["path"] = _abs_path(watch["path"], base)
        for volume in service.get("volumes") or []:
            if isinstance(volume, dict) and volume.get("type") == "bind":
                if "source" not in volume:
                    raise ComposeError('invalid mount config for type "bind": field source must not be empty',
                                       path="services.volumes")
                volume["source"] = _abs_path(volume["source"], base, windows_aware=True)
    for kind in ("configs", "secrets"):
        for resource in (model.get(kind) or {}).values():
            if isinstance(resource, dict) and isinstance(resource.get("file"), str):
                resource["file"] = _abs_path(resource["file"], base, windows_aware=True)
    for volume in (model.get("volumes") or {}).values():
        if isinstance(volume, dict) and volume.get("driver") == "local":
            opts = volume.get("driver_opts")
            if isinstance(opts, dict) and opts.get("o") == "bind" and "device" in opts:
                opts["device"] = _abs_path(opts["device"], base)
