"""The ``openai`` backend: any OpenAI-compatible server (SGLang, llama.cpp, vLLM without
its metrics, cloud APIs), through the HTTP engine layer's OpenAI-protocol client as it is."""

from __future__ import annotations

from typing import ClassVar

from shuniu.backends.http import OpenAIEngine

__all__ = ["OpenAIBackend"]


class OpenAIBackend(OpenAIEngine):
    kind: ClassVar[str] = "openai"
