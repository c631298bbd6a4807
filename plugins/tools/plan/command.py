"""The ``shuniu plan`` command: options, a progress bar over the trials, the printed or JSON
result and the exit status."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from shuniu.core.errors import ConfigError, Problem
from shuniu.core.plugin_manager import PluginManager
from shuniu.core.traffic import load_workload
from shuniu.plugins.tools.plan.planner import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_REPLICAS,
    DEFAULT_SEARCH_DURATION,
    plan,
)
from shuniu.plugins.tools.plan.report import print_plan
from shuniu.plugins.tools.plan.results import PlanError, PlanReporter, Trial

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

    def trial_started(self, phase: str, label: str, replicas: int, horizon: float) -> None:
        self.horizon = horizon
        label = f"{phase}: {replicas} x {label}"
        self.progress.reset(self.task, total=horizon, sim=0.0, n=0, label=label, visible=True)

    def advance(self, now: float, requests: int) -> None:
        self.progress.update(self.task, completed=min(now, self.horizon), sim=now, n=requests)

    def trial_finished(self, trial: Trial) -> None:
        verdict = "[green]meets[/]" if trial.met else f"[red]misses[/] ({'; '.join(trial.failures)})"
        self.progress.console.print(
            f"  {trial.phase:<7} {trial.replicas:>3} x {trial.label} "
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
@click.option(
    "--prefill-decode",
    default=None,
    help="Prefill/decode splits to try: auto (default: 1:1, 1:2, 2:1 and 1:3 units besides none, "
    "when the prompt tokens to compute are 4x the answer tokens), off, or comma-separated P:D "
    "units (off among them: also no split).",
)
@click.option(
    "--pipeline-parallel-size",
    "-pp",
    type=int,
    default=None,
    help="Plan only this many pipeline stages, each a node of --tensor-parallel-size devices "
    "(default: 1, or the fewest that hold a model that fits no node).",
)
@click.option(
    "--balancer",
    default=None,
    help="Balancer policy, or several comma-separated to choose from "
    "(default: prefix_affinity, least_load and round_robin when prompts share prefixes, else the last two).",
)
@click.option(
    "--precision",
    "weight_precision",
    default=None,
    help="Weight precisions to choose from, comma-separated (default: the model's own, fp8 "
    "where the hardware computes it else int8, and int4-awq; the quality cost of a lower one "
    "is printed with the answer).",
)
@click.option(
    "--kv-precision",
    default=None,
    help="KV-cache precisions to choose from, comma-separated (default: the model's own, and fp8 "
    "where the hardware has it).",
)
@click.option(
    "--max-num-batched-tokens",
    default=None,
    help="Iteration token budgets (prefill chunk sizes) to choose from, comma-separated "
    "(default: 128,256,512,1024,2048,8192; a chunk below the sequence limit lowers it to fit).",
)
@click.option(
    "--prefix-caching/--no-prefix-caching",
    default=None,
    help="Pin prefix caching on or off (default: both are tried).",
)
@click.option(
    "--price",
    type=float,
    default=None,
    help="Price of one device-hour (default: the hardware profile's price_per_hour; "
    "without one, configurations are ranked by devices).",
)
@click.option(
    "--jobs",
    "-j",
    type=int,
    default=None,
    help="Trials simulated side by side, one worker process each (default: one per CPU).",
)
@click.option(
    "--frontier-png",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the cost frontier (cost against p99 TTFT and ITL) as a PNG (needs shuniu[plot]).",
)
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
    "--max-num-seqs",
    default=None,
    help="Engine batch limits to choose from, comma-separated (default: 64,128,256,512).",
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
    pipeline_parallel_size: int | None,
    prefill_decode: str | None,
    balancer: str | None,
    weight_precision: str | None,
    kv_precision: str | None,
    max_num_batched_tokens: str | None,
    prefix_caching: bool | None,
    price: float | None,
    jobs: int | None,
    frontier_png: Path | None,
    goodput: float | None,
    ttft_p99: float | None,
    itl_p99: float | None,
    e2e_p99: float | None,
    gpu_memory_utilization: float,
    max_num_seqs: str | None,
    max_model_len: int | None,
    as_json: bool,
) -> None:
    """The cheapest pool of MODEL on HARDWARE that meets WORKLOAD's SLO, found by simulation.

    Searches the replica count together with the engine knobs an expert would tune (tensor
    parallelism, weight and KV precision, the prefill chunk, max_num_seqs, prefix caching, the
    balancer), one knob at a time, and confirms the answer over the full duration on another
    sample of the workload. Prints every trial, the configurations set aside and why, the
    cost frontier, and the KV-memory arithmetic of one replica. A knob given on the command
    line is pinned (or chosen among the comma-separated values). Exits 0 with a
    recommendation, 1 when no configuration meets the SLO, 2 on bad input.
    """
    from rich.console import Console

    from shuniu.core.plugin_manager import load_plugins
    from shuniu.plugins.tools.simulate import simulation_progress

    plugins = ctx.find_object(PluginManager) or load_plugins()
    try:
        workload = load_workload(workload_path)
        seqs = _ints(max_num_seqs, "--max-num-seqs")
        chunks = _ints(max_num_batched_tokens, "--max-num-batched-tokens")
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
                pipeline_parallel_size=pipeline_parallel_size,
                prefill_decode=prefill_decode,
                balancer=balancer,
                weight_precision=weight_precision,
                kv_precision=kv_precision,
                max_num_batched_tokens=chunks,
                prefix_caching=prefix_caching,
                price=price,
                jobs=jobs,
                goodput=goodput,
                ttft_p99=ttft_p99,
                itl_p99=itl_p99,
                e2e_p99=e2e_p99,
                gpu_memory_utilization=gpu_memory_utilization,
                max_num_seqs=seqs,
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
    if frontier_png is not None:
        from shuniu.core.extras import MissingExtraError
        from shuniu.plugins.tools.plan.frontier import plot_frontier

        try:
            plot_frontier(result, frontier_png)
        except MissingExtraError as exc:
            click.secho(str(exc), fg="red", err=True)
            ctx.exit(2)
        click.echo(f"frontier written to {frontier_png}", err=True)
    sys.stdout.flush()
    ctx.exit(0 if result.met else 1)


def _ints(text: str | None, option: str) -> list[int] | None:
    """Comma-separated whole numbers, or a config error naming ``option``."""
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PlanError(
            [Problem(option, f"expected whole numbers separated by commas (got {text!r})")], "options"
        ) from None
    if not values:
        raise PlanError([Problem(option, "give at least one value")], "options")
    return values
