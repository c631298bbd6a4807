"""Admission and attempts: the one loop that gets a request's first output from an engine,
for streamed and non-streamed requests alike.

Each attempt waits for the scheduler (a slot on an endpoint the balancer picks), starts the
engine call and waits for its first output, a first chunk or the whole completion, within
the time-to-first-token limit. An attempt that fails before that first output is still an
ordinary HTTP error, so it may be retried: on an untried endpoint of the pool while the
retry budget allows, then once on the model's fallback. A 4xx from the engine is the
request's own fault and is never retried. What happens after the first output is
:mod:`shuniu.core.pipeline.delivery`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from shuniu.core.api.wire import wire_of
from shuniu.core.contracts import Ticket
from shuniu.core.errors import PROTOCOL_ERROR, GatewayError, upstream_error
from shuniu.core.http.asgi import Send, send_error
from shuniu.core.pipeline.recording import Progress
from shuniu.core.pools.pool import EndpointState, Pool
from shuniu.core.pools.resilience import COARSE_FROM_S, DeadlineWheel, Resilience
from shuniu.core.state import GatewayState
from shuniu.core.types import Chunk, Completion, Embeddings, InferenceRequest, Outcome, Scores

__all__ = ["Attempts", "Opened", "close_stream"]

log = logging.getLogger("shuniu.gateway")


class Opened:
    """An engine call that produced its first output: the slot it holds, and that output
    (``first``: the first chunk of a stream, ``None`` for a stream that ended at once, or
    the whole completion)."""

    __slots__ = ("endpoint", "first", "resilience", "stream", "ticket")

    def __init__(
        self,
        ticket: Ticket,
        endpoint: EndpointState,
        resilience: Resilience,
        stream: AsyncIterator[Chunk] | None,
        first: Any,
    ) -> None:
        self.ticket = ticket
        self.endpoint = endpoint
        self.resilience = resilience
        self.stream = stream
        self.first: Chunk | Completion | Embeddings | Scores | None = first


class Attempts:
    """Admission, attempts, retries and fallback for one gateway."""

    __slots__ = ("_state", "_wheel")

    def __init__(self, state: GatewayState) -> None:
        self._state = state
        self._wheel: DeadlineWheel | None = None
        """The long time-to-first-output limits (one timer for all of them)."""

    async def open(
        self,
        req: InferenceRequest,
        pool: Pool,
        send: Send,
        loop: asyncio.AbstractEventLoop,
        progress: Progress,
        extra: list[tuple[bytes, bytes]],
    ) -> Opened | None:
        """Attempts until one engine call produced its first output. ``None``: every
        attempt failed (or the scheduler refused), and the error was sent."""
        opened = await self.run(req, pool, loop, progress)
        if isinstance(opened, Opened):
            return opened
        progress.fail(opened)
        await send_error(send, opened, req.id, extra, wire_of(req).error)
        return None

    async def run(
        self, req: InferenceRequest, pool: Pool, loop: asyncio.AbstractEventLoop, progress: Progress
    ) -> Opened | GatewayError:
        """Attempts until one engine call produced its first output (a stream's first chunk,
        a completion, a pooling answer), or the error that ended them."""
        streamed = req.stream
        while True:
            try:
                ticket = await self._admit(req, pool, progress)
            except GatewayError as refusal:
                return refusal
            res = self._state.resilience[pool.name]
            # The pool hands out slots on its own endpoints.
            endpoint: EndpointState = ticket.endpoint  # type: ignore[assignment]
            backend = endpoint.backend
            gen: AsyncIterator[Chunk] | None = None
            err: GatewayError | None = None
            call: Awaitable[Any]
            try:
                limit = first_token_limit(res, req, loop)
                if streamed:
                    gen = backend.stream(req)
                    call = gen.__anext__()
                elif req.pooling is None:
                    call = backend.complete(req)
                elif req.api == "embeddings":
                    call = backend.embed(req)
                else:
                    call = backend.score(req)
                if limit is None:
                    first = await call
                elif limit < COARSE_FROM_S:
                    async with asyncio.timeout(limit):
                        first = await call
                else:
                    wheel = self._wheel
                    if wheel is None or wheel.loop is not loop:
                        wheel = self._wheel = DeadlineWheel(loop)
                    deadline = wheel.arm(loop.time() + limit)
                    try:
                        first = await call
                    except asyncio.CancelledError:
                        if not wheel.expired(deadline):
                            raise
                        raise TimeoutError from None
                    finally:
                        wheel.disarm(deadline)
            except StopAsyncIteration:
                first = None
            except GatewayError as exc:
                err = exc
            except TimeoutError:
                err = timeout_error(res, req, loop)
            except asyncio.CancelledError:
                if gen is not None:
                    await close_stream(gen)
                self.attempt_over(ticket, Outcome.CANCELLED, progress)
                raise
            except Exception as exc:
                err = backend_failure(endpoint, exc)
            pool.first_output(ticket)
            if err is None:
                return Opened(ticket, endpoint, res, gen, first)
            if gen is not None:
                await close_stream(gen)
            self.attempt_over(ticket, Outcome.ERROR, progress)
            retry = await self._after_failure(req, pool, endpoint, err, progress, loop)
            if retry is None:
                return err
            pool = retry

    async def _admit(self, req: InferenceRequest, pool: Pool, progress: Progress) -> Ticket:
        trace = progress.trace
        if trace is None:
            ticket = await pool.scheduler.admit(req, pool)
        else:
            span = trace.child("shuniu.queue")
            try:
                ticket = await pool.scheduler.admit(req, pool)
            except BaseException as exc:
                trace.fail(span, exc.code if isinstance(exc, GatewayError) else type(exc).__name__)
                span.end()
                raise
            span.add_event("endpoint picked", {"shuniu.endpoint": ticket.endpoint.name})
            span.end()
            progress.upstream = trace.upstream(req, ticket.endpoint.name)
        progress.endpoint = ticket.endpoint.name
        progress.admitted = ticket.admitted
        return ticket

    def attempt_over(self, ticket: Ticket, outcome: Outcome, progress: Progress) -> None:
        """One engine attempt ended: free its slot, close its span, settle the retry count."""
        pool: Pool = ticket.pool  # type: ignore[assignment]  # tickets of this gateway's pools
        pool.scheduler.release(ticket, outcome)
        if progress.upstream is not None:
            progress.end_upstream()
        if progress.retrying:
            progress.retrying = False
            self._state.resilience[pool.name].retrying -= 1

    async def _after_failure(
        self,
        req: InferenceRequest,
        pool: Pool,
        endpoint: EndpointState,
        err: GatewayError,
        progress: Progress,
        loop: asyncio.AbstractEventLoop,
    ) -> Pool | None:
        """An attempt failed before the first output. Count it against the endpoint, and
        say which pool to try next (``None``: answer with the error)."""
        if err.status < 500 or err.code == PROTOCOL_ERROR:
            # The engine refused the request itself, or sent an answer the gateway cannot
            # read: another would do the same, and neither says the endpoint is unwell.
            return None
        await self.engine_suspect(endpoint)
        state = self._state
        res = state.resilience[pool.name]
        res.failed(endpoint, loop.time())
        tried = (req.tried or frozenset()) | {endpoint.name}
        req.tried = tried
        target: Pool | None = None
        if progress.attempts >= res.retries.max_retries:
            why = "max_retries"
        elif not res.has_alternative(tried):
            why = "no_alternative"
        elif not res.budget_allows():
            why = "budget"
        else:
            target = pool
        if target is None:
            fallback = res.retries.fallback
            if fallback is None or progress.fell_back or progress.attempts > res.retries.max_retries:
                res.gave_up[why] = res.gave_up.get(why, 0) + 1
                return None
            target = state.pools[fallback]
            if req.modalities - target.accepts or req.api not in target.serves:
                res.gave_up["fallback_cannot_serve"] = res.gave_up.get("fallback_cannot_serve", 0) + 1
                return None
            progress.fell_back = True
            req.tried = None
        progress.attempts += 1
        progress.retrying = True
        state.resilience[target.name].retrying += 1
        code = err.code or "error"
        res.retries_by_reason[code] = res.retries_by_reason.get(code, 0) + 1
        return target

    async def engine_suspect(self, endpoint: EndpointState) -> None:
        """A request to ``endpoint`` failed. If it is a launched engine whose process just
        died, take it out of balancing now, before the request's slot is released: an
        endpoint that fails at once would otherwise pull the whole queue into errors before
        the exit is reaped. Failure path only."""
        engines = self._state.engines
        if engines:
            engine = engines.get(endpoint.name)
            if engine is not None:
                await engine.confirm_exit()


async def close_stream(gen: Any) -> None:
    """Close an engine stream (cancels the engine's work if it is still running)."""
    try:
        await gen.aclose()
    except Exception:  # a stream that failed may fail again on close; the error is known
        pass


def backend_failure(endpoint: EndpointState, exc: BaseException) -> GatewayError:
    """An exception a backend should not have raised, as a 502 (and an ERROR log line: it
    is a bug in the backend or a failure it did not map)."""
    log.error("endpoint %s failed: %s: %s", endpoint.name, type(exc).__name__, exc)
    return upstream_error(f"The engine endpoint {endpoint.name} failed ({type(exc).__name__}).")


def first_token_limit(
    res: Resilience, req: InferenceRequest, loop: asyncio.AbstractEventLoop
) -> float | None:
    """Seconds this attempt may take to its first output: the TTFT limit, or what is left
    of the request's total time, whichever is shorter."""
    t = res.timeouts
    limit = t.ttft_s
    if t.total_s is not None:
        left = req.arrival + t.total_s - loop.time()
        limit = left if limit is None else min(limit, left)
    if limit is not None and limit <= 0:
        limit = 0.001
    return limit


def timeout_error(res: Resilience, req: InferenceRequest, loop: asyncio.AbstractEventLoop) -> GatewayError:
    t = res.timeouts
    if t.total_s is not None and loop.time() >= req.arrival + t.total_s - 0.001:
        return GatewayError(
            504,
            f"The request did not finish within {t.total_s:g} s.",
            type="timeout_error",
            code="request_timeout",
        )
    return GatewayError(
        504,
        f"The engine produced no token within {t.ttft_s:g} s.",
        type="timeout_error",
        code="ttft_timeout",
    )
