"""Squid (Dify's SSRF proxy image reads HTTP_PORT in its entrypoint)."""
from compose2sif.adapters.base import Adapter
from compose2sif.types import Knob

ADAPTER = Adapter(
    family="squid",
    images=r"(^|/)squid$",
    ports={3128: Knob("env", "HTTP_PORT", "{port}")},
    writable=("/var/log/squid", "/var/spool/squid", "/run", "/etc/squid"),
    workdir="/",  # the image's WORKDIR
    check=("squid", "-k", "parse"),  # squid writes why it stops into cache.log, not its output
)
