"""Knowledge of particular images, one module per family, behind one small interface (base.py).

The generic code never tests an image's name: it asks ``adapter_for(image)`` and uses what the
adapter supplies (ports and their knobs, the address knob, writable paths, the image's default
command, its web entry and TLS ports, its clients' password variables) and lets it ``finish`` the
service once the plan is decided. Presets (families of projects, such as Dify) come from here too.
"""
from typing import Dict, Iterable, List, Optional, Set

from compose2sif.adapters import (dify, llamacpp, minio, mongo, mysql, nginx, postgres, postgrest, redis, squid, vllm,
                                  weaviate)
from compose2sif.adapters.base import Adapter, Draft, PasswordClient, Preset
from compose2sif.model import Service

# first match wins: a preset's adapters come before the general ones they refine
ADAPTERS: List[Adapter] = [*dify.ADAPTERS, postgres.ADAPTER, redis.ADAPTER, mysql.ADAPTER, mongo.ADAPTER,
                           nginx.ADAPTER, llamacpp.ADAPTER, vllm.ADAPTER, weaviate.ADAPTER, squid.ADAPTER,
                           minio.ADAPTER, postgrest.ADAPTER]
PRESETS: Dict[str, Preset] = {preset.name: preset for preset in (dify.SETUP,)}


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


def presets_for(images: Iterable[Optional[str]]) -> Set[str]:
    """The presets of a project whose services run these images."""
    repositories = [repository(image) for image in images]
    return {name for name, preset in PRESETS.items() if any(preset.matches(r) for r in repositories)}


def preset_secrets(presets: Set[str]) -> Dict[str, str]:
    """Variable -> its public default, to be replaced by a generated value."""
    return {k: v for name in sorted(presets) for k, v in PRESETS[name].secrets.items()}


def adapter_for(image: Optional[str], presets: Set[str] = frozenset(), service: Optional[Service] = None
                ) -> Optional[Adapter]:
    """The adapter of the image's family; else (with ``service``) of the program the project shows
    the service runs, such as nginx in an image of another name with its config mounted."""
    repo = repository(image)
    found = next((a for a in ADAPTERS if repo and a.matches(repo) and (a.preset is None or a.preset in presets)),
                 None)
    if found is None and service is not None:
        found = next((a for a in ADAPTERS if a.preset is None and a.shown_by(service)), None)
    return found


PASSWORD_CLIENTS: Dict[str, PasswordClient] = {c.command: c for a in ADAPTERS for c in a.clients}
# the adapters that override names_not_hosts, once per implementation
_LOCAL_NAMES = list({type(a).names_not_hosts: a for a in ADAPTERS
                     if type(a).names_not_hosts is not Adapter.names_not_hosts}.values())


def names_not_hosts(text: str) -> Set[str]:
    """Names a config text defines for itself (any family's), which a URL in it may name."""
    return set().union(*(a.names_not_hosts(text) for a in _LOCAL_NAMES))


def tls_families() -> List[str]:
    """The families that can serve HTTPS for --tls (outside presets, which refine them)."""
    return sorted({a.family for a in ADAPTERS if a.tls_port is not None and a.preset is None})


__all__ = ["ADAPTERS", "PASSWORD_CLIENTS", "PRESETS", "Adapter", "Draft", "PasswordClient", "Preset", "adapter_for",
           "names_not_hosts", "preset_secrets", "presets_for", "repository", "tls_families"]
