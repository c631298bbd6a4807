"""The simulator's log-bucket histogram: a leap's batch of gaps counts as the gaps one by one."""

from __future__ import annotations

import random

import pytest

from shuniu.backends.sim import LogHistogram


@pytest.mark.parametrize("seed", range(20))
def test_add_gaps_is_add_of_each_gap(seed: int) -> None:
    rng = random.Random(seed)
    times = [0.0]
    for _ in range(200):  # gaps of every size, some below the first bucket, some repeated
        times.append(times[-1] + rng.choice([0.0, 1e-9, rng.uniform(1e-4, 0.2), 0.015]))
    one, batch = LogHistogram(), LogHistogram()
    for h in (one, batch):
        h.add(0.5, 3)  # earlier state carries over
    start, stop, n = rng.randint(1, 50), rng.randint(50, 201), rng.randint(1, 64)
    for i in range(start, stop):
        one.add(times[i] - times[i - 1], n)
    batch.add_gaps(times, start, stop, n)
    batch.add_gaps(times, stop, stop, n)  # an empty range adds nothing
    state = (batch._counts, batch.count, batch.total, batch.max)
    assert state == (one._counts, one.count, one.total, one.max)
    assert batch.quantile(0.99) == one.quantile(0.99)


@pytest.mark.parametrize("seed", range(12))
def test_add_gaps_of_a_leap_is_add_of_each_gap(seed: int) -> None:
    # A leap's gaps: nearly equal, slowly growing, each one a difference of running sums (so
    # rounding makes them wobble), often all in one bucket, sometimes across a bucket's edge
    # (where the shortcut must not be taken), and a jump down (a cut leap's next chunk).
    rng = random.Random(seed)
    one, batch = LogHistogram(), LogHistogram()
    for _ in range(300):
        edge = 1e-6 * 1.01 ** rng.randint(2_000, 3_000)  # about a bucket's edge (the growth's power)
        step = edge * (1 + rng.choice([-1e-12, 0.0, 1e-12, rng.uniform(-0.02, 0.02)]))
        growth = rng.choice([0.0, 1e-15, 1e-9, step * 1e-4])
        t = [rng.uniform(0, 1e4)]
        for i in range(rng.randint(1, 40)):
            t.append(t[-1] + step + i * growth)
        n = rng.randint(1, 300)
        for i in range(1, len(t)):
            one.add(t[i] - t[i - 1], n)
        batch.add_gaps(t, 1, len(t), n)
    assert (batch._counts, batch.count, batch.total, batch.max) == (
        one._counts,
        one.count,
        one.total,
        one.max,
    )


def test_add_each_is_add_to_each_histogram() -> None:
    rng = random.Random(7)
    ones = [LogHistogram() for _ in range(3)]
    each = [LogHistogram() for _ in range(3)]
    for _ in range(300):
        value = rng.choice([0.0, 1e-9, rng.uniform(1e-4, 3.0)])
        k = rng.randint(1, 3)
        for h in ones[:k]:
            h.add(value)
        LogHistogram.add_each(each[:k], value)
    for a, b in zip(ones, each, strict=True):
        assert (a._counts, a.count, a.total, a.max) == (b._counts, b.count, b.total, b.max)
