"""Prefix routing under KV-cache pressure, in virtual time: the table in docs/benchmarks.md.

Four simulated engines (fixed-rate timing: 20,000 prefill tokens/s, 60 tokens/s per
sequence; a KV cache of 20,480 tokens each, about half the workload's sixteen ~2,000-token
system prompts) behind the deployment's real scheduler and balancer, the workload
``examples/workloads/shared-prompts-kv-pressure.yaml`` at 1x to 5x its rate (10 to 50
requests/s), three seeds each. ``precise_prefix`` reads the engines' own KV events (the
in-process simulator publishes vLLM's); ``prefix_affinity`` only what it dispatched.

    python benchmarks/prefix_pressure.py                       # ~4 min on 2 cores
    python benchmarks/prefix_pressure.py --loads 2,3 --seeds 0 --policies prefix_affinity,precise_prefix
    python benchmarks/prefix_pressure.py --workload examples/workloads/hot-prompt-kv-pressure.yaml --loads 5,6

Prints one row per policy and load (medians over the seeds, and the worst seed's P99) and
writes benchmarks/results/prefix_pressure.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import write_json  # noqa: E402

from shuniu.core.config.loader import load_deployment  # noqa: E402
from shuniu.core.plugin_manager import load_plugins  # noqa: E402
from shuniu.core.traffic import load_workload  # noqa: E402
from shuniu.plugins.tools.simulate import simulate  # noqa: E402

WORKLOAD = ROOT / "examples" / "workloads" / "shared-prompts-kv-pressure.yaml"
DEPLOYMENT = """\
models:
  bench:
    endpoints:
      - {{kind: sim, replicas: 4, options: {{kv_cache_tokens: 20480, max_num_seqs: 64,
          output_tokens_min: 16, output_tokens_max: 400}}}}
    balancer: {{policy: {policy}{options}}}
    health: {{interval_s: 30}}
"""
POLICIES = ["round_robin", "least_load", "prefix_affinity", "precise_prefix"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--loads", default="1,2,3,4,5", help="Multiples of the workload's rate (10 requests/s).")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument(
        "--workload",
        type=Path,
        default=WORKLOAD,
        help="Another workload for the same engines (e.g. examples/workloads/hot-prompt-kv-pressure.yaml).",
    )
    ap.add_argument(
        "--balancer-options",
        default="",
        help="Options for the balancers, as the inside of a YAML mapping (e.g. 'waiting_cost_tokens: 0').",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "prefix_pressure.json")
    args = ap.parse_args()
    console = Console()
    plugins = load_plugins()
    base = load_workload(args.workload)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    table = Table(title="Prefix routing under KV-cache pressure (virtual time)")
    for col in ("policy", "load", "req/s", "TTFT p50", "TTFT p99", "worst p99", "prefix hits", "goodput"):
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for policy in args.policies.split(","):
        extra = (
            f", options: {{{args.balancer_options}}}"
            if args.balancer_options and policy.startswith("pre")
            else ""
        )
        resolved = load_deployment(
            "bench.yaml", plugins, text=DEPLOYMENT.format(policy=policy, options=extra), env={}
        )
        for load in (float(x) for x in args.loads.split(",")):
            runs = []
            for seed in seeds:
                r = simulate(resolved, plugins, base.scaled(load), seed=seed)
                runs.append(r.summary())
            p50 = statistics.median(x["ttft_p50"] for x in runs)
            p99 = statistics.median(x["ttft_p99"] for x in runs)
            worst = max(x["ttft_p99"] for x in runs)
            hits = statistics.median(x["prefix_hit_rate"] for x in runs)
            good = statistics.median(x["goodput"] for x in runs)
            rows.append(
                {"policy": policy, "load": load, "p50": p50, "p99": p99, "worst_p99": worst, "hits": hits,
                 "goodput": good, "runs": runs}
            )  # fmt: skip
            table.add_row(
                policy, f"{load:g}x", f"{10 * load:.0f}", f"{p50 * 1000:.0f} ms", f"{p99:.2f} s",
                f"{worst:.2f} s", f"{hits:.1%}", f"{good:.1%}",
            )  # fmt: skip
            console.print(f"  {policy} {load:g}x: p99 {p99:.2f} s, hits {hits:.1%}", highlight=False)
    console.print(table)
    write_json(args.out, {"workload": str(args.workload), "seeds": seeds, "rows": rows})
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
