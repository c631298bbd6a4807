"""Registers the ``tgi`` backend."""

from __future__ import annotations

from shuniu.backends.tgi.options import TgiOptions
from shuniu.core import hookimpl
from shuniu.core.contracts import Backend, EndpointSpec, RegisterBackend

__all__ = ["register_backends"]


def _factory(spec: EndpointSpec) -> Backend:
    # Imported on use: listing plugins or validating a deployment needs no aiohttp.
    from shuniu.backends.tgi.backend import TgiBackend

    return TgiBackend(spec)


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    register(
        "tgi",
        _factory,
        options=TgiOptions,
        description=(
            "Hugging Face Text Generation Inference: completions through /generate_stream, chat "
            "through its Messages API, load from /metrics, context window from /info."
        ),
    )
