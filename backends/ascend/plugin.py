"""Registers the ``ascend`` backend."""

from __future__ import annotations

from shuniu.backends.ascend.options import AscendOptions
from shuniu.core import hookimpl
from shuniu.core.contracts import Backend, EndpointSpec, RegisterBackend

__all__ = ["register_backends"]


def _factory(spec: EndpointSpec) -> Backend:
    # Imported on use: listing plugins or validating a deployment needs no aiohttp.
    from shuniu.backends.ascend.backend import build_backend

    return build_backend(spec)


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    register(
        "ascend",
        _factory,
        options=AscendOptions,
        description="Ascend NPU engines: vllm-ascend (the vllm adapter) or MindIE Service (its OpenAI "
        "API, health probes and /metrics), with each endpoint's NPU readings from npu-smi.",
    )
