"""Read an image's configuration (WORKDIR, EXPOSE, ENTRYPOINT, CMD, USER, HEALTHCHECK) from its registry.

Apptainer ignores an image's WORKDIR and does not say which ports it exposes, but the service may
depend on both. ``convert`` asks the registry (Docker Registry HTTP API v2, anonymous token auth as
Docker Hub uses) and records what it finds in the plan. Best effort: on an offline login node the
plan simply lacks it, and a warning says so.
"""
from __future__ import annotations

import platform
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import requests

from compose2sif.model import Healthcheck, healthcheck_of

MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])


@dataclass
class ImageConfig:
    workdir: Optional[str] = None
    exposed: List[int] = field(default_factory=list)
    entrypoint: Optional[List[str]] = None
    cmd: Optional[List[str]] = None
    user: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)
    volumes: List[str] = field(default_factory=list)
    stop_signal: Optional[str] = None
    healthcheck: Optional[Healthcheck] = None  # its HEALTHCHECK: the test where compose gives none


def config_healthcheck(config: Dict) -> Optional[Healthcheck]:
    """The HEALTHCHECK of an image config (Docker's and OCI configs both carry it as `Healthcheck`:
    Test as Docker stores it, durations in nanoseconds)."""
    health = config.get("Healthcheck")
    if not isinstance(health, dict) or not isinstance(health.get("Test"), list) or not health["Test"]:
        return None
    test = [str(a) for a in health["Test"]]
    seconds = {field_name: (health.get(key) or 0) / 1e9 for field_name, key in
               (("interval", "Interval"), ("timeout", "Timeout"), ("start_period", "StartPeriod"),
                ("start_interval", "StartInterval")) if isinstance(health.get(key) or 0, (int, float))}
    retries = health.get("Retries") if isinstance(health.get("Retries"), int) else 0
    return healthcheck_of(test, seconds, retries)


def split_reference(ref: str) -> Tuple[str, str, str]:
    """(registry, repository, tag or digest) with Docker Hub's defaults."""
    name, digest = (ref.split("@", 1) + [""])[:2]
    registry = "registry-1.docker.io"
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        registry, name = first, name.split("/", 1)[1]
        if registry in ("docker.io", "index.docker.io"):
            registry = "registry-1.docker.io"
    tag = "latest"
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    if registry == "registry-1.docker.io" and "/" not in name:
        name = "library/" + name
    return registry, name, digest or tag


def _arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le"}.get(machine, machine)


class _Client:
    def __init__(self, registry: str, repository: str, timeout: float, insecure: bool):
        self.repository = repository
        self.timeout = timeout
        plain = insecure or registry.startswith(("127.", "localhost"))
        self.base = f"{'http' if plain else 'https'}://{registry}/v2/{repository}"
        self.session = requests.Session()

    def get(self, path: str, accept: str) -> requests.Response:
        url = f"{self.base}/{path}"
        response = self.session.get(url, headers={"Accept": accept}, timeout=self.timeout)
        if response.status_code == 401 and "Bearer" in response.headers.get("WWW-Authenticate", ""):
            challenge = dict(re.findall(r'(\w+)="([^"]*)"', response.headers["WWW-Authenticate"]))
            token = self.session.get(challenge["realm"], timeout=self.timeout, params={
                "service": challenge.get("service", ""),
                "scope": challenge.get("scope", f"repository:{self.repository}:pull")}).json()
            self.session.headers["Authorization"] = f"Bearer {token.get('token') or token.get('access_token')}"
            response = self.session.get(url, headers={"Accept": accept}, timeout=self.timeout)
        response.raise_for_status()
        return response


def fetch_config(ref: str, timeout: float = 5.0, insecure: bool = False) -> ImageConfig:
    """The image's config; raises requests.RequestException or ValueError when it cannot be read."""
    registry, repository, reference = split_reference(ref)
    client = _Client(registry, repository, timeout, insecure)
    manifest = client.get(f"manifests/{reference}", MANIFEST_TYPES).json()
    if "manifests" in manifest:  # an index: pick this machine's platform
        wanted = _arch()
        choices = [m for m in manifest["manifests"]
                   if m.get("platform", {}).get("architecture") == wanted and m.get("platform", {}).get("os") == "linux"]
        if not choices:
            raise ValueError(f"{ref} has no linux/{wanted} image")
        manifest = client.get(f"manifests/{choices[0]['digest']}", MANIFEST_TYPES).json()
    config = client.get(f"blobs/{manifest['config']['digest']}", "*/*").json().get("config") or {}
    exposed = sorted(int(p.split("/")[0]) for p in (config.get("ExposedPorts") or {}) if p.split("/")[0].isdigit()
                     and not p.endswith("/udp"))
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    return ImageConfig(workdir=config.get("WorkingDir") or None, exposed=exposed,
                       entrypoint=config.get("Entrypoint"), cmd=config.get("Cmd"),
                       user=config.get("User") or None, env=env,
                       volumes=sorted(v for v in (config.get("Volumes") or {}) if v.startswith("/")),
                       stop_signal=config.get("StopSignal") or None, healthcheck=config_healthcheck(config))
