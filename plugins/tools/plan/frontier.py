"""A PNG of a plan's cost frontier (``shuniu plan --frontier-png``; needs ``shuniu[plot]``):
every search trial's cost against its p99 TTFT and p99 ITL, the frontier joined, the SLO
targets drawn and the recommendation marked."""

from __future__ import annotations

from pathlib import Path

from shuniu.plugins.tools.plan.results import PlanResult

__all__ = ["plot_frontier"]


def plot_frontier(result: PlanResult, path: str | Path) -> None:
    """Write the frontier of ``result`` to ``path`` as a PNG."""
    from shuniu.core.extras import require

    require("matplotlib", "plot", "The frontier plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trials = [t for t in result.tried if t.phase in ("search", "probe") and t.rate_scale == 1.0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    unit = "devices" if result.price_per_hour is None else "cost per hour"
    for ax, metric, target_key, name in (
        (axes[0], "ttft_p99", "ttft_p99_s", "TTFT p99 (ms)"),
        (axes[1], "itl_p99", "itl_p99_s", "ITL p99 (ms)"),
    ):
        for met, colour, label in ((True, "tab:green", "meets the SLO"), (False, "tab:grey", "misses")):
            xs = [t.cost_per_hour for t in trials if t.met == met]
            ys = [getattr(t, metric) * 1000 for t in trials if t.met == met]
            if xs:
                ax.scatter(xs, ys, c=colour, s=18, label=label, alpha=0.8)
        front = result.frontier
        if front:
            ax.plot(
                [t.cost_per_hour for t in front],
                [getattr(t, metric) * 1000 for t in front],
                "-",
                c="tab:blue",
                lw=1,
                label="frontier",
            )
        rec = result.recommendation
        if rec is not None:
            ax.scatter(
                [rec.cost_per_hour],
                [getattr(rec, metric) * 1000],
                marker="*",
                s=160,
                c="gold",
                edgecolors="black",
                zorder=5,
                label="recommendation",
            )
        target = result.slo.get(target_key)
        if target is not None:
            ax.axhline(target * 1000, c="tab:red", ls="--", lw=1, label="target")
        ax.set_yscale("log")
        ax.set_xlabel(unit)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8)
    fig.suptitle(f"{result.model} on {result.hardware} for {result.workload['name']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(str(path), dpi=100)
    plt.close(fig)
