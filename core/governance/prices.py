"""Prices: what a request cost, from ``governance.prices`` (per million tokens)."""

from __future__ import annotations

from collections.abc import Mapping

from shuniu.core.config import PriceConfig

__all__ = ["Prices"]

_MILLION = 1_000_000.0


class Prices:
    """Per-model prices, per token (a model not listed costs nothing)."""

    __slots__ = ("_per_token", "currency")

    def __init__(self, prices: Mapping[str, PriceConfig], currency: str) -> None:
        self.currency = currency
        self._per_token: dict[str, tuple[float, float, float]] = {
            name: (
                p.prompt / _MILLION,
                (p.cached if p.cached is not None else p.prompt) / _MILLION,
                p.completion / _MILLION,
            )
            for name, p in prices.items()
        }

    def __bool__(self) -> bool:
        return bool(self._per_token)

    def cost(self, model: str, prompt: int, cached: int, completion: int) -> float:
        """The cost of ``prompt`` tokens (``cached`` of them from the prefix cache) and
        ``completion`` tokens of ``model``."""
        price = self._per_token.get(model)
        if price is None:
            return 0.0
        cached = min(cached, prompt)
        return (prompt - cached) * price[0] + cached * price[1] + completion * price[2]
