"""A service's `pre_start` steps, as Docker Compose runs them: each a one-off container of its own
that runs to completion, in order, before the service first starts.

A step runs its service's image unless it names another (a SIF of its own, pulled or built like any
other: images.py). It shares what the service container has: its volumes and binds, its environment
with the step's added (the step's win), its working directory unless it names one, and the
service's entrypoint where it runs the service's image. Its fingerprint covers all of that, so that
run.sh runs it again only when it changed (or after `down`, which Compose's recreated container
means). Under Apptainer everything runs as the calling user: a step's `user` and `privileged` are
warned about, not applied.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Dict, List, Optional

from compose2sif.model import PreStartStep, Service
from compose2sif.plan.generated import Replacer
from compose2sif.plan.images import ImageSource
from compose2sif.plan.knobs import RUNSCRIPT
from compose2sif.plan.network import References
from compose2sif.plan.types import Plan, PreStartPlan, ServicePlan

_VALID_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # what an --env-file can carry


def plan_pre_start(plan: Plan, services: Dict[str, Service], images: Dict[str, ImageSource], refs: References,
                   secrets: Optional[Replacer]) -> None:
    """Give each ServicePlan of ``plan`` its steps (ServicePlan.pre_start), and their warnings."""
    image_of = {(name, index): key for key, source in images.items() for name, index in source.steps}
    for service_plan in plan.services:
        service = services[service_plan.name]
        for index, step in enumerate(service.pre_start):
            key = image_of[(service.name, index)]
            step_plan = _step(service, service_plan, index, step, key, refs, secrets)
            step_plan.fingerprint = _fingerprint(step_plan, service_plan, images[key].digest)
            service_plan.pre_start.append(step_plan)
            for warning in _warnings(service.name, index, step):
                service_plan.warnings.append(warning)
                plan.warnings.append(warning)


def _step(service: Service, service_plan: ServicePlan, index: int, step: PreStartStep, key: str,
          refs: References, secrets: Optional[Replacer]) -> PreStartPlan:
    entrypoint = service.entrypoint if key == service_plan.image else None  # the image's own otherwise
    if step.command is not None:
        launch: Optional[List[str]] = list(entrypoint if entrypoint is not None else [RUNSCRIPT]) + list(step.command)
    else:
        launch = list(entrypoint) if entrypoint is not None else None
    own = {k: v for k, v in refs.rewrite_environment(step.environment, service.name).items() if v is not None}
    if launch is not None:
        launch = [refs.rewrite(a, service.name) for a in launch]
    if secrets is not None:
        own = {k: secrets(v, k) for k, v in own.items()}
        launch = [secrets(a) for a in launch] if launch is not None else None
    environment = {**service_plan.environment, **{k: v for k, v in own.items() if _VALID_NAME.match(k)}}
    return PreStartPlan(index=index, image=key, env_file=f"env/{service.name}.pre_start.{index}.env",
                        environment=environment, launch=launch, workdir=step.working_dir or service_plan.workdir,
                        fingerprint="")


def _fingerprint(step: PreStartPlan, service: ServicePlan, image_digest: str) -> str:
    """What the step is: its image's definition, command, environment, working directory, and the
    service's binds and limits it runs with."""
    what = {"image": image_digest, "launch": step.launch, "environment": step.environment, "workdir": step.workdir,
            "binds": [[b.source, b.target, b.read_only] for b in service.binds], "ulimits": service.ulimits}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def _warnings(name: str, index: int, step: PreStartStep) -> List[str]:
    where = f"service {name!r}: pre_start[{index}]"
    out = [f"{where}: environment variable {key!r} is not a valid shell name and cannot be passed through "
           "--env-file; skipped" for key in sorted(step.environment) if not _VALID_NAME.match(key)]
    if step.user is not None:
        out.append(f"{where}: user {step.user!r} is ignored; Apptainer runs the step as you")
    if step.privileged:
        out.append(f"{where}: privileged is ignored; an unprivileged user cannot run privileged containers")
    return out
