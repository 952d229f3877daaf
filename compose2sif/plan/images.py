"""Where each service's image comes from, and the Singularity definition that builds its SIF.

One definition per distinct image source: services that share an image (Dify's api, worker and
worker_beat) share one definition and one SIF. Every definition gets the same ``%startscript``:
it runs the service's launch line from its environment (``C2S_LAUNCH``, written by the planner),
or else the image's own ENTRYPOINT+CMD. That makes ``instance start`` work on every Apptainer and
SingularityCE version, including the old setuid installs on RHEL7 (no ``instance run`` there).
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from compose2sif.errors import ComposeError
from compose2sif.model import Service
from compose2sif.plan import dockerfile

STARTSCRIPT = """%startscript
    # compose2sif: run this service's command (set per service in its env file), else the image's own
    if [ -n "${C2S_LAUNCH:-}" ]; then
        eval "$C2S_LAUNCH"
    fi
    exec /.singularity.d/runscript "$@"
"""

SOURCE_KINDS = ("docker", "docker-archive", "oci-archive", "sif")


@dataclass
class ImageSource:
    key: str                     # file stem: definitions/<key>.def, sif/<key>.sif
    kind: str                    # docker | docker-archive | oci-archive | sif | build
    ref: str                     # image reference, archive path, SIF path or build context
    definition: str
    services: List[str] = field(default_factory=list)
    workdir: Optional[str] = None  # known from a Dockerfile
    exposed: List[int] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.definition.encode()).hexdigest()


def _key(text: str) -> str:
    key = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.").lower()
    return key[:80] or "image"


def docker_reference(image: str, mirror: Optional[str]) -> str:
    """`nginx:1.27` -> `MIRROR/library/nginx:1.27` when a mirror is given for Docker Hub."""
    if not mirror:
        return image
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        if first not in ("docker.io", "index.docker.io", "registry-1.docker.io"):
            return image  # another registry: leave it
        image = image.split("/", 1)[1]
    if "/" not in image:
        image = "library/" + image
    return f"{mirror.rstrip('/')}/{image}"


def _definition(header: str, comment: str) -> str:
    return f"# {comment}\n{header}\n{STARTSCRIPT}"


def source_override(service: Service, cli_sources: Dict[str, str]) -> Optional[Dict[str, str]]:
    """An image source chosen per service: the CLI's SERVICE=KIND:PATH, or x-compose2sif.image."""
    if service.name in cli_sources:
        kind, _, path = cli_sources[service.name].partition(":")
        if kind not in SOURCE_KINDS or not path:
            raise ComposeError(f"--image-source {service.name}={cli_sources[service.name]}: "
                               f"expected KIND:PATH with KIND one of {', '.join(SOURCE_KINDS)}")
        return {kind: path}
    hint = (service.extensions.get("x-compose2sif") or {}).get("image")
    if hint is None:
        return None
    if not isinstance(hint, dict) or len(hint) != 1 or next(iter(hint)) not in SOURCE_KINDS:
        raise ComposeError(f"must be a mapping with one of {', '.join(SOURCE_KINDS)}",
                           path=f"services.{service.name}.x-compose2sif.image")
    return {str(k): str(v) for k, v in hint.items()}


def plan_images(services: List[Service], working_dir: str, mirror: Optional[str],
                cli_sources: Dict[str, str]) -> Dict[str, ImageSource]:
    """Image sources by key, each listing the services that use it."""
    sources: Dict[str, ImageSource] = {}
    by_identity: Dict[str, str] = {}

    def add(identity: str, make) -> ImageSource:
        if identity in by_identity:
            return sources[by_identity[identity]]
        source = make()
        base, n = source.key, 2
        while source.key in sources:
            source.key = f"{base}-{n}"
            n += 1
        sources[source.key] = source
        by_identity[identity] = source.key
        return source

    for service in services:
        override = source_override(service, cli_sources)
        if override:
            kind, path = next(iter(override.items()))
            path = os.path.normpath(os.path.join(working_dir, os.path.expanduser(path)))
            if kind == "docker":
                source = add(f"docker:{override['docker']}", lambda: ImageSource(
                    _key(override["docker"]), "docker", override["docker"],
                    _definition(f"Bootstrap: docker\nFrom: {docker_reference(override['docker'], mirror)}\n",
                                f"image {override['docker']}")))
            elif kind == "sif":
                source = add(f"sif:{path}", lambda: ImageSource(
                    _key(os.path.basename(path).rsplit(".", 1)[0]), "sif", path,
                    _definition(f"Bootstrap: localimage\nFrom: {path}\n", f"ready SIF {path}")))
            else:
                source = add(f"{kind}:{path}", lambda: ImageSource(
                    _key(os.path.basename(path).split(".")[0]), kind, path,
                    _definition(f"Bootstrap: {kind}\nFrom: {path}\n", f"{kind} {path}")))
        elif service.build is not None:
            source = add(f"build:{service.name}", lambda: _build_source(service, working_dir, mirror))
        elif service.image:
            image = service.image
            source = add(f"docker:{image}", lambda: ImageSource(
                _key(image), "docker", image,
                _definition(f"Bootstrap: docker\nFrom: {docker_reference(image, mirror)}\n", f"image {image}")))
        else:
            raise ComposeError("has neither an image nor a build context", path=f"services.{service.name}")
        source.services.append(service.name)
    return sources


def _build_source(service: Service, working_dir: str, mirror: Optional[str]) -> ImageSource:
    build = service.build or {}
    context = build.get("context") or working_dir
    if "://" in context or context.startswith(("git@", "github.com/")):
        raise ComposeError("remote build contexts are not supported; clone it and point build.context at it",
                           path=f"services.{service.name}.build.context")
    where = f"services.{service.name}.build"
    if build.get("dockerfile_inline"):
        text, name = build["dockerfile_inline"], "dockerfile_inline"
    else:
        path = os.path.join(context, build.get("dockerfile") or "Dockerfile")
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise ComposeError(f"cannot read the Dockerfile {path}: {exc.strerror}", path=where) from None
        name = path
    args = build.get("args") or {}
    if isinstance(args, list):
        args = dict(a.split("=", 1) if "=" in a else (a, None) for a in args)
    converted = dockerfile.convert(text, context, {k: (None if v is None else str(v)) for k, v in args.items()},
                                   build.get("target"), name, lambda image: docker_reference(image, mirror))
    key = _key(service.image) if service.image else _key(f"build-{service.name}")
    header = converted.definition
    definition = f"# built from {name}\n{header}\n{STARTSCRIPT}"
    warnings = list(converted.warnings)
    if converted.user and converted.user not in ("root", "0"):
        warnings.append(f"service {service.name!r}: the Dockerfile's USER {converted.user} is ignored; "
                        "Apptainer runs the service as you")
    return ImageSource(key, "build", context, definition, workdir=converted.workdir, exposed=converted.exposed,
                       warnings=warnings)
