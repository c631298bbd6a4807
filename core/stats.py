"""Summary statistics shared by the gateway's views, ``shuniu bench``, the simulator tools
and the benchmark scripts: the project's one percentile function."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["percentile"]


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of already sorted values, interpolating linearly
    between the two nearest ranks (numpy's default, ``statistics.quantiles(method=
    "inclusive")``); ``None`` for no values."""
    n = len(sorted_values)
    if n == 0:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0..100")
    pos = (n - 1) * q / 100.0
    lo = int(pos)
    if lo >= n - 1:
        return float(sorted_values[-1])
    frac = pos - lo
    a = sorted_values[lo]
    return float(a + (sorted_values[lo + 1] - a) * frac)
