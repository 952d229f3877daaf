"""``include``: each included project loaded on its own, with its own directory and .env, and its resources
imported into the including file (compose-go's loader/include.go)."""
from __future__ import annotations

import os
from typing import Any, Dict

from compose2sif.errors import ComposeError
from compose2sif.load.discovery import absolute, read_env_files
from compose2sif.load.yaml_source import Document

RESOURCE_KINDS = ("services", "volumes", "networks", "secrets", "configs", "models")


def apply_include(loader, data: Dict[str, Any], doc: Document) -> None:
    entries = data.pop("include")
    if not isinstance(entries, list):
        raise ComposeError("`include` must be a list", path="include")
    for entry in entries:
        if isinstance(entry, str):
            entry = {"path": entry}
        if not isinstance(entry, dict) or "path" not in entry:
            raise ComposeError("an include entry needs a path", path="include")
        paths = entry["path"] if isinstance(entry["path"], list) else [entry["path"]]
        paths = [absolute(str(p), loader.working_dir) for p in paths]
        project_dir = entry.get("project_directory")
        project_dir = absolute(str(project_dir), loader.working_dir) if project_dir else os.path.dirname(paths[0])
        if paths[0] in loader.included or paths[0] == doc.filename:
            chain = " include ".join(list(loader.included) + [doc.filename, paths[0]])
            raise ComposeError(f"include cycle detected: {chain}", path="include")
        env_files = entry.get("env_file")
        if env_files is None:
            default = os.path.join(project_dir, ".env")
            env_paths = [default] if os.path.isfile(default) else []
        else:
            env_files = env_files if isinstance(env_files, list) else [env_files]
            env_paths = [absolute(str(f), loader.working_dir) for f in env_files if f != "/dev/null"]
        from_files = read_env_files(env_paths, loader.environment)
        environment = dict(from_files)
        environment.update(loader.environment)  # the including project's values win
        sub = loader.nested(environment, project_dir, loader.included + (doc.filename,))
        imported = sub.load_model(paths)
        for kind in RESOURCE_KINDS:
            source = imported.get(kind)
            if not source:
                continue
            target = data.setdefault(kind, {})
            if target is None:
                target = data[kind] = {}
            for name, resource in source.items():
                if name in target and target[name] != resource:
                    raise ComposeError("conflicts with a resource of the same name in an included project "
                                       f"({paths[0]})", path=f"{kind}.{name}")
                target[name] = resource

# -- extends --------------------------------------------------------------------------------
