"""Registers the ``tei`` backend."""

from __future__ import annotations

from shuniu.backends.tei.options import TeiOptions
from shuniu.core import hookimpl
from shuniu.core.contracts import Backend, EndpointSpec, RegisterBackend

__all__ = ["register_backends"]


def _factory(spec: EndpointSpec) -> Backend:
    # Imported on use: listing plugins or validating a deployment needs no aiohttp.
    from shuniu.backends.tei.backend import TeiBackend

    return TeiBackend(spec)


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    register(
        "tei",
        _factory,
        options=TeiOptions,
        description=(
            "Hugging Face text-embeddings-inference: embeddings through /embed, rerank and score "
            "through /rerank, limits from /info, load from /metrics."
        ),
    )
