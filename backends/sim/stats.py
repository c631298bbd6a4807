"""Bounded-memory latency statistics: a log-bucket histogram (1% relative resolution)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import reduce
from itertools import repeat
from operator import add, mul, sub

__all__ = ["LogHistogram"]

_GROWTH = 1.01
_LOG_GROWTH = math.log(_GROWTH)
_MIN = 1e-6  # values below 1 µs share the first bucket
_BELOW, _ABOVE = 1.0 - 1e-9, 1.0 + 1e-9  # far beyond a logarithm's rounding, far within a bucket
_MIN_SAFE = _MIN * _ABOVE


class LogHistogram:
    """Counts of values in geometric buckets; quantiles within ~1% of the exact value,
    memory independent of the number of samples."""

    __slots__ = ("_counts", "count", "max", "total")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self.count = 0
        self.total = 0.0
        self.max = 0.0

    def add(self, value: float, n: int = 1) -> None:
        idx = int(math.log(value / _MIN) / _LOG_GROWTH) if value > _MIN else 0
        counts = self._counts
        counts[idx] = counts.get(idx, 0) + n
        self.count += n
        self.total += value * n
        if value > self.max:
            self.max = value

    @staticmethod
    def add_each(hists: Sequence[LogHistogram], value: float) -> None:
        """``h.add(value)`` for each histogram ``h``, the bucket worked out once."""
        idx = int(math.log(value / _MIN) / _LOG_GROWTH) if value > _MIN else 0
        for h in hists:
            counts = h._counts
            counts[idx] = counts.get(idx, 0) + 1
            h.count += 1
            h.total += value
            if value > h.max:
                h.max = value

    def add_gaps(self, times: Sequence[float], start: int, stop: int, n: int = 1) -> None:
        """``add(times[i] - times[i - 1], n)`` for each ``i`` from ``start`` to ``stop - 1``,
        in that order (the same buckets and sums), in one call: an engine's decode leap
        records each iteration's inter-token gap this way."""
        if stop <= start:
            return
        counts = self._counts
        get = counts.get
        log = math.log
        total, most = self.total, self.max
        if stop - start > 2:
            # A leap's gaps grow slowly: when the smallest and the largest lie well inside
            # one bucket (by a margin no rounding of the logarithm reaches), every gap is in
            # it, and the sums are taken in C, in the same order.
            gaps = list(map(sub, times[start:stop], times[start - 1 : stop - 1]))
            low, high = min(gaps), max(gaps)
            if low > _MIN_SAFE:
                idx = int(log(low * _BELOW / _MIN) / _LOG_GROWTH)
                if idx == int(log(high * _ABOVE / _MIN) / _LOG_GROWTH):
                    counts[idx] = get(idx, 0) + n * len(gaps)
                    self.count += n * len(gaps)
                    self.total = reduce(add, map(mul, gaps, repeat(n)), total)
                    if high > most:
                        self.max = high
                    return
        prev = times[start - 1]
        for i in range(start, stop):
            t = times[i]
            value = t - prev
            prev = t
            idx = int(log(value / _MIN) / _LOG_GROWTH) if value > _MIN else 0
            counts[idx] = get(idx, 0) + n
            total += value * n
            if value > most:
                most = value
        self.count += n * (stop - start)
        self.total, self.max = total, most

    def merge(self, other: LogHistogram) -> None:
        for idx, n in other._counts.items():
            self._counts[idx] = self._counts.get(idx, 0) + n
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)

    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def count_le(self, bound: float) -> int:
        """How many values are ≤ ``bound`` (to bucket resolution), for Prometheus histograms."""
        limit = int(math.log(bound / _MIN) / _LOG_GROWTH) if bound > _MIN else 0
        return sum(n for idx, n in self._counts.items() if idx <= limit)

    def quantile(self, q: float) -> float:
        """The value at quantile ``q`` (0..1); 0 for an empty histogram."""
        if not self.count:
            return 0.0
        rank = q * self.count
        seen = 0
        for idx in sorted(self._counts):
            seen += self._counts[idx]
            if seen >= rank:
                # the bucket's geometric midpoint
                value = _MIN * _GROWTH ** (idx + 0.5) if idx else _MIN
                return min(value, self.max)
        return self.max
