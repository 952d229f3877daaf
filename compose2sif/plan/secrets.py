"""Compose ``secrets:`` and ``configs:`` as read-only binds.

Where Compose puts them: a secret at ``/run/secrets/<source>``, a config at ``/<source>``; a
relative ``target`` goes under that directory, an absolute one is used as it is. Their sources:

* ``file``: the host file itself is bound (read-only);
* ``environment`` / ``content``: the value is written by convert into the output directory
  (``config/secrets/...``, mode 0600 in a 0700 directory) and that file is bound. The value never
  appears on a command line, and plan.json lists the file's path only;
* ``external``: there is no secret store here, so that is an error naming the service and key.

Ownership and mode cannot be chosen (the files belong to the user who runs the instances, who is
also the user inside them); a ``uid``, ``gid`` or ``mode`` is a warning.
"""
from __future__ import annotations

import hashlib
import os
import re
from typing import Any, Dict, List

from compose2sif.errors import ComposeError
from compose2sif.load import Project
from compose2sif.model import Service
from compose2sif.plan.types import Bind

KINDS = {"secrets": "/run/secrets/", "configs": "/"}  # where each kind goes when the target is relative
_UNBINDABLE = re.compile(r"[\x00-\x1f\x7f,:]")  # Apptainer's --bind splits at ',' and ':'


def _file_name(name: str) -> str:
    """A file name for a secret's name: safe characters kept, anything else replaced, and a hash
    added when something was replaced so that two names never share a file."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "_"
    if safe != name:
        safe += "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return safe


def _entries(service: Service, kind: str) -> List[Dict[str, Any]]:
    """The service's `secrets:` or `configs:` in long syntax."""
    out = []
    for item in service.raw.get(kind) or []:
        out.append({"source": item} if isinstance(item, str) else dict(item))
    return out


def _target(kind: str, entry: Dict[str, Any]) -> str:
    target = str(entry.get("target") or entry["source"])
    return target if target.startswith("/") else KINDS[kind] + target


def mounts(service: Service, project: Project, configs: Dict[str, str], warnings: List[str]) -> List[Any]:
    """Read-only binds for the service's secrets and configs. Values taken from the environment or
    inline are added to ``configs`` (output path -> content), which convert writes with mode 0600."""
    binds = []
    for kind in KINDS:
        defined = project.model.get(kind) or {}
        for entry in _entries(service, kind):
            name = str(entry.get("source") or "")
            where = f"services.{service.name}.{kind}"
            spec = defined.get(name)
            if not isinstance(spec, dict):
                raise ComposeError(f"{kind[:-1]} {name!r} is not defined in the top-level `{kind}`", path=where)
            target = _target(kind, entry)
            if _UNBINDABLE.search(target):
                raise ComposeError(f"target {target!r} of {kind[:-1]} {name!r} cannot be bound by Apptainer "
                                   "(',' ':' or a control character)", path=where)
            for key in ("uid", "gid", "mode"):
                if entry.get(key) is not None:
                    warnings.append(f"service {service.name!r}: {kind[:-1]} {name!r}: {key} is not applied; the "
                                    "file belongs to the user who runs the instance (the same user inside it)")
            if spec.get("external"):
                raise ComposeError(f"{kind[:-1]} {name!r} is external: there is no secret store under Apptainer; "
                                   f"define it with file, environment or content", path=f"{kind}.{name}")
            if spec.get("file"):
                source = os.path.join(project.working_dir, str(spec["file"]))
                if _UNBINDABLE.search(source):
                    raise ComposeError(f"the path {source!r} cannot be bound by Apptainer "
                                       "(',' ':' or a control character)", path=f"{kind}.{name}.file")
                if not os.path.isfile(source):
                    raise ComposeError(f"{source} is not a file", path=f"{kind}.{name}.file")
                binds.append(Bind(source, target, True, "bind", False))
                continue
            if spec.get("environment") is not None:
                variable = str(spec["environment"])
                if variable not in project.environment:
                    raise ComposeError(f"the environment variable {variable} is not set",
                                       path=f"{kind}.{name}.environment")
                value = project.environment[variable]
            elif spec.get("content") is not None:
                value = str(spec["content"])
            else:
                raise ComposeError("needs one of file, environment, content or external", path=f"{kind}.{name}")
            path = f"config/{kind}/{_file_name(name)}"
            configs[path] = value
            binds.append(Bind(path, target, True, "config", False))
    return binds
