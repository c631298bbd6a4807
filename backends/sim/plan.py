"""``shuniu plan``: how many replicas (at which tensor-parallel size) of a model on some hardware
meet a workload's SLO, found by simulating candidate deployments in virtual time.

For each candidate tensor-parallel (TP) size — the smallest that holds the weights with KV room
for one full-length sequence, and the next one or two powers of two (or the one given with
``tensor_parallel_size``) — the number of replicas is searched: a deployment of ``N`` simulated
endpoints (the ``sim`` backend with the hardware and model profiles, no gateway-side
concurrency limit, the ``fifo`` scheduler and the chosen balancer) is built in memory and the
workload is run against it with :func:`~shuniu.backends.sim.simulate.simulate`. A trial *meets*
the SLO when the run's p99s satisfy :meth:`Slo.satisfied` and, when the SLO has per-request
thresholds of its own (``ttft_s``, ``itl_s``, ``e2e_s``) or a goodput target is given, the
share of requests meeting them is at least the target (0.99 by default).

The search, per TP size:

1. a starting guess from the roofline cost model: the replica-equivalents of work the workload
   brings — decode at the largest batch whose iteration fits the ITL target (and the KV cache),
   plus prefill of the prompt tokens a prefix cache would not hold — rounded up. It ignores
   queueing, so it is an optimistic bound and the answer is rarely below it;
2. from there exponential growth on failure — the count is multiplied by how far the worst
   metric missed its target (measured above its unloaded value), 1.1x to 3x — one step down
   when the guess already meets, then narrowing of the bracket between the largest count known
   to fail and the smallest known to meet, by log-linear interpolation of that miss (bisection
   when interpolation keeps landing on one side). Results are cached; the count never exceeds
   ``max_replicas``;
3. before growing after a second failure, the SLO is checked against an *unloaded floor*: the
   cost model's single-iteration times (checked before any simulation, too) and a light run
   (one replica, the arrival rate scaled to ~2% of its estimated capacity). If even that misses
   a target (by more than 5%), no replica count can meet it at this TP size and the search
   stops at once instead of growing to ``max_replicas``.

Two horizons keep a plan fast: the search runs ``search_duration`` simulated seconds (120 by
default), and each candidate answer is then confirmed over the full ``duration`` (the
workload's ``duration_s`` unless given); if the confirmation fails, the count grows at the full
horizon. Longer runs are assumed to be no easier than shorter ones (the workload warms up and
conversations grow), so counts that failed the short run are not retried. TP sizes are explored
best first: a size is searched only up to as many devices as the best answer so far (or another
size's short-run answer) uses, and set aside once it needs more, so a plan rarely simulates
a larger TP size for long.

The answer is the configuration with the fewest devices (replicas x TP), ties broken by the
lower p99 TTFT. With it comes the KV-memory arithmetic of one replica at the workload's mean
input and output lengths (:func:`~shuniu.backends.sim.profiles.kv_report`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from shuniu.backends.sim.profiles import (
    GIB,
    HardwareProfile,
    KVReport,
    ModelProfile,
    kv_cache_tokens,
    kv_report,
    load_hardware,
    load_model,
    min_tensor_parallel,
    tensor_parallel_problem,
    weight_bytes,
)
from shuniu.backends.sim.workload import Workload, describe, load_workload
from shuniu.core.errors import ConfigError, Problem
from shuniu.core.plugin_manager import PluginManager

__all__ = [
    "DEFAULT_GOODPUT",
    "DEFAULT_MAX_REPLICAS",
    "DEFAULT_SEARCH_DURATION",
    "PlanError",
    "PlanReporter",
    "PlanResult",
    "Trial",
    "plan",
    "plan_command",
]

DEFAULT_MAX_REPLICAS = 64
DEFAULT_SEARCH_DURATION = 120.0
"""Simulated seconds of each search trial; answers are confirmed over the full duration."""
DEFAULT_GOODPUT = 0.99
"""Share of requests that must meet the per-request thresholds, when the SLO has its own."""
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
EXTRA_TP_SIZES = 2
"""Powers of two tried above the smallest TP size that fits."""

FLOOR_LOAD = 0.02
"""Load (share of one replica's estimated capacity) of the unloaded-floor run."""
FLOOR_REQUESTS = 600
"""Requests the unloaded-floor run aims for (its horizon grows up to 10x the search's)."""
FLOOR_MARGIN = 1.05
"""The floor must miss a p99 target by more than this factor to call the SLO unreachable."""
PREFILL_CHUNK = 2048
"""Prompt tokens per iteration used to price prefill in the starting guess."""

_DEPLOYMENT_SOURCE = "<shuniu plan deployment>"


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

    @property
    def devices(self) -> int:
        return self.tensor_parallel * self.replicas

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "devices": self.devices}


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
            "met": self.met,
            "recommendation": None
            if rec is None
            else {
                "tensor_parallel_size": rec.tensor_parallel,
                "replicas": rec.replicas,
                "devices": rec.devices,
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

    def trial_started(self, phase: str, tp: int, replicas: int, horizon: float) -> None:
        """A simulation of ``replicas`` x TP ``tp`` over ``horizon`` simulated seconds starts."""

    def advance(self, now: float, requests: int) -> None:
        """The running simulation reached ``now`` simulated seconds after ``requests`` arrivals."""

    def trial_finished(self, trial: Trial) -> None:
        """A simulation ended."""


# --------------------------------------------------------------------------- estimates


def _dist_mean(dist: Any) -> float:
    """Mean of a workload distribution (clamping ignored: a rough figure for the estimate)."""
    if dist is None:
        return 0.0
    if getattr(dist, "dist", None) == "fixed":
        return float(dist.value)
    if getattr(dist, "dist", None) == "uniform":
        return (dist.min + dist.max) / 2
    return float(getattr(dist, "mean", 0.0))


def _fresh_tokens_rate(workload: Workload, desc: dict[str, Any]) -> float:
    """Prompt tokens per second a prefix cache would not hold, roughly: shared system prompts
    and conversation history are taken as cached."""
    total = 0.0
    for stream, s in zip(workload.streams, desc["streams"], strict=True):
        mean_in = s["mean_input_tokens"]
        if s["type"] == "chat":
            fresh = _dist_mean(stream.user_tokens)
        elif s["type"] == "trace":
            fresh = mean_in if not s["prefix_groups"] else mean_in / 2
        else:
            system = stream.system_prompts
            fresh = mean_in - (_dist_mean(system.tokens) if system is not None else 0.0)
        total += s["request_rate"] * max(fresh, 1.0)
    return total


def _replica_load(
    cm: Any,
    desc: dict[str, Any],
    fresh_rate: float,
    kv_tokens: int,
    max_num_seqs: int,
    itl_target: float | None,
) -> float:
    """Replica-equivalents of work the workload brings at this TP size: decode at the largest
    batch whose iteration fits the ITL target and the KV cache, plus prefill of the fresh
    prompt tokens. Queueing is ignored, so this is optimistic."""
    rate = desc["request_rate"]
    if rate <= 0:
        return 0.0
    mean_in, mean_out = desc["mean_input_tokens"], desc["mean_output_tokens"]
    ctx = max(1, round(mean_in + mean_out / 2))
    bmax = max(1, min(max_num_seqs, int(kv_tokens // max(1.0, mean_in + mean_out))))
    batch = bmax
    if itl_target is not None and cm.decode_time(bmax, ctx) > itl_target:
        lo, hi = 1, bmax  # largest batch whose decode iteration fits the target
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cm.decode_time(mid, ctx) <= itl_target:
                lo = mid
            else:
                hi = mid - 1
        batch = lo
    decode = rate * mean_out * cm.decode_time(batch, ctx) / batch
    prefill = fresh_rate * cm.prefill_time(PREFILL_CHUNK) / PREFILL_CHUNK
    return decode + prefill


# --------------------------------------------------------------------------- inputs


def _with_slo(
    workload: Workload, ttft_p99: float | None, itl_p99: float | None, e2e_p99: float | None
) -> Workload:
    """The workload with SLO targets overridden (a per-request threshold of an overridden
    metric follows the new target)."""
    if ttft_p99 is None and itl_p99 is None and e2e_p99 is None:
        return workload
    from shuniu.backends.sim.workload import Slo

    data = workload.slo.model_dump() if workload.slo is not None else {}
    for metric, value in (("ttft", ttft_p99), ("itl", itl_p99), ("e2e", e2e_p99)):
        if value is not None:
            if not value > 0:
                raise PlanError([Problem(f"--{metric}-p99", f"must be positive (got {value:g})")], "options")
            data[f"{metric}_p99_s"] = value
            data[f"{metric}_s"] = None
    slo = Slo.model_validate(data)
    return workload.model_copy(update={"slo": slo}).with_base_dir(workload.base_dir)


def _fits(model: ModelProfile, hw: HardwareProfile, tp: int, util: float, need: int) -> str | None:
    """Why ``tp`` devices cannot hold a replica, or None."""
    problem = tensor_parallel_problem(model, tp)
    if problem is not None:
        return problem
    if tp > hw.max_tensor_parallel:
        return f"{hw.name} allows at most {hw.max_tensor_parallel} devices per replica"
    room = kv_cache_tokens(model, hw, tp, util)
    if room < need:
        return (
            f"{tp} x {hw.name} leave room for {room:,} KV tokens, less than one {need:,}-token "
            f"sequence ({weight_bytes(model) / GIB:,.1f} GiB of weights on "
            f"{tp * hw.memory_gib * util:,.1f} GiB usable)"
        )
    return None


def _tp_candidates(
    model: ModelProfile, hw: HardwareProfile, util: float, max_model_len: int | None, pinned: int | None
) -> list[int]:
    need = max_model_len if max_model_len is not None else model.max_position
    if pinned is not None:
        why = _fits(model, hw, pinned, util, need)
        if why is not None:
            raise PlanError([Problem("--tensor-parallel-size", why)], "options")
        return [pinned]
    smallest = min_tensor_parallel(model, hw, util, max_model_len)
    if smallest is None:
        message = (
            f"{model.name} ({weight_bytes(model) / GIB:,.1f} GiB of {model.weight_precision} weights) does "
            f"not fit on up to {hw.max_tensor_parallel} x {hw.name} ({hw.memory_gib:g} GiB each, "
            f"{util:.0%} usable) with KV room for one {need:,}-token sequence; try a smaller "
            f"weight precision (e.g. {model.name}@fp8 or @int4-awq), a smaller --max-model-len, "
            "or other hardware"
        )
        raise PlanError([Problem("--model", message)], "options")
    sizes = [smallest]
    tp = smallest * 2
    while len(sizes) <= EXTRA_TP_SIZES and tp <= hw.max_tensor_parallel:
        if _fits(model, hw, tp, util, need) is None:
            sizes.append(tp)
        tp *= 2
    return sizes


def _deployment_text(
    model: str,
    hardware: str,
    tp: int,
    replicas: int,
    balancer: str,
    util: float,
    max_num_seqs: int,
    max_model_len: int | None,
) -> str:
    options = {
        "hardware": hardware,
        "model": model,
        "tensor_parallel_size": tp,
        "gpu_memory_utilization": util,
        "max_num_seqs": max_num_seqs,
    }
    lines = ["models:", "  plan:"]
    if max_model_len is not None:
        lines.append(f"    max_model_len: {max_model_len}")
    lines += [
        f"    balancer: {{policy: {json.dumps(balancer)}}}",
        "    scheduler: {policy: fifo}",
        "    endpoints:",
        "      - kind: sim",
        f"        replicas: {replicas}",
        "        max_concurrency: 0",
        f"        options: {json.dumps(options)}",
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the planner


class _Planner:
    def __init__(
        self,
        *,
        model: str,
        hardware: str,
        model_profile: ModelProfile,
        hw: HardwareProfile,
        workload: Workload,
        desc: dict[str, Any],
        duration: float,
        search_duration: float,
        seed: int,
        max_replicas: int,
        balancer: str,
        goodput_target: float | None,
        util: float,
        max_num_seqs: int,
        max_model_len: int | None,
        plugins: PluginManager,
        reporter: PlanReporter,
    ) -> None:
        self.model = model
        self.hardware = hardware
        self.model_profile = model_profile
        self.hw = hw
        self.workload = workload
        self.desc = desc
        self.duration = duration
        self.search_duration = search_duration
        self.seed = seed
        self.max_replicas = max_replicas
        self.balancer = balancer
        self.goodput_target = goodput_target
        self.util = util
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.plugins = plugins
        self.reporter = reporter
        assert workload.slo is not None
        self.slo = workload.slo
        self.fresh_rate = _fresh_tokens_rate(workload, desc)
        self.tried: list[Trial] = []
        self.notes: list[str] = []
        self._cache: dict[tuple[int, int, float, float], Trial] = {}
        self._floor: dict[int, str | None] = {}
        self._cost: dict[int, Any] = {}

    # ----------------------------------------------------------------- simulation

    def cost_model(self, tp: int) -> Any:
        if tp not in self._cost:
            from shuniu.backends.sim.costmodel import CostModel

            self._cost[tp] = CostModel(self.model_profile, self.hw, tp)
        return self._cost[tp]

    def load(self, tp: int) -> float:
        kv = kv_cache_tokens(self.model_profile, self.hw, tp, self.util)
        itl = self.slo.itl_p99_s if self.slo.itl_p99_s is not None else self.slo.request_thresholds[1]
        return _replica_load(self.cost_model(tp), self.desc, self.fresh_rate, kv, self.max_num_seqs, itl)

    def judge(self, s: dict[str, Any], margin: float = 1.0) -> list[str]:
        """Why a run's summary misses the SLO (empty: it meets it)."""
        if not s["requests_completed"]:
            return ["no request completed"]
        slo = self.slo
        failures = []
        if not slo.satisfied(ttft_p99=s["ttft_p99"], itl_p99=s["itl_p99"], e2e_p99=s["e2e_p99"]):
            for name, target, value in (
                ("TTFT", slo.ttft_p99_s, s["ttft_p99"]),
                ("ITL", slo.itl_p99_s, s["itl_p99"]),
                ("E2E", slo.e2e_p99_s, s["e2e_p99"]),
            ):
                if target is not None and value > target * margin:
                    failures.append(f"{name} p99 {_secs(value)} > {_secs(target)}")
        if self.goodput_target is not None and s["goodput"] is not None:
            floor = self.goodput_target - (0.01 if margin > 1 else 0.0)
            if s["goodput"] < floor:
                failures.append(f"goodput {s['goodput']:.1%} < {self.goodput_target:.0%}")
        rejected = s["rejected"] / s["requests_arrived"] if s["requests_arrived"] else 0.0
        if rejected > 0.01:
            failures.append(f"{rejected:.1%} rejected (longer than the context window)")
        return failures

    def run(self, phase: str, tp: int, replicas: int, horizon: float, scale: float = 1.0) -> Trial:
        key = (tp, replicas, horizon, scale)
        if key in self._cache:
            return self._cache[key]
        from shuniu.backends.sim.simulate import simulate
        from shuniu.core.config_loader import load_deployment

        text = _deployment_text(
            self.model,
            self.hardware,
            tp,
            replicas,
            self.balancer,
            self.util,
            self.max_num_seqs,
            self.max_model_len,
        )
        resolved = load_deployment(_DEPLOYMENT_SOURCE, self.plugins, text=text)
        workload = self.workload if scale == 1.0 else self.workload.scaled(scale)
        self.reporter.trial_started(phase, tp, replicas, horizon)
        try:
            result = simulate(
                resolved,
                self.plugins,
                workload,
                duration=horizon,
                seed=self.seed,
                progress=self.reporter.advance,
            )
        except ValueError as exc:  # the engine refused the configuration
            raise PlanError([Problem("--model", str(exc))], "options") from None
        s = result.summary()
        failures = self.judge(s, FLOOR_MARGIN if phase == "floor" else 1.0)
        trial = Trial(
            phase=phase,
            tensor_parallel=tp,
            replicas=replicas,
            duration_s=horizon,
            rate_scale=scale,
            ttft_p50=s["ttft_p50"],
            ttft_p99=s["ttft_p99"],
            itl_p99=s["itl_p99"],
            e2e_p99=s["e2e_p99"],
            goodput=s["goodput"],
            throughput_tokens_per_s=s["throughput_tokens_per_s"],
            requests_arrived=s["requests_arrived"],
            requests_completed=s["requests_completed"],
            rejected=s["rejected"],
            preemptions=s["preemptions"],
            prefix_hit_rate=s["prefix_hit_rate"],
            met=not failures,
            failures=failures,
            wall_s=result.wall_s,
        )
        self._cache[key] = trial
        self.tried.append(trial)
        self.reporter.trial_finished(trial)
        return trial

    # ----------------------------------------------------------------- the floor

    def unreachable(self, tp: int, *, run: bool = True) -> str | None:
        """Why no replica count can meet the SLO at this TP size (None: it may). The cost
        model's single-iteration times are checked first; with ``run`` an unloaded run
        follows."""
        if tp in self._floor:
            return self._floor[tp]
        cm = self.cost_model(tp)
        slo = self.slo
        one_step = cm.decode_time(1, 1)
        if slo.itl_p99_s is not None and one_step > slo.itl_p99_s:
            reason: str | None = (
                f"one decode iteration of a single sequence takes {_secs(one_step)}, above the "
                f"ITL p99 target {_secs(slo.itl_p99_s)}"
            )
        elif slo.ttft_p99_s is not None and cm.prefill_time(1) > slo.ttft_p99_s:
            reason = (
                f"the shortest prefill iteration takes {_secs(cm.prefill_time(1))}, above the "
                f"TTFT p99 target {_secs(slo.ttft_p99_s)}"
            )
        elif not run:
            return None
        else:
            rate = self.desc["request_rate"]
            load = self.load(tp)
            scale = min(1.0, FLOOR_LOAD / load) if load > 0 else 1.0
            horizon = self.search_duration
            if rate > 0:
                horizon = min(10 * self.search_duration, max(horizon, FLOOR_REQUESTS / (rate * scale)))
            trial = self.run("floor", tp, 1, horizon, scale)
            reason = None
            if trial.failures:
                reason = (
                    f"even unloaded (1 replica at {scale:.2g}x the arrival rate) it misses: "
                    + "; ".join(trial.failures)
                )
        self._floor[tp] = reason
        return reason

    # ----------------------------------------------------------------- the search

    def excess(self, tp: int, trial: Trial) -> float:
        """How far a trial is from the SLO: the largest ratio over the targets of the metric's
        excess above its unloaded value to the target's (above 1: missed; None-free)."""
        slo = self.slo
        floor = self._floor_trial(tp)
        ctx = max(1, round(self.desc["mean_input_tokens"] + self.desc["mean_output_tokens"] / 2))
        itl_floor = floor.itl_p99 if floor else self.cost_model(tp).decode_time(1, ctx)
        ratio = 0.0
        for target, value, base in (
            (slo.ttft_p99_s, trial.ttft_p99, floor.ttft_p99 if floor else 0.0),
            (slo.itl_p99_s, trial.itl_p99, itl_floor),
            (slo.e2e_p99_s, trial.e2e_p99, floor.e2e_p99 if floor else 0.0),
        ):
            if target is not None:
                base = min(base, target * 0.95)
                ratio = max(ratio, (value - base) / (target - base))
        target_share, share = self.goodput_target, trial.goodput
        if target_share is not None and share is not None:
            ratio = max(ratio, (1 - share) / max(1 - target_share, 1e-3))
        return ratio

    def growth(self, tp: int, trial: Trial) -> float:
        """Factor on the replica count after a failed trial (1.1 to 3): the excess, taken as
        inversely proportional to the replica count, plus 10%."""
        ratio = self.excess(tp, trial)
        if ratio <= 1.0:  # failed for another reason (rejections, nothing completed)
            ratio = 2.0
        return min(3.0, max(1.1, ratio * 1.1))

    def _floor_trial(self, tp: int) -> Trial | None:
        for trial in self.tried:
            if trial.phase == "floor" and trial.tensor_parallel == tp:
                return trial
        return None

    def search(self, tp: int, horizon: float, phase: str, guess: int, lo: int, cap: int) -> int | None:
        """Smallest replica count in ``(lo, cap]`` meeting the SLO over ``horizon`` (counts up
        to ``lo`` are taken to fail); None when none does (or the SLO is unreachable).

        Grows by :meth:`growth` until a count meets, then narrows the bracket by interpolating
        the excess log-linearly between its ends (bisecting when that stalls on one side)."""
        if lo >= cap:
            return None
        hi: int | None = None
        lo_trial: Trial | None = None
        hi_trial: Trial | None = None
        failures = 0
        last_met: bool | None = None
        same_side = 0  # consecutive narrowing steps that moved the same end of the bracket
        first = n = max(lo + 1, min(guess, cap))
        while True:
            trial = self.run(phase, tp, n, horizon)
            if lo_trial is not None and hi_trial is not None:
                same_side = same_side + 1 if trial.met == last_met else 1
            last_met = trial.met
            if trial.met:
                hi, hi_trial = n, trial
            else:
                lo, lo_trial = n, trial
                failures += 1
                # Growing again after a second failure: first make sure more replicas can help.
                if hi is None and failures >= 2 and lo < cap and self.unreachable(tp) is not None:
                    return None
            if hi is None:
                if lo >= cap:
                    return None
                n = min(cap, max(lo + 1, math.ceil(lo * self.growth(tp, trial))))
            elif hi - lo <= 1:
                return hi
            elif lo_trial is None:
                # The first count tried met: the guess is optimistic, its predecessor most
                # likely fails; if not, bisect below.
                n = hi - 1 if n == first else (lo + hi) // 2
            else:
                n = (lo + hi) // 2
                r_lo = self.excess(tp, lo_trial)
                r_hi = self.excess(tp, hi_trial) if hi_trial is not None else 0.0
                if same_side < 2 and r_lo > 1.0 and 0.0 < r_hi < 1.0:
                    share = math.log(r_lo) / (math.log(r_lo) - math.log(r_hi))
                    guess_n = math.ceil(math.exp(math.log(lo) + share * (math.log(hi) - math.log(lo))))
                    n = min(hi - 1, max(lo + 1, guess_n))

    def solve(self, sizes: list[int]) -> Trial | None:
        """Best-first over the TP sizes by the fewest devices each could still need."""
        two_horizons = self.search_duration < self.duration
        # per TP: the largest count known to fail over the search horizon and over the full
        # one, the smallest known to meet over each, and the TP sizes settled for good
        lo_s = dict.fromkeys(sizes, 0)
        lo_f = dict.fromkeys(sizes, 0)
        found_s: dict[int, int] = {}
        found_f: dict[int, int] = {}
        settled: set[int] = set()
        best: Trial | None = None

        def bound(tp: int) -> int:
            """Fewest devices TP ``tp`` could still need."""
            if tp in found_f:
                return tp * found_f[tp]
            if tp in found_s:
                return tp * max(found_s[tp], lo_f[tp] + 1)
            return tp * (max(lo_s[tp], lo_f[tp]) + 1)

        while True:
            open_ = [tp for tp in sizes if tp not in settled]
            if not open_:
                break
            tp = min(open_, key=lambda t: (bound(t), t))
            if best is not None and bound(tp) > best.devices:
                for t in open_:
                    self.notes.append(
                        f"TP {t} left out: it needs at least {bound(t)} devices, "
                        f"more than the {best.devices} recommended"
                    )
                break
            # Devices worth spending: no more than another TP size is known to meet with (or
            # could, by its short run); a TP size cut off here stays open with a higher bound.
            others = [bound(u) for u in sizes if u != tp and u not in settled and (u in found_s)]
            if best is not None:
                others.append(best.devices)
            limit = min(others) // tp if others else self.max_replicas
            cap = min(self.max_replicas, limit)
            if tp not in found_s:
                if self.unreachable(tp, run=False) is not None:
                    settled.add(tp)
                    self._note_none(tp)
                    continue
                guess = max(1, math.ceil(self.load(tp)))
                n = self.search(tp, self.search_duration, "search", guess, lo_s[tp], cap)
                if n is None:
                    lo_s[tp] = max(lo_s[tp], cap)
                    if cap >= self.max_replicas or self._floor.get(tp) is not None:
                        settled.add(tp)
                        self._note_none(tp)
                    continue
                found_s[tp] = n
                lo_s[tp] = n - 1
                if two_horizons:
                    continue  # its bound may have grown: take the best TP size again
                found_f[tp] = n
            if tp not in found_f:
                start = max(found_s[tp], lo_f[tp] + 1)
                n = self.search(tp, self.duration, "confirm", start, start - 1, cap)
                if n is None:
                    lo_f[tp] = max(lo_f[tp], cap)
                    if cap >= self.max_replicas or self._floor.get(tp) is not None:
                        settled.add(tp)
                        self._note_none(tp)
                    continue
                found_f[tp] = n
            settled.add(tp)
            trial = self._cache[(tp, found_f[tp], self.duration, 1.0)]
            if best is None or (trial.devices, trial.ttft_p99) < (best.devices, best.ttft_p99):
                best = trial
        return best

    def _note_none(self, tp: int) -> None:
        reason = self._floor.get(tp)
        if reason is not None:
            self.notes.append(f"TP {tp}: no replica count can meet the SLO: {reason}")
        else:
            self.notes.append(
                f"TP {tp}: no replica count up to --max-replicas {self.max_replicas} meets the SLO"
            )


def _check_deployment(planner: _Planner, tp: int) -> None:
    """Build the deployment once before simulating, so that a bad ``--balancer`` (or an
    engine setting) is reported against the option that caused it."""
    from shuniu.core.config_loader import load_deployment

    text = _deployment_text(
        planner.model,
        planner.hardware,
        tp,
        1,
        planner.balancer,
        planner.util,
        planner.max_num_seqs,
        planner.max_model_len,
    )
    try:
        load_deployment(_DEPLOYMENT_SOURCE, planner.plugins, text=text)
    except ConfigError as exc:
        options = {
            "models.plan.balancer.policy": "--balancer",
            "models.plan.max_model_len": "--max-model-len",
        }
        problems = [
            Problem(options.get(p.path, p.path.replace("models.plan.endpoints[0].options.", "--")), p.message)
            for p in exc.problems
        ]
        raise PlanError(problems, "options") from None


def plan(
    model: str,
    hardware: str,
    workload: Workload | str | Path,
    *,
    duration: float | None = None,
    search_duration: float | None = DEFAULT_SEARCH_DURATION,
    seed: int = 0,
    max_replicas: int = DEFAULT_MAX_REPLICAS,
    tensor_parallel_size: int | None = None,
    balancer: str = "round_robin",
    goodput: float | None = None,
    ttft_p99: float | None = None,
    itl_p99: float | None = None,
    e2e_p99: float | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    max_model_len: int | None = None,
    plugins: PluginManager | None = None,
    reporter: PlanReporter | None = None,
) -> PlanResult:
    """Find the fewest devices (replicas x tensor-parallel size) of ``model`` on ``hardware``
    that meet ``workload``'s SLO, by simulation (see the module's docstring for the search).

    ``model`` and ``hardware`` are profile names or paths (``model`` may carry precisions:
    ``llama-3.1-70b@fp8``). ``duration``: simulated seconds the answer is confirmed over
    (default: the workload's); ``search_duration``: seconds of each search trial (``None``:
    the full duration). ``goodput``: share of requests that must meet the per-request
    thresholds (default 0.99 when the SLO has thresholds of its own, else unchecked).
    ``ttft_p99``/``itl_p99``/``e2e_p99`` override the workload's SLO targets (seconds).

    Raises :class:`PlanError` (a ``ConfigError``) for unusable inputs; a workload no
    configuration meets is not an error: the result's ``recommendation`` is ``None`` and its
    ``notes`` say why."""
    started = time.perf_counter()
    from shuniu.core.plugin_manager import load_plugins

    problems = []
    if max_replicas < 1:
        problems.append(Problem("--max-replicas", f"must be at least 1 (got {max_replicas})"))
    if duration is not None and not duration > 0:
        problems.append(Problem("--duration", f"must be positive (got {duration:g})"))
    if search_duration is not None and not search_duration > 0:
        problems.append(Problem("--search-duration", f"must be positive (got {search_duration:g})"))
    if goodput is not None and not 0 <= goodput <= 1:
        problems.append(Problem("--goodput", f"must be between 0 and 1 (got {goodput:g})"))
    if not 0 < gpu_memory_utilization <= 1:
        problems.append(Problem("--gpu-memory-utilization", "must be in (0, 1]"))
    if max_num_seqs < 1:
        problems.append(Problem("--max-num-seqs", "must be at least 1"))
    if max_model_len is not None and max_model_len < 16:
        problems.append(Problem("--max-model-len", "must be at least 16"))
    if problems:
        raise PlanError(problems, "options")

    model_profile = load_model(model)
    hw = load_hardware(hardware)
    if not isinstance(workload, Workload):
        workload = load_workload(workload)
    workload = _with_slo(workload, ttft_p99, itl_p99, e2e_p99)
    slo = workload.slo
    if slo is None or all(
        v is None for v in (slo.ttft_p99_s, slo.itl_p99_s, slo.e2e_p99_s, *slo.request_thresholds)
    ):
        raise PlanError(
            [
                Problem(
                    "slo",
                    "the workload has no SLO to plan for: add `slo: {ttft_p99_s: ..., itl_p99_s: ...}` "
                    "to it, or give --ttft-p99 / --itl-p99 / --e2e-p99",
                )
            ],
            workload.name or "workload",
        )
    own_thresholds = any(v is not None for v in (slo.ttft_s, slo.itl_s, slo.e2e_s))
    if goodput is None and own_thresholds:
        goodput = DEFAULT_GOODPUT
    if goodput == 0:
        goodput = None

    full = duration if duration is not None else workload.duration_s
    short = full if search_duration is None else min(search_duration, full)
    sizes = _tp_candidates(model_profile, hw, gpu_memory_utilization, max_model_len, tensor_parallel_size)
    desc = describe(workload, full)
    plugins = plugins or load_plugins()
    planner = _Planner(
        model=model,
        hardware=hardware,
        model_profile=model_profile,
        hw=hw,
        workload=workload,
        desc=desc,
        duration=full,
        search_duration=short,
        seed=seed,
        max_replicas=max_replicas,
        balancer=balancer,
        goodput_target=goodput,
        util=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        plugins=plugins,
        reporter=reporter or PlanReporter(),
    )
    _check_deployment(planner, sizes[0])
    best = planner.solve(sizes)
    if best is None:
        planner.notes.insert(0, "no configuration meets the SLO")
    kv_tp = best.tensor_parallel if best is not None else sizes[0]
    input_tokens = max(1, round(desc["mean_input_tokens"]))
    output_tokens = max(1, round(desc["mean_output_tokens"]))
    report = kv_report(
        model_profile,
        hw,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        tp=kv_tp,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
    )
    room = report.kv_blocks // max(-(-(input_tokens + output_tokens) // report.block_size), 1)
    return PlanResult(
        model=model_profile.spec,
        hardware=hw.name,
        workload={
            k: desc[k]
            for k in ("name", "request_rate", "mean_input_tokens", "mean_output_tokens", "prefix_groups")
        },
        slo=slo.model_dump(exclude_none=True),
        goodput_target=goodput,
        duration_s=full,
        search_duration_s=short,
        seed=seed,
        balancer=balancer,
        max_replicas=max_replicas,
        tensor_parallel_sizes=sizes,
        recommendation=best,
        tried=planner.tried,
        kv=report,
        kv_room_seqs=room,
        max_num_seqs=max_num_seqs,
        notes=planner.notes,
        wall_s=time.perf_counter() - started,
    )


# --------------------------------------------------------------------------- the command


def _secs(seconds: float) -> str:
    if seconds >= 100:
        return f"{seconds:,.0f} s"
    if seconds >= 1:
        return f"{seconds:.3g} s"
    return f"{seconds * 1000:.3g} ms"


def _report_error(exc: ConfigError) -> None:
    click.secho(f"{exc.source or 'input'}: {len(exc.problems)} problem(s)", fg="red", err=True)
    for problem in exc.problems:
        click.echo(f"  - {problem}", err=True)


class _Bar(PlanReporter):
    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self.task = progress.add_task("plan", total=1.0, sim=0.0, n=0, label="", visible=False)
        self.horizon = 1.0

    def trial_started(self, phase: str, tp: int, replicas: int, horizon: float) -> None:
        self.horizon = horizon
        label = f"{phase}: TP {tp} x {replicas}"
        self.progress.reset(self.task, total=horizon, sim=0.0, n=0, label=label, visible=True)

    def advance(self, now: float, requests: int) -> None:
        self.progress.update(self.task, completed=min(now, self.horizon), sim=now, n=requests)

    def trial_finished(self, trial: Trial) -> None:
        verdict = "[green]meets[/]" if trial.met else f"[red]misses[/] ({'; '.join(trial.failures)})"
        self.progress.console.print(
            f"  {trial.phase:<7} TP {trial.tensor_parallel} x {trial.replicas:<3} "
            f"{trial.duration_s:,.0f} s simulated in {trial.wall_s:.1f} s: {verdict}",
            highlight=False,
        )


def _slo_text(result: PlanResult) -> str:
    slo = result.slo
    names = {"ttft": "TTFT", "itl": "ITL", "e2e": "E2E"}
    parts = [f"{names[m]} p99 <= {_secs(slo[f'{m}_p99_s'])}" for m in names if f"{m}_p99_s" in slo]
    own = [f"{names[m]} <= {_secs(slo[f'{m}_s'])}" for m in names if f"{m}_s" in slo]
    if result.goodput_target is not None:
        share = f"{result.goodput_target:.0%} of requests"
        parts.append(f"{share} within " + (", ".join(own) if own else "the p99 targets"))
    return ", ".join(parts)


def _num(value: float) -> str:
    """Three significant digits, thousands separated."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _print(result: PlanResult, console: Any) -> None:
    from rich import box
    from rich.table import Table

    w = result.workload
    table = Table(
        title=f"{result.model} on {result.hardware} for {w['name']}: {w['request_rate']:.3g} requests/s, "
        f"mean {w['mean_input_tokens']:,.0f} in / {w['mean_output_tokens']:,.0f} out tokens; "
        f"SLO {_slo_text(result)}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=0,
    )
    columns = [
        "run",
        "TP",
        "repl",
        "dev",
        "sim s",
        "TTFT\np50 ms",
        "TTFT\np99 ms",
        "ITL\np99 ms",
        "E2E\np99 s",
        "good-\nput",
        "tok/s",
    ]
    for name in columns:
        table.add_column(name, justify="left" if name == "run" else "right", no_wrap=True)
    table.add_column("met", overflow="fold", min_width=12)
    table.caption = "repl: replicas; dev: devices (replicas x TP); sim s: simulated seconds of arrivals"
    table.caption_justify = "left"
    rec = result.recommendation
    for t in result.tried:
        run = t.phase
        met = "yes" if t.met else "no: " + "; ".join(t.failures)
        if t.rate_scale != 1.0:
            met += f" (unloaded: {t.rate_scale:.2g}x the rate)"
        style = "bold green" if t is rec else None
        table.add_row(
            run,
            str(t.tensor_parallel),
            str(t.replicas),
            str(t.devices),
            f"{t.duration_s:,.0f}",
            _num(t.ttft_p50 * 1000),
            _num(t.ttft_p99 * 1000),
            _num(t.itl_p99 * 1000),
            _num(t.e2e_p99),
            "-" if t.goodput is None else f"{t.goodput:.1%}",
            f"{t.throughput_tokens_per_s:,.0f}",
            met,
            style=style,
        )
    if result.tried:
        console.print(table)
    else:
        console.print(table.title, "\n(nothing simulated)", highlight=False)
    if rec is not None:
        console.print(
            f"[bold]Recommendation:[/] {rec.replicas} replica{'s' if rec.replicas != 1 else ''} x TP "
            f"{rec.tensor_parallel} = [bold]{rec.devices} x {result.hardware}[/] — TTFT p99 "
            f"{_secs(rec.ttft_p99)}, ITL p99 {_secs(rec.itl_p99)}"
            + ("" if rec.goodput is None else f", goodput {rec.goodput:.1%}")
            + f" over {rec.duration_s:,.0f} simulated seconds",
            highlight=False,
        )
    else:
        console.print(
            "[bold red]No configuration meets the SLO[/] "
            f"(TP {', '.join(map(str, result.tensor_parallel_sizes))}, "
            f"up to {result.max_replicas} replicas).",
            highlight=False,
        )
    for note in result.notes:
        if note != "no configuration meets the SLO":
            console.print(f"  - {note}", highlight=False)
    kv = result.kv
    rows = kv.rows()
    rows[-1] = (
        "max concurrent sequences",
        f"{kv.max_concurrent_seqs:,} (the KV cache holds {result.kv_room_seqs:,} such requests; "
        f"max_num_seqs {result.max_num_seqs:,})",
    )
    kv_table = Table(
        title=f"KV memory of one replica (TP {kv.tensor_parallel}) at the workload's mean lengths",
        title_justify="left",
        show_header=False,
    )
    kv_table.add_column("quantity")
    kv_table.add_column("value", justify="right")
    for k, v in rows:
        kv_table.add_row(k, v)
    console.print(kv_table)
    console.print(f"planned in {result.wall_s:.1f} s ({len(result.tried)} simulations)", style="dim")


@click.command("plan")
@click.option(
    "--model", "-m", "model", required=True, help="Model profile (e.g. qwen2.5-7b, llama-3.1-70b@fp8)."
)
@click.option("--hardware", "-H", "hardware", required=True, help="Hardware profile (e.g. h200, h100-sxm).")
@click.option(
    "--workload",
    "-w",
    "workload_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Workload YAML with an SLO (see examples/workloads/).",
)
@click.option(
    "--duration",
    type=float,
    default=None,
    help="Simulated seconds the answer is confirmed over (default: the workload's duration_s).",
)
@click.option(
    "--search-duration",
    type=float,
    default=DEFAULT_SEARCH_DURATION,
    show_default=True,
    help="Simulated seconds of each search trial (capped at --duration).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed of the workload.")
@click.option(
    "--max-replicas", type=int, default=DEFAULT_MAX_REPLICAS, show_default=True, help="Most replicas to try."
)
@click.option(
    "--tensor-parallel-size",
    "-tp",
    type=int,
    default=None,
    help="Plan only this tensor-parallel size "
    "(default: the smallest that fits and the next two powers of two).",
)
@click.option("--balancer", default="round_robin", show_default=True, help="Balancer policy of the pool.")
@click.option(
    "--goodput",
    type=float,
    default=None,
    help="Share of requests that must meet the per-request SLO thresholds "
    "(default 0.99 when the SLO sets ttft_s/itl_s/e2e_s; 0 = not checked).",
)
@click.option("--ttft-p99", type=float, default=None, help="Override the SLO's TTFT p99 target (seconds).")
@click.option("--itl-p99", type=float, default=None, help="Override the SLO's ITL p99 target (seconds).")
@click.option(
    "--e2e-p99", type=float, default=None, help="Override the SLO's end-to-end p99 target (seconds)."
)
@click.option(
    "--gpu-memory-utilization",
    type=float,
    default=DEFAULT_GPU_MEMORY_UTILIZATION,
    show_default=True,
    help="Share of device memory the engine may use.",
)
@click.option(
    "--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS, show_default=True, help="Engine batch limit."
)
@click.option("--max-model-len", type=int, default=None, help="Context window (default: the model's).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.pass_context
def plan_command(
    ctx: click.Context,
    model: str,
    hardware: str,
    workload_path: Path,
    duration: float | None,
    search_duration: float,
    seed: int,
    max_replicas: int,
    tensor_parallel_size: int | None,
    balancer: str,
    goodput: float | None,
    ttft_p99: float | None,
    itl_p99: float | None,
    e2e_p99: float | None,
    gpu_memory_utilization: float,
    max_num_seqs: int,
    max_model_len: int | None,
    as_json: bool,
) -> None:
    """How many replicas of MODEL on HARDWARE meet WORKLOAD's SLO, found by simulation.

    Searches the replica count (and the tensor-parallel size where the model needs several
    devices) for the fewest devices that meet the SLO, then prints the KV-memory arithmetic of
    one replica. Exits 0 with a recommendation, 1 when no configuration meets the SLO, 2 on
    bad input.
    """
    from rich.console import Console

    from shuniu.backends.sim.commands import simulation_progress
    from shuniu.core.plugin_manager import load_plugins

    plugins = ctx.find_object(PluginManager) or load_plugins()
    try:
        workload = load_workload(workload_path)
    except ConfigError as exc:
        _report_error(exc)
        ctx.exit(2)
    console = Console(stderr=True)
    with simulation_progress(console, disable=as_json or not console.is_terminal) as bar:
        reporter = None if as_json or not console.is_terminal else _Bar(bar)
        try:
            result = plan(
                model,
                hardware,
                workload,
                duration=duration,
                search_duration=search_duration,
                seed=seed,
                max_replicas=max_replicas,
                tensor_parallel_size=tensor_parallel_size,
                balancer=balancer,
                goodput=goodput,
                ttft_p99=ttft_p99,
                itl_p99=itl_p99,
                e2e_p99=e2e_p99,
                gpu_memory_utilization=gpu_memory_utilization,
                max_num_seqs=max_num_seqs,
                max_model_len=max_model_len,
                plugins=plugins,
                reporter=reporter,
            )
        except ConfigError as exc:
            _report_error(exc)
            ctx.exit(2)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        # Piped output keeps whole rows instead of an 80-column cut.
        _print(result, Console(width=None if sys.stdout.isatty() else 180))
    sys.stdout.flush()
    ctx.exit(0 if result.met else 1)
