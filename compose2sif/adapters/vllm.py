"""vLLM's OpenAI-compatible server: `--host` and `--port`."""
from compose2sif.adapters.base import Adapter
from compose2sif.plan.knobs import Knob

ADAPTER = Adapter(
    family="vllm",
    images=r"vllm",
    ports={8000: Knob("flag", "--port", "{port}")},
    address=Knob("flag", "--host", "{address}"),
    model_server=True,
)
