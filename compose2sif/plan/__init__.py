"""Stage 3: decisions. From typed services to a plan that the renderer writes out and run.sh runs.

For every service: its instance name, image (SIF), start level, its own loopback address and
where each of its ports listens (network.py), how it is told (knobs.py and the image's adapter),
the env file contents, binds (binds.py: volumes, scratch dirs, rendered configs), GPUs,
healthcheck, restart policy, and a warning for everything Apptainer cannot do. build.py runs the
phases; the plan is plain data (types.py; ``Plan.to_json()`` is plan.json). Knowledge of
particular images lives in compose2sif.adapters, which this package imports and which imports
nothing of it.
"""
from __future__ import annotations

from typing import Dict, Optional

from compose2sif.load import Project
from compose2sif.model import services as typed_services
from compose2sif.plan.build import PlanOptions, build_plan
from compose2sif.plan.images import ImageSource, plan_images
from compose2sif.plan.types import Bind, ImagePlan, Plan, PortPlan, ServicePlan

__all__ = ["Bind", "ImagePlan", "Plan", "PlanOptions", "PortPlan", "ServicePlan", "build_plan", "image_definitions"]


def image_definitions(project: Project, options: Optional[PlanOptions] = None) -> Dict[str, ImageSource]:
    """The project's image sources alone, as build_plan plans them."""
    options = options or PlanOptions()
    return plan_images(list(typed_services(project).values()), project.working_dir, options.registry_mirrors,
                       options.image_sources, options.image_configs)
