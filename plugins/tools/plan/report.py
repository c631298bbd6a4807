"""How ``shuniu plan`` prints a :class:`PlanResult`: the table of trials, the recommendation,
the notes and the KV memory of one replica."""

from __future__ import annotations

from typing import Any

from shuniu.plugins.tools.plan.results import PlanResult, Trial
from shuniu.plugins.tools.plan.shapes import parallel_label

__all__ = ["print_plan", "secs"]


def secs(seconds: float) -> str:
    """A duration as a plan writes it: ``1,234 s``, ``2.5 s`` or ``340 ms``."""
    if seconds >= 100:
        return f"{seconds:,.0f} s"
    if seconds >= 1:
        return f"{seconds:.3g} s"
    return f"{seconds * 1000:.3g} ms"


def _slo_text(result: PlanResult) -> str:
    slo = result.slo
    names = {"ttft": "TTFT", "itl": "ITL", "e2e": "E2E"}
    parts = [f"{names[m]} p99 <= {secs(slo[f'{m}_p99_s'])}" for m in names if f"{m}_p99_s" in slo]
    own = [f"{names[m]} <= {secs(slo[f'{m}_s'])}" for m in names if f"{m}_s" in slo]
    if result.goodput_target is not None:
        share = f"{result.goodput_target:.0%} of requests"
        parts.append(f"{share} within " + (", ".join(own) if own else "the p99 targets"))
    return ", ".join(parts)


def _num(value: float) -> str:
    """Three significant digits, thousands separated."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _replicas(rec: Trial) -> str:
    """``3 replicas x TP 8``, ``2 replicas x TP 8 x PP 2``, ``2 units of 1 prefill + 2 decode
    engines x TP 4``."""
    parallel = parallel_label(rec.tensor_parallel, rec.pipeline_parallel)
    p, d = rec.config.get("prefill_engines", 0), rec.config.get("decode_engines", 0)
    if p:
        units = "unit" if rec.replicas == 1 else "units"
        return f"{rec.replicas} {units} of {p} prefill + {d} decode engines x {parallel}"
    return f"{rec.replicas} replica{'s' if rec.replicas != 1 else ''} x {parallel}"


def _money(result: PlanResult, cost: float) -> str:
    """A configuration's cost per hour (devices when no price is known)."""
    if result.price_per_hour is None:
        return f"{cost:,.0f} dev"
    return f"{cost:,.2f}/h"


def print_plan(result: PlanResult, console: Any) -> None:
    """Print ``result`` as tables on a rich ``console``."""
    from rich import box
    from rich.table import Table

    w = result.workload
    table = Table(
        title=f"{result.model} on {result.hardware} for {w['name']}: {w['request_rate']:.3g} requests/s, "
        f"mean {w['mean_input_tokens']:,.0f} in / {w['mean_output_tokens']:,.0f} out tokens; "
        f"SLO {_slo_text(result)}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
    columns = [
        "run",
        "configuration",
        "repl",
        "dev",
        "cost",
        "sim s",
        "TTFT\np50 ms",
        "TTFT\np99 ms",
        "ITL\np99 ms",
        "E2E\np99 s",
        "good-\nput",
        "tok/s",
    ]
    for name in columns:
        table.add_column(name, justify="left" if name in ("run", "configuration") else "right", no_wrap=True)
    table.add_column("met", overflow="fold", min_width=12)
    table.caption = (
        "repl: replicas (units of a prefill/decode split, 1P2D: one prefill and two decode engines); "
        "dev: devices (replicas x engines x TP x PP); cost: per hour"
        + (" (devices: no price known)" if result.price_per_hour is None else "")
        + "; sim s: simulated seconds of arrivals; chunk: max_num_batched_tokens; seqs: max_num_seqs"
    )
    table.caption_justify = "left"
    rec = result.recommendation
    for t in result.tried:
        met = "yes" if t.met else "no: " + "; ".join(t.failures)
        if t.rate_scale != 1.0:
            met += f" (unloaded: {t.rate_scale:.2g}x the rate)"
        style = "bold green" if t is rec else None
        table.add_row(
            t.phase,
            t.label,
            str(t.replicas),
            str(t.devices),
            _money(result, t.cost_per_hour),
            f"{t.duration_s:,.0f}",
            _num(t.ttft_p50 * 1000),
            _num(t.ttft_p99 * 1000),
            _num(t.itl_p99 * 1000),
            _num(t.e2e_p99),
            "-" if t.goodput is None else f"{t.goodput:.1%}",
            f"{t.throughput_tokens_per_s:,.0f}",
            met,
            style=style,
        )
    if result.tried:
        console.print(table)
    else:
        console.print(table.title, "\n(nothing simulated)", highlight=False)
    if result.rejected:
        why = Table(title="Set aside, and why", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        why.add_column("change")
        why.add_column("repl", justify="right")
        why.add_column("reason", overflow="fold")
        for r in result.rejected:
            why.add_row(r.change, str(r.replicas) if r.replicas else "-", r.reason)
        console.print(why)
    if result.frontier:
        front = Table(
            title=f"Cost frontier (search trials, {result.search_duration_s:,.0f} simulated s): "
            "none cheaper is also faster at p99",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
        )
        for name in ("cost", "dev", "configuration", "repl", "TTFT p99", "ITL p99", "met"):
            front.add_column(
                name, justify="left" if name == "configuration" else "right", no_wrap=name != "met"
            )
        for t in result.frontier:
            front.add_row(
                _money(result, t.cost_per_hour),
                str(t.devices),
                t.label,
                str(t.replicas),
                secs(t.ttft_p99),
                secs(t.itl_p99),
                "yes" if t.met else "no",
            )
        console.print(front)
    if rec is not None:
        price = "" if result.price_per_hour is None else f" ({_money(result, rec.cost_per_hour)})"
        console.print(
            f"[bold]Recommendation:[/] {_replicas(rec)} = [bold]{rec.devices} x {result.hardware}[/]{price}, "
            f"{rec.label} — TTFT p99 {secs(rec.ttft_p99)}, ITL p99 {secs(rec.itl_p99)}"
            + ("" if rec.goodput is None else f", goodput {rec.goodput:.1%}")
            + f" over {rec.duration_s:,.0f} simulated seconds (seed {rec.seed})",
            highlight=False,
        )
        if result.quality is not None:
            console.print(f"  [yellow]quality:[/] {result.quality}", highlight=False)
            if result.native is not None:
                console.print(
                    f"  at the model's own precision: {result.native.replicas} x {result.native.label} "
                    f"= {result.native.devices} devices ({_money(result, result.native.cost_per_hour)}, "
                    f"search trial)",
                    highlight=False,
                )
    else:
        console.print(
            f"[bold red]No configuration meets the SLO[/] (up to {result.max_replicas} replicas).",
            highlight=False,
        )
    for note in result.notes:
        if note != "no configuration meets the SLO":
            console.print(f"  - {note}", highlight=False)
    kv = result.kv
    rows = kv.rows()
    rows[-1] = (
        "max concurrent sequences",
        f"{kv.max_concurrent_seqs:,} (the KV cache holds {result.kv_room_seqs:,} such requests; "
        f"max_num_seqs {result.max_num_seqs:,})",
    )
    kv_table = Table(
        title=f"KV memory of one replica ({kv.devices} devices) at the workload's mean lengths",
        title_justify="left",
        show_header=False,
    )
    kv_table.add_column("quantity")
    kv_table.add_column("value", justify="right")
    for k, v in rows:
        kv_table.add_row(k, v)
    console.print(kv_table)
    console.print(f"planned in {result.wall_s:.1f} s ({len(result.tried)} simulations)", style="dim")
