"""The ``shuniu plan`` command: options, a progress bar over the trials, the printed or JSON
result and the exit status."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from shuniu.core.errors import ConfigError
from shuniu.core.plugin_manager import PluginManager
from shuniu.core.traffic import load_workload
from shuniu.plugins.tools.plan.planner import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_MAX_REPLICAS,
    DEFAULT_SEARCH_DURATION,
    plan,
)
from shuniu.plugins.tools.plan.report import print_plan
from shuniu.plugins.tools.plan.results import PlanReporter, Trial

__all__ = ["plan_command"]


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

    from shuniu.core.plugin_manager import load_plugins
    from shuniu.plugins.tools.simulate import simulation_progress

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
        print_plan(result, Console(width=None if sys.stdout.isatty() else 180))
    sys.stdout.flush()
    ctx.exit(0 if result.met else 1)
