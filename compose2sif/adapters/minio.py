"""MinIO: `minio server --address HOST:PORT` (default `:9000`), a flag of the `server` command that
minio parses only before the data directories; the console's `--console-address` the same way."""
from compose2sif.adapters.base import Adapter
from compose2sif.types import Knob

_ADDRESS = Knob("flag", "--address", "{address}:{port}")

ADAPTER = Adapter(
    family="minio",
    images=r"(^|/)minio/minio$",
    ports={9000: _ADDRESS},
    address=_ADDRESS,
    workdir="/",  # the image's WORKDIR
)
