"""The report of a run: percentiles, the summary (every number, as JSON), and the tables.

Percentiles interpolate linearly between the two nearest ranks (numpy's default method, as
vLLM's and most serving benchmarks report them): the p-th percentile of ``n`` sorted values
is at rank ``(n - 1) * p / 100``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from shuniu.core.stats import percentile
from shuniu.plugins.tools.bench.runner import RunResult

__all__ = ["LAG_LIMIT_S", "LAG_SHARE", "latency_stats", "percentile", "print_report", "summarize", "verdicts"]

LAG_LIMIT_S = 0.010
"""A schedule-lag p99 above this is reported; the client is called the bottleneck when the lag
also grows by more than this over the run, or exceeds ``LAG_SHARE`` of the median TTFT (of
the median end-to-end latency when not streamed)."""
LAG_SHARE = 0.1
CPU_LIMIT = 0.9
"""A client using more than this share of one core may be what limits the run."""
PERCENTILES = (50, 90, 95, 99)


def latency_stats(values_s: Sequence[float]) -> dict[str, float | int | None]:
    """``n``, ``mean``, ``min``, ``p50``, ``p90``, ``p95``, ``p99``, ``max`` in milliseconds."""
    s = sorted(values_s)
    out: dict[str, float | int | None] = {"n": len(s)}
    if not s:
        out.update({k: None for k in ("mean", "min", *(f"p{p}" for p in PERCENTILES), "max")})
        return out
    ms = 1000.0
    out["mean"] = round(math.fsum(s) / len(s) * ms, 4)
    out["min"] = round(s[0] * ms, 4)
    for p in PERCENTILES:
        out[f"p{p}"] = round(percentile(s, p) * ms, 4)  # type: ignore[operator]
    out["max"] = round(s[-1] * ms, 4)
    return out


def _trend_ms(lag: Sequence[float]) -> float | None:
    """Mean lag of the last quarter of the requests minus that of the first quarter."""
    n = len(lag)
    if n < 8:
        return None
    q = n // 4
    return round((math.fsum(lag[-q:]) - math.fsum(lag[:q])) / q * 1000, 4)


def verdicts(summary: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(why the client was the bottleneck, warnings): empty lists for a clean run."""
    out: list[str] = []
    warnings: list[str] = []
    saturated = summary["requests"]["client_saturated"]
    if saturated:
        out.append(
            f"client saturated: {saturated:,} requests were not sent because "
            f"{summary['config']['max_in_flight']:,} were already in flight (--max-in-flight); "
            "the offered load was not applied"
        )
    lag = summary["schedule_lag_ms"]
    p99 = lag["p99"]
    if summary["mode"] == "open" and p99 is not None and p99 > LAG_LIMIT_S * 1000:
        growing = summary["client"]["lag_trend_ms"] or 0.0
        measured = summary["ttft_ms"]["p50"] or summary["e2e_ms"]["p50"]
        if growing > LAG_LIMIT_S * 1000 or measured is None or p99 > LAG_SHARE * measured:
            out.append(
                f"the client fell behind its schedule (schedule lag p99 {p99:,.1f} ms"
                + (f", growing by {growing:,.1f} ms over the run" if growing > 1 else "")
                + "): the client (or the machine it runs on), not the server, limited the offered "
                "load; lower --rate, give the client a quieter CPU, or split the load over processes"
            )
        else:
            warnings.append(
                f"schedule lag p99 {p99:,.1f} ms (the client was held up now and then, not "
                f"falling behind): small next to the latency measured ({measured:,.0f} ms at p50)"
            )
    cpu = summary["client"]["cpu_share"]
    if cpu is not None and cpu > CPU_LIMIT:
        warnings.append(
            f"the client used {cpu:.0%} of a CPU core: near its ceiling, so its own latency may "
            "be in the numbers"
        )
    return out, warnings


def _rate(n: float, seconds: float) -> float:
    return round(n / seconds, 4) if seconds > 0 else 0.0


def summarize(r: RunResult, config: dict[str, Any], slo: dict[str, float] | None = None) -> dict[str, Any]:
    """Every number of a run (JSON-ready). ``config`` describes the run (target, mode,
    options); ``slo`` the goodput thresholds in ms (None: no goodput)."""
    window = r.window_s
    out_total = sum(r.output_tokens)
    completed = r.succeeded + r.failed
    offered = r.issued + r.saturated
    inflight = [
        round(s / n, 3) if n else 0.0 for s, n in zip(r.series_inflight_sum, r.series_inflight_n, strict=True)
    ]
    lag = list(r.lag)
    summary: dict[str, Any] = {
        "mode": r.mode,
        "config": config,
        "interrupted": r.interrupted,
        "requests": {
            "issued": r.issued,
            "succeeded": r.succeeded,
            "failed": r.failed,
            "client_saturated": r.saturated,
            "warmup": r.warmup_issued,
            "aborted": r.aborted,
        },
        "errors": dict(r.errors.most_common()),
        "error_rate": round(r.failed / completed, 6) if completed else 0.0,
        "duration_s": round(window, 4),
        "issue_duration_s": round(r.issue_s, 4),
        "offered_rate": _rate(offered - 1, r.issue_s) if r.mode == "open" and offered > 1 else None,
        "qps": _rate(r.succeeded, window),
        "output_tokens_per_s": _rate(out_total, window),
        "input_tokens_per_s": _rate(r.input_tokens, window),
        "output_tokens": {
            "total": out_total,
            "mean": round(out_total / r.succeeded, 3) if r.succeeded else None,
            "from_usage": r.usage_reported,
        },
        "input_tokens": {"total": r.input_tokens},
        "inputs": r.inputs,
        "inputs_per_s": _rate(r.inputs, window),
        "tokens_per_chunk": round(out_total / r.chunks, 4) if r.chunks else None,
        "ttft_ms": latency_stats(r.ttft),
        "itl_ms": latency_stats(r.itl),
        "tpot_ms": latency_stats(r.tpot),
        "e2e_ms": latency_stats(r.e2e),
        "schedule_lag_ms": latency_stats(lag),
        "goodput": None,
        "client": {
            "cpu_s": round(r.client_cpu_s, 3),
            "cpu_share": round(r.client_cpu_s / r.wall_s, 4) if r.wall_s > 0 else None,
            "wall_s": round(r.wall_s, 3),
            "connections": r.connections,
            "lag_trend_ms": _trend_ms(lag),
        },
        "timeseries": [
            {
                "t": t,
                "sent": r.series_sent[t],
                "succeeded": r.series_ok[t],
                "failed": r.series_errors[t],
                "client_saturated": r.series_saturated[t],
                "output_tokens": round(r.series_tokens[t], 2),
                "in_flight_mean": inflight[t],
                "in_flight_max": r.series_inflight_max[t],
            }
            for t in range(len(r.series_sent))
        ],
    }
    if slo:
        summary["goodput"] = {
            "slo_ms": slo,
            "requests": r.good,
            "share": round(r.good / offered, 6) if offered else 0.0,
            "per_s": _rate(r.good, window),
        }
    reasons, warnings = verdicts(summary)
    summary["client"]["bottleneck"] = bool(reasons)
    summary["client"]["verdict"] = reasons
    summary["client"]["warnings"] = warnings
    return summary


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.1f}" if v >= 10 else f"{v:,.2f}"


def print_report(summary: dict[str, Any], console: Any) -> None:
    """The report as rich tables on ``console``."""
    from rich.table import Table

    cfg = summary["config"]
    req = summary["requests"]
    title = f"shuniu bench: {cfg['url']} ({cfg['model']}, {cfg['api']}, {cfg['load']})"
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("measure")
    t.add_column("value", justify="right")
    sent = f"{req['issued']:,}"
    if req["warmup"]:
        sent += f" (+{req['warmup']:,} warm-up, not counted)"
    t.add_row("requests sent", sent)
    t.add_row("succeeded", f"{req['succeeded']:,}")
    rate = summary["error_rate"]
    t.add_row("failed", f"[red]{req['failed']:,} ({rate:.2%})[/]" if req["failed"] else "0")
    for kind, n in summary["errors"].items():
        t.add_row(f"  {kind}", f"[red]{n:,}[/]")
    if req["client_saturated"]:
        t.add_row("client saturated (not sent)", f"[red]{req['client_saturated']:,}[/]")
    if req["aborted"]:
        t.add_row("aborted (interrupted)", f"{req['aborted']:,}")
    t.add_row("duration (s)", f"{summary['duration_s']:,.2f}")
    if summary["offered_rate"] is not None:
        t.add_row("offered rate (req/s)", f"{summary['offered_rate']:,.2f}")
    t.add_row("throughput (req/s)", f"{summary['qps']:,.2f}")
    t.add_row("output tokens/s", f"{summary['output_tokens_per_s']:,.1f}")
    t.add_row("input tokens/s", f"{summary['input_tokens_per_s']:,.1f}")
    if summary.get("inputs"):
        what = "documents" if summary["config"].get("api") == "rerank" else "inputs"
        t.add_row(f"{what}/s", f"{summary['inputs_per_s']:,.1f}")
    out = summary["output_tokens"]
    if out["mean"] is not None:
        t.add_row("output tokens per request (mean)", f"{out['mean']:,.1f}")
    if summary["tokens_per_chunk"] is not None:
        t.add_row("tokens per streamed chunk", f"{summary['tokens_per_chunk']:,.2f}")
    g = summary["goodput"]
    if g is not None:
        slo = ", ".join(f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in g["slo_ms"].items())
        t.add_row(f"goodput ({slo})", f"{g['per_s']:,.2f} req/s ({g['share']:.1%} of requests)")
    c = summary["client"]
    cpu = c["cpu_share"]
    t.add_row(
        "client CPU",
        f"{c['cpu_s']:,.2f} s ({cpu:.0%} of a core), {c['connections']:,} connections"
        if cpu is not None
        else "-",
    )
    console.print(t)

    lat = Table(title="latency (ms)", title_justify="left")
    lat.add_column("")
    for col in ("mean", "p50", "p90", "p95", "p99", "max", "n"):
        lat.add_column(col, justify="right")
    rows = [
        ("TTFT", summary["ttft_ms"]),
        ("ITL (per chunk)", summary["itl_ms"]),
        ("TPOT (per token)", summary["tpot_ms"]),
        ("end-to-end", summary["e2e_ms"]),
    ]
    if summary["mode"] == "open":
        rows.append(("schedule lag", summary["schedule_lag_ms"]))
    for name, s in rows:
        if not s["n"]:
            continue
        lat.add_row(name, *(_ms(s[k]) for k in ("mean", "p50", "p90", "p95", "p99", "max")), f"{s['n']:,}")
    console.print(lat)
    if summary["interrupted"]:
        console.print("[yellow]interrupted: the numbers cover the requests that ended before Ctrl-C[/]")
    for note in c["verdict"]:
        console.print(f"[bold red]CLIENT BOTTLENECK: {note}[/]")
    for note in c["warnings"]:
        console.print(f"[yellow]note: {note}[/]")
