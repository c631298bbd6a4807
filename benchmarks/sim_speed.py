"""How fast ``shuniu simulate`` runs: simulated seconds per wall second, with decode leaps and
without (one event per engine iteration), alternating, on the same deployment and workload.

Usage::

    .venv/bin/python benchmarks/sim_speed.py                  # 4 x H200 8B, shared-prefix chat at 50 req/s
    .venv/bin/python benchmarks/sim_speed.py --rounds 3 --duration 300
    .venv/bin/python benchmarks/sim_speed.py --hardware ascend-910b --model llama-3.1-70b --tp 8 --replicas 6

The workload is ``examples/workloads/chat-shared-prefix.yaml`` scaled so its steady rate is
``--rate`` requests/s (it ramps up over the first minute or two as conversations lengthen).
Each round runs the leap setting and the stepping one back to back, so a slower moment of a
shared machine hits both; the table has each setting's median and the runs agree on every
latency figure (the script checks). Startup (imports, plugins) is not counted: ``wall_s`` is
the simulation's own.
"""

from __future__ import annotations

import argparse
import statistics
import textwrap
from pathlib import Path

from shuniu.core.config.loader import load_deployment
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.traffic import describe, load_workload
from shuniu.plugins.tools.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("requests_completed", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "e2e_p99", "prefix_hit_rate")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hardware", default="h200")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--balancer", default="prefix_affinity")
    ap.add_argument("--rate", type=float, default=50.0, help="steady requests/s")
    ap.add_argument("--duration", type=float, default=300.0, help="simulated seconds")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    plugins = load_plugins()
    base = load_workload(ROOT / "examples" / "workloads" / "chat-shared-prefix.yaml")
    workload = base.scaled(args.rate / describe(base)["request_rate"])
    text = textwrap.dedent(
        f"""
        models:
          m:
            balancer: {{policy: {args.balancer}}}
            endpoints:
              - kind: sim
                replicas: {args.replicas}
                max_concurrency: 0
                options: {{hardware: {args.hardware}, model: {args.model}, tensor_parallel_size: {args.tp},
                           max_num_batched_tokens: {args.chunk}}}
        """
    )
    walls: dict[str, list[float]] = {"leaps": [], "stepping": []}
    seen: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for name, leap in (("leaps", 512), ("stepping", 1)):
            resolved = load_deployment(None, plugins, text=text)
            result = simulate(resolved, plugins, workload, duration=args.duration, seed=0, leap_steps=leap)
            s = result.summary()
            walls[name].append(result.wall_s)
            seen[name] = {k: s[k] for k in CHECKED}
            sim_s = s["sim_time_s"]
            print(
                f"{name:>8}: {s['requests_completed']:,} requests, {sim_s:,.0f} simulated s in "
                f"{result.wall_s:.2f} s = {sim_s / result.wall_s:.0f}x real time",
                flush=True,
            )
    for key in CHECKED:
        a, b = seen["leaps"][key], seen["stepping"][key]
        assert abs(a - b) <= 1e-9 * max(1.0, abs(b)), f"{key} differs: {a} vs {b}"
    print(
        f"\n{args.replicas} x {args.model} TP {args.tp} on {args.hardware}, chunk {args.chunk}, "
        f"{args.balancer}, {args.rate:g} req/s, {args.duration:,.0f} simulated s, median of {args.rounds}:"
    )
    print(f"{'':>10} {'wall s':>8} {'x real time':>12} {'us / request':>13}")
    n = seen["leaps"]["requests_completed"]
    for name, values in walls.items():
        wall = statistics.median(values)
        print(f"{name:>10} {wall:8.2f} {args.duration / wall:12.0f} {wall / n * 1e6:13,.0f}")
    print("(the same latencies either way: checked)")


if __name__ == "__main__":
    main()
