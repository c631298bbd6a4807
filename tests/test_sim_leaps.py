"""Decode leaps: a simulated engine that runs stretches of decode-only iterations as one event
gives the same run as one event per iteration, only with fewer events."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from shuniu.backends.sim import SimBackend
from shuniu.core.config.loader import load_deployment
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.traffic import load_workload
from shuniu.plugins.tools.simulate import simulate
from tests.test_simulate import WORKLOADS

COMPARED = (
    "requests_arrived",
    "requests_completed",
    "preemptions",
    "rejected",
    "unfinished",
    "ttft_p50",
    "ttft_p99",
    "itl_p50",
    "itl_p99",
    "e2e_p50",
    "e2e_p99",
    "prefix_hit_rate",
    "throughput_tokens_per_s",
    "sim_time_s",
)


def _run(deployment: str, workload: Any, duration: float, leap_steps: int) -> tuple[dict[str, Any], int, int]:
    """The run's summary, and the engines' iterations and timers (events) summed."""
    plugins = load_plugins()
    resolved = load_deployment(None, plugins, text=textwrap.dedent(deployment))
    engines = []
    original = SimBackend.__init__

    def keep(self: SimBackend, spec: Any) -> None:
        original(self, spec)
        engines.append(self.engine)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SimBackend, "__init__", keep)
        result = simulate(resolved, plugins, workload, duration=duration, seed=3, leap_steps=leap_steps)
    return (
        result.summary(),
        sum(e.core.iterations for e in engines),
        sum(e.timers for e in engines),
    )


def _deployment(options: str, replicas: int, balancer: str) -> str:
    return f"""
    models:
      m:
        balancer: {{policy: {balancer}}}
        endpoints:
          - kind: sim
            replicas: {replicas}
            max_concurrency: 0
            options: {options}
    """


CASES = {
    # multi-turn chat with shared system prompts: prefix hits, histories, many finishes
    "chat": (
        _deployment("{hardware: h200, model: llama-3.1-8b}", 2, "prefix_affinity"),
        "chat-shared-prefix.yaml",
        40.0,
        0.5,
    ),
    # a KV cache too small for the load: preemptions, waiting sequences, evictions
    "kv-pressure": (
        _deployment(
            "{hardware: h200, model: llama-3.1-8b, kv_cache_tokens: 12000, max_num_batched_tokens: 512}",
            2,
            "round_robin",
        ),
        "shared-prompts-kv-pressure.yaml",
        30.0,
        1.0,
    ),
    # chat under a small KV cache: preemptions, with arrivals and iteration ends at the same
    # virtual time (the loop keeps such ties in the order they were set, whatever the
    # number of timers, so leaps and steps see them alike)
    "chat-kv-pressure": (
        _deployment(
            "{hardware: h200, model: llama-3.1-8b, kv_cache_tokens: 30000, max_num_batched_tokens: 1024}",
            2,
            "round_robin",
        ),
        "chat-shared-prefix.yaml",
        40.0,
        1.2,
    ),
    "heavy-kv-pressure": (
        _deployment(
            "{hardware: h200, model: llama-3.1-8b, kv_cache_tokens: 12000, max_num_batched_tokens: 1024}",
            2,
            "round_robin",
        ),
        "shared-prompts-kv-pressure.yaml",
        30.0,
        2.0,
    ),
    # the calibrated CPU profile: seeded step jitter and a per-request admission cost
    "jitter": (
        _deployment(
            "{hardware: cpu-tiny, model: tiny-llama, max_num_seqs: 16, max_model_len: 4096}", 1, "round_robin"
        ),
        "poisson-simple.yaml",
        30.0,
        0.05,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_leaps_change_nothing_but_the_events(case: str) -> None:
    deployment, workload_file, duration, scale = CASES[case]
    workload = load_workload(WORKLOADS / workload_file).scaled(scale)
    stepped, iterations, timers = _run(deployment, workload, duration, leap_steps=1)
    leapt, leapt_iterations, leapt_timers = _run(deployment, workload, duration, leap_steps=512)
    assert stepped["requests_completed"] > 20
    assert leapt_iterations == iterations  # the same iterations ran...
    assert timers == iterations  # (one timer each, stepping)
    # ...in fewer events (far fewer unless sequences wait for KV blocks most of the time)
    assert leapt_timers < iterations * (0.9 if case == "heavy-kv-pressure" else 0.5)
    for key in COMPARED:
        assert leapt[key] == pytest.approx(stepped[key], rel=1e-9, abs=1e-12), key
    for name, endpoint in stepped["per_endpoint"].items():  # busy time: a leap's, cuts taken off
        busy = leapt["per_endpoint"][name]["busy_share"]
        assert busy == pytest.approx(endpoint["busy_share"], rel=1e-9), name
    if "kv-pressure" in case:
        assert stepped["preemptions"] > 0
