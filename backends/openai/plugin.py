"""Registers the ``openai`` backend."""

from __future__ import annotations

from shuniu.backends.http import OpenAIOptions
from shuniu.core import hookimpl
from shuniu.core.contracts import Backend, EndpointSpec, RegisterBackend


def _factory(spec: EndpointSpec) -> Backend:
    from shuniu.backends.openai.backend import OpenAIBackend

    return OpenAIBackend(spec)


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    register(
        "openai",
        _factory,
        options=OpenAIOptions,
        description="Any OpenAI-compatible server (SGLang, llama.cpp, vLLM without metrics, cloud APIs).",
    )
