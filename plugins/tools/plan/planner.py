"""``shuniu plan``: how many replicas (at which tensor-parallel size) of a model on some hardware
meet a workload's SLO, found by simulating candidate deployments in virtual time.

For each candidate tensor-parallel (TP) size — the smallest that holds the weights with KV room
for one full-length sequence, and the next one or two powers of two (or the one given with
``tensor_parallel_size``) — the number of replicas is searched: a deployment of ``N`` simulated
endpoints (the ``sim`` backend with the hardware and model profiles, no gateway-side
concurrency limit, the ``fifo`` scheduler and the chosen balancer) is built in memory and the
workload is run against it with :func:`~shuniu.plugins.tools.simulate.simulate`. A trial *meets*
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
input and output lengths (:func:`~shuniu.backends.sim.kv_report`).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from shuniu.backends.sim import (
    CostModel,
    HardwareProfile,
    ModelProfile,
    kv_cache_tokens,
    kv_report,
    load_hardware,
    load_model,
)
from shuniu.core.config.loader import load_deployment
from shuniu.core.errors import Problem
from shuniu.core.plugin_manager import PluginManager, load_plugins
from shuniu.core.traffic import Slo, Workload, describe, load_workload
from shuniu.plugins.tools.plan.candidates import tp_candidates
from shuniu.plugins.tools.plan.deployment import DEPLOYMENT_SOURCE, check_deployment, deployment_text
from shuniu.plugins.tools.plan.estimates import fresh_tokens_rate, replica_load
from shuniu.plugins.tools.plan.report import secs
from shuniu.plugins.tools.plan.results import PlanError, PlanReporter, PlanResult, Trial
from shuniu.plugins.tools.simulate import simulate

__all__ = [
    "DEFAULT_GOODPUT",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DEFAULT_MAX_NUM_SEQS",
    "DEFAULT_MAX_REPLICAS",
    "DEFAULT_SEARCH_DURATION",
    "Planner",
    "plan",
]

DEFAULT_MAX_REPLICAS = 64
DEFAULT_SEARCH_DURATION = 120.0
"""Simulated seconds of each search trial; answers are confirmed over the full duration."""
DEFAULT_GOODPUT = 0.99
"""Share of requests that must meet the per-request thresholds, when the SLO has its own."""
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9

FLOOR_LOAD = 0.02
"""Load (share of one replica's estimated capacity) of the unloaded-floor run."""
FLOOR_REQUESTS = 600
"""Requests the unloaded-floor run aims for (its horizon grows up to 10x the search's)."""
FLOOR_MARGIN = 1.05
"""The floor must miss a p99 target by more than this factor to call the SLO unreachable."""


def _with_slo(
    workload: Workload, ttft_p99: float | None, itl_p99: float | None, e2e_p99: float | None
) -> Workload:
    """The workload with SLO targets overridden (a per-request threshold of an overridden
    metric follows the new target)."""
    if ttft_p99 is None and itl_p99 is None and e2e_p99 is None:
        return workload
    data = workload.slo.model_dump() if workload.slo is not None else {}
    for metric, value in (("ttft", ttft_p99), ("itl", itl_p99), ("e2e", e2e_p99)):
        if value is not None:
            if not value > 0:
                raise PlanError([Problem(f"--{metric}-p99", f"must be positive (got {value:g})")], "options")
            data[f"{metric}_p99_s"] = value
            data[f"{metric}_s"] = None
    slo = Slo.model_validate(data)
    return workload.model_copy(update={"slo": slo}).with_base_dir(workload.base_dir)


class Planner:
    """One plan's search: it runs (and caches) the trials, finds the unloaded floor of each TP
    size, searches the replica count and picks the best TP size (:meth:`solve`)."""

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
        self.fresh_rate = fresh_tokens_rate(workload, desc)
        self.tried: list[Trial] = []
        self.notes: list[str] = []
        self._cache: dict[tuple[int, int, float, float], Trial] = {}
        self._floor: dict[int, str | None] = {}
        self._cost: dict[int, Any] = {}

    # ----------------------------------------------------------------- simulation

    def deployment(self, tp: int, replicas: int) -> str:
        """The deployment a trial of ``replicas`` x TP ``tp`` simulates."""
        return deployment_text(
            self.model,
            self.hardware,
            tp,
            replicas,
            self.balancer,
            self.util,
            self.max_num_seqs,
            self.max_model_len,
        )

    def cost_model(self, tp: int) -> Any:
        if tp not in self._cost:
            self._cost[tp] = CostModel(self.model_profile, self.hw, tp)
        return self._cost[tp]

    def load(self, tp: int) -> float:
        kv = kv_cache_tokens(self.model_profile, self.hw, tp, self.util)
        itl = self.slo.itl_p99_s if self.slo.itl_p99_s is not None else self.slo.request_thresholds[1]
        return replica_load(self.cost_model(tp), self.desc, self.fresh_rate, kv, self.max_num_seqs, itl)

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
                    failures.append(f"{name} p99 {secs(value)} > {secs(target)}")
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
        resolved = load_deployment(DEPLOYMENT_SOURCE, self.plugins, text=self.deployment(tp, replicas))
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
                f"one decode iteration of a single sequence takes {secs(one_step)}, above the "
                f"ITL p99 target {secs(slo.itl_p99_s)}"
            )
        elif slo.ttft_p99_s is not None and cm.prefill_time(1) > slo.ttft_p99_s:
            reason = (
                f"the shortest prefill iteration takes {secs(cm.prefill_time(1))}, above the "
                f"TTFT p99 target {secs(slo.ttft_p99_s)}"
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
    sizes = tp_candidates(model_profile, hw, gpu_memory_utilization, max_model_len, tensor_parallel_size)
    desc = describe(workload, full)
    plugins = plugins or load_plugins()
    planner = Planner(
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
    check_deployment(planner.deployment(sizes[0], 1), plugins)
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
