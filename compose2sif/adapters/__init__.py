"""Knowledge of particular images, one module per family, behind one small interface (base.py).

The generic planner never tests an image's name: it asks ``adapter_for(image)`` and uses what
the adapter supplies (ports and their knobs, the address knob, writable paths, the image's
default command) and lets it ``finish`` the service once the plan is decided.
"""
import re
from typing import Dict, Iterable, List, Optional, Set

from compose2sif.adapters import dify, llamacpp, mongo, mysql, nginx, postgres, redis, squid, vllm, weaviate
from compose2sif.adapters.base import Adapter, Draft

# first match wins: a preset's adapters come before the general ones they refine
ADAPTERS: List[Adapter] = [*dify.ADAPTERS, postgres.ADAPTER, redis.ADAPTER, mysql.ADAPTER, mongo.ADAPTER,
                           nginx.ADAPTER, llamacpp.ADAPTER, vllm.ADAPTER, weaviate.ADAPTER, squid.ADAPTER]


def repository(image: Optional[str]) -> str:
    """`docker.io/library/nginx:1.27@sha256:...` -> `library/nginx`, `127.0.0.1:5000/c2s/nginx:test` -> `c2s/nginx`."""
    if not image:
        return ""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    return "/".join(parts)


PRESETS = {dify.PRESET: r"(^|/)langgenius/dify-"}   # a project is Dify's when one of its images is
PRESET_SECRETS = {dify.PRESET: dify.SECRETS}       # variable -> its public default, to be replaced


def presets_for(images: Iterable[Optional[str]]) -> Set[str]:
    return {name for name, pattern in PRESETS.items()
            if any(re.search(pattern, repository(image)) for image in images)}


def preset_secrets(presets: Set[str]) -> Dict[str, str]:
    return {k: v for preset in sorted(presets) for k, v in PRESET_SECRETS.get(preset, {}).items()}


def adapter_for(image: Optional[str], presets: Set[str] = frozenset()) -> Optional[Adapter]:
    repo = repository(image)
    return next((a for a in ADAPTERS if repo and a.matches(repo) and (a.preset is None or a.preset in presets)),
                None)


__all__ = ["ADAPTERS", "PRESETS", "Adapter", "Draft", "adapter_for", "preset_secrets", "presets_for", "repository"]
