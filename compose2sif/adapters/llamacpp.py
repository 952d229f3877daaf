"""llama.cpp's llama-server: `--host` and `--port`."""
from compose2sif.adapters.base import Adapter
from compose2sif.types import Knob

ADAPTER = Adapter(
    family="llama.cpp",
    images=r"llama\.cpp|llama-server|(^|/)llama$",
    ports={8080: Knob("flag", "--port", "{port}")},
    address=Knob("flag", "--host", "{address}"),
    model_server=True,
)
