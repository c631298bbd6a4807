"""The virtual-time run behind ``shuniu simulate``: a deployment's own scheduler and balancer,
simulated engines.

The deployment is built exactly as ``shuniu serve`` builds it (the same :class:`Gateway`,
pools, scheduler and balancer objects); only the HTTP layer is left out and the clock is
virtual (:mod:`shuniu.plugins.tools.simulate.vclock`). Each workload request is admitted by
the pool's scheduler, placed by its balancer, and run on the chosen endpoint's simulated
engine, one event per engine iteration.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from shuniu.backends.sim import LogHistogram, Seq, SimBackend
from shuniu.core.blockhash import PrefixChain
from shuniu.core.config.loader import ResolvedDeployment
from shuniu.core.contracts import Ticket
from shuniu.core.errors import ConfigError, GatewayError, Problem
from shuniu.core.plugin_manager import PluginManager
from shuniu.core.pools.pool import Pool
from shuniu.core.types import InferenceRequest, Outcome, Principal
from shuniu.plugins.tools.simulate.results import SimulationResult
from shuniu.plugins.tools.simulate.stop import StopRule
from shuniu.plugins.tools.simulate.vclock import Stepper, run_virtual

__all__ = ["CHAINS", "LEAP_STEPS", "simulate"]

CHAINS = 4096
"""Most prompt families (conversations, system prompts) whose block hashes a run remembers."""

LEAP_STEPS = 512
"""Most decode iterations an engine runs as one event in a simulation (``SimEngine.leap_steps``)."""

_GC_YOUNG = 20_000
"""The collector's young-generation threshold while a simulation runs (the default is 700)."""


def _chain(chains: OrderedDict[str, PrefixChain], key: str) -> tuple[PrefixChain, bool]:
    """The remembered chain of prompt family ``key``, now the most recent of :data:`CHAINS`,
    and whether it is new (never seen, or forgotten)."""
    chain = chains.get(key)
    if chain is not None:
        chains.move_to_end(key)
        return chain, False
    chain = chains[key] = PrefixChain()
    if len(chains) > CHAINS:
        chains.popitem(last=False)
    return chain, True


def _check_sim_only(resolved: ResolvedDeployment) -> None:
    problems = [
        Problem(
            f"models.{name}.endpoints[{i}].kind",
            f"`shuniu simulate` runs simulated engines only; this endpoint is {ep.kind!r} "
            "(give it `kind: sim` with `hardware` and `model` profiles to plan for it)",
        )
        for name, model in resolved.deployment.models.items()
        for i, ep in enumerate(model.endpoints)
        if ep.kind != "sim"
    ]
    if problems:
        raise ConfigError(problems, resolved.source)


def _slo_of(workload: Any) -> dict[str, float] | None:
    slo = getattr(workload, "slo", None)
    if slo is None:
        return None
    data = slo.model_dump() if hasattr(slo, "model_dump") else dict(slo)
    return {k: float(v) for k, v in data.items() if v is not None}


async def _run(
    gateways: list[Any],
    requests: Iterator[Any],
    default_model: str,
    slo: Any,
    result: SimulationResult,
    progress: Callable[[float, int], None] | None,
    drain_s: float,
    split: str = "clients",
    stop_after: StopRule | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    for gw in gateways:
        await gw.start()
    gateway = gateways[0]
    itl = [  # the engines' own inter-token gaps, for the stop rule
        core.itl
        for pool in gateway.pools.values()
        for ep in pool.endpoints
        if isinstance(ep.backend, SimBackend)
        for core in ep.backend.engine.output_cores
    ]
    inflight: dict[int, _Flight] = {}
    """The requests started and not finished, by number (each takes itself out)."""
    failures: list[BaseException] = []
    """What went wrong in a request's own code (not the refusals and failures a run counts):
    the run fails with the first."""
    drained: asyncio.Future[None] | None = None
    """Set once the arrivals are over: resolved when the last request in flight ends."""
    principals: dict[tuple[str, str], Principal] = {}
    """(tenant, tier) → its principal: one object per credential, as authenticators hand
    them out (the tenancy's per-principal plan is found by it)."""
    homes: dict[str, int] = {}
    """``split="tenants"``: tenant → its gateway, in turn by first appearance."""
    block_of = {name: _block_size(pool) for name, pool in gateway.routes.items()}
    """Model → its engines' KV block size: the block a request's hash chain is made of."""
    chains: OrderedDict[str, PrefixChain] = OrderedDict()
    """``SimRequest.chain_key`` → the hashes of its shared blocks, the most recent
    :data:`CHAINS` (a live conversation forgotten is only hashed again)."""

    # A request runs on callbacks, in the steps a task running it would take, each where
    # the task's would run (the loop turn after its arrival; when the scheduler's future or
    # the engine's is done): start(flight), then dispatched(flight, ticket) once admitted,
    # then _Flight.ended once the engine is done with it. What waits in a coroutine (a
    # queued admission, an engine with injected faults) is stepped by a Stepper.

    def left(flight: _Flight) -> None:
        del inflight[flight.n]
        if not inflight and drained is not None and not drained.done():
            drained.set_result(None)

    def failed(flight: _Flight, exc: BaseException) -> None:
        failures.append(exc)
        if flight.n not in inflight:  # it went wrong after the request was done with
            return
        if flight.ticket is not None and not flight.released:
            flight.released = True
            flight.pool.scheduler.release(flight.ticket, Outcome.ERROR)
        left(flight)

    def start(flight: _Flight) -> None:
        spec, n = flight.spec, flight.n
        if split == "tenants":
            # Each tenant's connections all on one gateway (as behind a load balancer
            # that hashes on the client), the tenants dealt out in turn.
            home = homes.get(spec.tenant)
            if home is None:
                home = homes[spec.tenant] = len(homes) % len(gateways)
                result.tenant(spec.tenant).gateway = home
        else:
            home = n % len(gateways)  # clients take the gateways in turn
        gateway = gateways[home]
        pools: dict[str, Pool] = gateway.routes
        model = getattr(spec, "model", None) or default_model
        pool = pools[model]
        now = flight.now = loop.time()
        principal = principals.get((spec.tenant, spec.tier))
        if principal is None:
            principal = principals[spec.tenant, spec.tier] = Principal(tenant=spec.tenant, tier=spec.tier)
        req = flight.req = InferenceRequest(
            id=f"sim-{n}",
            api="chat" if getattr(spec, "kind", "chat") == "chat" else "completions",
            model=model,
            # The conversation id stands in for OpenAI's `user` field (session affinity keys on it).
            body={"user": spec.session} if spec.session is not None else {},
            prompt="",
            prompt_tokens=len(spec.prompt),
            max_tokens=spec.output_tokens,
            ignore_eos=True,
            arrival=now,
            priority=spec.priority,
            principal=principal,
            token_ids=spec.prompt,
        )
        key = flight.key = spec.chain_key
        if key is not None:
            # The blocks this prompt shares with its conversation's earlier turns (or its
            # system prompt) were hashed then: only the new ones are hashed now.
            block = block_of[model]
            chain, new = _chain(chains, key)
            if new and spec.prefix_group is not None and spec.prefix_tokens and key.startswith("chat:"):
                # A new conversation starts with its system prompt, hashed once for all the
                # conversations that share it (the family a non-chat request of that system
                # prompt names).
                family, _ = _chain(chains, f"system:{spec.prefix_group}")
                shared = spec.prefix_tokens
                chain.adopt(family.known(spec.prompt, block, shared), block, shared)
            req.prefix_hashes = chain.hashes(spec.prompt, block, spec.chain_tokens)
            req.prefix_block = block
            flight.chain = chain
        tier = flight.tier = result.tier(spec.tier)
        tier.arrived += 1
        try:
            pool = flight.pool = gateway.router.resolve(req, pool)
            gateway.check_context(req, pool)
            if pool.demand is not None:  # as the request path counts it, after routing
                pool.demand.arrived(now, req.prompt_tokens)
            scheduler = pool.scheduler
            if not getattr(scheduler, "steps_without_task", False):
                # Its admit needs a task (asyncio.timeout, say): one for the admission.
                flight.task = loop.create_task(admit_in_task(flight, scheduler.admit(req, pool)))
                return
            admission = scheduler.admit(req, pool)
            try:
                awaited = admission.send(None)
            except StopIteration as admitted:  # the usual: a slot at once
                ticket = admitted.value
            else:  # it waits in the queue
                flight.stepper = Stepper(admission, flight.admitted)
                flight.stepper.wait(awaited)
                return
        except GatewayError as err:
            refused(flight, err)
            return
        except BaseException as exc:
            failed(flight, exc)
            return
        try:
            dispatched(flight, ticket)
        except BaseException as exc:
            failed(flight, exc)

    async def admit_in_task(flight: _Flight, admission: Coroutine[Any, Any, Ticket]) -> None:
        try:
            ticket = await admission
        except BaseException as exc:
            flight.admitted(None, exc)
        else:
            flight.admitted(ticket, None)

    def refused(flight: _Flight, err: GatewayError) -> None:
        result.rejected += 1
        code = err.code or str(err.status)
        result.rejected_by_code[code] = result.rejected_by_code.get(code, 0) + 1
        tier = flight.tier
        tier.rejected_by_code[code] = tier.rejected_by_code.get(code, 0) + 1
        left(flight)

    def dispatched(flight: _Flight, ticket: Ticket) -> None:
        flight.ticket = ticket
        spec, req, pool = flight.spec, flight.req, flight.pool
        admitted = loop.time()
        result.queue.add(admitted - flight.now)
        backend = ticket.endpoint.backend
        assert isinstance(backend, SimBackend)
        seq = flight.seq = Seq(
            req.id,
            spec.prompt,
            spec.output_tokens,
            output_seed=spec.output_seed,
            priority=req.priority,  # as the scheduler set it (from the tier)
            arrival=admitted,
        )
        seq.on_first = functools.partial(pool.first_output, ticket)
        seq.output_ids = spec.answer  # the engine's own ids, as the workload generated them
        hashes = req.prefix_hashes
        shared = hashes is not None and req.prefix_block == backend.engine.core.config.block_size
        flight.shared = shared
        if shared:
            seq.hashes = list(hashes)  # type: ignore[arg-type]  # the balancer's chain is the engine's: hash once
        if backend.faults is not None:  # run_seq awaits what the faults inject
            flight.stepper = Stepper(backend.run_seq(seq), flight.ran)
            flight.stepper.start()
            return
        try:
            done = backend.submit_seq(seq)
        except BaseException as exc:
            flight.ended(None, exc)
            return
        done.add_done_callback(flight.ended)

    class _Flight:
        """One request of the run: what its steps hand on to each other."""

        __slots__ = (
            "chain",
            "key",
            "n",
            "now",
            "pool",
            "released",
            "req",
            "seq",
            "shared",
            "spec",
            "stepper",
            "task",
            "ticket",
            "tier",
        )

        def __init__(self, spec: Any, n: int) -> None:
            self.spec = spec
            self.n = n
            self.chain: PrefixChain | None = None
            self.ticket: Ticket | None = None
            self.seq: Seq | None = None
            self.stepper: Stepper | None = None
            self.task: asyncio.Task[None] | None = None
            self.released = False

        def admitted(self, ticket: Ticket | None, exc: BaseException | None) -> None:
            """The queued admission ended: a ticket, or what it raised."""
            self.stepper = self.task = None
            if exc is None:
                assert ticket is not None
                try:
                    dispatched(self, ticket)
                except BaseException as err:
                    failed(self, err)
            elif isinstance(exc, GatewayError):
                refused(self, exc)
            elif isinstance(exc, asyncio.CancelledError):
                left(self)  # the run's time was up while it waited
            else:
                failed(self, exc)

        def ended(self, done: asyncio.Future[None] | None, exc: BaseException | None = None) -> None:
            """The engine is done with the request: its future is ``done`` (cancelled: the
            run's time is up), or ``exc`` is what its run raised, if anything."""
            try:
                if done is not None and done.cancelled():
                    exc = asyncio.CancelledError()
                spec, seq, pool, ticket = self.spec, self.seq, self.pool, self.ticket
                assert seq is not None and ticket is not None
                if exc is None:
                    key, chain = self.key, self.chain
                    if self.shared and chain is not None and key is not None and key.startswith("chat:"):
                        # The conversation's next turn starts with this prompt and its answer, whose
                        # blocks the engine has hashed (the same chain): not hashed again then.
                        chain.adopt(seq.hashes, self.req.prefix_block, len(spec.prompt) + seq.output_count)
                self.released = True
                pool.scheduler.release(ticket, Outcome.OK if exc is None else Outcome.ERROR)
                if exc is not None:
                    if isinstance(exc, ValueError):
                        result.rejected += 1
                        result.rejected_by_code["too_long"] = result.rejected_by_code.get("too_long", 0) + 1
                    elif isinstance(exc, GatewayError):
                        result.failed += 1
                    elif not isinstance(exc, asyncio.CancelledError):  # cancelled: unfinished at the end
                        failures.append(exc)
                    left(self)
                    return
                now = self.now
                tier = self.tier
                end = loop.time()
                if pool.demand is not None:
                    pool.demand.finished(end, seq.output_count)
                first = seq.first_token_at if seq.first_token_at is not None else end
                ttft = first - now
                hists = result.endpoint_latency.get(ticket.endpoint.name)
                if hists is None:
                    hists = result.endpoint_latency[ticket.endpoint.name] = (LogHistogram(), LogHistogram())
                who = result.tenant(spec.tenant)
                window = result.window(now)  # of its arrival, for the timeline
                LogHistogram.add_each((result.ttft, hists[0], tier.ttft, who.ttft, window[0]), ttft)
                LogHistogram.add_each((result.e2e, hists[1], tier.e2e), end - now)
                result.requests_completed += 1
                tier.completed += 1
                who.completed += 1
                who.tokens += len(spec.prompt) + seq.output_count
                # A request's inter-token latency is its mean gap (time per output token).
                tpot = (end - first) / (seq.output_count - 1) if seq.output_count > 1 else None
                if tpot is not None:
                    LogHistogram.add_each((window[1], result.tpot), tpot)
                if slo is not None and slo.meets(ttft, itl=tpot, e2e=end - now):
                    result.met_slo += 1
                    tier.met_slo += 1
                left(self)
            except BaseException as err:
                failed(self, err)

        def ran(self, _: Any, exc: BaseException | None) -> None:
            """``run_seq`` (an engine with faults) returned, or raised ``exc``."""
            self.stepper = None
            self.ended(None, exc)

        def cancel(self) -> None:
            """Give up on the request (the run's time is up): as cancelling its task would."""
            if self.stepper is not None:
                self.stepper.cancel()
            elif self.task is not None:
                self.task.cancel()
            elif self.seq is not None and self.seq.done is not None:
                self.seq.done.cancel()

    sampler = loop.create_task(_sample_scaling(gateways, result)) if _scaled(gateways) else None
    arrived: asyncio.Future[int] = loop.create_future()
    """Resolved with the number of requests started once the arrivals end (or stop)."""

    def arrive(spec: Any, n: int) -> None:
        # Each arrival is a timer that starts its request and sets the next arrival's (a
        # task sleeping between arrivals would take two loop turns and a future each).
        nonlocal drain_s
        try:
            while True:
                n += 1
                flight = inflight[n] = _Flight(spec, n)
                loop.call_soon(start, flight)  # as a task's first step
                if progress is not None and n % 256 == 0:
                    progress(loop.time(), n)
                if stop_after is not None and n % 64 == 0:
                    reason = stop_after.settled(result, itl)
                    if reason is not None:
                        result.stopped_at = loop.time()
                        result.stopped_because = reason
                        drain_s = 0.0  # what is still running is left unfinished
                        break
                spec = next(requests, None)
                if spec is None:
                    break
                delay = spec.arrival - loop.time()
                if delay > 0:
                    loop.call_later(delay, arrive, spec, n)
                    return
        except BaseException as exc:  # a workload that fails to generate: the run fails with it
            arrived.set_exception(exc)
            return
        arrived.set_result(n)

    first = next(requests, None)
    if first is None:
        arrived.set_result(0)
    elif (delay := first.arrival - loop.time()) > 0:
        loop.call_later(delay, arrive, first, 0)
    else:
        arrive(first, 0)
    n = await arrived
    result.requests_arrived = n
    if inflight:
        # A hung endpoint (an injected fault) would keep its requests forever: stop waiting
        # after `drain_s` and count them as unfinished.
        drained = loop.create_future()
        done, _ = await asyncio.wait((drained,), timeout=drain_s)
        if not done:
            pending = list(inflight.values())
            for flight in pending:
                flight.cancel()
            result.unfinished = len(pending)
            if inflight:
                drained = loop.create_future()
                await drained
    if failures:
        raise failures[0]
    result.sim_time_s = loop.time()
    for pool in gateway.pools.values():
        for ep in pool.endpoints:
            failure = ep.backend.engine.failure
            if failure is not None:  # its requests hung: the figures would mean nothing
                raise RuntimeError(f"the simulated engine of {ep.name} failed: {failure!r}") from failure
    if sampler is not None:
        sampler.cancel()
    if progress is not None:
        progress(loop.time(), n)
    for pool in gateway.pools.values():
        for ep in pool.endpoints:
            engine = ep.backend.engine
            completed = generated = queries = hits = preemptions = 0
            for core in engine.output_cores:
                completed += core.completed
                generated += core.generated_tokens
                result.itl.merge(core.itl)
            for core in engine.prompt_cores:
                result.prompt_tokens += core.prompt_tokens
                queries += core.prefix_queries
                hits += core.prefix_hits
            for core in engine.cores:
                preemptions += core.preemptions
            result.generated_tokens += generated
            result.prefix_queries += queries
            result.prefix_hits += hits
            result.preemptions += preemptions
            result.per_endpoint[ep.name] = {  # the engines are shared: gateway 0's view
                "completed": completed,
                "generated_tokens": generated,
                "prefix_hit_rate": hits / queries if queries else 0.0,
                "preemptions": preemptions,
                "busy_share": engine.busy_time / result.sim_time_s if result.sim_time_s else 0.0,
            }
            served = result.endpoint_latency.get(ep.name)
            if served is not None:
                for what, hist in zip(("ttft", "e2e"), served, strict=True):
                    result.per_endpoint[ep.name][f"{what}_p50"] = hist.quantile(0.5)
                    result.per_endpoint[ep.name][f"{what}_p99"] = hist.quantile(0.99)
    for gw in gateways:
        await gw.stop()


def _block_size(pool: Pool) -> int:
    """The KV block size of a pool's simulated engines (vLLM's 16 when it has none)."""
    for ep in pool.endpoints:
        if isinstance(ep.backend, SimBackend):
            return ep.backend.engine.core.config.block_size
    return 16


def _scaled(gateways: list[Any]) -> bool:
    return any(gw.autoscalers.scalers for gw in gateways)


async def _sample_scaling(gateways: list[Any], result: SimulationResult) -> None:
    """Every window, each autoscaled pool's signals (summed over the gateways, as a fleet's
    gauges are: ``desired`` is the ceiling of the summed demand)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(result.window_s)
        now = loop.time()
        for name in gateways[0].autoscalers.scalers:
            signals = [gw.pools[name].scaling for gw in gateways if gw.pools[name].scaling is not None]
            if not signals:
                continue
            first = signals[0]
            cfg = gateways[0].autoscalers.scalers[name].config
            demands = [s.demand for s in signals if s.demand is not None]
            demand = sum(demands) if demands else None
            if demand is not None and len(demands) == len(signals):
                desired = min(cfg.max_replicas, max(cfg.min_replicas, math.ceil(demand - 1e-9)))
            else:
                desired = first.desired
            result.scaling.append(
                {
                    "t": now,
                    "model": name,
                    "state": first.state,
                    "rate": sum(s.rate for s in signals),
                    "forecast": sum(s.forecast for s in signals),
                    "replica_capacity": first.capacity,
                    "demand": demand,
                    "desired": desired,
                    "replicas": first.replicas,
                }
            )


def simulate(
    resolved: ResolvedDeployment,
    plugins: PluginManager,
    workload: Any,
    *,
    duration: float | None = None,
    seed: int = 0,
    model: str | None = None,
    progress: Callable[[float, int], None] | None = None,
    drain_s: float = 600.0,
    gateways: int = 1,
    shared_state: bool = True,
    split: str = "clients",
    leap_steps: int = LEAP_STEPS,
    stop_after: StopRule | None = None,
) -> SimulationResult:
    """Run ``workload`` against the deployment in virtual time and measure it. With
    ``gateways`` above 1, that many gateways share the engines, clients take them in turn,
    and (``shared_state``) they share routing state as a fleet does (``fleet:``); with
    ``split="tenants"`` each tenant's requests all go to one gateway instead (tenants dealt
    out in turn). ``leap_steps``: most decode iterations an engine advances as one event
    (1: one event per iteration; the results are the same either way). ``stop_after``: end
    the run as soon as its verdict against an SLO is settled (:class:`StopRule`)."""
    if split not in ("clients", "tenants"):
        raise ValueError(f"split must be 'clients' or 'tenants', not {split!r}")
    from shuniu.core.fleet import MemoryHub
    from shuniu.core.gateway import Gateway

    _check_sim_only(resolved)
    default_model = model or next(iter(resolved.deployment.models))
    horizon = duration or getattr(workload, "duration_s", 600.0)
    result = SimulationResult(slo=_slo_of(workload), window_s=max(horizon / 120, 1.0))
    started = time.perf_counter()

    async def main() -> None:
        # Built inside the virtual loop so every timer the gateway creates lives on it.
        hub = MemoryHub() if gateways > 1 and shared_state else None
        built = [
            Gateway(resolved, plugins, fleet=hub.transport() if hub is not None else None, virtual_time=True)
            for _ in range(gateways)
        ]
        for i, g in enumerate(built):
            if g.fleet is not None:
                g.fleet.name = f"gateway-{i}"  # names decide the engines' pollers: fixed, for repeatable runs
        gateway = built[0]
        for other in built[1:]:
            # One set of engines behind every gateway, as in a real fleet.
            for name, pool in other.pools.items():
                for mine, theirs in zip(pool.endpoints, gateway.pools[name].endpoints, strict=True):
                    mine.backend = theirs.backend
        for pool in gateway.pools.values():
            for ep in pool.endpoints:
                if isinstance(ep.backend, SimBackend):
                    ep.backend.engine.leap_steps = leap_steps
        if default_model not in gateway.routes:
            raise ConfigError(
                [Problem("--model", f"the deployment has no model {default_model!r}")], resolved.source
            )
        try:
            await _run(
                built,
                workload.requests(seed=seed, duration=duration),
                default_model,
                workload.slo,
                result,
                progress,
                drain_s,
                split,
                stop_after,
            )
        except BaseException:
            # A failed run stops its gateways too: their health, load and autoscaling tasks
            # would otherwise be left pending on the closed loop.
            for gw in built:
                with contextlib.suppress(Exception):
                    await gw.stop()
            raise

    # A run allocates many small objects that live a while (requests, sequences, cached
    # blocks): at the default threshold the collector's young passes and the older passes
    # they trigger took about 4% of a run. Fewer, larger passes for its duration only (the
    # thread is the run's until it returns).
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], _GC_YOUNG), *thresholds[1:])
    try:
        run_virtual(main())
    finally:
        gc.set_threshold(*thresholds)
    result.wall_s = time.perf_counter() - started
    return result
