"""``shuniu simulate``: a deployment's own scheduler and balancer, simulated engines, virtual time.

The deployment is built exactly as ``shuniu serve`` builds it (the same :class:`Gateway`,
pools, scheduler and balancer objects); only the HTTP layer is left out and the clock is
virtual (:mod:`shuniu.backends.sim.vclock`). Each workload request is admitted by the pool's
scheduler, placed by its balancer, and run on the chosen endpoint's simulated engine, one
event per engine iteration.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from shuniu.backends.sim.backend import SimBackend
from shuniu.backends.sim.engine import Seq
from shuniu.backends.sim.stats import LogHistogram
from shuniu.backends.sim.vclock import run_virtual
from shuniu.core.config_loader import ResolvedDeployment
from shuniu.core.errors import ConfigError, GatewayError, Problem
from shuniu.core.plugin_manager import PluginManager
from shuniu.core.pool import Pool
from shuniu.core.types import InferenceRequest, Outcome, Principal

__all__ = ["SimulationResult", "TierResult", "plot_timeline", "simulate"]


@dataclass
class TierResult:
    """Latency and refusals of one tier's requests."""

    arrived: int = 0
    completed: int = 0
    rejected_by_code: dict[str, int] = field(default_factory=dict)
    met_slo: int = 0
    ttft: LogHistogram = field(default_factory=LogHistogram)
    e2e: LogHistogram = field(default_factory=LogHistogram)

    def summary(self, with_slo: bool) -> dict[str, Any]:
        return {
            "arrived": self.arrived,
            "completed": self.completed,
            "rejected": sum(self.rejected_by_code.values()),
            "rejected_by_code": dict(self.rejected_by_code),
            "ttft_p50": self.ttft.quantile(0.5),
            "ttft_p99": self.ttft.quantile(0.99),
            "e2e_p99": self.e2e.quantile(0.99),
            "goodput": self.met_slo / self.arrived if with_slo and self.arrived else None,
        }


@dataclass
class SimulationResult:
    """What a simulation measured. Latencies are in seconds of simulated time."""

    requests_arrived: int = 0
    requests_completed: int = 0
    rejected: int = 0
    failed: int = 0
    """Requests an endpoint failed (injected faults)."""
    unfinished: int = 0
    """Requests still running ``drain_s`` after the last arrival (e.g. on a hung endpoint)."""
    rejected_by_code: dict[str, int] = field(default_factory=dict)
    met_slo: int = 0
    slo: dict[str, float] | None = None
    generated_tokens: int = 0
    prompt_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    sim_time_s: float = 0.0
    wall_s: float = 0.0
    ttft: LogHistogram = field(default_factory=LogHistogram)
    itl: LogHistogram = field(default_factory=LogHistogram)
    e2e: LogHistogram = field(default_factory=LogHistogram)
    queue: LogHistogram = field(default_factory=LogHistogram)
    per_endpoint: dict[str, dict[str, Any]] = field(default_factory=dict)
    window_s: float = 10.0
    """Width of the time windows of :attr:`timeline`."""
    timeline: dict[int, tuple[LogHistogram, LogHistogram]] = field(default_factory=dict)
    """Window index (by arrival time) → (TTFT, per-request mean ITL) histograms, for plots."""
    tiers: dict[str, TierResult] = field(default_factory=dict)
    """The same figures per tier (the workload's ``tier`` of each request)."""

    def tier(self, name: str) -> TierResult:
        t = self.tiers.get(name)
        if t is None:
            t = self.tiers[name] = TierResult()
        return t

    def record_window(self, arrival: float, ttft: float, itl: float | None) -> None:
        window = self.timeline.get(int(arrival // self.window_s))
        if window is None:
            window = self.timeline[int(arrival // self.window_s)] = (LogHistogram(), LogHistogram())
        window[0].add(ttft)
        if itl is not None:
            window[1].add(itl)

    def summary(self) -> dict[str, Any]:
        """The figures ``--json`` prints."""
        return {
            "ttft_p50": self.ttft.quantile(0.5),
            "ttft_p99": self.ttft.quantile(0.99),
            "itl_p50": self.itl.quantile(0.5),
            "itl_p99": self.itl.quantile(0.99),
            "e2e_p50": self.e2e.quantile(0.5),
            "e2e_p99": self.e2e.quantile(0.99),
            "queue_p99": self.queue.quantile(0.99),
            "throughput_tokens_per_s": self.generated_tokens / self.sim_time_s if self.sim_time_s else 0.0,
            "requests_per_s": self.requests_completed / self.sim_time_s if self.sim_time_s else 0.0,
            "requests_arrived": self.requests_arrived,
            "requests_completed": self.requests_completed,
            "goodput": self.met_slo / self.requests_arrived if self.slo and self.requests_arrived else None,
            "prefix_hit_rate": self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0,
            "preemptions": self.preemptions,
            "rejected": self.rejected,
            "failed": self.failed,
            "unfinished": self.unfinished,
            "rejected_by_code": dict(self.rejected_by_code),
            "slo": self.slo,
            "sim_time_s": self.sim_time_s,
            "wall_s": self.wall_s,
            "simulated_requests_per_wall_s": self.requests_arrived / self.wall_s if self.wall_s else 0.0,
            "per_endpoint": self.per_endpoint,
            "tiers": {name: t.summary(bool(self.slo)) for name, t in sorted(self.tiers.items())},
        }


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
    gateway: Any,
    requests: Iterator[Any],
    default_model: str,
    slo: Any,
    result: SimulationResult,
    progress: Callable[[float, int], None] | None,
    drain_s: float,
) -> None:
    loop = asyncio.get_running_loop()
    await gateway.start()
    pools: dict[str, Pool] = gateway.routes
    inflight: set[asyncio.Task[None]] = set()

    async def one(spec: Any, n: int) -> None:
        model = getattr(spec, "model", None) or default_model
        pool = pools[model]
        now = loop.time()
        req = InferenceRequest(
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
            principal=Principal(tenant=spec.tenant, tier=spec.tier),
            token_ids=spec.prompt,
        )
        tier = result.tier(spec.tier)
        tier.arrived += 1
        try:
            pool = gateway.router.resolve(req, pool)
            gateway.check_context(req, pool)
            ticket = await pool.scheduler.admit(req, pool)
        except GatewayError as err:
            result.rejected += 1
            code = err.code or str(err.status)
            result.rejected_by_code[code] = result.rejected_by_code.get(code, 0) + 1
            tier.rejected_by_code[code] = tier.rejected_by_code.get(code, 0) + 1
            return
        admitted = loop.time()
        result.queue.add(admitted - now)
        backend = ticket.endpoint.backend
        assert isinstance(backend, SimBackend)
        seq = Seq(
            req.id,
            spec.prompt,
            spec.output_tokens,
            output_seed=spec.output_seed,
            priority=req.priority,  # as the scheduler set it (from the tier)
            arrival=admitted,
        )
        outcome = Outcome.ERROR
        try:
            await backend.run_seq(seq)
            outcome = Outcome.OK
        except ValueError:
            result.rejected += 1
            result.rejected_by_code["too_long"] = result.rejected_by_code.get("too_long", 0) + 1
            return
        except GatewayError:
            result.failed += 1
            return
        finally:
            pool.scheduler.release(ticket, outcome)
        end = loop.time()
        first = seq.first_token_at if seq.first_token_at is not None else end
        ttft = first - now
        result.ttft.add(ttft)
        result.e2e.add(end - now)
        result.requests_completed += 1
        tier.ttft.add(ttft)
        tier.e2e.add(end - now)
        tier.completed += 1
        # A request's inter-token latency is its mean gap (time per output token).
        tpot = (end - first) / (seq.output_count - 1) if seq.output_count > 1 else None
        result.record_window(now, ttft, tpot)
        if slo is not None and slo.meets(ttft, itl=tpot, e2e=end - now):
            result.met_slo += 1
            tier.met_slo += 1

    n = 0
    for spec in requests:
        delay = spec.arrival - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        n += 1
        task = loop.create_task(one(spec, n))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
        if progress is not None and n % 256 == 0:
            progress(loop.time(), n)
    result.requests_arrived = n
    if inflight:
        # A hung endpoint (an injected fault) would keep its requests forever: stop waiting
        # after `drain_s` and count them as unfinished.
        _, pending = await asyncio.wait(list(inflight), timeout=drain_s)
        for task in pending:
            task.cancel()
        result.unfinished = len(pending)
        if pending:
            await asyncio.wait(pending)
    result.sim_time_s = loop.time()
    if progress is not None:
        progress(loop.time(), n)
    for pool in gateway.pools.values():
        for ep in pool.endpoints:
            core = ep.backend.engine.core
            result.generated_tokens += core.generated_tokens
            result.prompt_tokens += core.prompt_tokens
            result.prefix_queries += core.prefix_queries
            result.prefix_hits += core.prefix_hits
            result.preemptions += core.preemptions
            result.itl.merge(core.itl)
            result.per_endpoint[ep.name] = {
                "completed": core.completed,
                "generated_tokens": core.generated_tokens,
                "prefix_hit_rate": core.prefix_hits / core.prefix_queries if core.prefix_queries else 0.0,
                "preemptions": core.preemptions,
                "busy_share": ep.backend.engine.busy_time / result.sim_time_s if result.sim_time_s else 0.0,
            }
    await gateway.stop()


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
) -> SimulationResult:
    """Run ``workload`` against the deployment in virtual time and measure it."""
    from shuniu.core.gateway import Gateway

    _check_sim_only(resolved)
    default_model = model or next(iter(resolved.deployment.models))
    horizon = duration or getattr(workload, "duration_s", 600.0)
    result = SimulationResult(slo=_slo_of(workload), window_s=max(horizon / 120, 1.0))
    started = time.perf_counter()

    async def main() -> None:
        # Built inside the virtual loop so every timer the gateway creates lives on it.
        gateway = Gateway(resolved, plugins)
        if default_model not in gateway.routes:
            raise ConfigError(
                [Problem("--model", f"the deployment has no model {default_model!r}")], resolved.source
            )
        await _run(
            gateway,
            workload.requests(seed=seed, duration=duration),
            default_model,
            workload.slo,
            result,
            progress,
            drain_s,
        )

    run_virtual(main())
    result.wall_s = time.perf_counter() - started
    return result


def plot_timeline(result: SimulationResult, path: str, title: str = "") -> None:
    """A PNG of TTFT p50/p99 and ITL p50/p99 over time (needs ``shuniu[plot]``)."""
    from shuniu.core.extras import require

    require("matplotlib", "plot", "The simulation plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows = sorted(result.timeline)
    t = [(w + 0.5) * result.window_s for w in windows]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    for q, style in ((0.5, "-"), (0.99, "--")):
        top.plot(
            t,
            [result.timeline[w][0].quantile(q) * 1000 for w in windows],
            style,
            label=f"TTFT p{round(q * 100)}",
        )
        bottom.plot(
            t,
            [result.timeline[w][1].quantile(q) * 1000 for w in windows],
            style,
            label=f"ITL p{round(q * 100)}",
        )
    top.set_ylabel("TTFT (ms)")
    bottom.set_ylabel("mean ITL per request (ms)")
    bottom.set_xlabel("arrival time (simulated s)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
    if title:
        top.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
