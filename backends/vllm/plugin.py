"""Registers the ``vllm`` backend."""

from __future__ import annotations

from shuniu.backends.vllm.options import VllmOptions
from shuniu.core import hookimpl
from shuniu.core.contracts import Backend, EndpointSpec, RegisterBackend

__all__ = ["register_backends"]


def _factory(spec: EndpointSpec) -> Backend:
    # Imported on use: listing plugins or validating a deployment needs no aiohttp.
    from shuniu.backends.vllm.backend import VllmBackend

    return VllmBackend(spec)


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    register(
        "vllm",
        _factory,
        options=VllmOptions,
        description="Remote vLLM servers: load from /metrics, priority and per-tenant cache_salt forwarded.",
    )
