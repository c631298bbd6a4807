"""The base class of a rate-limit store's binding: one principal's limits, booked without a
coroutine (see ``MemoryRateLimitStore.bind``).

A regular install compiles this module with mypyc (``core/compiled.py``). A binding compiled
with it (the memory store's :class:`~shuniu.plugins.ratelimit.loop_binding.LoopBinding`)
subclasses :class:`Binding`, and the compiled tenancy then calls its methods directly, as C
calls, instead of looking them up and calling them through the interpreter. Any other object
with the same two methods still works as a binding: it is called the interpreter's way.
"""

from __future__ import annotations

__all__ = ["Binding"]


class Binding:
    """``take`` and ``give_back`` of one principal's limits in an in-process store."""

    def take(self, cost: float, token: object) -> tuple[int, int, float, int, int, float] | None:
        """Book one request (one unit of each request rate, ``cost`` of each token rate, a
        lease of each concurrency limit) and return, for the response headers, the tightest
        request rate and token rate after it: ``(index, remaining, reset_s)`` each, the
        index ``-1`` where there are none; ``None`` (nothing booked) when any limit
        refuses."""
        raise NotImplementedError

    def give_back(self, delta: float, token: object) -> None:
        """The request ended: move each token rate by ``delta`` units (negative gives back
        an unused reservation) and release its leases."""
        raise NotImplementedError
