"""Probing an engine over HTTP: liveness, what it says about itself, its metrics page.

One :class:`Prober` per endpoint holds the probe headers and time limit; every HTTP backend
asks it instead of writing its own GET, status check and error detail.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import msgspec

from shuniu.backends.http.errors import PROBE_ERRORS, ProbeError, describe_error
from shuniu.core.types import Health

__all__ = ["Prober", "short_body"]


def short_body(body: bytes) -> str:
    """The start of a body, for a health detail."""
    return body[:200].decode("utf-8", "replace").strip()


class Prober:
    """GETs against one engine with the probe headers and time limit."""

    __slots__ = ("_session", "headers", "timeout")

    def __init__(
        self,
        session: Callable[[], aiohttp.ClientSession | None],
        headers: dict[str, str],
        timeout_s: float,
    ) -> None:
        """``session`` returns the backend's current session (``None`` when stopped)."""
        self._session = session
        self.headers = headers
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def get(self, url: str, limit: aiohttp.ClientTimeout | None = None) -> tuple[int, bytes]:
        """GET ``url``: its status and body, within ``limit`` (default: the probe time
        limit; a long read such as TensorRT-LLM's statistics passes its own). Raises
        :class:`ProbeError` when the backend is not started, and the transport's own errors
        (:data:`~.errors.PROBE_ERRORS`)."""
        session = self._session()
        if session is None:
            raise ProbeError("not started")
        async with session.get(url, headers=self.headers, timeout=limit or self.timeout) as resp:
            return resp.status, await resp.read()

    async def fetch(self, url: str, what: str) -> bytes:
        """The body of ``url`` (a metrics page), or :class:`ProbeError` naming ``what``
        (e.g. ``GET /metrics``) when the answer is not a 200."""
        status, body = await self.get(url)
        if status != 200:
            raise ProbeError(f"{what}: HTTP {status}")
        return body

    async def fetch_json(self, url: str, what: str) -> Any:
        """:meth:`fetch`, decoded as JSON."""
        return msgspec.json.decode(await self.fetch(url, what))

    async def alive(self, url: str) -> str | None:
        """``None`` when ``url`` answers 200, else why not (``HTTP 503: <body>``). Raises
        the transport's errors."""
        status, body = await self.get(url)
        if status == 200:
            return None
        text = short_body(body)
        return f"HTTP {status}: {text}" if text else f"HTTP {status}"

    async def health(
        self, url: str, *, started: bool, pending: Callable[[], Awaitable[str | None]] | None = None
    ) -> Health:
        """An HTTP backend's health: not started; ``url`` not answering 200; or, while what
        the backend reads at start-up is still missing, ``pending()`` (which reads it and
        returns why it is still unusable, or ``None``); else healthy (``HTTP 200``)."""
        if not started:
            return Health(False, "not started")
        try:
            down = await self.alive(url)
            if down is not None:
                return Health(False, down)
            if pending is not None:
                problem = await pending()
                if problem is not None:
                    return Health(False, problem)
        except ProbeError as exc:
            return Health(False, str(exc))
        except PROBE_ERRORS as exc:
            return Health(False, describe_error(exc))
        return Health(True, "HTTP 200")
