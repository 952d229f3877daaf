"""vLLM's OpenAI-compatible server: `--host` and `--port`; a batch job gives it the GPUs of its
tensor x pipeline parallel size."""
from typing import List, Optional

from compose2sif.adapters.base import Adapter, flag_value
from compose2sif.errors import ComposeError
from compose2sif.types import Knob


class Vllm(Adapter):
    def parallel_size(self, argv: List[str], path: str) -> int:
        return (_positive_flag(argv, path, "--tensor-parallel-size", "-tp")
                * _positive_flag(argv, path, "--pipeline-parallel-size", "-pp"))

    def across_nodes_problem(self, argv: List[str]) -> Optional[str]:
        if flag_value(argv, "--distributed-executor-backend") == "ray":
            return None
        return "across nodes vLLM needs --distributed-executor-backend=ray in its command"


def _positive_flag(argv: List[str], path: str, *names: str) -> int:
    value = flag_value(argv, *names)
    if value is None:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise ComposeError(f"{names[0]} {value!r} is not a positive integer", path=path)
    return int(value)


ADAPTER = Vllm(
    family="vllm",
    images=r"vllm",
    ports={8000: Knob("flag", "--port", "{port}")},
    address=Knob("flag", "--host", "{address}"),
    model_server=True,
)
