"""Counting prompts in tokens the way the model's engine does.

Every limit measured in tokens (the context window, ``max_prompt_tokens``, TPM, length
routing, fair shares) reads ``InferenceRequest.prompt_tokens``. A model with ``tokenizer:``
in the deployment file has it counted right after the model is looked up, before any of
those limits; any other model gets the estimate of :mod:`shuniu.core.tokens` there (the
request path makes no estimate that a tokenizer would replace):

- ``tokenizer: PATH`` — a local ``tokenizer.json`` or model directory, loaded once with
  Hugging Face ``tokenizers`` (:class:`~.local.LocalTokenizer`); chat prompts are rendered
  with the model's chat template first (:class:`~.chat_template.ChatTemplate`), as engines
  do, so the count is the engine's ``prompt_tokens``;
- ``tokenizer: engine`` — the engine's own ``/tokenize`` (:class:`~.engine.EngineCounter`),
  one call per distinct prompt (cached).

A counter that cannot count a request leaves it to the estimate: counting never fails a
request.
"""

from __future__ import annotations

from shuniu.core.lazy import lazy_exports

__all__ = [
    "ChatTemplate",
    "EngineCounter",
    "LocalTokenizer",
    "PromptCounter",
    "TokenizerError",
    "build_counter",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ChatTemplate": "shuniu.core.tokenization.chat_template",
        "EngineCounter": "shuniu.core.tokenization.engine",
        "LocalTokenizer": "shuniu.core.tokenization.local",
        "PromptCounter": "shuniu.core.tokenization.counter",
        "TokenizerError": "shuniu.core.tokenization.counter",
        "build_counter": "shuniu.core.tokenization.build",
    },
)
