"""The response-cache step: answer from the cache (replayed as JSON or as a stream), or
note that this request fills an entry, and after the answer was sent store it (or give the
fill up). What may be cached and how keys are made is
:mod:`shuniu.core.pipeline.response_cache`.
"""

from __future__ import annotations

import asyncio
import logging

from shuniu.core.http.asgi import LENGTH_KEY, Send, send_json
from shuniu.core.pipeline.delivery import SSE_HEADERS
from shuniu.core.pipeline.recording import Progress
from shuniu.core.pipeline.response_cache import Filler, ResponseCache
from shuniu.core.pools.pool import Pool
from shuniu.core.tenancy.tenancy import Tier
from shuniu.core.types import InferenceRequest

__all__ = ["HIT", "finish", "lookup"]

log = logging.getLogger("shuniu.gateway")

HIT = b"hit"
"""The state :func:`lookup` returns when it answered the request itself."""


async def lookup(
    cache: ResponseCache,
    req: InferenceRequest,
    pool: Pool,
    tier: Tier | None,
    extra: list[tuple[bytes, bytes]],
    send: Send,
    loop: asyncio.AbstractEventLoop,
    progress: Progress,
) -> tuple[str | None, Filler | None, bytes]:
    """Answer from the cache (state :data:`HIT`: the response was sent), or say whether
    this request fills the entry: ``(key, filler, state)`` with state ``miss``, ``bypass``
    or ``skip`` (the value of ``x-shuniu-cache``)."""
    control = cache.control(req)
    if control == "no-store" or not cache.cacheable(req, tier is not None and tier.cache):
        return None, None, b"skip" if control != "no-store" else b"bypass"
    versions = req.version or pool.versions_key
    key = cache.key(req, pool.name, versions)
    if control == "no-cache":
        return key, Filler(), b"bypass"
    answer, fills = await cache.lookup(key)
    if answer is None:
        return (key, Filler(), b"miss") if fills else (None, None, b"miss")
    progress.cached = True
    progress.endpoint = None
    progress.first_token = loop.time()
    progress.prompt_tokens = answer.prompt_tokens
    progress.completion_tokens = answer.completion_tokens
    headers = [*extra, (b"x-shuniu-cache", HIT)]
    if req.stream:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*SSE_HEADERS, (b"x-request-id", req.id.encode()), *headers],
                LENGTH_KEY: -1,  # the request path's own headers (see send_json's ``own``)
            }
        )
        await send({"type": "http.response.body", "body": cache.as_sse(req, answer), "more_body": False})
    else:
        await send_json(send, 200, cache.as_json(req, answer), req.id, raw_headers=headers, own=True)
    return None, None, HIT


async def finish(
    cache: ResponseCache, key: str, req: InferenceRequest, progress: Progress, filler: Filler
) -> None:
    """Store the answer a filling request got (a whole, successful one), or give up the fill."""
    try:
        if progress.outcome is None and progress.status == 200:
            await cache.fill(key, req, filler)
        else:
            await cache.abandon(key)
    except Exception:
        log.exception("storing an answer in the cache failed")
