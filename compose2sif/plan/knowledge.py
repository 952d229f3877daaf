"""What compose2sif knows about common images: where they listen, how to move them to another
port or address, and which paths they write to.

Under Apptainer every service shares the node's network, so a port is only free to move if the
service can be told its new port. Each profile says how (an environment variable, a command-line
flag, or a config file we render). A service's ``x-compose2sif`` key can say the same for images we
do not know::

    x-compose2sif:
      ports:                        # (keys quoted: Compose allows only string keys)
        "8000": {env: PORT}         # the service reads its port from $PORT
        "9000": {flag: --port}      # ... or from `--port N` on its command line
      bind_address: {env: HOST}     # ... and its listen address from $HOST
      writable: [/var/lib/app]      # paths it writes inside the image
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple


@dataclass(frozen=True)
class Setter:
    """How to tell a service a value: ``env`` sets a variable, ``flag`` puts ``FLAG VALUE`` on
    its command line (replacing an existing one), ``nginx`` rewrites rendered nginx configs."""
    kind: str                  # env | flag | nginx | postgres
    name: str = ""
    template: str = "{value}"  # e.g. "{address}:{port}" for services that take both in one value


@dataclass(frozen=True)
class ImageProfile:
    match: str                                   # regex on the image repository (no registry, no tag)
    ports: Dict[int, Setter] = field(default_factory=dict)
    bind_address: Optional[Setter] = None
    default_command: Optional[Tuple[str, ...]] = None  # the image's CMD, when flags must be appended
    writable: Tuple[str, ...] = ()               # directories it writes inside the image


PROFILES: List[ImageProfile] = [
    ImageProfile(r"(^|/)postgres(ql)?$|pgvector|/postgres$",
                 ports={5432: Setter("env", "PGPORT")},
                 bind_address=Setter("postgres", "listen_addresses"),
                 default_command=("postgres",),
                 writable=("/var/run/postgresql",)),
    ImageProfile(r"(^|/)redis(-stack)?(-server)?$|valkey",
                 ports={6379: Setter("flag", "--port")},
                 bind_address=Setter("flag", "--bind"),
                 default_command=("redis-server",)),
    ImageProfile(r"(^|/)nginx(-unprivileged)?$|openresty",
                 ports={80: Setter("nginx"), 443: Setter("nginx")},
                 bind_address=Setter("nginx"),
                 writable=("/var/cache/nginx", "/var/run", "/run", "/var/log/nginx", "/var/lib/nginx")),
    ImageProfile(r"llama\.cpp|llama-server|(^|/)llama$",
                 ports={8080: Setter("flag", "--port")},
                 bind_address=Setter("flag", "--host")),
    ImageProfile(r"vllm",
                 ports={8000: Setter("flag", "--port")},
                 bind_address=Setter("flag", "--host")),  # vLLM's OpenAI-compatible server
    ImageProfile(r"dify-api$", ports={5001: Setter("env", "DIFY_PORT")},
                 bind_address=Setter("env", "DIFY_BIND_ADDRESS"), writable=("/app/logs",)),
    ImageProfile(r"dify-web$", ports={3000: Setter("env", "PORT")}, bind_address=Setter("env", "HOSTNAME")),
    ImageProfile(r"dify-plugin-daemon$", ports={5002: Setter("env", "SERVER_PORT")}),
    ImageProfile(r"dify-sandbox$", ports={8194: Setter("env", "SANDBOX_PORT")}),
    ImageProfile(r"(^|/)squid$", ports={3128: Setter("env", "HTTP_PORT")},
                 writable=("/var/log/squid", "/var/spool/squid", "/run", "/etc/squid")),
    ImageProfile(r"(^|/)weaviate$", ports={8080: Setter("flag", "--port")},
                 bind_address=Setter("flag", "--host")),
]


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


def profile_for(image: Optional[str]) -> Optional[ImageProfile]:
    repo = repository(image)
    for profile in PROFILES:
        if re.search(profile.match, repo):
            return profile
    return None


def hint_setter(spec) -> Optional[Setter]:
    """A setter from an x-compose2sif hint: {env: NAME}, {flag: --port} or {fixed: true}."""
    if not isinstance(spec, dict):
        return None
    if spec.get("env"):
        return Setter("env", str(spec["env"]), str(spec.get("template", "{value}")))
    if spec.get("flag"):
        return Setter("flag", str(spec["flag"]))
    return None
