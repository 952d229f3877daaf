"""Profiles: which services are active, selected as Docker Compose selects them.

``--profile`` flags are taken as given; without any, COMPOSE_PROFILES (from the host or a .env) is split on
commas and each name trimmed. An empty name counts: ``profiles: ["", "gpu"]`` is active when no profile is
asked for, with ``COMPOSE_PROFILES=`` or ``gpu,``, or with ``--profile ''``, and not with ``--profile other``.
Asking for nothing is asking for the empty profile. ``*`` selects every service.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence


def selected_profiles(flags: Sequence[str], environment: Dict[str, str]) -> List[str]:
    if flags:
        selected = list(flags)
    elif "COMPOSE_PROFILES" in environment:
        selected = [p.strip() for p in environment["COMPOSE_PROFILES"].split(",")]
    else:
        selected = []
    return selected or [""]


def has_profile(service: Dict[str, Any], profiles: List[str]) -> bool:
    own = service.get("profiles") or []
    return not own or "*" in profiles or any(p in own for p in profiles)
