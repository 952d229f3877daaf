"""What a service's instance sees of the node: volumes, tmpfs and scratch directories as binds, and
the small text files bound into it, rewritten where they name a moved port or a public default
secret."""
from __future__ import annotations

import os
import re
from typing import List, Optional, Tuple

from compose2sif.adapters import Adapter, Draft
from compose2sif.load import Project
from compose2sif.model import Service
from compose2sif.plan.generated import Replacer
from compose2sif.plan.knobs import hints
from compose2sif.types import Bind

STATE = "state"  # relative to the output directory; created private (0700) by run.sh
_TEXT_LIMIT = 256 * 1024


def _sanitize(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", path.strip("/")) or "root"


def service_binds(service: Service, project: Project, adapter: Optional[Adapter]) -> Tuple[List[Bind], List[str]]:
    """The service's mounts, tmpfs and writable scratch directories as binds; and warnings."""
    warnings: List[str] = []
    binds: List[Bind] = []
    scratch = f"{STATE}/services/{service.name}"
    for mount in service.mounts:
        if mount.type == "bind":
            binds.append(Bind(mount.source or "", mount.target, mount.read_only, "bind", mount.create_host_path))
        elif mount.type == "volume":
            name = mount.source or f"_anonymous_{service.name}_{_sanitize(mount.target)}"
            if mount.source:
                volume = (project.model.get("volumes") or {}).get(mount.source) or {}
                if volume.get("external"):
                    warnings.append(f"service {service.name!r}: external volume {mount.source!r} becomes "
                                    f"{STATE}/volumes/{mount.source}")
                if volume.get("driver") not in (None, "local"):
                    warnings.append(f"service {service.name!r}: volume driver {volume['driver']!r} is ignored")
            source = f"{STATE}/volumes/{name}" + (f"/{mount.subpath}" if mount.subpath else "")
            binds.append(Bind(source, mount.target, mount.read_only, "volume", True))
        elif mount.type == "tmpfs":
            binds.append(Bind(f"{scratch}/tmpfs/{_sanitize(mount.target)}", mount.target, False, "tmpfs", True))
        else:
            warnings.append(f"service {service.name!r}: {mount.type} mount at {mount.target} is not supported; skipped")
    for path in service.tmpfs:
        target = path.split(":", 1)[0]
        binds.append(Bind(f"{scratch}/tmpfs/{_sanitize(target)}", target, False, "tmpfs", True))
    targets = {b.target for b in binds}
    writable = list(adapter.writable if adapter else ()) + list(hints(service).get("writable") or [])
    if "/tmp" not in targets:
        writable.append("/tmp")
    for path in writable:
        if path not in targets and not any(path.startswith(t.rstrip("/") + "/") for t in targets):
            binds.append(Bind(f"{scratch}/scratch/{_sanitize(path)}", path, False, "scratch", True))
            targets.add(path)
    return binds, warnings


def bound_texts(bind: Bind) -> List[Tuple[str, str, str]]:
    """(host path, path in the instance, text) of the small text files a bind mount brings in."""
    files: List[Tuple[str, str]] = []
    if os.path.isfile(bind.source):
        files = [(bind.source, bind.target)]
    elif os.path.isdir(bind.source):
        for folder, dirs, names in os.walk(bind.source):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))[:20]
            for name in sorted(names):
                path = os.path.join(folder, name)
                files.append((path, os.path.join(bind.target, os.path.relpath(path, bind.source))))
                if len(files) >= 200:
                    break
    texts = []
    for path, target in files:
        try:
            if not os.path.isfile(path) or os.path.getsize(path) > _TEXT_LIMIT:
                continue  # a FIFO or a device would block or never end
            with open(path, "rb") as fh:
                data = fh.read()
            if b"\0" in data:
                continue
            texts.append((path, target, data.decode("utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return texts


def texts_of(service: Service) -> List[Tuple[str, str]]:
    """(where, text) of everything of a service that may name another service's port."""
    texts = [(f"env {k}", v) for k, v in service.environment.items() if isinstance(v, str)]
    texts += [("command", a) for a in (service.entrypoint or []) + (service.command or [])]
    if service.healthcheck is not None:
        texts += [("healthcheck", a) for a in service.healthcheck.test]
    for mount in service.mounts:
        if mount.type == "bind" and mount.source:
            texts += [(target, text) for _, target, text in bound_texts(Bind(mount.source, mount.target))]
    return texts


def rewrite_bound_files(draft: Draft, secrets: Optional[Replacer]) -> None:
    """A bound text config that names a moved port, or a public default secret, gets a rewritten
    copy bound over it."""
    extra: List[Bind] = []
    for path, content in list(draft.configs.items()):
        if secrets and path.startswith(f"config/{draft.name}/"):
            draft.configs[path] = secrets(content)
    for bind in draft.binds:
        if bind.kind != "bind":
            continue
        for _, target, text in bound_texts(bind):
            rewritten = draft.refs.rewrite(text, draft.name)
            if secrets:
                rewritten = secrets(rewritten)
            if rewritten != text:
                path = f"config/{draft.name}/files{target}"
                draft.configs[path] = rewritten
                if target == bind.target:
                    bind.source, bind.kind, bind.read_only, bind.create = path, "config", True, False
                else:
                    extra.append(Bind(path, target, True, "config", False))
                draft.warnings.append(f"service {draft.name!r}: {target} names a moved port or a public default "
                                      f"secret; a rewritten copy is bound there ({path})")
    draft.binds.extend(extra)
