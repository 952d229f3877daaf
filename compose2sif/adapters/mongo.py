"""MongoDB: `--port` and `--bind_ip` on mongod's command line."""
from compose2sif.adapters.base import Adapter
from compose2sif.types import Knob

ADAPTER = Adapter(
    family="mongo",
    images=r"(^|/)mongo(db)?(-community-server)?$",
    ports={27017: Knob("flag", "--port", "{port}")},
    address=Knob("flag", "--bind_ip", "{address}"),
    default_command=("mongod",),
    workdir="/",  # the image's WORKDIR
)
