"""Counting with the engine's own tokenizer, through its ``/tokenize`` endpoint.

``tokenizer: engine`` asks one of the model's healthy endpoints to count each prompt
(:meth:`shuniu.core.contracts.Backend.count_tokens`: vLLM's and SGLang's ``/tokenize``,
TGI's ``/tokenize`` and ``/chat_tokenize``). The engine applies its own chat template, so
the count is exactly its ``prompt_tokens``, at the price of one round trip per distinct
prompt: counts are cached by a digest of what the engine tokenizes (:data:`CACHE_SIZE`
prompts, least recently used first out), so a prompt seen before costs nothing. An engine
that does not answer within :data:`TIMEOUT_S` leaves the estimate in place.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from shuniu.core.types import InferenceRequest

__all__ = ["CACHE_SIZE", "TIMEOUT_S", "EngineCounter", "prompt_digest"]

log = logging.getLogger("shuniu.tokenization")

CACHE_SIZE = 4096
"""Distinct prompts whose counts are kept."""
TIMEOUT_S = 2.0
"""Longest wait for an engine's count before the request goes on with the estimate."""

_encode = msgspec.json.Encoder().encode


def prompt_digest(req: InferenceRequest) -> bytes:
    """A digest of everything an engine's count of ``req`` depends on."""
    h = hashlib.blake2b(req.api.encode(), digest_size=16)
    if req.api == "chat":
        body = req.body
        h.update(
            _encode(
                [
                    body.get("messages"),
                    body.get("tools"),
                    body.get("add_generation_prompt", True),
                    body.get("chat_template_kwargs"),
                ]
            )
        )
    else:
        h.update(req.prompt.encode("utf-8", "surrogatepass"))
    return h.digest()


class EngineCounter:
    """Counts prompts with a healthy endpoint's ``count_tokens``, cached."""

    __slots__ = ("_cache", "_endpoints", "_next", "calls", "fallbacks", "name")

    def __init__(self, endpoints: Callable[[], Iterable[Any]]) -> None:
        """``endpoints`` returns the pool's endpoints now (each with ``backend``,
        ``healthy``, ``ejected`` and ``draining``)."""
        self._endpoints = endpoints
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._next = 0
        self.name = "engine"
        self.calls = 0
        """Counts asked of an engine (cache misses)."""
        self.fallbacks = 0
        """Requests that kept the estimate: no endpoint could count, or it failed."""

    def _backend(self) -> Any | None:
        ready = [
            e.backend
            for e in self._endpoints()
            if e.healthy and not e.ejected and not e.draining and getattr(e.backend, "tokenizes", False)
        ]
        if not ready:
            return None
        self._next += 1
        return ready[self._next % len(ready)]

    async def count(self, req: InferenceRequest) -> int | None:
        key = prompt_digest(req)
        cache = self._cache
        n = cache.get(key)
        if n is not None:
            cache.move_to_end(key)
            return n
        backend = self._backend()
        if backend is None:
            self.fallbacks += 1
            return None
        self.calls += 1
        try:
            async with asyncio.timeout(TIMEOUT_S):
                n = await backend.count_tokens(req)
        except TimeoutError:
            n = None
            log.debug("tokenize: %s did not answer within %.1f s", getattr(backend, "name", "?"), TIMEOUT_S)
        except Exception as exc:  # an engine error must not fail the request
            n = None
            log.debug("tokenize: %s failed: %s", getattr(backend, "name", "?"), exc)
        if n is None:
            self.fallbacks += 1
            return None
        cache[key] = n
        if len(cache) > CACHE_SIZE:
            cache.popitem(last=False)
        return n

    def close(self) -> None:
        self._cache.clear()
