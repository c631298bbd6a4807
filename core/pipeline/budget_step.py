"""Budgets on the request path (``governance:``): the request's tokens and cost reserved
against its key's, tenant's and project's budgets after its rate limits (429
``budget_exceeded`` when one would be overrun), and settled with its real usage and cost
when it ends. Nothing happens for a principal without budgets."""

from __future__ import annotations

from collections.abc import Awaitable

from shuniu.core.governance import BudgetHold, Budgets
from shuniu.core.pipeline.recording import Progress
from shuniu.core.types import InferenceRequest

__all__ = ["reserve", "settle"]


def reserve(budgets: Budgets, req: InferenceRequest, model: str) -> Awaitable[BudgetHold | None]:
    """The request's hold on its budgets (``None``: none applies), or a 429. Not a
    coroutine itself: the budgets' own is returned as it is (one frame less per request)."""
    return budgets.reserve(req, model)


def settle(budgets: Budgets, hold: BudgetHold, progress: Progress) -> None:
    """Book the real usage: a cached answer, or a request that got no answer, costs nothing."""
    if progress.cached:
        budgets.settle(hold, 0, 0.0)
        return
    prompt, completion = progress.prompt_tokens, progress.completion_tokens
    cost = budgets.prices.cost(hold.model, prompt, progress.cached_tokens, completion)
    budgets.settle(hold, prompt + completion, cost)
