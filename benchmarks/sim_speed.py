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
the simulation's own. The header says whether the simulator runs compiled (``setup.py``).

``--compare DIR`` also runs the leap setting on the ``shuniu`` installed in ``DIR`` (each
setting then in a child process of its own, alternating): for example the compiled build
against the pure-Python source of an editable install::

    pip install --no-deps --target /tmp/compiled .            # compiled (needs a C compiler)
    .venv/bin/python benchmarks/sim_speed.py --compare /tmp/compiled --rounds 4

``--compiled`` does both: it builds this tree that way into a temporary folder first (about a
minute) and compares with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from shuniu.backends.sim import compiled_modules
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
    ap.add_argument("--compare", metavar="DIR", help="also run the leaps on the shuniu installed in DIR")
    ap.add_argument("--compiled", action="store_true", help="build this tree compiled and --compare with it")
    ap.add_argument("--child", type=int, metavar="LEAP", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(run_once(args, args.child)))
        return
    if args.compiled:
        with tempfile.TemporaryDirectory(prefix="shuniu-compiled-") as where:
            print(f"building this tree compiled into {where} ...", flush=True)
            build = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", where, str(ROOT)]
            subprocess.run(build, check=True, env={**os.environ, "SHUNIU_COMPILE": "1"})
            args.compare = where
            _compare(args)
        return
    _compare(args)


def _compare(args: argparse.Namespace) -> None:
    settings = [("leaps", 512, None), ("stepping", 1, None)]
    if args.compare:
        settings = [("leaps", 512, ""), (f"leaps, {args.compare}", 512, args.compare), ("stepping", 1, "")]
    this = compiled_modules()
    print(f"this simulator: {_build(this)}", flush=True)
    if not this and not args.compare:
        print("(an editable install runs the sources: --compiled measures the build `pip install .` makes)")
    walls: dict[str, list[float]] = {name: [] for name, _, _ in settings}
    seen: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for name, leap, where in settings:
            out = run_once(args, leap) if where is None else _child(args, leap, where)
            walls[name].append(out["wall_s"])
            seen[name] = out["summary"]
            sim_s = out["summary"]["sim_time_s"]
            print(
                f"{name:>8}: {out['summary']['requests_completed']:,} requests, {sim_s:,.0f} simulated s in "
                f"{out['wall_s']:.2f} s = {sim_s / out['wall_s']:.0f}x real time ({_build(out['compiled'])})",
                flush=True,
            )
    first = settings[0][0]
    for name, _, _ in settings[1:]:
        for key in CHECKED:
            a, b = seen[first][key], seen[name][key]
            assert abs(a - b) <= 1e-9 * max(1.0, abs(b)), f"{key} differs ({first}, {name}): {a} vs {b}"
    print(
        f"\n{args.replicas} x {args.model} TP {args.tp} on {args.hardware}, chunk {args.chunk}, "
        f"{args.balancer}, {args.rate:g} req/s, {args.duration:,.0f} simulated s, median of {args.rounds}:"
    )
    width = max(10, *(len(name) for name in walls))
    print(f"{'':>{width}} {'wall s':>8} {'x real time':>12} {'us / request':>13}")
    n = seen[first]["requests_completed"]
    for name, values in walls.items():
        wall = statistics.median(values)
        print(f"{name:>{width}} {wall:8.2f} {args.duration / wall:12.0f} {wall / n * 1e6:13,.0f}")
    print("(the same latencies in every setting: checked)")


def _build(compiled: list[str]) -> str:
    return f"compiled ({', '.join(compiled)})" if compiled else "pure Python"


def run_once(args: argparse.Namespace, leap: int) -> dict[str, Any]:
    """One simulation: its wall time, the figures the settings must agree on, and which
    modules ran compiled."""
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
    resolved = load_deployment(None, plugins, text=text)
    result = simulate(resolved, plugins, workload, duration=args.duration, seed=0, leap_steps=leap)
    s = result.summary()
    return {
        "wall_s": result.wall_s,
        "summary": {k: s[k] for k in (*CHECKED, "sim_time_s")},
        "compiled": compiled_modules(),
    }


def _child(args: argparse.Namespace, leap: int, where: str) -> dict[str, Any]:
    """:func:`run_once` in a child process, with the ``shuniu`` in ``where`` first on its
    path (``""``: this process's own)."""
    keys = ("hardware", "model", "tp", "replicas", "chunk", "balancer")
    argv = [f"--{key}={getattr(args, key)}" for key in keys]
    argv += [f"--rate={args.rate!r}", f"--duration={args.duration!r}", f"--child={leap}"]
    env = dict(os.environ)
    if where:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [where, env.get("PYTHONPATH", "")]))
    command = [sys.executable, __file__, *argv]
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


if __name__ == "__main__":
    main()
