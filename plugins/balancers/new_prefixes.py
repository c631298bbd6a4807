"""Where new prefixes went lately: the prompt tokens each endpoint was sent cold.

A prompt no endpoint holds (a new system prompt, one evicted everywhere) starts a copy of
its prefix in one engine's cache, and every later request with that prefix follows it
there. Placing such prompts by request load alone spreads them unevenly: in a burst of new
prefixes (a pool's first second, a restart), loads barely differ, and an engine that ends up
with more prefixes than its share both carries more traffic and evicts more. Both prefix
balancers therefore place a new prefix on the endpoint that took the fewest new prompt
tokens within a window (as ``sglang-router``'s ``cache_aware`` sends an unmatched prompt to
its smallest tree), and only then on the less loaded one.
"""

from __future__ import annotations

from collections import deque

from shuniu.plugins.balancers.prefix_index import loop_time

__all__ = ["NewPrefixes"]


class NewPrefixes:
    """Prompt tokens sent cold to each endpoint index in the last ``window_s`` seconds."""

    __slots__ = ("_placed", "_sums", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._placed: dict[int, deque[tuple[float, float]]] = {}
        self._sums: dict[int, float] = {}

    @staticmethod
    def now() -> float:
        """The clock the window runs on (the running loop's: virtual in ``shuniu simulate``)."""
        return loop_time()

    def placed(self, endpoint: int, tokens: float, now: float) -> None:
        """``endpoint`` was sent ``tokens`` prompt tokens that no endpoint held."""
        q = self._placed.get(endpoint)
        if q is None:
            q = self._placed[endpoint] = deque()
            self._sums[endpoint] = 0.0
        q.append((now, tokens))
        self._sums[endpoint] += tokens
        self._expire(endpoint, now)

    def tokens(self, endpoint: int, now: float) -> float:
        """New prompt tokens ``endpoint`` took within the window."""
        if endpoint not in self._placed:
            return 0.0
        self._expire(endpoint, now)
        return self._sums[endpoint]

    def forget(self, endpoint: int) -> None:
        """``endpoint`` lost its cache (a restart): what it took no longer counts."""
        self._placed.pop(endpoint, None)
        self._sums.pop(endpoint, None)

    def _expire(self, endpoint: int, now: float) -> None:
        q = self._placed[endpoint]
        horizon = now - self.window_s
        while q and q[0][0] < horizon:
            self._sums[endpoint] -= q.popleft()[1]
        if not q:
            self._sums[endpoint] = 0.0  # no drift from float subtraction
