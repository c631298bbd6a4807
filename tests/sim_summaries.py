"""Simulations whose summaries must not depend on how the simulator was built: run as a
script (``python -m tests.sim_summaries``), it prints one JSON line per deployment and leap
setting, then one with the modules it ran compiled. tests/test_compiled_build.py runs it on the
pure-Python sources and on a compiled build and compares the lines.

The deployments reach the engine's paths: prefix affinity and the KV events of
``precise_prefix``, a KV cache tight enough to evict and preempt, the engine's priority
scheduling, a prefill/decode split, gateway queues with timeouts and sheds, injected faults,
V0's prefill-first scheduling, and pipeline stages; each with decode leaps and stepping.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_8B = "hardware: h200, model: llama-3.1-8b"
_QUEUED = "scheduler: {policy: priority, options: {max_wait_s: 2.0, max_queue: 40}}"
_FAULTS = "faults: {error_rate: 0.05, spike_rate: 0.1, spike_s: 0.5, seed: 3}"
_V0 = (
    "prefill_first: true, enable_chunked_prefill: false, max_model_len: 32768, max_num_batched_tokens: 32768"
)
DEPLOYMENTS: dict[str, tuple[float, str, str, int, str, str]] = {
    # name: (requests/s, balancer, sim options, replicas, endpoint line, model line)
    "affinity": (50, "prefix_affinity", f"{_8B}, max_num_batched_tokens: 2048", 4, "", ""),
    "precise": (50, "precise_prefix", f"{_8B}, max_num_batched_tokens: 2048", 4, "", ""),
    "tight": (40, "round_robin", f"{_8B}, kv_cache_tokens: 60000, max_num_batched_tokens: 1024", 3, "", ""),
    "priority": (40, "least_load", f"{_8B}, kv_cache_tokens: 50000, scheduling_policy: priority", 3, "", ""),
    "disagg": (30, "prefix_affinity", f"{_8B}, prefill_engines: 1, decode_engines: 2, kv_cache_tokens: 80000", 1, "", ""),  # noqa: E501
    "queue": (60, "prefix_affinity", f"{_8B}, kv_cache_tokens: 80000", 2, "max_concurrency: 12", _QUEUED),
    "faults": (30, "round_robin", f"{_8B}, {_FAULTS}", 2, "", ""),
    "v0": (30, "round_robin", f"{_8B}, {_V0}, kv_cache_tokens: 60000", 2, "", ""),
    "stages": (20, "least_load", "hardware: h200, model: llama-3.1-70b, tensor_parallel_size: 2, pipeline_parallel_size: 2", 1, "", ""),  # noqa: E501
}  # fmt: skip
WALL_FIELDS = ("wall_s", "simulated_requests_per_wall_s")
"""Summary fields that measure the run itself, not the simulated system."""


def summaries(duration: float) -> list[str]:
    """One line per deployment and leap setting: ``name leaps {summary}``."""
    from shuniu.core.config.loader import load_deployment
    from shuniu.core.plugin_manager import load_plugins
    from shuniu.core.traffic import describe, load_workload
    from shuniu.plugins.tools.simulate import simulate

    plugins = load_plugins()
    base = load_workload(ROOT / "examples" / "workloads" / "chat-shared-prefix.yaml")
    lines = []
    for name, (rate, balancer, options, replicas, endpoint, model) in DEPLOYMENTS.items():
        text = textwrap.dedent(
            f"""
            models:
              m:
                balancer: {{policy: {balancer}}}
                {model}
                endpoints:
                  - kind: sim
                    replicas: {replicas}
                    {endpoint or "max_concurrency: 0"}
                    options: {{{options}}}
            """
        )
        resolved = load_deployment(None, plugins, text=text)
        workload = base.scaled(rate / describe(base)["request_rate"])
        for leaps in (512, 1):
            summary = simulate(
                resolved, plugins, workload, duration=duration, seed=1, leap_steps=leaps
            ).summary()
            for key in WALL_FIELDS:
                summary.pop(key, None)
            lines.append(f"{name} {leaps} {json.dumps(summary, sort_keys=True, default=str)}")
    return lines


def main() -> None:
    from shuniu.backends.sim import compiled_modules

    for line in summaries(float(sys.argv[1]) if len(sys.argv) > 1 else 30.0):
        print(line, flush=True)
    print("compiled " + json.dumps(compiled_modules()))


if __name__ == "__main__":
    main()
