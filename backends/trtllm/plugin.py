"""Registers the ``trtllm`` backend."""

from __future__ import annotations

from shuniu.backends.trtllm.options import TrtllmOptions
from shuniu.core import hookimpl
from shuniu.core.contracts import Backend, EndpointSpec, RegisterBackend

__all__ = ["register_backends"]


def _factory(spec: EndpointSpec) -> Backend:
    # Imported on use: listing plugins or validating a deployment needs no aiohttp.
    assert isinstance(spec.options, TrtllmOptions)
    if spec.options.api == "triton":
        from shuniu.backends.trtllm.triton import TritonBackend

        return TritonBackend(spec)
    from shuniu.backends.trtllm.serve import TrtllmServeBackend

    return TrtllmServeBackend(spec)


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    register(
        "trtllm",
        _factory,
        options=TrtllmOptions,
        description=(
            "NVIDIA TensorRT-LLM: trtllm-serve's OpenAI API (load from its iteration statistics) "
            "or Triton's generate endpoint (load from Triton's metrics)."
        ),
    )
