"""Registers the ``openai`` backend."""

from __future__ import annotations

from shuniu.backends.openai.options import OpenAIOptions
from shuniu.core import hookimpl
from shuniu.core.interfaces import EndpointSpec


def _factory(spec: EndpointSpec):  # type: ignore[no-untyped-def]
    from shuniu.backends.openai.backend import OpenAIBackend

    return OpenAIBackend(spec)


@hookimpl
def register_backends(register) -> None:  # type: ignore[no-untyped-def]
    register(
        "openai",
        _factory,
        options=OpenAIOptions,
        description="Any OpenAI-compatible server (SGLang, llama.cpp, vLLM without metrics, cloud APIs).",
    )
