"""The ``shuniu simulate`` command, and the progress bar over simulated time it shares with
``shuniu plan``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import click

from shuniu.backends.sim import compiled_modules
from shuniu.core.errors import ConfigError

__all__ = ["simulate_command", "simulation_progress"]


def _report(exc: ConfigError) -> None:
    click.secho(f"{exc.source or 'input'}: {len(exc.problems)} problem(s)", fg="red", err=True)
    for problem in exc.problems:
        click.echo(f"  - {problem}", err=True)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


def simulation_progress(console: Any, disable: bool) -> Any:
    """A progress bar over simulated seconds; tasks carry ``label``, ``sim`` (simulated time
    now) and ``n`` (requests so far) fields. Shared by ``simulate`` and ``plan``."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]{task.fields[label]}[/]"),
        BarColumn(),
        TextColumn("{task.fields[sim]:>8.1f} / {task.total:.0f} s simulated, {task.fields[n]:,} requests"),
        TimeElapsedColumn(),
        console=console,
        disable=disable,
        transient=True,
    )


@click.command("simulate")
@click.argument("deployment", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--workload",
    "-w",
    "workload_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Workload YAML (see examples/workloads/).",
)
@click.option(
    "--duration", type=float, default=None, help="Simulated seconds of arrivals (default: the workload's)."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed of the workload.")
@click.option("--rate-scale", type=float, default=1.0, show_default=True, help="Multiply every arrival rate.")
@click.option("--model", default=None, help="Model of the deployment to send to (default: its first).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option(
    "--gateways",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Gateways in front of the engines, taken by clients in turn.",
)
@click.option(
    "--shared-state/--no-shared-state",
    default=True,
    show_default=True,
    help="With --gateways: share routing state as a fleet does (fleet:), or route each alone.",
)
@click.option(
    "--split",
    type=click.Choice(["clients", "tenants"]),
    default="clients",
    show_default=True,
    help="With --gateways: clients take the gateways in turn, or each tenant stays on one gateway.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a PNG of TTFT and ITL over time (needs shuniu[plot]).",
)
@click.pass_context
def simulate_command(
    ctx: click.Context,
    deployment: Path,
    workload_path: Path,
    duration: float | None,
    seed: int,
    rate_scale: float,
    model: str | None,
    as_json: bool,
    plot_path: Path | None,
    gateways: int,
    shared_state: bool,
    split: str,
) -> None:
    """Run a WORKLOAD against a DEPLOYMENT of simulated engines, in virtual time.

    The deployment's own scheduler and balancer decide every request; engines are simulated
    one batch iteration at a time, so hours of traffic take seconds.
    """
    from rich.console import Console

    from shuniu.core.config.loader import load_deployment
    from shuniu.core.plugin_manager import PluginManager, load_plugins
    from shuniu.core.traffic import load_workload
    from shuniu.plugins.tools.simulate.run import simulate

    plugins = ctx.find_object(PluginManager) or load_plugins()
    try:
        resolved = load_deployment(deployment, plugins)
        workload = load_workload(workload_path)
    except ConfigError as exc:
        _report(exc)
        ctx.exit(2)
    if rate_scale != 1.0:
        workload = workload.scaled(rate_scale)
    horizon = duration or workload.duration_s
    console = Console(stderr=True)
    with simulation_progress(console, disable=as_json or not console.is_terminal) as bar:
        task = bar.add_task("sim", total=horizon, sim=0.0, n=0, label="simulating")

        def progress(now: float, n: int) -> None:
            bar.update(task, completed=min(now, horizon), sim=now, n=n)

        try:
            result = simulate(
                resolved,
                plugins,
                workload,
                duration=horizon,
                seed=seed,
                model=model,
                progress=progress,
                gateways=gateways,
                shared_state=shared_state,
                split=split,
            )
        except ConfigError as exc:
            _report(exc)
            ctx.exit(2)
        except ValueError as exc:
            click.secho(f"{deployment}: cannot build the deployment: {exc}", fg="red", err=True)
            ctx.exit(2)
    summary = result.summary()
    if plot_path is not None:
        from shuniu.core.extras import MissingExtraError
        from shuniu.plugins.tools.simulate.plot import plot_timeline

        try:
            plot_timeline(result, str(plot_path), f"{deployment.name} + {workload_path.name}")
        except MissingExtraError as exc:
            click.secho(str(exc), fg="red", err=True)
            ctx.exit(2)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    _print_tables(summary, deployment, workload_path, Console())
    sys.stdout.flush()


def _print_tables(s: dict, deployment: Path, workload: Path, console) -> None:  # type: ignore[no-untyped-def,type-arg]
    from rich.table import Table

    table = Table(title=f"{deployment.name} + {workload.name}", show_header=True)
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("TTFT p50 / p99 (ms)", f"{_ms(s['ttft_p50'])} / {_ms(s['ttft_p99'])}"),
        ("ITL p50 / p99 (ms)", f"{_ms(s['itl_p50'])} / {_ms(s['itl_p99'])}"),
        ("E2E p50 / p99 (ms)", f"{_ms(s['e2e_p50'])} / {_ms(s['e2e_p99'])}"),
        ("gateway queue p99 (ms)", _ms(s["queue_p99"])),
        ("throughput (tokens/s)", f"{s['throughput_tokens_per_s']:,.0f}"),
        ("requests completed / arrived", f"{s['requests_completed']:,} / {s['requests_arrived']:,}"),
        ("goodput (share meeting the SLO)", "-" if s["goodput"] is None else f"{s['goodput']:.1%}"),
        ("prefix-cache hit rate", f"{s['prefix_hit_rate']:.1%}"),
        ("preemptions", f"{s['preemptions']:,}"),
        ("rejected", f"{s['rejected']:,}" + (f" {s['rejected_by_code']}" if s["rejected"] else "")),
        ("simulated time (s)", f"{s['sim_time_s']:,.1f}"),
        ("wall time (s)", f"{s['wall_s']:,.2f} ({s['simulated_requests_per_wall_s']:,.0f} requests/s)"),
        ("simulator build", "compiled" if compiled_modules() else "pure Python (docs/simulator.md)"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
    _print_rows(
        console,
        "per endpoint",
        ("endpoint", "completed", "tokens", "prefix hits", "preemptions", "busy"),
        [
            (
                name,
                f"{e['completed']:,}",
                f"{e['generated_tokens']:,}",
                f"{e['prefix_hit_rate']:.1%}",
                f"{e['preemptions']:,}",
                f"{e['busy_share']:.0%}",
            )
            for name, e in s["per_endpoint"].items()
        ],
    )
    if len(s.get("tenants") or {}) > 1:
        _print_rows(
            console,
            "per tenant",
            ("tenant", "gateway", "completed", "tokens", "token share", "TTFT p99 (ms)"),
            [
                (
                    name,
                    "-" if t["gateway"] is None else str(t["gateway"]),
                    f"{t['completed']:,}",
                    f"{t['tokens']:,}",
                    f"{t['token_share']:.1%}",
                    _ms(t["ttft_p99"]),
                )
                for name, t in s["tenants"].items()
            ],
        )
    if s.get("scaling_summary"):
        _print_scaling(s, console)


def _print_rows(console, title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:  # type: ignore[no-untyped-def]
    """A table named by its first column (left-aligned), the figures right-aligned."""
    from rich.table import Table

    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def _print_scaling(s: dict, console) -> None:  # type: ignore[no-untyped-def,type-arg]
    from rich.table import Table

    def at(t: float | None) -> str:
        return "-" if t is None else f"{t:,.0f}"

    _print_rows(
        console,
        "desired replicas against the run's fixed replicas",
        ("model", "replicas", "rose above (s)", "SLO broken (s)", "ahead (s)", "peak", "back (s)"),
        [
            (
                model,
                str(m["replicas"]),
                at(m["rose_at_s"]),
                at(m["slo_broken_at_s"]) if m["slo_broken_at_s"] is not None else "never",
                at(m["lead_s"]),
                f"{m['peak_desired']} at {at(m['peak_at_s'])} s",
                at(m["fell_at_s"]),
            )
            for model, m in s["scaling_summary"].items()
        ],
    )
    timeline = Table(title="signals over time (every minute)")
    for col in ("t (s)", "model", "rate now", "forecast", "replica capacity", "desired"):
        timeline.add_column(col, justify="left" if col == "model" else "right")
    last: dict[str, float] = {}
    for x in s["scaling"]:
        if x["t"] - last.get(x["model"], -math.inf) < 60:
            continue
        last[x["model"]] = x["t"]
        cap = x["replica_capacity"]
        timeline.add_row(
            f"{x['t']:,.0f}",
            x["model"],
            f"{x['rate']:.1f}/s",
            f"{x['forecast']:.1f}/s",
            "-" if cap is None else f"{cap:.1f}/s",
            str(x["desired"]),
        )
    console.print(timeline)
