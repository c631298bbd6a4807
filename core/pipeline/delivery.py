"""Delivery: from an engine call's first output to the client's last byte.

A non-streamed answer is one JSON response. A streamed one is SSE: the head, every chunk
as it comes, and ``data: [DONE]``; an idle or total timeout (one re-armed timer per
stream) or an engine failure after the first byte ends the stream with an SSE error event
and ``[DONE]``, since the status line was already sent. Either way the slot is released and
the usage recorded once the engine call is over.
"""

from __future__ import annotations

import asyncio

from shuniu.core.api.wire import StreamWriter, wire_of
from shuniu.core.config import TimeoutsConfig
from shuniu.core.errors import PROTOCOL_ERROR, GatewayError
from shuniu.core.http.asgi import LENGTH_KEY, Send, send_json
from shuniu.core.pipeline.attempts import Attempts, Opened, backend_failure, close_stream
from shuniu.core.pipeline.recording import Progress
from shuniu.core.pipeline.response_cache import Filler
from shuniu.core.pools.resilience import Watchdog
from shuniu.core.types import Chunk, Completion, InferenceRequest, Outcome

__all__ = ["SSE_HEADERS", "raw_events_allowed", "send_completion", "send_stream"]

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def raw_events_allowed(req: InferenceRequest, filler: Filler | None) -> bool:
    """Whether ``req``'s stream may forward the engine's own events
    (:attr:`~shuniu.core.types.InferenceRequest.raw_events`): an OpenAI-wire stream (one
    choice: ``n`` > 1 is refused), unless the gateway writes running usage on every chunk
    (``continuous_usage_stats``) or a response-cache fill reads the text."""
    return req.stream and req.wire == "openai" and not req.continuous_usage and filler is None


async def send_completion(
    attempts: Attempts,
    opened: Opened,
    req: InferenceRequest,
    send: Send,
    loop: asyncio.AbstractEventLoop,
    progress: Progress,
    extra: list[tuple[bytes, bytes]],
    filler: Filler | None,
) -> None:
    """A whole answer as one JSON response (the slot is released first: the engine is done)."""
    attempts.attempt_over(opened.ticket, Outcome.OK, progress)
    opened.resilience.succeeded(opened.endpoint, loop.time())
    result = opened.first
    assert isinstance(result, Completion)
    progress.first_token = loop.time()
    progress.prompt_tokens = result.usage.prompt_tokens
    progress.completion_tokens = result.usage.completion_tokens
    progress.cached_tokens = result.usage.cached_tokens or 0
    progress.finish_reason = result.finish_reason
    if filler is not None:
        filler.completion(result)
    await send_json(send, 200, wire_of(req).completion(req, result), req.id, raw_headers=extra, own=True)


async def send_stream(
    attempts: Attempts,
    opened: Opened,
    req: InferenceRequest,
    send: Send,
    loop: asyncio.AbstractEventLoop,
    progress: Progress,
    extra: list[tuple[bytes, bytes]],
    filler: Filler | None,
) -> None:
    """The stream as SSE, from its first chunk to ``[DONE]`` (or an error event)."""
    gen = opened.stream
    assert gen is not None
    first: Chunk | None = opened.first  # type: ignore[assignment]  # a stream's first output is a chunk
    res = opened.resilience
    endpoint = opened.endpoint
    encoder = wire_of(req).stream(req)
    outcome = Outcome.ERROR
    timeouts = res.timeouts
    deadline = req.arrival + timeouts.total_s if timeouts.total_s is not None else None
    dog = Watchdog(loop, timeouts.idle_s, deadline) if timeouts.idle_s is not None or deadline else None
    held: list[bytes] = []
    """What the encoder wrote and was not sent yet."""
    raised: BaseException | None = None
    # No ``finally:`` that awaits: compiled by mypyc (2.4.1), it raises again an exception a
    # handler below had handled (see RequestPath._serve); the end runs after, on every way out.
    try:
        try:
            progress.first_token = loop.time()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [*SSE_HEADERS, (b"x-request-id", req.id.encode()), *extra],
                    LENGTH_KEY: -1,  # the request path's own headers (see send_json's ``own``)
                }
            )
            # Chunks that arrived together leave in one write: a stream that says the next chunk
            # is already here (``ready()``, optional on a backend's stream) has its bytes held
            # until it would wait for the engine, then sent at once. Nothing is ever held
            # while the engine is silent, so the first token is not delayed.
            ready = getattr(gen, "ready", None)
            held.append(encoder.start())
            if first is not None:
                held.append(encoder.chunk(first))
                if filler is not None:
                    filler.chunk(first)
                if ready is None or not ready():
                    await send({"type": "http.response.body", "body": b"".join(held), "more_body": True})
                    held.clear()
                async for chunk in gen:
                    if dog is not None:
                        dog.last = loop.time()
                    if filler is not None:
                        filler.chunk(chunk)
                    data = encoder.chunk(chunk)
                    if data:
                        held.append(data)
                    if held and (ready is None or not ready()):
                        body = held[0] if len(held) == 1 else b"".join(held)
                        await send({"type": "http.response.body", "body": body, "more_body": True})
                        held.clear()
            outcome = Outcome.OK
            if dog is not None:
                dog.stop()
            held.append(encoder.end())
            await send({"type": "http.response.body", "body": b"".join(held), "more_body": False})
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if dog is None or dog.fired is None or task is None or task.uncancel() > 0:
                outcome = Outcome.CANCELLED
                raise
            # The watchdog's cancellation, not the client's: end the stream with an error.
            err = stream_timeout(dog.fired, timeouts)
            progress.fail(err)
            progress.status = 200
            await _send_error_event(send, held, encoder, err)
            res.failed(endpoint, loop.time())
        except Exception as exc:
            if not isinstance(exc, GatewayError) or (exc.status >= 500 and exc.code != PROTOCOL_ERROR):
                # A broken stream counts against the endpoint; an unreadable event (malformed,
                # oversized) is the answer's fault and must not eject a healthy engine.
                await attempts.engine_suspect(endpoint)
                res.failed(endpoint, loop.time())
            err = exc if isinstance(exc, GatewayError) else backend_failure(endpoint, exc)
            progress.fail(err)
            progress.status = 200
            await _send_error_event(send, held, encoder, err)
        else:
            res.succeeded(endpoint, loop.time())
    except BaseException as exc:
        raised = exc
    if dog is not None:
        dog.stop()
    try:
        await close_stream(gen)
    finally:
        attempts.attempt_over(opened.ticket, outcome, progress)
        usage = encoder.final_usage()
        progress.prompt_tokens = usage.prompt_tokens
        progress.completion_tokens = usage.completion_tokens
        progress.cached_tokens = usage.cached_tokens or 0
        progress.finish_reason = encoder.finish_reason
        if filler is not None and filler.usage is None:
            filler.usage = usage
    if raised is not None:
        try:
            raise raised
        finally:
            raised = None  # no cycle: exception -> traceback -> this frame -> exception


async def _send_error_event(send: Send, held: list[bytes], encoder: StreamWriter, err: GatewayError) -> None:
    """What was held back, then the error event that ends the stream."""
    body = b"".join(held) + encoder.error(err)
    await send({"type": "http.response.body", "body": body, "more_body": False})


def stream_timeout(kind: str, timeouts: TimeoutsConfig) -> GatewayError:
    """The error event that ends a stream that went quiet (``idle``) or ran out of time."""
    if kind == "idle":
        return GatewayError(
            504,
            f"The engine sent nothing for {timeouts.idle_s:g} s; the stream was ended.",
            type="timeout_error",
            code="idle_timeout",
        )
    return GatewayError(
        504,
        f"The request did not finish within {timeouts.total_s:g} s; the stream was ended.",
        type="timeout_error",
        code="request_timeout",
    )
