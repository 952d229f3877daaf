"""Weaviate: its image's CMD is `--host 0.0.0.0 --port 8080 --scheme http`; gRPC on GRPC_PORT."""
from compose2sif.adapters.base import Adapter
from compose2sif.types import Knob

ADAPTER = Adapter(
    family="weaviate",
    images=r"(^|/)weaviate$",
    ports={8080: Knob("flag", "--port", "{port}"), 50051: Knob("env", "GRPC_PORT", "{port}")},
    address=Knob("flag", "--host", "{address}"),
    default_command=("--host", "0.0.0.0", "--port", "8080", "--scheme", "http"),
    workdir="/",  # the image's WORKDIR
)
