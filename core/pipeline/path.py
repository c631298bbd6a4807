"""The request path: one inference request from raw ASGI to the last byte, stage by stage.

:meth:`RequestPath.handle` reads top to bottom as the request meets the stages:

1. **intake** (:mod:`.intake`): method, header size; the credential first
   (**identity**, :mod:`.identity`), then the body, parsed and size-checked;
2. **routing** (:mod:`.routing`): the model, its prompt counted in the model's own tokens
   when it has ``tokenizer:`` (:mod:`shuniu.core.tokenization`), the size limits, the
   shuniu headers, the tier's rules, degradation, routing rules, the version split, the
   context window;
3. **rate limits** (:mod:`.identity`), taken for the whole request, then the **budgets**
   (:mod:`.budget_step`);
4. **the response cache** (:mod:`.cache_step`): answered here, or noted to fill;
5. **admission and attempts** (:mod:`.attempts`): the scheduler's slot and the engine's
   first output, retried elsewhere before it;
6. **delivery** (:mod:`.delivery`): JSON, or the stream to ``[DONE]``;
7. **recording** (:mod:`.recording`): rate limits settled, cache filled, observers told.

A client error anywhere before delivery is an OpenAI-style JSON error; a client that
leaves cancels the engine call (:mod:`.disconnect`). No plugin hook is called through
pluggy here and nothing is logged at INFO.
"""

from __future__ import annotations

import asyncio
import time

from shuniu.core.api.openai import UNCOUNTED, estimate_prompt
from shuniu.core.api.wire import Wire, wire_of
from shuniu.core.errors import GatewayError, method_not_allowed
from shuniu.core.governance import BudgetHold
from shuniu.core.http.asgi import (
    Receive,
    Scope,
    Send,
    header_map,
    new_request_id,
    request_id_from,
    send_error,
    send_json,
)
from shuniu.core.observability.tracing import Tracing, traced
from shuniu.core.pipeline import budget_step, cache_step, identity, routing
from shuniu.core.pipeline.attempts import Attempts
from shuniu.core.pipeline.delivery import raw_events_allowed, send_completion, send_stream
from shuniu.core.pipeline.disconnect import Disconnect
from shuniu.core.pipeline.intake import Intake
from shuniu.core.pipeline.pooling import send_pooled
from shuniu.core.pipeline.recording import Progress, Recorder
from shuniu.core.pipeline.response_cache import Filler
from shuniu.core.pools.pool import Pool
from shuniu.core.running_loop import running_loop
from shuniu.core.state import GatewayState
from shuniu.core.tenancy.tenancy import Admission, Tier
from shuniu.core.tokenization.counter import recount
from shuniu.core.types import Api, InferenceRequest, Outcome

__all__ = ["RequestPath"]


class RequestPath:
    """The stages of one gateway, run in order for each inference request."""

    __slots__ = ("attempts", "intake", "recorder", "state", "tracing")

    def __init__(
        self, state: GatewayState, intake: Intake, recorder: Recorder, tracing: Tracing | None
    ) -> None:
        self.state = state
        self.intake = intake
        self.recorder = recorder
        self.tracing = tracing
        self.attempts = Attempts(state)

    async def handle(self, api: Api, wire: Wire, scope: Scope, receive: Receive, send: Send) -> None:
        """One inference request, from raw ASGI to the last byte, read and answered in
        ``wire``'s format."""
        headers = scope["headers"]
        # Every header look-up below is one dict access (a walk over the pairs each time
        # cost more than the map once, with a client's dozen headers or with three).
        by_name = header_map(headers)
        request_id = request_id_from(by_name.get(b"x-request-id"))
        loop = running_loop()
        if scope["method"] != "POST":
            err = method_not_allowed(scope["method"], scope["path"])
            await send_error(send, err, request_id, render=wire.error)
            return
        arrival = loop.time()
        state = self.state
        tenancy = state.tenancy
        trace = self.tracing.start(api, headers, time.time_ns()) if self.tracing is not None else None
        req: InferenceRequest | None = None
        tier: Tier | None = None
        degraded: bytes | None = None
        try:
            # Intake, with the credential first: an unauthenticated client's body is never read.
            if headers:
                self.intake.check_headers(headers)
            # A batch request carries its owner's principal (the runner's scope; never a
            # client's, which the server builds), else the credential decides.
            principal = scope.get("shuniu.principal")
            if principal is None:
                principal = identity.authenticate(tenancy, headers, trace, by_name)
            # Counted below, once the model (and whether it has a tokenizer) is known.
            req = await self.intake.read(api, wire, scope, receive, request_id, arrival, False, by_name)
            if principal is not None:
                req.principal = principal
            if trace is not None:
                trace.request(req)
            # Routing: the model, counted in its own tokens when it has a tokenizer, then the
            # size limits, the shuniu headers, the tier's rules, degradation, rules.
            pool = routing.lookup(state.routes, req)
            if req.api not in pool.serves:
                routing.check_served(req, pool, state.pools)
            counter = pool.counter
            if counter is not None and req.pooling is None:
                await recount(req, counter)
            if req.prompt_tokens == UNCOUNTED:  # no tokenizer, or it could not count this one
                req.prompt_tokens = estimate_prompt(req)
            self.intake.check_size(req)
            if headers:
                self.intake.apply_headers(req, headers, arrival, tenancy.identity_headers, by_name)
            tier = identity.check_tier(tenancy, req, pool)
            if pool.classifier is not None:
                await routing.classify(req, pool.classifier)
            pool, degraded = routing.route(req, tier, pool, state.pools, state.router, state.overload)
            if pool.counter is not counter and pool.counter is not None and req.pooling is None:
                # A rule or degradation chose a model with another tokenizer: its count decides
                # whether the prompt fits there.
                await recount(req, pool.counter)
                routing.check_context(req, pool)
            if pool.demand is not None:
                pool.demand.arrived(arrival, req.prompt_tokens)
        except GatewayError as err:
            await send_error(send, err, request_id, render=wire.error)
            if req is not None and req.prompt_tokens == UNCOUNTED:  # refused before it was counted
                req.prompt_tokens = estimate_prompt(req)
            self.recorder.refused(request_id, api, req, err, arrival, loop.time(), trace)
            return
        await self._serve(req, pool, tier, degraded, scope, receive, send, loop, Progress(pool.name, trace))

    async def count(self, wire: Wire, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/messages/count_tokens``: the prompt's length as its model counts it (its
        tokenizer, else the estimate), after the credential, body and model-access checks of
        an inference request; nothing reaches an engine and no rate limit is taken."""
        request_id = new_request_id(scope)
        if scope["method"] != "POST":
            err = method_not_allowed(scope["method"], scope["path"])
            await send_error(send, err, request_id, render=wire.error)
            return
        state = self.state
        headers = scope["headers"]
        try:
            if headers:
                self.intake.check_headers(headers)
            principal = identity.authenticate(state.tenancy, headers, None)
            now = running_loop().time()
            req = await self.intake.read("chat", wire, scope, receive, request_id, now)
            if principal is not None:
                req.principal = principal
            pool = routing.lookup(state.routes, req)
            identity.check_model_access(state.tenancy, req, pool)
            if pool.counter is not None:
                await recount(req, pool.counter)
        except GatewayError as err:
            await send_error(send, err, request_id, render=wire.error)
            return
        await send_json(send, 200, b'{"input_tokens":%d}' % req.prompt_tokens, request_id, own=True)

    async def _serve(
        self,
        req: InferenceRequest,
        pool: Pool,
        tier: Tier | None,
        degraded: bytes | None,
        scope: Scope,
        receive: Receive,
        send: Send,
        loop: asyncio.AbstractEventLoop,
        progress: Progress,
    ) -> None:
        """A routed request: rate limits, the cache, the engine, and the record at the end."""
        watch = Disconnect()
        watch.start(scope, receive, loop)
        held = _Held()
        raised: BaseException | None = None
        # No ``finally:`` that awaits (here or in delivery.send_stream): compiled by mypyc
        # (2.4.1), such a finally raises again an exception that a handler below had
        # handled, when it reached this coroutine through another compiled one's await (a
        # client that left became a CancelledError in the server's log). The ends below do
        # what the finally did, on every way out.
        try:
            await self._respond(req, pool, tier, degraded, send, loop, progress, held)
        except asyncio.CancelledError as exc:
            if watch.disconnected:
                progress.outcome = Outcome.CANCELLED
                progress.status = 499
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
            else:
                raised = exc
        except BaseException as exc:
            raised = exc
        watch.stop()
        cache = self.state.cache
        if held.cache_key is not None and held.filler is not None and cache is not None:
            await cache_step.finish(cache, held.cache_key, req, progress, held.filler)
        admission = held.admission
        if admission is not None:
            tenancy = self.state.tenancy
            if tenancy.sync:
                identity.settle_now(tenancy, admission, progress)
            else:
                await identity.settle(tenancy, admission, progress)
        governance = self.state.governance
        if held.hold is not None and governance is not None and governance.budgets is not None:
            budget_step.settle(governance.budgets, held.hold, progress)
        now = loop.time()
        if pool.demand is not None and progress.status < 400:
            pool.demand.finished(now, progress.completion_tokens)
        self.recorder.finished(req, progress, now)
        if raised is not None:
            try:
                raise raised
            finally:
                raised = None  # no cycle: exception -> traceback -> this frame -> exception

    async def _respond(
        self,
        req: InferenceRequest,
        pool: Pool,
        tier: Tier | None,
        degraded: bytes | None,
        send: Send,
        loop: asyncio.AbstractEventLoop,
        progress: Progress,
        held: _Held,
    ) -> None:
        """Rate limits, budget, the cache and the engine, for :meth:`_serve`; what must be
        given back at the end is left in ``held``."""
        tenancy = self.state.tenancy
        trace = progress.trace
        governance = self.state.governance
        budgets = governance.budgets if governance is not None else None
        cache = self.state.cache
        extra: list[tuple[bytes, bytes]] = [] if degraded is None else [(b"x-shuniu-degraded", degraded)]
        if tenancy.store is not None:
            try:
                if tenancy.sync and trace is None:  # no coroutine for an in-process store
                    admission = tenancy.acquire_now(req, tier or tenancy.tiers["default"])
                else:
                    admission = await identity.acquire(tenancy, req, tier, trace)
            except GatewayError as err:
                progress.fail(err)
                await send_error(send, err, req.id, render=wire_of(req).error)
                return
            if admission is not None:
                held.admission = admission
                extra = [*extra, *admission.headers] if extra else admission.headers
        if budgets is not None:
            try:
                hold = await budget_step.reserve(budgets, req, pool.name)
            except GatewayError as err:
                progress.fail(err)
                await send_error(send, err, req.id, render=wire_of(req).error)
                return
            if hold is not None:
                held.hold = hold
                if hold.headers:
                    extra = [*extra, *hold.headers]
        filler: Filler | None = None
        if cache is not None:
            lookup = cache_step.lookup(cache, req, pool, tier, extra, send, loop, progress)
            cache_key, filler, cache_state = await (
                lookup if trace is None else traced(trace, "shuniu.cache", lookup)
            )
            held.cache_key, held.filler = cache_key, filler
            if cache_state is cache_step.HIT:
                return
            extra = [*extra, (b"x-shuniu-cache", cache_state)]
        if req.pooling is not None:
            await send_pooled(self.attempts, req, pool, send, loop, progress, extra, filler)
            return
        req.raw_events = raw_events_allowed(req, filler)
        opened = await self.attempts.open(req, pool, send, loop, progress, extra)
        if opened is None:
            return
        if req.stream:
            await send_stream(self.attempts, opened, req, send, loop, progress, extra, filler)
        else:
            await send_completion(self.attempts, opened, req, send, loop, progress, extra, filler)


class _Held:
    """What a request took that its end gives back (see ``RequestPath._serve``)."""

    __slots__ = ("admission", "cache_key", "filler", "hold")

    def __init__(self) -> None:
        self.admission: Admission | None = None
        self.hold: BudgetHold | None = None
        self.cache_key: str | None = None
        self.filler: Filler | None = None
