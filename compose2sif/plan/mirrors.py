"""Registry mirrors: which registry an image reference names, and the mirror it is pulled through.

`--registry-mirror [REGISTRY=][http://]HOST[:PORT][/PREFIX]` (repeatable) and `C2S_REGISTRY_MIRRORS`
(the same, comma-separated) map a registry to a site's pull-through mirror. With no `REGISTRY=` the
mirror is Docker Hub's, as Docker's own `registry-mirrors` is. A Docker Hub image keeps its
`library/` part on the mirror (`app:1` -> `HOST/library/app:1`, as Distribution's proxy
and Harbor's proxy projects serve it); another registry's image keeps its repository path under the
prefix (`ghcr.io=HOST/ghcr.io` maps `ghcr.io/x/y:1` to `HOST/ghcr.io/x/y:1`). `http://` says the
mirror speaks plain HTTP: run.sh then builds from it with `--nohttps` and reads its digests over
HTTP; nothing else is ever sent in the clear.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from compose2sif.errors import ComposeError

DOCKER_HUB = "docker.io"
_HUB_NAMES = ("docker.io", "index.docker.io", "registry-1.docker.io")
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?"
_MIRROR = re.compile(rf"^(?P<scheme>https?://)?(?P<host>{_HOST})(?P<prefix>(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)/?$")
_REGISTRY = re.compile(rf"^{_HOST}$")
USAGE = "expected [REGISTRY=][http://]HOST[:PORT][/PREFIX], e.g. mirror.example.org or ghcr.io=mirror.example.org/ghcr"


def split_registry(image: str) -> Tuple[str, str]:
    """(registry, repository[:tag][@digest]) as Docker reads a reference: the first part names a
    registry only when it has a dot or a port or is `localhost`; Docker Hub's one-part names are
    `library/NAME`."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, path = (DOCKER_HUB if first in _HUB_NAMES else first), rest
    else:
        registry, path = DOCKER_HUB, image
    if registry == DOCKER_HUB and "/" not in path:
        path = "library/" + path
    return registry, path


@dataclass(frozen=True)
class Mirror:
    registry: str      # the registry it stands for: docker.io, ghcr.io, quay.io, ...
    host: str          # HOST[:PORT]
    prefix: str        # path under the host, no slashes at either end; may be empty
    plain_http: bool   # the user wrote http://

    @property
    def base(self) -> str:
        return f"{self.host}/{self.prefix}" if self.prefix else self.host

    def to_json(self) -> Dict[str, object]:
        return {"registry": self.registry, "mirror": self.base, "plain_http": self.plain_http}


class Mirrors:
    """The mirror of each registry that has one."""

    def __init__(self, mirrors: Sequence[Mirror] = ()):
        self.by_registry: Dict[str, Mirror] = {m.registry: m for m in mirrors}

    @classmethod
    def parse(cls, options: Sequence[str] = (), environ: Optional[str] = None) -> "Mirrors":
        """The command line's entries, over those of C2S_REGISTRY_MIRRORS for the same registry."""
        found: Dict[str, Mirror] = {}
        for text in [t for t in (environ or "").split(",") if t.strip()]:
            mirror = _parse_one(text.strip(), "C2S_REGISTRY_MIRRORS")
            found[mirror.registry] = mirror
        for text in options:
            mirror = _parse_one(text, "--registry-mirror")
            found[mirror.registry] = mirror
        return cls(list(found.values()))

    def __bool__(self) -> bool:
        return bool(self.by_registry)

    def reference(self, image: str) -> str:
        """The reference to pull ``image`` by: through its registry's mirror where there is one."""
        registry, path = split_registry(image)
        mirror = self.by_registry.get(registry)
        return f"{mirror.base}/{path}" if mirror else image

    def plain_hosts(self) -> List[str]:
        """HOST[:PORT] of the mirrors that speak plain HTTP."""
        return sorted({m.host for m in self.by_registry.values() if m.plain_http})

    def to_json(self) -> List[Dict[str, object]]:
        return [self.by_registry[r].to_json() for r in sorted(self.by_registry)]


def _parse_one(text: str, where: str) -> Mirror:
    registry, sep, target = text.partition("=")
    if not sep:
        registry, target = DOCKER_HUB, text
    registry = registry.strip().lower()
    registry = DOCKER_HUB if registry in _HUB_NAMES else registry
    match = _MIRROR.match(target.strip())
    if not registry or not _REGISTRY.match(registry) or match is None:
        raise ComposeError(f"{where} {text!r}: {USAGE}")
    return Mirror(registry, match["host"].lower(), match["prefix"].strip("/"), match["scheme"] == "http://")
