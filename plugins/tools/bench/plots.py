"""PNG plots of a run (needs ``shuniu[plot]``, i.e. matplotlib): ``latency_cdf.png`` (the
cumulative distributions of TTFT, ITL and end-to-end latency) and ``throughput.png``
(requests/s, output tokens/s and requests in flight, per second)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shuniu.plugins.tools.bench.runner import RunResult

__all__ = ["write_plots"]


def _cdf(ax: Any, values_s: Sequence[float], label: str) -> None:
    if not values_s:
        ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(label)
        return
    xs = sorted(v * 1000 for v in values_s)
    n = len(xs)
    ax.plot(xs, [(i + 1) / n for i in range(n)], drawstyle="steps-post")
    ax.set_title(label)
    ax.set_xlabel("ms")
    ax.grid(alpha=0.3)
    if xs[0] > 0 and xs[-1] / xs[0] > 50:
        ax.set_xscale("log")
    for q, style in ((0.5, ":"), (0.99, "--")):
        ax.axhline(q, color="grey", linestyle=style, linewidth=0.8)


def write_plots(result: RunResult, directory: Path, title: str) -> list[Path]:
    """Write the PNGs into ``directory`` (created); returns their paths. Raises
    :class:`~shuniu.core.extras.MissingExtraError` without matplotlib."""
    from shuniu.core.extras import require

    require("matplotlib", "plot", "shuniu bench --plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    _cdf(axes[0], result.ttft, "TTFT")
    _cdf(axes[1], result.itl, "ITL (per chunk)")
    _cdf(axes[2], result.e2e, "end-to-end")
    axes[0].set_ylabel("share of requests (ITL: of gaps)")
    fig.suptitle(title)
    fig.tight_layout()
    path = directory / "latency_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    t = [s + 0.5 for s in range(len(result.series_sent))]
    fig, (top, mid, bottom) = plt.subplots(3, 1, sharex=True, figsize=(10, 8))
    top.plot(t, result.series_sent, label="sent")
    top.plot(t, result.series_ok, label="succeeded")
    if any(result.series_errors):
        top.plot(t, result.series_errors, label="failed", color="red")
    if any(result.series_saturated):
        top.plot(t, result.series_saturated, label="client saturated", color="black")
    top.set_ylabel("requests/s")
    mid.plot(t, result.series_tokens, color="tab:green")
    mid.set_ylabel("output tokens/s")
    mean = [
        s / n if n else 0.0 for s, n in zip(result.series_inflight_sum, result.series_inflight_n, strict=True)
    ]
    bottom.plot(t, mean, label="mean")
    bottom.plot(t, result.series_inflight_max, label="max", linestyle="--")
    bottom.set_ylabel("in flight")
    bottom.set_xlabel("seconds since start")
    for ax in (top, mid, bottom):
        ax.grid(alpha=0.3)
        if result.warmup_s > 0:
            ax.axvspan(0, result.warmup_s, color="grey", alpha=0.15)
    top.legend(loc="upper left")
    bottom.legend(loc="upper left")
    fig.suptitle(title + ("  (shaded: warm-up, not counted)" if result.warmup_s > 0 else ""))
    fig.tight_layout()
    path = directory / "throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths
