"""The search behind ``shuniu plan``: the cheapest pool of a model on some hardware that
meets a workload's SLO, found by simulating candidate deployments in virtual time.

A configuration is a :class:`~shuniu.plugins.tools.plan.shapes.Shape` (tensor-parallel size,
weight and KV precision, ``max_num_batched_tokens``, ``max_num_seqs``, prefix caching, the
balancer) and a replica count; its cost is replicas x TP x the price of a device-hour (the
hardware profile's ``price_per_hour`` or ``--price``; without one, the device count). Each
trial builds a deployment of that many ``sim`` endpoints in memory (no gateway-side
concurrency limit, the ``fifo`` scheduler) and runs the workload against it with
:func:`~shuniu.plugins.tools.simulate.simulate`. A trial *meets* the SLO when the run's p99s
satisfy :meth:`Slo.satisfied` and, when the SLO has per-request thresholds of its own or a
goodput target is given, the share of requests meeting them reaches the target (0.99 by
default).

The search:

1. **A start an expert would pick**: the model's own precision at the smallest TP size that
   holds it, the largest prefill chunk whose iteration (chunk plus a typical decode batch)
   stays under 90% of the ITL target, 256 sequences, prefix caching, and a prefix-aware
   balancer when prompts share prefixes. Its replica count is searched from the roofline
   guess (:mod:`.estimates`): grown on failure by how far the worst metric missed, then the
   bracket narrowed by geometric bisection. The growth stops when more replicas stop
   helping (half again as many leave a missed ITL p99 where it was: an iteration-level
   limit) or when an unloaded *floor* run shows that even one idle replica misses.
2. **One knob at a time** (:data:`~shuniu.plugins.tools.plan.shapes.DIMENSIONS`): each other
   value of a knob is tried at the most replicas that would still cost less than the best so
   far (the chunks above the current one smallest first: once one misses the ITL target the
   larger ones are rejected unrun, :meth:`Planner._chunk_settled`). Missing there rejects it
   (no fewer replicas can do better) with the reason; so does,
   without a simulation, a roofline guess more than twice that count, or a single iteration
   slower than a target. A value that meets has its own count searched and may become the best. Passes
   repeat (at most :data:`MAX_PASSES`) while one improves the best.
3. **Confirmation**: the best is run over the full duration on another sample of the
   workload (the seed plus one); if it misses there its count grows until it meets.

Search trials run ``search_duration`` simulated seconds past the warm-up of a workload whose
load grows (multi-turn chat; :func:`~shuniu.plugins.tools.plan.steady.warmup_s`). Longer runs
are taken to be no easier than shorter ones, so counts that failed a short run are not retried.

With the answer come the rejected configurations and why, the cost frontier (search trials
no other beats on cost, p99 TTFT and p99 ITL together), the quality cost of a lower
precision (and the cheapest answer at the model's own precision), and the KV-memory
arithmetic of one replica (:func:`~shuniu.backends.sim.kv_report`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from shuniu.backends.sim import kv_cache_tokens
from shuniu.core.config.loader import load_deployment
from shuniu.core.errors import Problem
from shuniu.core.plugin_manager import PluginManager
from shuniu.core.traffic import Workload
from shuniu.plugins.tools.plan.deployment import DEPLOYMENT_SOURCE, sim_deployment_text
from shuniu.plugins.tools.plan.estimates import fresh_tokens_rate, replica_work
from shuniu.plugins.tools.plan.report import secs
from shuniu.plugins.tools.plan.results import PlanError, PlanReporter, Rejection, Trial
from shuniu.plugins.tools.plan.shapes import DIMENSIONS, Shape, Space, quality_loss
from shuniu.plugins.tools.plan.workers import simulate_summary
from shuniu.plugins.tools.simulate import StopRule, simulate, stop_allowance

__all__ = [
    "CONFIRM_GROWTH",
    "FLOOR_LOAD",
    "FLOOR_MARGIN",
    "FLOOR_REQUESTS",
    "MAX_GROWTH",
    "MAX_PASSES",
    "ROOFLINE_MARGIN",
    "SATURATION_GAIN",
    "SATURATION_GROWTH",
    "Planner",
]

MAX_PASSES = 2
"""Passes over the knobs (another pass only when the previous one improved the best)."""

ROOFLINE_MARGIN = 2.0
"""A shape whose roofline guess is above this many times the replicas that would beat the
best is rejected without a simulation."""
MAX_GROWTH = 2.0
"""Largest factor on the replica count after a missed search trial."""
CONFIRM_GROWTH = 1.25
"""Largest factor on the replica count when the full-duration confirmation misses (it met a
shorter run: the count it needs is close, and each confirmation is a full-duration run); the
grown count is rounded to the nearest, at least one more."""
SATURATION_GROWTH = 1.5
SATURATION_GAIN = 0.9
"""A count :data:`SATURATION_GROWTH` times larger whose missed ITL p99 is still above this
share of the smaller count's means more replicas do not help (:meth:`Planner._saturated`)."""

FLOOR_LOAD = 0.02
"""Load (share of one replica's estimated capacity) of the unloaded-floor run."""
FLOOR_REQUESTS = 600
"""Requests the unloaded-floor run aims for (its horizon grows up to 10x the search's)."""
FLOOR_MARGIN = 1.05
"""The floor must miss a p99 target by more than this factor to call the SLO unreachable."""


class Planner:
    """One plan's search: it runs (and caches) the trials, finds the unloaded floor of a
    shape, searches a shape's replica count and varies the knobs (:meth:`solve`)."""

    def __init__(
        self,
        *,
        space: Space,
        hardware: str,
        workload: Workload,
        desc: dict[str, Any],
        duration: float,
        search_duration: float,
        seed: int,
        max_replicas: int,
        goodput_target: float | None,
        price: float | None,
        max_model_len: int | None,
        plugins: PluginManager,
        reporter: PlanReporter,
        jobs: int = 1,
    ) -> None:
        self.space = space
        self.jobs = jobs
        self.pool: ProcessPoolExecutor | None = None
        """Worker processes for trials side by side (set by :func:`plan` when ``jobs`` > 1)."""
        self.hardware = hardware
        self.workload = workload
        self.desc = desc
        self.duration = duration
        self.search_duration = search_duration
        self.seed = seed
        self.max_replicas = max_replicas
        self.goodput_target = goodput_target
        self.price = price
        self.max_model_len = max_model_len
        self.plugins = plugins
        self.reporter = reporter
        assert workload.slo is not None
        self.slo = workload.slo
        self.fresh_rate = fresh_tokens_rate(workload, desc)
        self.tried: list[Trial] = []
        self.notes: list[str] = []
        self.rejected: list[Rejection] = []
        self.visited: set[Shape] = set()
        self._cache: dict[tuple[Shape, int, float, float, int], Trial] = {}
        self._floor: dict[Shape, str | None] = {}
        self._floor_trial: dict[Shape, Trial] = {}

    # ----------------------------------------------------------------- simulation

    def deployment(self, shape: Shape, replicas: int) -> str:
        """The deployment a trial of ``replicas`` of ``shape`` simulates."""
        options = shape.options(self.hardware, self.space.model_spec, self.space.util)
        return sim_deployment_text(options, replicas, shape.balancer, self.max_model_len)

    def cost(self, shape: Shape, replicas: int) -> float:
        """What ``replicas`` of ``shape`` cost per hour (devices, without a price)."""
        return replicas * shape.devices * (self.price if self.price is not None else 1.0)

    def cheaper_than(self, shape: Shape, cost: float) -> int:
        """The most replicas of ``shape`` that cost less than ``cost``."""
        return max(0, math.ceil(cost / self.cost(shape, 1) - 1e-9) - 1)

    def load(self, shape: Shape) -> float:
        """Replica-equivalents of work at this shape (the roofline guess; optimistic)."""
        model = self.space.model_at(shape.weight_precision, shape.kv_precision)
        kv = kv_cache_tokens(
            model, self.space.hw, shape.tensor_parallel, self.space.util, pp=shape.pipeline_parallel
        )
        itl = self.slo.itl_p99_s if self.slo.itl_p99_s is not None else self.slo.request_thresholds[1]
        cm = self.space.cost_model(shape)
        decode, prefill = replica_work(cm, self.desc, self.fresh_rate, kv, shape.max_num_seqs, itl)
        if shape.prefill_engines:  # units: each engine takes one part
            return max(prefill / shape.prefill_engines, decode / shape.decode_engines)
        return decode + prefill

    def judge(self, s: dict[str, Any], margin: float = 1.0) -> tuple[list[str], float]:
        """Why a run's summary misses the SLO (empty: it meets it), and its worst ratio of a
        p99 to its target."""
        if not s["requests_completed"]:
            return ["no request completed"], math.inf
        slo = self.slo
        failures = []
        worst = 0.0
        for name, target, value in (
            ("TTFT", slo.ttft_p99_s, s["ttft_p99"]),
            ("ITL", slo.itl_p99_s, s["itl_p99"]),
            ("E2E", slo.e2e_p99_s, s["e2e_p99"]),
        ):
            if target is not None:
                worst = max(worst, value / target)
                if value > target * margin:
                    failures.append(f"{name} p99 {secs(value)} > {secs(target)} ({value / target:.2g}x)")
        if self.goodput_target is not None and s["goodput"] is not None:
            floor = self.goodput_target - (0.01 if margin > 1 else 0.0)
            if s["goodput"] < floor:
                failures.append(f"goodput {s['goodput']:.1%} < {self.goodput_target:.0%}")
        rejected = s["rejected"] / s["requests_arrived"] if s["requests_arrived"] else 0.0
        if rejected > 0.01:
            failures.append(f"{rejected:.1%} rejected (longer than the context window)")
        return failures, worst

    def run(
        self,
        phase: str,
        shape: Shape,
        replicas: int,
        horizon: float,
        scale: float = 1.0,
        seed: int | None = None,
    ) -> Trial:
        seed = self.seed if seed is None else seed
        key = (shape, replicas, horizon, scale, seed)
        if key in self._cache:
            return self._cache[key]
        resolved = load_deployment(DEPLOYMENT_SOURCE, self.plugins, text=self.deployment(shape, replicas))
        workload = self.workload if scale == 1.0 else self.workload.scaled(scale)
        self.reporter.trial_started(phase, shape.label(), replicas, horizon)
        try:
            result = simulate(
                resolved,
                self.plugins,
                workload,
                duration=horizon,
                seed=seed,
                progress=self.reporter.advance,
                stop_after=None if phase == "floor" else self.stop_after(horizon),
            )
        except ValueError as exc:  # the engine refused the configuration
            raise PlanError([Problem("--model", str(exc))], "options") from None
        return self._record(phase, shape, replicas, horizon, scale, seed, result.summary(), result.wall_s)

    def stop_after(self, horizon: float) -> StopRule | None:
        """When a trial's verdict is settled (simulating an overloaded pool to its end is the
        slowest part of a search, and its answer is known): once more requests than the
        target allows of those the horizon brings have taken longer than the TTFT target to
        their first token (1% for the p99; the goodput share for the per-request threshold),
        more inter-token gaps than 1% of the tokens it brings are above the ITL p99 target,
        or more requests than the goodput target allows have missed their own thresholds.
        Expected counts carry a margin (:func:`~shuniu.plugins.tools.simulate.stop.stop_allowance`)."""
        rate = self.desc["request_rate"]
        expected = rate * horizon
        gaps = expected * max(0.0, self.desc["mean_output_tokens"] - 1)
        slo, target = self.slo, self.goodput_target
        ttft_s, ttft_most = None, 0
        if slo.ttft_p99_s is not None:
            ttft_s, ttft_most = slo.ttft_p99_s, stop_allowance(0.01, expected)
        elif slo.ttft_s is not None and target is not None:
            ttft_s, ttft_most = slo.ttft_s, stop_allowance(1 - target, expected)
        itl_s, itl_most = None, 0
        if slo.itl_p99_s is not None and gaps > 0:
            itl_s, itl_most = slo.itl_p99_s, stop_allowance(0.01, gaps)
        missed_most = stop_allowance(1 - target, expected) if target is not None else None
        if ttft_s is None and itl_s is None and missed_most is None:
            return None
        return StopRule(ttft_s, ttft_most, itl_s, itl_most, missed_most)

    def prefetch(self, runs: list[tuple[str, Shape, int, float, int]]) -> None:
        """Run the uncached trials among ``runs`` (phase, shape, replicas, horizon, seed; at
        the workload's own rate) side by side in the worker pool, when there is one and more
        than one trial to run; the search then finds them done."""
        todo: dict[tuple[Shape, int, float, float, int], str] = {}
        for phase, shape, replicas, horizon, seed in runs:
            key = (shape, replicas, horizon, 1.0, seed)
            if key not in self._cache:
                todo.setdefault(key, phase)
        if self.pool is None or len(todo) < 2:
            return
        futures = {}
        for (shape, replicas, horizon, _, seed), phase in todo.items():
            self.reporter.trial_started(phase, shape.label(), replicas, horizon)
            text = self.deployment(shape, replicas)
            args = (DEPLOYMENT_SOURCE, text, self.workload, horizon, seed, self.stop_after(horizon))
            futures[self.pool.submit(simulate_summary, *args)] = (phase, shape, replicas, horizon, seed)
        for future in as_completed(futures):
            phase, shape, replicas, horizon, seed = futures[future]
            try:
                summary, wall = future.result()
            except ValueError as exc:  # the engine refused the configuration
                raise PlanError([Problem("--model", str(exc))], "options") from None
            self._record(phase, shape, replicas, horizon, 1.0, seed, summary, wall)

    def _record(
        self,
        phase: str,
        shape: Shape,
        replicas: int,
        horizon: float,
        scale: float,
        seed: int,
        s: dict[str, Any],
        wall_s: float,
    ) -> Trial:
        """A finished run as a :class:`Trial`, cached and reported."""
        key = (shape, replicas, horizon, scale, seed)
        failures, worst = self.judge(s, FLOOR_MARGIN if phase == "floor" else 1.0)
        if s.get("stopped_at") is not None:
            failures.append(f"stopped at {s['stopped_at']:,.0f} s: {s['stopped_because']}")
        trial = Trial(
            phase=phase,
            tensor_parallel=shape.tensor_parallel,
            pipeline_parallel=shape.pipeline_parallel,
            engines=shape.engines,
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
            wall_s=wall_s,
            config=shape.to_dict(),
            label=shape.label(),
            cost_per_hour=self.cost(shape, replicas),
            seed=seed,
            worst=worst,
            stopped_at=s.get("stopped_at"),
        )
        self._cache[key] = trial
        self.tried.append(trial)
        self.reporter.trial_finished(trial)
        return trial

    # ----------------------------------------------------------------- the floor

    def unreachable(self, shape: Shape, *, run: bool = True) -> str | None:
        """Why no replica count of ``shape`` can meet the SLO (None: it may). The cost model's
        single-iteration times are checked first; with ``run`` an unloaded run follows."""
        if shape in self._floor:
            return self._floor[shape]
        cm = self.space.cost_model(shape)
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
            load = self.load(shape)
            scale = min(1.0, FLOOR_LOAD / load) if load > 0 else 1.0
            horizon = self.search_duration
            if rate > 0:
                horizon = min(10 * self.search_duration, max(horizon, FLOOR_REQUESTS / (rate * scale)))
            trial = self.run("floor", shape, 1, horizon, scale)
            self._floor_trial[shape] = trial
            reason = None
            if trial.failures:
                reason = (
                    f"even unloaded (1 replica at {scale:.2g}x the arrival rate) it misses: "
                    + "; ".join(trial.failures)
                )
        self._floor[shape] = reason
        return reason

    # ----------------------------------------------------------------- one shape's count

    def excess(self, shape: Shape, trial: Trial) -> float:
        """How far a trial is from the SLO: the largest ratio over the targets of the metric's
        excess above its unloaded value to the target's (above 1: missed; None-free). The
        goodput's shortfall counts only when every p99 is met: once a p99 misses, the share
        of requests over their thresholds climbs far faster than the load above capacity
        (12x the allowed share at a 1.3x TTFT miss), so it would overshoot the growth."""
        slo = self.slo
        floor = self._floor_trial.get(shape)
        ctx = max(1, round(self.desc["mean_input_tokens"] + self.desc["mean_output_tokens"] / 2))
        itl_floor = floor.itl_p99 if floor else self.space.cost_model(shape).decode_time(1, ctx)
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
        if ratio <= 1.0 and target_share is not None and share is not None:
            ratio = max(ratio, (1 - share) / max(1 - target_share, 1e-3))
        return ratio

    def growth(self, shape: Shape, trial: Trial) -> float:
        """Factor on the replica count after a failed trial (1.1 to :data:`MAX_GROWTH`): the
        excess, taken as inversely proportional to the replica count, plus 10%."""
        ratio = self.excess(shape, trial)
        if ratio <= 1.0:  # failed for another reason (rejections, nothing completed)
            ratio = 2.0
        return min(MAX_GROWTH, max(1.1, ratio * 1.1))

    def search(
        self,
        shape: Shape,
        horizon: float,
        phase: str,
        guess: int,
        lo: int,
        cap: int,
        seed: int | None = None,
        alongside: Callable[[int], list[tuple[str, Shape, int, float, int]]] | None = None,
    ) -> int | None:
        """Smallest replica count in ``(lo, cap]`` meeting the SLO over ``horizon`` (counts up
        to ``lo`` are taken to fail); None when none does (or the SLO is unreachable).
        ``alongside(n)``: other trials to run side by side with the one at ``n`` (ones the
        caller will need whatever it shows; :meth:`prefetch`).

        Grows by :meth:`growth` until a count meets (stopping early when more replicas stop
        helping, :meth:`_saturated`), then narrows the bracket by geometric bisection
        (:meth:`_after_meeting`). With worker processes, the counts it would try next if the
        current one meets run side by side with it: the same trials and the same answer as
        one at a time, in fewer rounds."""
        if lo >= cap:
            return None
        seed = self.seed if seed is None else seed
        hi: int | None = None
        lo_trial: Trial | None = None
        failures = 0
        first = n = max(lo + 1, min(guess, cap))
        while True:
            if self.pool is not None:
                # Side by side with n: what the caller needs anyway, then the counts this
                # search tries next if n (and each of those) meets; the same trials as one
                # at a time, sooner (a miss only wastes a worker's time).
                runs = [(phase, shape, n, horizon, seed)]
                if alongside is not None:
                    runs += alongside(n)
                m, top = n, n
                while len(runs) < self.jobs:
                    m = self._after_meeting(lo, top, lo_trial is not None, m == first)
                    if m is None:
                        break
                    runs.append((phase, shape, m, horizon, seed))
                    top = m
                self.prefetch(runs)
            trial = self.run(phase, shape, n, horizon, seed=seed)
            if trial.met:
                hi = n
            else:
                previous = lo_trial
                lo, lo_trial = n, trial
                failures += 1
                if hi is None and previous is not None and self._saturated(shape, previous, trial):
                    return None
                # Growing again after a second failure: first make sure more replicas can help.
                if hi is None and failures >= 2 and lo < cap and self.unreachable(shape) is not None:
                    return None
            if hi is None:
                if lo >= cap:
                    return None
                factor = self.growth(shape, trial)
                if phase == "confirm":
                    # It met a shorter run, so the count it needs is close: grown by at most
                    # CONFIRM_GROWTH, rounded to the nearest count (each confirmation is a
                    # full-duration run; rounding up turned 5 into 7 where 6 was the answer).
                    grown = round(lo * min(factor, CONFIRM_GROWTH))
                else:
                    grown = math.ceil(lo * factor)
                n = min(cap, max(lo + 1, grown))
            else:
                after = self._after_meeting(lo, hi, lo_trial is not None, n == first)
                if after is None:
                    return hi
                n = after

    @staticmethod
    def _after_meeting(lo: int, hi: int, missed_before: bool, was_first: bool) -> int | None:
        """The count a search tries after ``hi`` met with ``lo`` the most known to miss (None:
        ``hi`` is the answer). When nothing tried has missed yet and ``hi`` was the first
        guess, its predecessor (the guess is optimistic: it most likely fails); otherwise
        the geometric middle of the bracket: the excess is too flat near an iteration-bound
        target (ITL) for interpolation to land well, and counts are compared by ratio."""
        if hi - lo <= 1:
            return None
        if not missed_before:
            return hi - 1 if was_first else (lo + hi) // 2
        return min(hi - 1, max(lo + 1, round(math.sqrt(lo * hi))))

    def _saturated(self, shape: Shape, fewer: Trial, more: Trial) -> bool:
        """Whether adding replicas stopped helping the ITL: at least
        :data:`SATURATION_GROWTH` times the replicas left a missed p99 ITL within
        :data:`SATURATION_GAIN` of where it was. That is an iteration-level limit (a prefill
        chunk that makes the iterations it joins too long, a slow single step) which more
        replicas do not cure. The reason is kept for the report."""
        target = self.slo.itl_p99_s
        if target is None or more.replicas < SATURATION_GROWTH * fewer.replicas:
            return False
        if more.itl_p99 <= target or more.itl_p99 < SATURATION_GAIN * fewer.itl_p99:
            return False
        self._floor[shape] = (
            f"more replicas do not help: from {fewer.replicas} to {more.replicas} replicas the ITL p99 "
            f"stays at {secs(more.itl_p99)} (target {secs(target)})"
        )
        return True

    # ----------------------------------------------------------------- the knobs

    def guess(self, shape: Shape) -> int:
        return max(1, math.ceil(self.load(shape)))

    def reject(self, shape: Shape, against: Shape | None, replicas: int, reason: str) -> None:
        change = shape.change(against) if against is not None else "the start"
        self.rejected.append(Rejection(shape.label(), change, replicas, reason))

    def attempt(self, shape: Shape, against: Shape | None, best: Trial | None) -> Trial | None:
        """Try ``shape`` against the best so far: its search trial at the fewest replicas
        meeting the SLO when that costs less than ``best``, else None (with the reason kept)."""
        self.visited.add(shape)
        cap = self.max_replicas
        if best is not None:
            cap = min(cap, self.cheaper_than(shape, best.cost_per_hour))
            if cap < 1:
                self.reject(
                    shape, against, 0, f"one replica costs as much as the best ({best.devices} devices)"
                )
                return None
        why = self.unreachable(shape, run=False)
        if why is not None:
            self.reject(shape, against, 0, why)
            return None
        guess = self.guess(shape)
        if guess > ROOFLINE_MARGIN * cap:
            # The roofline guess is rough (it can land above the answer): only a clear
            # shortfall is rejected without a simulation.
            self.reject(
                shape,
                against,
                guess,
                f"the roofline estimate is {guess} replicas; {cap} is the most that would cost less",
            )
            return None
        if best is not None:
            above = self._failed_at_or_above(shape, cap)
            if above is not None:  # a side-by-side probe at a higher count already missed
                self.reject(
                    shape,
                    against,
                    above.replicas,
                    f"misses at {above.replicas} replicas: " + "; ".join(above.failures),
                )
                return None
            probe = self.run("probe", shape, cap, self.search_duration)
            if not probe.met:
                self.reject(shape, against, cap, f"misses at {cap} replicas: " + "; ".join(probe.failures))
                return None
        n = self.search(shape, self.search_duration, "search", guess, 0, cap)
        if n is None:
            floor = self._floor.get(shape)
            reason = floor or f"no count up to {cap} replicas meets the SLO"
            self.reject(shape, against, cap, reason)
            return None
        return self._cache[(shape, n, self.search_duration, 1.0, self.seed)]

    def _failed_at_or_above(self, shape: Shape, replicas: int) -> Trial | None:
        """A search-horizon trial of ``shape`` at ``replicas`` or more that missed (fewer
        replicas are taken to miss too)."""
        for (s, n, horizon, scale, seed), t in self._cache.items():
            if s == shape and n >= replicas and horizon == self.search_duration and scale == 1.0:
                if seed == self.seed and not t.met:
                    return t
        return None

    def _probes(self, shapes: list[Shape], best: Trial | None) -> list[tuple[str, Shape, int, float, int]]:
        """The probe trials :meth:`attempt` would run first for each of ``shapes``."""
        runs = []
        for shape in shapes:
            if best is None or self.unreachable(shape, run=False) is not None:
                continue
            cap = min(self.max_replicas, self.cheaper_than(shape, best.cost_per_hour))
            if cap >= 1 and self.guess(shape) <= ROOFLINE_MARGIN * cap:
                runs.append(("probe", shape, cap, self.search_duration, self.seed))
        return runs

    def solve(self, start: Shape) -> tuple[Shape, Trial] | None:
        """The cheapest shape and count found from ``start`` (see the module's docstring),
        confirmed over the full duration; None when nothing meets."""
        best: tuple[Shape, Trial] | None = None
        trial = self.attempt(start, None, None)
        if trial is not None:
            best = (start, trial)
        for _ in range(MAX_PASSES):
            improved = False
            for dimension in DIMENSIONS:
                center = best[0] if best is not None else start
                shapes = [x for x in self.space.neighbours(center, dimension) if x not in self.visited]
                for batch in self._waves(dimension, center, shapes):
                    batch = [x for x in batch if not self._chunk_settled(x, center, best)]
                    self.prefetch(self._probes(batch, best[1] if best is not None else None))
                    for shape in batch:
                        trial = self.attempt(shape, center, best[1] if best is not None else None)
                        if trial is not None and (best is None or self.better(trial, best[1])):
                            best = (shape, trial)
                            improved = True
            if not improved:
                break
        if best is None:
            return None
        shape, found = best
        # The answer, over the full duration on another sample of the workload (and, with
        # workers to spare, the closest runners-up at once, in case it grows past them).
        confirm_seed = self.seed + 1
        runs = [("confirm", shape, found.replicas, self.duration, confirm_seed)]
        for other in self._runners_up(shape)[: max(0, self.jobs - 1)]:
            runs.append(("confirm", Shape(**other.config), other.replicas, self.duration, confirm_seed))
        self.prefetch(runs)

        def companions(n: int) -> list[tuple[str, Shape, int, float, int]]:
            # Runners-up that rank no worse than the answer at n are confirmed whether or not
            # n meets: run the closest of them side by side with it.
            todo = []
            for other in self._runners_up(shape):
                other_shape = Shape(**other.config)
                key = (other_shape, other.replicas, self.duration, 1.0, confirm_seed)
                if key not in self._cache and self.rank(other_shape, other.replicas) <= self.rank(shape, n):
                    todo.append(("confirm", other_shape, other.replicas, self.duration, confirm_seed))
            return todo[: max(0, self.jobs - 1)]

        n = self.search(
            shape,
            self.duration,
            "confirm",
            found.replicas,
            found.replicas - 1,
            self.max_replicas,
            seed=confirm_seed,
            alongside=companions if self.pool is not None else None,
        )
        if n is None:
            self.notes.append(
                f"{shape.label()} met the SLO over {self.search_duration:,.0f} s with "
                f"{found.replicas} replicas but no count up to {self.max_replicas} meets it "
                f"over {self.duration:,.0f} s"
            )
            return None
        confirmed = self._cache[(shape, n, self.duration, 1.0, confirm_seed)]
        if n > found.replicas:
            self.notes.append(
                f"over the full {self.duration:,.0f} s {shape.label()} needed {n} replicas "
                f"instead of {found.replicas}"
            )
        # Others that met the short run for less (or for as much at the model's own
        # precision) are confirmed too: the answer may have grown past them.
        answer = (shape, confirmed)
        for other in self._runners_up(shape):
            current = answer[1]
            if not self.better(other, current):
                continue
            other_shape = Shape(**other.config)
            cap = self.most_that_beat(other_shape, current)
            n = self.search(
                other_shape,
                self.duration,
                "confirm",
                other.replicas,
                other.replicas - 1,
                cap,
                seed=confirm_seed,
            )
            if n is not None:
                trial = self._cache[(other_shape, n, self.duration, 1.0, confirm_seed)]
                if self.better(trial, current):
                    answer = (other_shape, trial)
        return answer

    def _waves(self, dimension: str, center: Shape, shapes: list[Shape]) -> list[list[Shape]]:
        """The order in which one knob's values are tried, in waves run side by side: all at
        once, except the chunks above ``center``'s, smallest first and as many at a time as
        there are workers, so that one missing its ITL target settles the larger ones
        (:meth:`_chunk_settled`) before they are run."""
        if dimension != "max_num_batched_tokens":
            return [shapes]
        chunk = center.max_num_batched_tokens
        smaller = [x for x in shapes if x.max_num_batched_tokens < chunk]
        larger = sorted(
            (x for x in shapes if x.max_num_batched_tokens > chunk), key=lambda x: x.max_num_batched_tokens
        )
        step = max(1, self.jobs)
        return [smaller, *(larger[i : i + step] for i in range(0, len(larger), step))]

    def _chunk_settled(self, shape: Shape, center: Shape, best: tuple[Shape, Trial] | None) -> bool:
        """Whether ``shape``, a larger chunk than ``center``'s and otherwise the same, is
        rejected without a simulation (and is, with the reason): a chunk between the two
        already missed the ITL target at as many replicas or more. A larger chunk only
        lengthens the iterations that carry one, which is what sets a missed ITL p99."""
        chunk = shape.max_num_batched_tokens
        if best is None or chunk <= center.max_num_batched_tokens:
            return False
        if shape != dataclasses.replace(center, max_num_batched_tokens=chunk):
            return False
        cap = min(self.max_replicas, self.cheaper_than(shape, best[1].cost_per_hour))
        for smaller in (c for c in self.space.chunks if center.max_num_batched_tokens < c < chunk):
            other = dataclasses.replace(center, max_num_batched_tokens=smaller)
            missed = self._failed_at_or_above(other, cap) if other in self.visited else None
            if missed is not None and any(f.startswith("ITL") for f in missed.failures):
                self.visited.add(shape)
                self.reject(
                    shape,
                    center,
                    missed.replicas,
                    f"chunk {smaller} already missed at {missed.replicas} replicas: "
                    + "; ".join(missed.failures),
                )
                return True
        return False

    def _runners_up(self, shape: Shape) -> list[Trial]:
        """The cheapest short-run trial meeting the SLO of every other shape, cheapest first."""
        best: dict[str, Trial] = {}
        for t in self.tried:
            if t.met and t.phase in ("search", "probe") and t.duration_s == self.search_duration:
                if t.label != shape.label() and (t.label not in best or self.better(t, best[t.label])):
                    best[t.label] = t
        return sorted(best.values(), key=lambda t: (t.cost_per_hour, self.loss(t.config), t.ttft_p99))

    def loss(self, config: dict[str, Any]) -> int:
        """The quality-loss rank of a configuration's precisions (0: the model's own)."""
        return quality_loss(config["weight_precision"], config["kv_precision"], *self.space.native)

    def rank(self, shape: Shape, replicas: int) -> tuple[float, int, int]:
        """What orders configurations before their latency: cost, devices, quality loss."""
        cost = round(self.cost(shape, replicas), 6)
        return (cost, replicas * shape.devices, self.loss(shape.to_dict()))

    def trial_rank(self, trial: Trial) -> tuple[float, int, int]:
        """:meth:`rank` of a trial's configuration and count."""
        return (round(trial.cost_per_hour, 6), trial.devices, self.loss(trial.config))

    def better(self, a: Trial, b: Trial) -> bool:
        """Cheaper; at the same cost, fewer devices, then the smaller quality loss (the
        model's own precision first), then the lower p99 TTFT."""
        return (*self.trial_rank(a), a.ttft_p99) < (*self.trial_rank(b), b.ttft_p99)

    def most_that_beat(self, shape: Shape, trial: Trial) -> int:
        """The most replicas of ``shape`` that rank before ``trial`` whatever their latency
        (cheaper, or as cheap with fewer devices or a smaller quality loss): a confirmation
        run is not spent on a tie that only the p99 TTFT would break."""
        target = self.trial_rank(trial)
        n = min(self.max_replicas, math.floor(trial.cost_per_hour / self.cost(shape, 1) + 1e-9))
        while n > 0 and self.rank(shape, n) >= target:
            n -= 1
        return n

    def frontier(self) -> list[Trial]:
        """Search trials no other beats on cost, p99 TTFT and p99 ITL together, cheapest first
        (of those that ran to their end: a stopped run's p99s are only those of its start)."""
        pool = [
            t
            for t in self.tried
            if t.phase in ("search", "probe")
            and t.rate_scale == 1.0
            and t.duration_s == self.search_duration
            and t.stopped_at is None
        ]
        keys = [(t.cost_per_hour, t.ttft_p99, t.itl_p99) for t in pool]
        out = []
        for t, k in zip(pool, keys, strict=True):
            dominated = any(o != k and all(a <= b for a, b in zip(o, k, strict=True)) for o in keys)
            if not dominated and all(k != (u.cost_per_hour, u.ttft_p99, u.itl_p99) for u in out):
                out.append(t)
        return sorted(out, key=lambda t: (t.cost_per_hour, t.ttft_p99))
