"""What the request path asks of a prompt counter, and the one step that uses it."""

from __future__ import annotations

from typing import Protocol

from shuniu.core.types import InferenceRequest

__all__ = ["PromptCounter", "TokenizerError", "recount"]


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded or used (a configuration problem, reported at
    start-up with the model named)."""


class PromptCounter(Protocol):
    """Counts a request's prompt in the model's own tokens."""

    name: str
    """What counts (``"engine"`` or the tokenizer's path), for ``/status`` and logs."""

    async def count(self, req: InferenceRequest) -> int | None:
        """The prompt's token count, or ``None`` when this request cannot be counted (the
        estimate stays). Never raises for a request's content."""
        ...


async def recount(req: InferenceRequest, counter: PromptCounter) -> None:
    """Replace the estimate in ``req.prompt_tokens`` with ``counter``'s count. A prompt sent
    as token ids is exact already and is left alone."""
    if req.token_ids is not None:
        return
    n = await counter.count(req)
    if n is not None:
        req.prompt_tokens = n
