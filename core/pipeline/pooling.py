"""Pooling requests (embeddings, rerank, score) from admission to the JSON answer.

A request with more inputs than the model's ``pooling.split_inputs`` is split
(:func:`shuniu.core.api.pooling.split`): every part is admitted on its own (the scheduler's
slot, the balancer's pick, retries on other endpoints), so a long list runs on several
replicas at once, and the answers are put back together in the client's order. The first
part to fail ends the request with its error and cancels the others. The answer is one JSON
body, written by the route's wire format; it is stored in the response cache (pooling
answers are deterministic, so every one is cacheable) and its prompt tokens are what rate
limits settle.
"""

from __future__ import annotations

import asyncio
from typing import Any

from shuniu.core.api.pooling import merge, split
from shuniu.core.api.wire import wire_of
from shuniu.core.errors import GatewayError
from shuniu.core.http.asgi import Send, send_error, send_json
from shuniu.core.pipeline.attempts import Attempts, Opened
from shuniu.core.pipeline.recording import Progress
from shuniu.core.pipeline.response_cache import Filler
from shuniu.core.pools.pool import Pool
from shuniu.core.types import Embeddings, InferenceRequest, Outcome, Scores

__all__ = ["send_pooled"]


async def send_pooled(
    attempts: Attempts,
    req: InferenceRequest,
    pool: Pool,
    send: Send,
    loop: asyncio.AbstractEventLoop,
    progress: Progress,
    extra: list[tuple[bytes, bytes]],
    filler: Filler | None,
) -> None:
    """Answer a pooling request: its parts on the pool's endpoints, then one JSON body."""
    parts = split(req, pool.split_inputs)
    result: Embeddings | Scores | GatewayError
    if len(parts) == 1:
        result = await _part(attempts, req, pool, loop, progress)
    else:
        result = await _parts(attempts, parts, pool, loop, progress)
    if isinstance(result, GatewayError):
        progress.fail(result)
        await send_error(send, result, req.id, extra, wire_of(req).error)
        return
    progress.first_token = loop.time()
    progress.prompt_tokens = result.prompt_tokens
    body = wire_of(req).completion(req, result)
    if filler is not None:
        filler.pooled(body, result.prompt_tokens)
    await send_json(send, 200, body, req.id, raw_headers=extra, own=True)


async def _part(
    attempts: Attempts, req: InferenceRequest, pool: Pool, loop: asyncio.AbstractEventLoop, progress: Progress
) -> Embeddings | Scores | GatewayError:
    """One engine call's answer (with its retries), or the error that ended it."""
    opened = await attempts.run(req, pool, loop, progress)
    if not isinstance(opened, Opened):
        return opened
    attempts.attempt_over(opened.ticket, Outcome.OK, progress)
    opened.resilience.succeeded(opened.endpoint, loop.time())
    result = opened.first
    assert isinstance(result, Embeddings | Scores)
    job = req.pooling
    assert job is not None
    count = len(result.vectors) if isinstance(result, Embeddings) else len(result.scores)
    if count != job.size:
        return GatewayError(
            502,
            f"The engine endpoint {opened.endpoint.name} answered {count} results for {job.size} inputs.",
            type="server_error",
            code="upstream_error",
        )
    return result


async def _parts(
    attempts: Attempts,
    parts: list[InferenceRequest],
    pool: Pool,
    loop: asyncio.AbstractEventLoop,
    progress: Progress,
) -> Embeddings | Scores | GatewayError:
    """Every part at once, each with its own progress (retries are counted per part); the
    first error cancels the rest."""
    trace = progress.trace
    progresses = [Progress(pool.name, trace) for _ in parts]
    tasks = [
        loop.create_task(_raising(attempts, part, pool, loop, p))
        for part, p in zip(parts, progresses, strict=True)
    ]
    try:
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    firsts = [p for p in progresses if p.endpoint is not None]
    if firsts:
        progress.endpoint = firsts[0].endpoint
        admitted = [p.admitted for p in firsts if p.admitted is not None]
        progress.admitted = min(admitted) if admitted else None
    progress.attempts = sum(p.attempts for p in progresses)
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if isinstance(exc, GatewayError):
                return exc
            raise exc  # type: ignore[misc]  # a bug, not an engine's answer
    return merge([task.result() for task in tasks])


async def _raising(
    attempts: Attempts, req: InferenceRequest, pool: Pool, loop: asyncio.AbstractEventLoop, progress: Progress
) -> Any:
    result = await _part(attempts, req, pool, loop, progress)
    if isinstance(result, GatewayError):
        raise result
    return result
