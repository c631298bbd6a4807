"""What ``shuniu plan`` produces: each simulated :class:`Trial`, the :class:`PlanResult`, the
:class:`PlanReporter` hooks it calls while it works, and :class:`PlanError` for inputs it
cannot start from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from shuniu.backends.sim import KVReport
from shuniu.core.errors import ConfigError, Problem

__all__ = ["PlanError", "PlanReporter", "PlanResult", "Rejection", "Trial"]


class PlanError(ConfigError):
    """Inputs a plan cannot start from: unknown profiles, a model that fits no TP size, a
    workload without an SLO, impossible options."""

    def __init__(self, problems: list[Problem], source: str | None = None) -> None:
        super().__init__(problems, source)
        head = f"{source}: " if source else ""
        lines = "\n".join(f"  - {p}" for p in problems)
        self.args = (f"{head}{len(problems)} problem(s):\n{lines}",)


@dataclass
class Trial:
    """One simulated configuration and what it measured (latencies in seconds)."""

    phase: str
    """``search`` (short horizon), ``confirm`` (full horizon) or ``floor`` (the unloaded run)."""
    tensor_parallel: int
    replicas: int
    duration_s: float
    """Simulated seconds of arrivals."""
    rate_scale: float
    """Factor on the workload's arrival rates (below 1 only for the floor run)."""
    ttft_p50: float
    ttft_p99: float
    itl_p99: float
    e2e_p99: float
    goodput: float | None
    throughput_tokens_per_s: float
    requests_arrived: int
    requests_completed: int
    rejected: int
    preemptions: int
    prefix_hit_rate: float
    met: bool
    failures: list[str] = field(default_factory=list)
    """Why it does not meet the SLO (empty when it does)."""
    wall_s: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)
    """The engine configuration (:class:`~shuniu.plugins.tools.plan.shapes.Shape` as a dict)."""
    label: str = ""
    """The configuration, briefly (``TP 8 bf16/kv bf16 chunk 256 ...``)."""
    cost_per_hour: float = 0.0
    """Replicas x TP x the price of a device-hour (the device count when no price is known)."""
    seed: int = 0
    """Seed of the workload sample it ran."""
    worst: float = 0.0
    """The largest ratio of a p99 to its target (above 1: missed)."""
    stopped_at: float | None = None
    """When the run stopped because its miss was settled (its latencies are those of the
    run so far, so lower than a full run's); ``None``: it ran to its end."""
    pipeline_parallel: int = 1
    """Pipeline stages of each replica (each a node of ``tensor_parallel`` devices)."""
    engines: int = 1
    """Engines of each replica: a unit of a prefill/decode split has several."""

    @property
    def devices(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel * self.engines * self.replicas

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "devices": self.devices}


@dataclass
class Rejection:
    """A configuration the plan set aside, and why."""

    label: str
    """The configuration, briefly."""
    change: str
    """What differs from the configuration it was compared with (``chunk 2048``)."""
    replicas: int
    """Replicas it was tried (or would have needed) at; 0 when never simulated."""
    reason: str
    """Which target it missed and by how much, or why it was not simulated."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class PlanResult:
    """The answer of :func:`plan` and everything it tried."""

    model: str
    """Model spec with precisions, e.g. ``qwen2.5-7b@bf16,kv=bf16``."""
    hardware: str
    workload: dict[str, Any]
    """Name, expected request rate and mean lengths (from :func:`describe`)."""
    slo: dict[str, float]
    goodput_target: float | None
    """Share of requests that must meet the per-request thresholds (``None``: not checked)."""
    duration_s: float
    search_duration_s: float
    seed: int
    balancer: str
    max_replicas: int
    tensor_parallel_sizes: list[int]
    recommendation: Trial | None
    """The full-horizon trial of the configuration chosen; ``None`` when nothing meets."""
    tried: list[Trial]
    kv: KVReport
    """KV arithmetic of one replica at the recommended TP size (else the smallest that fits)."""
    kv_room_seqs: int
    """Full-length requests the KV cache of one replica holds (not capped by max_num_seqs)."""
    max_num_seqs: int
    notes: list[str]
    wall_s: float = 0.0
    price_per_hour: float | None = None
    """Price of one device-hour (``None``: unknown; costs are device counts)."""
    rejected: list[Rejection] = field(default_factory=list)
    """Configurations set aside, with the reason, in the order they were tried."""
    frontier: list[Trial] = field(default_factory=list)
    """Search trials no other beats on cost, p99 TTFT and p99 ITL together, cheapest first."""
    quality: str | None = None
    """The quality cost of the recommendation's precision (``None``: the model's own)."""
    native: Trial | None = None
    """The cheapest search trial at the model's own precision meeting the SLO, when the
    recommendation is quantized."""
    warmup_s: float = 0.0
    """Seconds the workload's load grows before it settles (trials run past it)."""
    pipeline_parallel: int = 1
    """Pipeline stages of a replica at the recommended split (above 1 only for a model that
    fits no node)."""

    @property
    def met(self) -> bool:
        return self.recommendation is not None

    @property
    def devices(self) -> int | None:
        return None if self.recommendation is None else self.recommendation.devices

    def to_dict(self) -> dict[str, Any]:
        rec = self.recommendation
        return {
            "model": self.model,
            "hardware": self.hardware,
            "workload": self.workload,
            "slo": self.slo,
            "goodput_target": self.goodput_target,
            "duration_s": self.duration_s,
            "search_duration_s": self.search_duration_s,
            "seed": self.seed,
            "balancer": self.balancer,
            "max_replicas": self.max_replicas,
            "tensor_parallel_sizes": self.tensor_parallel_sizes,
            "pipeline_parallel_size": self.pipeline_parallel,
            "met": self.met,
            "price_per_hour": self.price_per_hour,
            "warmup_s": self.warmup_s,
            "quality": self.quality,
            "recommendation": None
            if rec is None
            else {
                "tensor_parallel_size": rec.tensor_parallel,
                "pipeline_parallel_size": rec.pipeline_parallel,
                "prefill_engines": rec.config.get("prefill_engines", 0),
                "decode_engines": rec.config.get("decode_engines", 0),
                "replicas": rec.replicas,
                "devices": rec.devices,
                "config": rec.config,
                "cost_per_hour": rec.cost_per_hour,
                **{
                    k: getattr(rec, k)
                    for k in (
                        "ttft_p50",
                        "ttft_p99",
                        "itl_p99",
                        "e2e_p99",
                        "goodput",
                        "throughput_tokens_per_s",
                        "duration_s",
                    )
                },
            },
            "tried": [t.to_dict() for t in self.tried],
            "rejected": [r.to_dict() for r in self.rejected],
            "frontier": [t.to_dict() for t in self.frontier],
            "native": None if self.native is None else self.native.to_dict(),
            "kv": {
                **dataclasses.asdict(self.kv),
                "kv_room_seqs": self.kv_room_seqs,
                "max_num_seqs": self.max_num_seqs,
            },
            "notes": self.notes,
            "wall_s": self.wall_s,
        }


class PlanReporter:
    """Hooks :func:`plan` calls while it works (the command draws a progress bar with them).
    Every method is optional to override."""

    def trial_started(self, phase: str, label: str, replicas: int, horizon: float) -> None:
        """A simulation of ``replicas`` of configuration ``label`` over ``horizon`` simulated
        seconds starts."""

    def advance(self, now: float, requests: int) -> None:
        """The running simulation reached ``now`` simulated seconds after ``requests`` arrivals."""

    def trial_finished(self, trial: Trial) -> None:
        """A simulation ended."""
