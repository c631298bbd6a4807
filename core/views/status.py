"""The gateway's recent requests for the status page's data (``GET /status.json``).

``/status.json`` is ``/ready``'s body plus a ``recent`` object per model, computed when it is
asked for from a :class:`StatusWindow`: a ``request_finished`` observer that keeps, per model,
a ring of the last :data:`RING_SIZE` finished requests as one small tuple each. The page
itself is :mod:`shuniu.core.views.status_page`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from shuniu.core.stats import percentile
from shuniu.core.types import Outcome, RequestRecord
from shuniu.core.version import __version__

__all__ = ["REFRESH_S", "RING_SIZE", "WINDOW_S", "RecentWindow", "StatusWindow", "status_json"]

RING_SIZE = 2048
"""Finished requests remembered per model."""
WINDOW_S = 60.0
"""The span the page's rates and percentiles cover (less when the ring holds less)."""
REFRESH_S = 2.0
"""How often the page asks for ``status.json``."""

_ERROR = Outcome.ERROR  # bound once: an enum member looked up on its class costs ~0.5 µs on 3.11

_Entry = tuple[float, bool, float | None, float | None]
"""(finish time on the event-loop clock, failed, time to first token, end to end)."""


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


class RecentWindow:
    """The last ``size`` finished requests of one model, oldest first."""

    __slots__ = ("created", "ring")

    def __init__(self, size: int = RING_SIZE, *, created: float | None = None) -> None:
        if size < 1:
            raise ValueError("a RecentWindow holds at least one request")
        self.ring: deque[_Entry] = deque(maxlen=size)
        self.created = time.monotonic() if created is None else created
        """When the window began (event-loop clock): rates of a young gateway are over
        its lifetime, not a minute it was not running."""

    def add(self, finished: float, failed: bool, ttft: float | None, e2e: float | None) -> None:
        self.ring.append((finished, failed, ttft, e2e))

    def summary(self, now: float, window_s: float = WINDOW_S) -> dict[str, Any]:
        """Counts, rates and latency percentiles of the requests that finished in the last
        ``window_s`` seconds before ``now``. ``span_s`` is the time they cover: shorter than
        ``window_s`` while the gateway is younger than that, or when more requests than the
        ring holds finished within it (then the rates are over the span the ring still has)."""
        since = now - window_s
        ring = self.ring
        span = min(window_s, now - self.created)
        if ring and len(ring) == ring.maxlen and ring[0][0] > since:
            span = min(span, now - ring[0][0])
        requests = errors = 0
        ttfts: list[float] = []
        e2es: list[float] = []
        for finished, failed, ttft, e2e in ring:
            if finished < since or finished > now:
                continue
            requests += 1
            if failed:
                errors += 1
            if ttft is not None:
                ttfts.append(ttft)
            if e2e is not None:
                e2es.append(e2e)
        ttfts.sort()
        e2es.sort()
        span = max(span, 1e-3)
        return {
            "requests": requests,
            "errors": errors,
            "rps": round(requests / span, 3),
            "error_rate": round(errors / requests, 4) if requests else None,
            "ttft_p50": _round(percentile(ttfts, 50)),
            "ttft_p99": _round(percentile(ttfts, 99)),
            "e2e_p50": _round(percentile(e2es, 50)),
            "e2e_p99": _round(percentile(e2es, 99)),
            "span_s": round(span, 3),
        }


class StatusWindow:
    """The gateway's recent requests, per model: a ``request_finished`` observer.

    Requests refused before a model was known (bad JSON, unknown model) go to
    :attr:`unrouted`. Time to first token is taken from streamed requests only and
    end-to-end latency from requests that reached an engine or the cache, as in
    ``/metrics``; a request fails when its outcome is ``error`` (client disconnects do not).
    """

    __slots__ = ("_size", "models", "unrouted")

    def __init__(self, models: Iterable[str], *, size: int = RING_SIZE, created: float | None = None) -> None:
        created = time.monotonic() if created is None else created
        self._size = size
        self.models: dict[str | None, RecentWindow] = {
            name: RecentWindow(size, created=created) for name in models
        }
        self.unrouted = RecentWindow(size, created=created)
        self.models[None] = self.unrouted

    def observe(self, record: RequestRecord) -> None:
        """The ``request_finished`` observer: one tuple per request."""
        first = record.first_token
        if first is None:
            ttft = e2e = None
        else:
            e2e = record.finished - record.arrival
            ttft = first - record.arrival if record.stream else None
        window = self.models.get(record.pool)
        if window is None:  # a pool the gateway did not have at start (none today)
            window = self.models[record.pool] = RecentWindow(self._size, created=self.unrouted.created)
        window.ring.append((record.finished, record.outcome is _ERROR, ttft, e2e))

    def summary(self, model: str | None, now: float, window_s: float = WINDOW_S) -> dict[str, Any] | None:
        window = self.models.get(model)
        return window.summary(now, window_s) if window is not None else None


def _loop_now() -> float:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


def status_json(
    ready: bool,
    body: dict[str, Any],
    window: StatusWindow | None,
    *,
    auth: bool,
    now: float | None = None,
) -> dict[str, Any]:
    """``/status.json``: readiness (``ready`` and its ``body``) with the version, the
    window and refresh period, a ``recent`` object per model from ``window`` and
    ``unrouted`` (requests refused before a model was known); ``auth`` tells the page
    whether to ask for a key. ``now`` is on the event-loop clock (the clock of
    :class:`~shuniu.core.types.RequestRecord`'s times), by default the running loop's."""
    if now is None:
        now = _loop_now()
    for name, model in body["models"].items():
        model["recent"] = window.summary(name, now) if window is not None else None
    return {
        "ready": ready,
        **body,
        "version": __version__,
        "time": time.time(),
        "window_s": WINDOW_S,
        "refresh_s": REFRESH_S,
        "auth": auth,
        "unrouted": window.unrouted.summary(now) if window is not None else None,
    }
