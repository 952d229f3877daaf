"""What a service's instance sees of the node: volumes, tmpfs and scratch directories as binds, and
the small text files bound into it, rewritten where they name a moved port or a public default
secret."""
from __future__ import annotations

import os
import re
from typing import List, Mapping, Optional, Sequence, Tuple

from compose2sif.adapters import Adapter, Draft
from compose2sif.load import Project
from compose2sif.model import Service
from compose2sif.plan.generated import Replacer
from compose2sif.plan.knobs import hints
from compose2sif.types import Bind

STATE = "state"  # relative to the output directory; created private (0700) by run.sh
_TEXT_LIMIT = 256 * 1024
# In a bound directory (often a whole project tree), files a server does not read as its settings:
# compose files, Dockerfiles, documentation and program sources. Ports named there are no evidence,
# and rewriting them would change code, not settings.
_NOT_SETTINGS = re.compile(r"^((docker-)?compose([.-][\w.-]+)?\.ya?ml|Dockerfile([.-][\w.-]*)?|[\w.-]+\.dockerfile"
                           r"|[\w.-]+\.(md|rst|txt|html?|css|s?[ch]|cc|cpp|hpp|go|rs|py|pyi|ipynb|js|mjs|cjs|jsx|tsx?|"
                           r"java|kt|scala|rb|php|cs|swift|lock|map|svg)|LICENSE[\w.-]*|README[\w.-]*)$",
                           re.IGNORECASE)


def _sanitize(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", path.strip("/")) or "root"


def is_docker_socket(path: str, environ: Mapping[str, str]) -> bool:
    """A Docker daemon's socket, by its interpolated path: `docker.sock` anywhere (a rootless one under
    $XDG_RUNTIME_DIR included), or where DOCKER_HOST points."""
    host = environ.get("DOCKER_HOST") or ""
    return "docker.sock" in os.path.basename(path.rstrip("/")) or \
        (host.startswith("unix://") and os.path.normpath(host[len("unix://"):]) == os.path.normpath(path))


# What of a mount's long syntax a bind carries; anything else (SELinux relabelling, propagation,
# consistency, a tmpfs's size and mode, ...) has no effect here and is named in a warning.
_MOUNT_KEYS_USED = {"type", "source", "target", "read_only", "bind.create_host_path", "volume.nocopy",
                    "volume.subpath"}


def _ignored_options(mount: Mapping[str, object]) -> List[str]:
    keys = []
    for key, value in mount.items():
        if isinstance(value, dict) and key in ("bind", "volume", "tmpfs", "image"):
            keys += [f"{key}.{k}" for k in value if not str(k).startswith("x-")]
        elif not str(key).startswith("x-"):
            keys.append(str(key))
    return [k for k in keys if k not in _MOUNT_KEYS_USED]


def _depth(target: str) -> int:
    return os.path.normpath(target).count("/")


def _inside(child: str, parent: str) -> bool:
    parent = os.path.normpath(parent)
    return os.path.normpath(child).startswith(parent.rstrip("/") + "/")


def service_binds(service: Service, project: Project, adapter: Optional[Adapter],
                  image_volumes: Sequence[str] = ()) -> Tuple[List[Bind], List[str]]:
    """The service's mounts, its image's VOLUMEs, tmpfs and writable scratch directories as binds, in
    Docker's order (parents before children); and warnings."""
    warnings: List[str] = []
    binds: List[Bind] = []
    scratch = f"{STATE}/services/{service.name}"
    project_dir = os.path.realpath(project.working_dir)
    for raw in (project.model.get("services") or {}).get(service.name, {}).get("volumes") or []:
        ignored = _ignored_options(raw) if isinstance(raw, dict) and raw.get("type") in ("bind", "volume", "tmpfs") else []
        if ignored:
            warnings.append(f"service {service.name!r}: mount at {raw.get('target')}: {', '.join(ignored)} "
                            "ignored (no effect under Apptainer)")
    for mount in service.mounts:
        if mount.type == "bind":
            source = mount.source or ""
            if is_docker_socket(source, project.environment) or is_docker_socket(mount.target, {}):
                warnings.append(f"service {service.name!r}: binds the Docker socket {source}; no Docker daemon runs "
                                "under Apptainer, so what it does through Docker (listing, starting or watching "
                                "containers) will not work; the socket is bound only where one exists at `up`")
                binds.append(Bind(source, mount.target, mount.read_only, "bind", False, socket=True))
                continue
            outside = os.path.isabs(source) and not _inside(os.path.realpath(source), project_dir) \
                and os.path.realpath(source) != project_dir
            if outside and not os.path.exists(source):
                warnings.append(f"service {service.name!r}: host path {source} (bound at {mount.target}) is outside "
                                "the project and missing here; `up` stops before anything starts where it is missing "
                                "and cannot be created; bind a directory of your choice there in an override file")
            binds.append(Bind(source, mount.target, mount.read_only, "bind", mount.create_host_path,
                              host_path=outside))
        elif mount.type == "volume":
            if mount.source:
                volume = (project.model.get("volumes") or {}).get(mount.source) or {}
                if volume.get("external"):
                    warnings.append(f"service {service.name!r}: external volume {mount.source!r} becomes "
                                    f"{STATE}/volumes/{mount.source}")
                if volume.get("driver") not in (None, "local"):
                    warnings.append(f"service {service.name!r}: volume driver {volume['driver']!r} is ignored")
                if volume.get("driver_opts"):
                    warnings.append(f"service {service.name!r}: volume {mount.source!r}: driver_opts "
                                    f"({', '.join(map(str, volume['driver_opts']))}) are ignored; it is the directory "
                                    f"{STATE}/volumes/{mount.source}")
                source = f"{STATE}/volumes/{mount.source}" + (f"/{mount.subpath}" if mount.subpath else "")
            else:
                source = _anonymous(service.name, mount.target)
            binds.append(Bind(source, mount.target, mount.read_only, "volume", True,
                              fill=not mount.nocopy and not mount.subpath, anonymous=not mount.source))
        elif mount.type == "tmpfs":
            binds.append(Bind(f"{scratch}/tmpfs/{_sanitize(mount.target)}", mount.target, False, "tmpfs", True))
        else:
            warnings.append(f"service {service.name!r}: {mount.type} mount at {mount.target} is not supported; skipped")
    for path in service.tmpfs:
        target = path.split(":", 1)[0]
        binds.append(Bind(f"{scratch}/tmpfs/{_sanitize(target)}", target, False, "tmpfs", True))
    targets = {os.path.normpath(b.target) for b in binds}
    for path in image_volumes:  # each VOLUME of the image is an anonymous volume unless mounted over
        if os.path.normpath(path) not in targets:
            binds.append(Bind(_anonymous(service.name, path), os.path.normpath(path), False, "volume", True,
                              fill=True, anonymous=True))
            targets.add(os.path.normpath(path))
    writable = list(adapter.writable if adapter else ()) + list(hints(service).get("writable") or [])
    if "/tmp" not in targets:
        writable.append("/tmp")
    for path in writable:
        if path not in targets and not any(path.startswith(t.rstrip("/") + "/") for t in targets):
            binds.append(Bind(f"{scratch}/scratch/{_sanitize(path)}", path, False, "scratch", True))
            targets.add(path)
    return docker_order(binds), warnings


def _anonymous(service: str, target: str) -> str:
    return f"{STATE}/anonymous/{service}/{_sanitize(target)}"


def docker_order(binds: List[Bind]) -> List[Bind]:
    """Parents before children (sorted by depth, as Docker mounts), and each child's mount point
    recorded in the source of the bind it lands in, where run.sh creates it as Docker does."""
    ordered = sorted(binds, key=lambda b: _depth(b.target))
    for i, child in enumerate(ordered):
        if child.socket:
            continue
        parent = next((p for p in reversed(ordered[:i]) if _inside(child.target, p.target)), None)
        if parent is not None and not parent.socket and parent.kind != "config":
            parent.mount_points.append(os.path.relpath(os.path.normpath(child.target), os.path.normpath(parent.target)))
    return ordered


def bound_texts(bind: Bind) -> List[Tuple[str, str, str]]:
    """(host path, path in the instance, text) of the small text files a bind mount brings in."""
    files: List[Tuple[str, str]] = []
    if os.path.isfile(bind.source):
        files = [(bind.source, bind.target)]
    elif os.path.isdir(bind.source):
        for folder, dirs, names in os.walk(bind.source):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))[:20]
            for name in sorted(n for n in names if not _NOT_SETTINGS.match(n)):
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
    """A bound text config that names a moved port, the service's own localhost:PORT (it listens on
    its own address), or a public default secret, gets a rewritten copy bound over it."""
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
                draft.warnings.append(f"service {draft.name!r}: {target} names a moved port, its own localhost:PORT "
                                      f"or a public default secret; a rewritten copy is bound there ({path})")
    draft.binds.extend(extra)
