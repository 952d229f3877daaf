"""``extends``: a service merged onto the service it extends, in the same file or another one, resolved
recursively (compose-go's loader/extends.go)."""
from __future__ import annotations

import os
from typing import Any, Dict, Tuple

from compose2sif.errors import ComposeError
from compose2sif.load.canonical import canonical
from compose2sif.load.discovery import absolute
from compose2sif.load.interpolate import interpolate_tree
from compose2sif.load.merge import apply_resets, collect_resets, enforce_unicity, merge, merge_mappings
from compose2sif.load.paths import resolve_paths
from compose2sif.load.yaml_source import Document


def apply_extends(loader, data: Dict[str, Any], doc: Document, reset_paths) -> None:
    services = data.get("services")
    if not isinstance(services, dict):
        return
    for name in list(services):
        services[name] = _extend(loader, name, services, doc.filename, loader.working_dir, reset_paths, ())


def _extend(loader, name: str, services: Dict[str, Any], filename: str, working_dir: str,
            reset_paths, chain: Tuple[Tuple[str, str], ...]) -> Any:
    service = services.get(name)
    if not isinstance(service, dict) or "extends" not in service:
        return service
    extends = service["extends"]
    if isinstance(extends, str):
        ref, other_file = extends, None
    elif isinstance(extends, dict) and isinstance(extends.get("service"), str):
        ref, other_file = extends["service"], extends.get("file")
    else:
        raise ComposeError("extends needs the name of a service", path=f"services.{name}.extends")
    if (filename, name) in chain:
        raise ComposeError(f"circular reference in extends of service {name!r}",
                           path=f"services.{name}.extends")
    chain = chain + ((filename, name),)
    base_services, base_file, base_dir, base_resets = services, filename, working_dir, reset_paths
    if other_file is not None:
        base_file = absolute(str(other_file), working_dir)
        base_dir = os.path.dirname(base_file)
        base_model: Dict[str, Any] = {}
        base_resets = []  # the other file's own !reset markers act on what its services extend
        for other in loader.ctx.documents_of(base_file):
            other_data, other_resets = collect_resets(other.data)
            base_resets += other_resets
            base_model = merge_mappings(base_model, interpolate_tree(other_data, loader.lookup), ())
        base_model = canonical(enforce_unicity(base_model))
        base_services = base_model.get("services")
        if not isinstance(base_services, dict):
            raise ComposeError(f"cannot extend service {name!r}: {base_file} has no services section",
                               path=f"services.{name}.extends")
        if ref not in base_services:
            raise ComposeError(f"cannot extend service {name!r}: service {ref!r} not found in {base_file}",
                               path=f"services.{name}.extends")
        resolve_paths(base_model, base_dir)
    elif ref not in services:
        raise ComposeError(f"cannot extend service {name!r}: service {ref!r} not found",
                           path=f"services.{name}.extends")
    base = _extend(loader, ref, base_services, base_file, base_dir, base_resets, chain)
    if base is None:
        return service
    source = _clone(base)
    apply_resets({"services": {name: source}}, reset_paths)
    merged = merge(source, service, ("services", "x"))
    merged.pop("extends", None)
    services[name] = merged
    return merged


def _clone(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value
