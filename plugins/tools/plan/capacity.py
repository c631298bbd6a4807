"""One replica's capacity at a token mix: the highest Poisson arrival rate at which one
simulated replica of an engine meets an SLO. The ``simulated`` capacity model behind the
autoscaling signals (``autoscaling.capacity``) asks this once per token mix.

The search: a first guess (the roofline estimate of :mod:`.estimates` with hardware and
model profiles, else 1 request/s), doubled while it meets the SLO or halved while it misses,
then narrowed by geometric bisection between the highest rate known to meet and the lowest
known to miss. Every trial runs one replica (``max_concurrency: 0``, ``fifo``) for
``duration_s`` simulated seconds (longer at low rates, so a trial holds at least
:data:`MIN_REQUESTS` requests) with a fixed seed, so the answer is repeatable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from shuniu.core.config.loader import load_deployment
from shuniu.core.contracts import TokenMix
from shuniu.core.plugin_manager import PluginManager
from shuniu.core.traffic import Slo, Workload, describe
from shuniu.plugins.tools.plan.deployment import sim_deployment_text
from shuniu.plugins.tools.plan.estimates import fresh_tokens_rate, replica_work
from shuniu.plugins.tools.simulate import simulate

__all__ = ["MIN_REQUESTS", "mix_workload", "replica_capacity"]

MIN_REQUESTS = 300
"""Requests a trial holds at least (its horizon grows at low rates, up to 20x)."""
LOWEST_RATE = 1e-3
"""Below this many requests per second the SLO counts as out of reach."""


def mix_workload(
    mix: TokenMix,
    rate: float,
    slo: Slo,
    duration_s: float,
    *,
    sigma: float = 0.6,
    prefix_groups: int = 4,
    max_model_len: int | None = None,
) -> Workload:
    """Poisson arrivals at ``rate`` whose lengths have the means of ``mix`` (log-normal,
    ``sigma``); the cached share is modelled as ``prefix_groups`` shared system prompts of
    that share of the prompt."""
    prompt = max(1.0, mix.prompt_tokens)
    shared = round(prompt * min(max(mix.cached_share, 0.0), 0.95))
    fresh = max(1.0, prompt - shared)
    limit_in = limit_out = None
    if max_model_len is not None:
        limit_out = max(1, max_model_len // 4)
        limit_in = max(1, max_model_len - shared - limit_out)
    stream: dict[str, Any] = {
        "arrival": {"process": "poisson", "rate": rate},
        "input_tokens": {"dist": "lognormal", "mean": fresh, "sigma": sigma, "min": 1, "max": limit_in},
        "output_tokens": {
            "dist": "lognormal",
            "mean": max(1.0, mix.output_tokens),
            "sigma": sigma,
            "min": 1,
            "max": limit_out,
        },
    }
    if shared >= 1:
        stream["system_prompts"] = {"count": prefix_groups, "tokens": {"dist": "fixed", "value": shared}}
    return Workload.model_validate(
        {"name": "capacity", "duration_s": duration_s, "slo": slo.model_dump(), "streams": [stream]}
    )


def _first_guess(engine: Mapping[str, Any], workload: Workload, slo: Slo) -> float:
    """Requests per second the roofline model says one replica carries (optimistic), or 1."""
    if engine.get("hardware") is None or engine.get("model") is None:
        return 1.0
    from shuniu.backends.sim import CostModel, kv_cache_tokens, load_hardware, load_model

    model, hw = load_model(engine["model"]), load_hardware(engine["hardware"])
    tp = int(engine.get("tensor_parallel_size", 1))
    pp = int(engine.get("pipeline_parallel_size", 1))
    util = float(engine.get("gpu_memory_utilization", 0.9))
    desc = describe(workload)
    decode, prefill = replica_work(
        CostModel(model, hw, tp, pp),
        desc,
        fresh_tokens_rate(workload, desc),
        kv_cache_tokens(model, hw, tp, util, pp=pp),
        int(engine.get("max_num_seqs", 256)),
        slo.itl_p99_s,
    )
    load = decode + prefill
    rate = desc["request_rate"]
    return rate / load if load > 0 else 1.0


def replica_capacity(
    engine: Mapping[str, Any],
    mix: TokenMix,
    slo: Slo,
    plugins: PluginManager,
    *,
    duration_s: float = 120.0,
    seed: int = 0,
    steps: int = 6,
    sigma: float = 0.6,
    prefix_groups: int = 4,
    max_model_len: int | None = None,
) -> float:
    """Requests per second one replica of ``engine`` (the ``sim`` backend's options) serves
        at ``mix`` while meeting ``slo``'s p99 targets (the ITL target on each request's mean
    inter-token latency, as the gateway's metric measures it); 0 when even
    :data:`LOWEST_RATE` misses."""
    text = sim_deployment_text(engine, 1, "round_robin", max_model_len)
    resolved = load_deployment("<capacity deployment>", plugins, text=text)

    def meets(rate: float) -> bool:
        horizon = min(max(duration_s, MIN_REQUESTS / rate), 20 * duration_s)
        workload = mix_workload(
            mix, rate, slo, horizon, sigma=sigma, prefix_groups=prefix_groups, max_model_len=max_model_len
        )
        result = simulate(resolved, plugins, workload, seed=seed, drain_s=horizon)
        s = result.summary()
        if not result.requests_completed or result.unfinished or result.rejected:
            return False
        # ITL as the gateway measures it: each request's mean gap, its p99 over requests.
        return slo.satisfied(ttft_p99=s["ttft_p99"], itl_p99=s["tpot_p99"], e2e_p99=s["e2e_p99"])

    guess = _first_guess(engine, mix_workload(mix, 1.0, slo, duration_s), slo)
    lo, hi = 0.0, math.inf
    rate = max(guess, LOWEST_RATE)
    for _ in range(40):  # doubling or halving until the bracket closes
        if meets(rate):
            lo = rate
            if hi < math.inf:
                break
            rate *= 2
        else:
            hi = rate
            if lo > 0:
                break
            rate /= 2
            if rate < LOWEST_RATE:
                return 0.0
    if lo == 0.0:
        return 0.0
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo
