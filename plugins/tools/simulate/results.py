"""What a simulation measured: :class:`SimulationResult` (latency histograms, counts, per
endpoint and per tier figures, the timeline for plots) and :class:`TierResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shuniu.backends.sim import LogHistogram

__all__ = ["SimulationResult", "TierResult"]


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
