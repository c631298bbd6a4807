"""A PNG of a simulation's latencies over time (``shuniu simulate --plot``; needs ``shuniu[plot]``)."""

from __future__ import annotations

from shuniu.plugins.tools.simulate.results import SimulationResult

__all__ = ["plot_timeline"]


def plot_timeline(result: SimulationResult, path: str, title: str = "") -> None:
    """A PNG of TTFT p50/p99 and ITL p50/p99 over time (needs ``shuniu[plot]``)."""
    from shuniu.core.extras import require

    require("matplotlib", "plot", "The simulation plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows = sorted(result.timeline)
    t = [(w + 0.5) * result.window_s for w in windows]
    rows = 3 if result.scaling else 2
    fig, axes = plt.subplots(rows, 1, sharex=True, figsize=(9, 3 * rows))
    top, bottom = axes[0], axes[1]
    for q, style in ((0.5, "-"), (0.99, "--")):
        top.plot(
            t,
            [result.timeline[w][0].quantile(q) * 1000 for w in windows],
            style,
            label=f"TTFT p{round(q * 100)}",
        )
        bottom.plot(
            t,
            [result.timeline[w][1].quantile(q) * 1000 for w in windows],
            style,
            label=f"ITL p{round(q * 100)}",
        )
    top.set_ylabel("TTFT (ms)")
    bottom.set_ylabel("mean ITL per request (ms)")
    bottom.set_xlabel("arrival time (simulated s)")
    if result.scaling:
        # The autoscaling signals: the rate now and forecast, and the desired count.
        scaled = axes[2]
        bottom.set_xlabel("")
        for model in dict.fromkeys(x["model"] for x in result.scaling):
            xs = [x for x in result.scaling if x["model"] == model]
            ts = [x["t"] for x in xs]
            scaled.plot(ts, [x["rate"] for x in xs], "-", label=f"{model} rate now (req/s)")
            scaled.plot(ts, [x["forecast"] for x in xs], ":", label=f"{model} forecast (req/s)")
            twin = scaled.twinx()
            twin.step(ts, [x["desired"] for x in xs], "k-", where="post", label=f"{model} desired replicas")
            twin.set_ylabel("desired replicas")
            twin.legend(loc="upper right")
        scaled.set_ylabel("requests/s")
        scaled.set_xlabel("simulated s")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
    if title:
        top.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
