"""The exact-match response cache: which requests may be answered from it, their keys, what
is stored, single-flight filling, and replay (as JSON or as SSE).

**What is cacheable.** Only answers that are deterministic by configuration: the request
sets ``temperature: 0`` or a ``seed``, or its tier opts in (``tiers.<t>.cache``); ``n`` must
be 1. Embeddings, rerank and score answers always are (stored as their JSON body). A client
can skip the lookup with ``Cache-Control: no-cache`` (the fresh answer is still stored) or
skip the cache entirely with ``no-store``.

**The key** is a SHA-256 over: the tenant (so one tenant can never read, or probe for,
another's answers), the model's own name (aliases share entries), the endpoint versions the
request may run on (an upgrade never serves the old version's answers), the API, the value
of the knowledge-base version header, and the whole request body in canonical form (sorted
keys) minus ``stream``, ``stream_options`` and ``model`` — so every message, the system
prompt, every sampling parameter and every tool definition are part of it.

**Single-flight.** Concurrent misses of one key in one process wait for the first one's
answer (a future per key). Across processes a shared store hands out a fill lock: the
gateway holding it asks the engine, the others poll the store until the answer appears or
the lock goes away (the filler failed), and then ask the engine themselves.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any, Protocol

import msgspec

from shuniu.core.api.wire import wire_of
from shuniu.core.config import CacheConfig
from shuniu.core.types import Chunk, Completion, InferenceRequest, Usage

__all__ = ["CacheStore", "CachedAnswer", "Filler", "ResponseCache"]

_encode = msgspec.json.Encoder(order="sorted").encode
_VOLATILE = frozenset({"stream", "stream_options", "model"})
_CACHE_CONTROL = b"cache-control"
_POLL_START_S = 0.01
_POLL_MAX_S = 0.2


class CacheStore(Protocol):
    """Where cached answers live. Built once per gateway (``cache.store`` and
    ``cache.options``). Values are opaque bytes. Methods must not raise for an unreachable
    backing service: a failed ``get`` is a miss, a failed ``put`` is dropped."""

    async def get(self, key: str) -> bytes | None:
        """The value stored under ``key``, or ``None``."""
        ...

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        """Store ``value`` under ``key`` for ``ttl_s`` seconds."""
        ...

    async def lock(self, key: str, ttl_s: float) -> bool:
        """Try to become the one process filling ``key``: ``True`` when this caller holds
        the fill lock now (it expires after ``ttl_s``), ``False`` when another holds it.
        A store that is not shared between processes always returns ``True``."""
        ...

    async def unlock(self, key: str) -> None:
        """Give up the fill lock of ``key`` (after storing the answer, or on failure)."""
        ...

    async def close(self) -> None: ...


class CachedAnswer(msgspec.Struct, array_like=True):
    """A stored answer, enough to replay it as JSON or as a stream."""

    api: str
    pieces: list[str]
    """The text as the engine streamed it (one piece for a non-streamed answer)."""
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    extra: dict[str, Any] | None = None
    """Other message fields of a non-streamed answer (``tool_calls``)."""
    created: float = 0.0
    cached_tokens: int | None = None
    """The engine's prefix-cache tokens of the original answer, replayed as they were (last:
    entries written before the field decode without it)."""


_decode_answer = msgspec.msgpack.Decoder(CachedAnswer).decode
_encode_answer = msgspec.msgpack.Encoder().encode


class Filler:
    """Collects the answer of a request that fills a cache entry."""

    __slots__ = ("extra", "finish_reason", "ok", "pieces", "usage")

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.extra: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.ok = True
        """False once something uncacheable went by (a streamed tool-call delta)."""

    def chunk(self, chunk: Chunk) -> None:
        if chunk.extra:
            self.ok = False
        if chunk.text:
            self.pieces.append(chunk.text)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage

    def pooled(self, body: bytes, prompt_tokens: int) -> None:
        """A pooling answer: its whole JSON body is what is stored and replayed."""
        self.pieces = [body.decode()]
        self.usage = Usage(prompt_tokens, 0, prompt_tokens)

    def completion(self, result: Completion) -> None:
        self.pieces = [result.text]
        self.extra = result.extra
        self.finish_reason = result.finish_reason
        self.usage = result.usage


class ResponseCache:
    """The cache as the request path uses it."""

    def __init__(self, config: CacheConfig, store: CacheStore) -> None:
        self.config = config
        self.store = store
        self.ttl_s = config.ttl_s
        self._kb_header = config.kb_version_header.encode()
        self._inflight: dict[str, asyncio.Future[bytes | None]] = {}
        self.hits = 0
        self.misses = 0
        self.coalesced = 0
        """Misses answered by another request's fill (in this process or another)."""

    # -- deciding -------------------------------------------------------------------------

    @staticmethod
    def cacheable(req: InferenceRequest, tier_opts_in: bool) -> bool:
        if req.pooling is not None:
            return True  # vectors and scores are the same for the same input
        body = req.body
        n = body.get("n")
        if n is not None and n != 1:
            return False
        if tier_opts_in:
            return True
        return body.get("temperature") == 0 or req.seed is not None

    @staticmethod
    def control(req: InferenceRequest) -> str:
        """``""``, ``"no-cache"`` (skip the lookup) or ``"no-store"`` (skip the cache)."""
        value = req.header(_CACHE_CONTROL)
        if value is None:
            return ""
        text = value.decode("latin-1").lower()
        if "no-store" in text:
            return "no-store"
        if "no-cache" in text:
            return "no-cache"
        return ""

    def key(self, req: InferenceRequest, root: str, versions: str) -> str:
        body = {k: v for k, v in req.body.items() if k not in _VOLATILE}
        kb = req.header(self._kb_header)
        material = _encode(
            [
                req.principal.tenant,
                root,
                versions,
                req.api,
                kb.decode("latin-1") if kb is not None else None,
                body,
            ]
        )
        return hashlib.sha256(material).hexdigest()

    # -- looking up and filling -----------------------------------------------------------

    async def lookup(self, key: str) -> tuple[CachedAnswer | None, bool]:
        """``(answer, False)`` on a hit; ``(None, True)`` when the caller must fill the entry
        (and later call :meth:`fill` or :meth:`abandon`); ``(None, False)`` when it should
        just ask the engine without filling (another request's fill failed)."""
        value = await self.store.get(key)
        if value is not None:
            answer = _decode(value)
            if answer is not None:
                self.hits += 1
                return answer, False
        waiting = self._inflight.get(key)
        if waiting is not None:
            value = await asyncio.shield(waiting)
            answer = _decode(value) if value is not None else None
            if answer is not None:
                self.coalesced += 1
                return answer, False
            self.misses += 1
            return None, False
        future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            answer = await self._take_lock(key)
        except BaseException:
            self._release(key, None)
            raise
        if answer is not None:
            self.coalesced += 1
            self._release(key, _encode_answer(answer))
            return answer, False
        self.misses += 1
        return None, True

    async def _take_lock(self, key: str) -> CachedAnswer | None:
        """Hold the shared fill lock (→ ``None``), or return the answer another process
        stored while this one waited for it."""
        delay = _POLL_START_S
        deadline = time.monotonic() + self.config.lock_ttl_s
        waited = False
        while not await self.store.lock(key, self.config.lock_ttl_s):
            waited = True
            await asyncio.sleep(delay)
            value = await self.store.get(key)
            if value is not None and (answer := _decode(value)) is not None:
                return answer
            if time.monotonic() > deadline:
                return None  # the filler is stuck: ask the engine without the lock
            delay = min(delay * 2, _POLL_MAX_S)
        if waited:
            # The lock came free: the filler may have stored its answer and unlocked between
            # this process's last look and its lock, so look once more before filling again.
            value = await self.store.get(key)
            if value is not None and (answer := _decode(value)) is not None:
                await self.store.unlock(key)
                return answer
        return None

    async def fill(self, key: str, req: InferenceRequest, filler: Filler) -> None:
        """Store a successful answer and wake the requests waiting for it."""
        value: bytes | None = None
        usage = filler.usage
        if filler.ok and usage is not None:
            answer = CachedAnswer(
                req.api,
                filler.pieces,
                filler.finish_reason,
                usage.prompt_tokens,
                usage.completion_tokens,
                filler.extra,
                time.time(),
                usage.cached_tokens,
            )
            value = _encode_answer(answer)
            if len(value) > self.config.max_entry_bytes:
                value = None
        try:
            if value is not None:
                await self.store.put(key, value, self.ttl_s)
            await self.store.unlock(key)
        finally:
            self._release(key, value)

    async def abandon(self, key: str) -> None:
        """The filling request failed: let the waiters ask the engine themselves."""
        try:
            await self.store.unlock(key)
        finally:
            self._release(key, None)

    def _release(self, key: str, value: bytes | None) -> None:
        future = self._inflight.pop(key, None)
        if future is not None and not future.done():
            future.set_result(value)

    # -- replaying ------------------------------------------------------------------------

    @staticmethod
    def usage(answer: CachedAnswer) -> Usage:
        p, c = answer.prompt_tokens, answer.completion_tokens
        return Usage(p, c, p + c, answer.cached_tokens)

    @staticmethod
    def as_json(req: InferenceRequest, answer: CachedAnswer) -> bytes:
        if req.pooling is not None:
            return answer.pieces[0].encode()
        result = Completion(
            "".join(answer.pieces), answer.finish_reason, ResponseCache.usage(answer), answer.extra
        )
        return wire_of(req).completion(req, result)

    @staticmethod
    def as_sse(req: InferenceRequest, answer: CachedAnswer) -> bytes:
        """The whole stream, framed as a live one: role, content pieces, finish, usage (when
        asked for), ``[DONE]``."""
        encoder = wire_of(req).stream(req)
        parts = [encoder.start()]
        if answer.extra:
            parts.append(encoder.chunk(Chunk(text="".join(answer.pieces), extra=answer.extra)))
        else:
            parts.extend(encoder.chunk(Chunk(text=piece, tokens=0)) for piece in answer.pieces)
        parts.append(
            encoder.chunk(Chunk(finish_reason=answer.finish_reason, usage=ResponseCache.usage(answer)))
        )
        parts.append(encoder.end())
        return b"".join(parts)


def _decode(value: bytes) -> CachedAnswer | None:
    try:
        return _decode_answer(value)
    except msgspec.DecodeError:
        return None  # a foreign or older entry: a miss, not an error
