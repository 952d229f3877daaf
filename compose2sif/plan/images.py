"""Where each service's image comes from, and the Singularity definition that builds its SIF.

One definition per distinct image source: services that share an image (a web app's api, worker
and scheduler) share one definition and one SIF. Every definition gets the same ``%startscript``:
it runs the service's launch line from its environment (``C2S_LAUNCH``, written by the planner),
or else the image's own ENTRYPOINT+CMD. That makes ``instance start`` work on every Apptainer and
SingularityCE version, including the old setuid installs on RHEL7 (no ``instance run`` there).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from compose2sif.errors import ComposeError
from compose2sif.model import Healthcheck, Service
from compose2sif.plan import dockerfile
from compose2sif.plan.dockerfile import comment_text, header_value
from compose2sif.plan.knobs import hints
from compose2sif.plan.mirrors import Mirrors

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

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
    volumes: List[str] = field(default_factory=list)  # the Dockerfile's VOLUMEs
    cmd: Optional[List[str]] = None  # the Dockerfile's CMD in exec form
    stop_signal: Optional[str] = None  # the Dockerfile's STOPSIGNAL
    healthcheck: Optional[Healthcheck] = None  # the Dockerfile's HEALTHCHECK
    warnings: List[str] = field(default_factory=list)
    steps: List[Tuple[str, int]] = field(default_factory=list)  # (service, index) of the pre_start steps it runs

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.definition.encode()).hexdigest()


def _key(text: str) -> str:
    key = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.").lower()
    return key[:80] or "image"


def _image_name(image: str) -> str:
    """An image reference as Docker resolves it: `httpd` and `docker.io/library/httpd:latest` are one."""
    for prefix in ("docker.io/", "index.docker.io/"):
        if image.startswith(prefix):
            image = image[len(prefix):]
    if image.startswith("library/") and image.count("/") == 1:
        image = image[len("library/"):]
    if "@" not in image and ":" not in image.rsplit("/", 1)[-1]:
        image += ":latest"
    return image


def _definition(header: str, comment: str) -> str:
    return f"# {comment_text(comment)}\n{header}\n{STARTSCRIPT}"


def source_override(service: Service, cli_sources: Dict[str, str]) -> Optional[Dict[str, str]]:
    """An image source chosen per service: the CLI's SERVICE=KIND:PATH (for a service of N replicas,
    each of them), or x-compose2sif.image."""
    named = next((n for n in (service.name, service.replica_of) if n and n in cli_sources), None)
    if named is not None:
        kind, _, path = cli_sources[named].partition(":")
        if kind not in SOURCE_KINDS or not path:
            raise ComposeError(f"--image-source {named}={cli_sources[named]}: "
                               f"expected KIND:PATH with KIND one of {', '.join(SOURCE_KINDS)}")
        return {kind: path}
    hint = hints(service).get("image")
    if hint is None:
        return None
    if not isinstance(hint, dict) or len(hint) != 1 or next(iter(hint)) not in SOURCE_KINDS:
        raise ComposeError(f"must be a mapping with one of {', '.join(SOURCE_KINDS)}",
                           path=f"services.{service.name}.x-compose2sif.image")
    kind, value = next(iter(hint.items()))
    if not isinstance(value, str) or not value.strip():  # not str(): `docker: null` is no image named None
        raise ComposeError(f"{value!r}: expected {'an image reference' if kind == 'docker' else 'a path'}",
                           path=f"services.{service.name}.x-compose2sif.image.{kind}")
    return {kind: value}


def _checked(value: Any, path: str) -> str:
    """A compose value that ends up in a definition: one line, no control characters."""
    text = str(value)
    if _CONTROL.search(text):
        raise ComposeError("contains a newline or another control character, which could change the image's "
                           "definition; refused", path=path)
    return text


class DockerfileMissing(Exception):
    """The Dockerfile cannot be read: an error, unless the service's image can be pulled instead."""

    def __init__(self, error: ComposeError):
        super().__init__(str(error))
        self.error = error


def build_args(service: Service) -> Dict[str, Optional[str]]:
    """``build.args`` in either form, map or list (``- NAME=value`` / ``- NAME``); a name without a
    value is resolved from the environment by the loader, and stays unset (None) when it has none."""
    args = (service.build or {}).get("args") or {}
    if isinstance(args, list):
        args = dict(str(a).split("=", 1) if "=" in str(a) else (str(a), None) for a in args)
    where = f"services.{service.name}.build.args"
    return {_checked(k, where): (None if v is None else _checked(v, f"{where}.{k}")) for k, v in args.items()}


def pull_or_build(service: Service, image_configs: Optional[Dict[str, Any]]) -> Tuple[str, Optional[str]]:
    """("pull" | "build", why) for a service with both ``build`` and ``image``, as Compose decides:
    ``pull_policy: build`` always builds; otherwise (missing, always, daily...) the image is pulled
    when it can be had and built when it cannot. Here "can be had" is "its registry gave us its
    configuration" (``image_configs``, filled by convert unless --offline)."""
    policy = service.pull_policy
    if policy == "build":
        return "build", None
    if policy == "never":
        return "build", (f"service {service.name!r}: pull_policy never with build: built (no image is "
                         "stored here to reuse)")
    if image_configs is not None and service.image in image_configs:
        return "pull", (f"service {service.name!r}: image {service.image} is in its registry: pulled, not built "
                        "(pull_policy: build builds it)")
    return "build", (f"service {service.name!r}: image {service.image} could not be read from its registry "
                     "(--offline, or it is not there): built from build: instead")


def registry_questions(services: List[Service], cli_sources: Dict[str, str]) -> List[Tuple[str, bool]]:
    """(image, whether a service surely runs it as pulled) of every image whose registry convert asks
    for its configuration before plan_images: the images services run, and the images of services
    that both build and name one (pulled instead of built when their registry has them)."""
    questions: Dict[str, bool] = {}
    for service in services:
        where = f"services.{service.name}.image"
        override = source_override(service, cli_sources)
        if override:
            if "docker" in override:
                questions[_checked(override["docker"], f"services.{service.name}.x-compose2sif.image")] = True
        elif service.build is not None:
            if service.image and service.pull_policy != "build":
                questions.setdefault(_checked(service.image, where), False)
        elif service.image:
            questions[_checked(service.image, where)] = True
    return list(questions.items())


def plan_images(services: List[Service], working_dir: str, mirrors: Mirrors,
                cli_sources: Dict[str, str], image_configs: Optional[Dict[str, Any]] = None) -> Dict[str, ImageSource]:
    """Image sources by key, each listing the services that use it. ``image_configs``: images whose
    registry answered; decides pull or build for services that have both ``build`` and ``image``."""
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

    def pulled(image: str, where: str) -> ImageSource:
        ref = header_value(mirrors.reference(_checked(image, where)), "image", where)
        return add(f"docker:{image}", lambda: ImageSource(
            _key(image), "docker", image, _definition(f"Bootstrap: docker\nFrom: {ref}\n", f"image {image}")))

    # images that a service of the project builds (not pulled): a Dockerfile FROM one of them
    # starts from that service's SIF, built first (run.sh orders the builds by these headers)
    builders: Dict[str, Service] = {}
    for service in services:
        if (service.build is not None and service.image and not source_override(service, cli_sources)
                and pull_or_build(service, image_configs)[0] == "build"):
            builders.setdefault(_image_name(service.image), service)
    planned: Dict[str, ImageSource] = {}
    in_progress: List[str] = []

    def local_image(service: Service, image: str) -> Optional[str]:
        builder = builders.get(_image_name(image))
        if builder is None or builder.name == service.name:
            return None  # a build FROM its own `image:` starts from the registry's image, as Compose builds it
        if builder.name in in_progress:  # in_progress: each service's build starts FROM the next one's image
            chain = " FROM ".join(repr(n) for n in in_progress[in_progress.index(builder.name):] + [builder.name])
            raise ComposeError(f"its Dockerfile uses image {image}: a cycle of images built from each other: services "
                               f"{chain}; refused", path=f"services.{service.name}.build")
        return f"sif/{plan_service(builder).key}.sif"  # relative: run.sh builds in its own directory

    def plan_service(service: Service) -> ImageSource:
        if service.name in planned:
            return planned[service.name]
        in_progress.append(service.name)
        override = source_override(service, cli_sources)
        decision_note = None
        if override:
            kind, path = next(iter(override.items()))
            where = f"services.{service.name}.x-compose2sif.image"
            if kind == "docker":
                source = pulled(override["docker"], where)
            else:
                path = os.path.normpath(os.path.join(working_dir, os.path.expanduser(_checked(path, where))))
                header = header_value(path, kind, where)
                if kind == "sif":
                    source = add(f"sif:{path}", lambda: ImageSource(
                        _key(os.path.basename(path).rsplit(".", 1)[0]), "sif", path,
                        _definition(f"Bootstrap: localimage\nFrom: {header}\n", f"ready SIF {path}")))
                else:
                    source = add(f"{kind}:{path}", lambda: ImageSource(
                        _key(os.path.basename(path).split(".")[0]), kind, path,
                        _definition(f"Bootstrap: {kind}\nFrom: {header}\n", f"{kind} {path}")))
        elif service.build is not None:
            choice = "build"
            if service.image:
                choice, decision_note = pull_or_build(service, image_configs)
            build = None
            if choice == "build":
                try:
                    build = _build(service, working_dir, mirrors, local_image)
                except DockerfileMissing as exc:
                    if not (service.image and decision_note):  # nothing to pull instead
                        raise exc.error from None
                    decision_note = (f"service {service.name!r}: its Dockerfile cannot be read "
                                     f"({exc.error.message}): image {service.image} is pulled instead")
            if build is None:
                source = pulled(service.image, f"services.{service.name}.image")
            else:
                source = add(*build)
        elif service.image:
            source = pulled(service.image, f"services.{service.name}.image")
        else:
            raise ComposeError("has neither an image nor a build context", path=f"services.{service.name}")
        if decision_note:
            source.warnings.append(decision_note)
        source.services.append(service.name)
        in_progress.remove(service.name)
        planned[service.name] = source
        return source

    for service in services:
        plan_service(service)
    for service in services:  # a pre_start step runs its service's image, or another one pulled or built like it
        for index, step in enumerate(service.pre_start):
            if step.image is None or (service.image and _image_name(step.image) == _image_name(service.image)):
                source = planned[service.name]
            elif _image_name(step.image) in builders:
                source = plan_service(builders[_image_name(step.image)])
            else:
                source = pulled(step.image, f"services.{service.name}.pre_start[{index}].image")
            source.steps.append((service.name, index))
    return sources


def _build(service: Service, working_dir: str, mirrors: Mirrors, local_image):
    """(identity, maker) of a build: services with the same context, Dockerfile, args and target
    share one definition and one SIF."""
    build = service.build or {}
    where = f"services.{service.name}.build"
    context = _checked(build.get("context") or working_dir, f"{where}.context")
    if "://" in context or context.startswith(("git@", "github.com/")):
        raise ComposeError("remote build contexts are not supported; clone it and point build.context at it",
                           path=f"{where}.context")
    args = build_args(service)
    target = _checked(build["target"], f"{where}.target") if build.get("target") else None
    if build.get("dockerfile_inline"):
        text, name = str(build["dockerfile_inline"]), f"{where}.dockerfile_inline"
    else:
        name = os.path.join(context, _checked(build.get("dockerfile") or "Dockerfile", f"{where}.dockerfile"))
        try:
            if os.path.exists(name) and not os.path.isfile(name):  # a FIFO would block
                raise IsADirectoryError(0, "not a regular file")
            with open(name, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise DockerfileMissing(ComposeError(f"cannot read the Dockerfile {name}: {exc.strerror}",
                                                 path=where)) from None
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = data[:exc.start].count(b"\n") + 1
            raise ComposeError(f"{name}: line {line}: not UTF-8 text", path=where) from None
    identity = "build:" + json.dumps([context, name, text, sorted(args.items()), target])

    def make() -> ImageSource:
        try:
            converted = dockerfile.convert(text, context, args, target, name,
                                           mirrors.reference,
                                           lambda image: local_image(service, image))
        except ComposeError as exc:
            exc.path = exc.path or where
            raise
        key = _key(service.image) if service.image else _key(f"build-{service.name}")
        definition = f"# built from {comment_text(name)}\n{converted.definition}\n{STARTSCRIPT}"
        warnings = list(converted.warnings)
        if converted.user and converted.user not in ("root", "0"):
            warnings.append(f"service {service.name!r}: the Dockerfile's USER {converted.user} is ignored; "
                            "Apptainer runs the service as you")
        return ImageSource(key, "build", context, definition, workdir=converted.workdir,
                           exposed=converted.exposed, volumes=converted.volumes, warnings=warnings,
                           cmd=converted.cmd, stop_signal=converted.stop_signal,
                           healthcheck=converted.healthcheck)
    return identity, make
