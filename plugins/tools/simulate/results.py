"""What a simulation measured: :class:`SimulationResult` (latency histograms, counts, per
endpoint, per tier and per tenant figures, the timeline for plots), :class:`TierResult` and
:class:`TenantResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shuniu.backends.sim import LogHistogram

__all__ = ["SimulationResult", "TenantResult", "TierResult"]


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
class TenantResult:
    """What one tenant's requests were served: its share of the tokens is what fair
    queueing divides."""

    completed: int = 0
    tokens: int = 0
    """Prompt plus generated tokens of its completed requests (what the fair share counts)."""
    gateway: int | None = None
    """The gateway its requests went to (``--split tenants``), else ``None``."""
    ttft: LogHistogram = field(default_factory=LogHistogram)

    def summary(self, total_tokens: int) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "tokens": self.tokens,
            "token_share": self.tokens / total_tokens if total_tokens else 0.0,
            "gateway": self.gateway,
            "ttft_p50": self.ttft.quantile(0.5),
            "ttft_p99": self.ttft.quantile(0.99),
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
    """Requests still running ``drain_s`` after the last arrival (e.g. on a hung endpoint), or
    when the run was stopped early."""
    stopped_at: float | None = None
    """When the run was stopped early (``simulate(stop_after=...)``); ``None``: it ran to its end."""
    stopped_because: str | None = None
    """Which limit of the stop rule it passed (:class:`~.stop.StopRule`)."""
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
    tpot: LogHistogram = field(default_factory=LogHistogram)
    """Each request's mean inter-token latency (what the gateway's
    ``shuniu_inter_token_latency_seconds`` observes; ``itl`` is every token gap)."""
    per_endpoint: dict[str, dict[str, Any]] = field(default_factory=dict)
    endpoint_latency: dict[str, tuple[LogHistogram, LogHistogram]] = field(default_factory=dict)
    """Time to first token and end-to-end latency of the requests each endpoint served
    (summarised in :attr:`per_endpoint` as ``ttft_p50``, ``ttft_p99``, ``e2e_p50`` and
    ``e2e_p99``)."""
    window_s: float = 10.0
    """Width of the time windows of :attr:`timeline`."""
    timeline: dict[int, tuple[LogHistogram, LogHistogram]] = field(default_factory=dict)
    """Window index (by arrival time) → (TTFT, per-request mean ITL) histograms, for plots."""
    tiers: dict[str, TierResult] = field(default_factory=dict)
    """The same figures per tier (the workload's ``tier`` of each request)."""
    tenants: dict[str, TenantResult] = field(default_factory=dict)
    """Tokens served and latency per tenant (the workload's ``tenant`` of each request)."""
    scaling: list[dict[str, Any]] = field(default_factory=list)
    """Every window, each ``autoscaling:`` pool's signals (``t``, ``model``, ``rate``,
    ``forecast``, ``replica_capacity``, ``demand``, ``desired``, ``replicas``)."""

    def tier(self, name: str) -> TierResult:
        t = self.tiers.get(name)
        if t is None:
            t = self.tiers[name] = TierResult()
        return t

    def tenant(self, name: str) -> TenantResult:
        t = self.tenants.get(name)
        if t is None:
            t = self.tenants[name] = TenantResult()
        return t

    def window(self, arrival: float) -> tuple[LogHistogram, LogHistogram]:
        """The (TTFT, per-request mean ITL) histograms of the window of ``arrival``."""
        key = int(arrival // self.window_s)
        window = self.timeline.get(key)
        if window is None:
            window = self.timeline[key] = (LogHistogram(), LogHistogram())
        return window

    def window_p99(self) -> list[dict[str, Any]]:
        """Per window of arrivals: its start, TTFT p99 and per-request ITL p99 (``None``
        when the window has none)."""
        out = []
        for w in sorted(self.timeline):
            ttft, itl = self.timeline[w]
            out.append(
                {
                    "t": w * self.window_s,
                    "ttft_p99": ttft.quantile(0.99),
                    "itl_p99": itl.quantile(0.99) if itl.count else None,
                }
            )
        return out

    def scaling_summary(self) -> dict[str, dict[str, Any]]:
        """Per autoscaled model, how its desired count moved against the SLO on the fixed
        replicas the run had: when it first rose above them (``rose_at_s``), when the first
        window of arrivals broke the SLO (``slo_broken_at_s``; TTFT p99 or per-request ITL
        p99 above target), the difference (``lead_s``: positive is ahead), the peak, and when
        it came back down to them after the peak (``fell_at_s``)."""
        slo = self.slo or {}
        ttft_target, itl_target = slo.get("ttft_p99_s"), slo.get("itl_p99_s")
        broken = [
            w["t"]
            for w in self.window_p99()
            if (ttft_target is not None and w["ttft_p99"] > ttft_target)
            or (itl_target is not None and w["itl_p99"] is not None and w["itl_p99"] > itl_target)
        ]
        out: dict[str, dict[str, Any]] = {}
        for model in dict.fromkeys(x["model"] for x in self.scaling):
            samples = [x for x in self.scaling if x["model"] == model]
            replicas = samples[0]["replicas"]
            rose = next((x["t"] for x in samples if x["desired"] > replicas), None)
            peak = max(samples, key=lambda x: x["desired"])
            fell = next((x["t"] for x in samples if x["t"] > peak["t"] and x["desired"] <= replicas), None)
            first_broken = broken[0] if broken else None
            out[model] = {
                "replicas": replicas,
                "rose_at_s": rose,
                "slo_broken_at_s": first_broken,
                "lead_s": first_broken - rose if rose is not None and first_broken is not None else None,
                "peak_desired": peak["desired"],
                "peak_at_s": peak["t"],
                "fell_at_s": fell,
            }
        return out

    def _tenants_summary(self) -> dict[str, dict[str, Any]]:
        total = sum(t.tokens for t in self.tenants.values())
        return {name: t.summary(total) for name, t in sorted(self.tenants.items())}

    def summary(self) -> dict[str, Any]:
        """The figures ``--json`` prints."""
        return {
            "ttft_p50": self.ttft.quantile(0.5),
            "ttft_p99": self.ttft.quantile(0.99),
            "itl_p50": self.itl.quantile(0.5),
            "itl_p99": self.itl.quantile(0.99),
            "tpot_p99": self.tpot.quantile(0.99) if self.tpot.count else None,
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
            "stopped_at": self.stopped_at,
            "stopped_because": self.stopped_because,
            "rejected_by_code": dict(self.rejected_by_code),
            "slo": self.slo,
            "sim_time_s": self.sim_time_s,
            "wall_s": self.wall_s,
            "simulated_requests_per_wall_s": self.requests_arrived / self.wall_s if self.wall_s else 0.0,
            "per_endpoint": self.per_endpoint,
            "tiers": {name: t.summary(bool(self.slo)) for name, t in sorted(self.tiers.items())},
            "tenants": self._tenants_summary(),
            **(
                {
                    "scaling_summary": self.scaling_summary(),
                    "scaling": self.scaling,
                    "windows": self.window_p99(),
                }
                if self.scaling
                else {}
            ),
        }
