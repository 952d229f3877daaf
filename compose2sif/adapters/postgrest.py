"""PostgREST: PGRST_SERVER_PORT (default 3000) and PGRST_SERVER_HOST (default `!4`, every IPv4 address)."""
from compose2sif.adapters.base import Adapter
from compose2sif.types import Knob

ADAPTER = Adapter(
    family="postgrest",
    images=r"(^|/)postgrest/postgrest$",
    ports={3000: Knob("env", "PGRST_SERVER_PORT", "{port}")},
    address=Knob("env", "PGRST_SERVER_HOST", "{address}"),
    workdir="/",  # the image's WORKDIR
)
