"""Profiles: which services are active (compose-go's ServiceConfig.HasProfile)."""
from __future__ import annotations

from typing import Any, Dict, List


def has_profile(service: Dict[str, Any], profiles: List[str]) -> bool:
    own = service.get("profiles") or []
    return not own or "*" in profiles or any(p in own for p in profiles)
