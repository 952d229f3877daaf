"""PostgreSQL (and images built on it: pgvector, postgis): PGPORT moves its port, `-c
listen_addresses=` tells it its address; its Unix socket directory must be writable."""
from compose2sif.adapters.base import Adapter
from compose2sif.types import Knob

ADAPTER = Adapter(
    family="postgres",
    images=r"(^|/)postgres(ql)?$|pgvector|postgis|/postgres$",
    ports={5432: Knob("env", "PGPORT", "{port}")},
    address=Knob("flag", "-c", "listen_addresses={address}", append=True),
    default_command=("postgres",),
    writable=("/var/run/postgresql",),
    workdir="/",  # the image's WORKDIR
)
