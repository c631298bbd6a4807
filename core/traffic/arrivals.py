"""When requests arrive: :class:`Arrival` (a renewal process at a constant rate or following a
rate schedule of :class:`RatePoint` s) and the cumulative rate that maps a schedule to time."""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Literal

from pydantic import Field, model_validator

from shuniu.core.config import Options
from shuniu.core.traffic.errors import FieldError

__all__ = ["Arrival", "RatePoint"]


class RatePoint(Options):
    """One point of a rate schedule."""

    at_s: float = Field(ge=0)
    """From this time (seconds since the start)..."""
    rate: float = Field(ge=0)
    """...arrivals come at this rate (per second), until the next point."""
    ramp: bool = False
    """Reach this rate by a linear ramp from the previous point's rate, instead of a step."""


class Arrival(Options):
    """When requests (or, for ``chat`` streams, conversations) arrive.

    ``process`` shapes the gaps: ``poisson`` (exponential gaps), ``gamma`` (gamma gaps with
    coefficient of variation ``cv``: above 1 is burstier than Poisson, below 1 more regular)
    or ``constant`` (evenly spaced). Give either a constant ``rate`` or a ``schedule``; with a
    schedule the process runs in "operational time" (gaps of mean 1 mapped through the
    cumulative rate), so the instantaneous rate follows the schedule."""

    process: Literal["poisson", "gamma", "constant"] = "poisson"
    """Shape of the gaps between arrivals."""
    rate: float | None = Field(None, ge=0)
    """Arrivals per second (or give ``schedule``)."""
    cv: float | None = Field(None, gt=0, le=100)
    """Coefficient of variation of the gaps (``gamma`` only; 1 is Poisson)."""
    schedule: list[RatePoint] | None = Field(None, min_length=1)
    """Rate over time: the first point at ``at_s: 0``, times increasing; after the last point
    its rate holds (or the schedule repeats, see ``repeat_s``)."""
    repeat_s: float | None = Field(None, gt=0)
    """Repeat the schedule with this period (at least the last point's ``at_s``)."""

    @model_validator(mode="after")
    def _consistent(self) -> Arrival:
        if (self.rate is None) == (self.schedule is None):
            raise ValueError("give either `rate` or `schedule`")
        if self.process == "gamma" and self.cv is None:
            raise FieldError(("cv",), "required for process: gamma (1.0 is Poisson; larger is burstier)")
        if self.process != "gamma" and self.cv is not None:
            raise FieldError(("cv",), f"only process: gamma takes a cv (process is {self.process})")
        if self.schedule is not None:
            if self.schedule[0].at_s != 0:
                raise FieldError(("schedule", 0, "at_s"), "the first point must be at 0")
            if self.schedule[0].ramp:
                raise FieldError(("schedule", 0, "ramp"), "the first point has nothing to ramp from")
            for i in range(1, len(self.schedule)):
                if self.schedule[i].at_s <= self.schedule[i - 1].at_s:
                    raise FieldError(("schedule", i, "at_s"), "times must increase from point to point")
            if self.repeat_s is not None and self.repeat_s < self.schedule[-1].at_s:
                raise FieldError(("repeat_s",), "must be at least the last point's at_s")
        elif self.repeat_s is not None:
            raise FieldError(("repeat_s",), "only a schedule repeats")
        return self

    def scaled(self, factor: float) -> Arrival:
        if self.rate is not None:
            return self.model_copy(update={"rate": self.rate * factor})
        points = [p.model_copy(update={"rate": p.rate * factor}) for p in self.schedule or ()]
        return self.model_copy(update={"schedule": points})

    def mean_rate(self, duration: float) -> float:
        """Expected arrivals per second over ``[0, duration)``."""
        if self.rate is not None:
            return self.rate
        return _Intensity(self).cumulative(duration) / duration

    def times(self, rng: random.Random) -> Iterator[float]:
        """Arrival times, increasing, forever (or until the rate stays at 0)."""
        gap: Callable[[], float]
        if self.process == "poisson":
            expovariate = rng.expovariate

            def gap() -> float:
                return expovariate(1.0)

        elif self.process == "gamma":
            cv2 = (self.cv or 1.0) ** 2
            gammavariate, shape = rng.gammavariate, 1.0 / cv2

            def gap() -> float:
                return gammavariate(shape, cv2)  # mean 1, coefficient of variation cv

        else:

            def gap() -> float:
                return 1.0

        u = 0.0  # operational time: a unit-rate renewal process
        if self.rate is not None:
            if self.rate <= 0:
                return
            inv = 1.0 / self.rate
            while True:
                u += gap()
                yield u * inv
        intensity = _Intensity(self)
        while True:
            u += gap()
            t = intensity.inverse(u)
            if t == math.inf:
                return
            yield t


class _Intensity:
    """The cumulative rate of a schedule, Λ(t), and its inverse."""

    def __init__(self, arrival: Arrival) -> None:
        points = arrival.schedule or []
        self.period = arrival.repeat_s
        self.segments: list[tuple[float, float, float, float]] = []  # t0, t1, r0, r1
        for i, p in enumerate(points):
            if i + 1 < len(points):
                nxt = points[i + 1]
                t1, r1 = nxt.at_s, nxt.rate if nxt.ramp else p.rate
            else:
                t1, r1 = (self.period if self.period is not None else math.inf), p.rate
            self.segments.append((p.at_s, t1, p.rate, r1))
        masses = [
            (r0 + r1) / 2 * (t1 - t0) if t1 != math.inf else (math.inf if r0 > 0 else 0.0)
            for t0, t1, r0, r1 in self.segments
        ]
        self.starts = [0.0, *accumulate(masses)][:-1]
        self.total = sum(masses)

    def _within(self, t: float) -> float:
        for (t0, t1, r0, r1), start in zip(self.segments, self.starts, strict=True):
            if t < t1:
                d = t - t0
                slope = (r1 - r0) / (t1 - t0) if t1 != math.inf else 0.0
                return start + r0 * d + slope * d * d / 2
        return self.total

    def cumulative(self, t: float) -> float:
        if self.period is None:
            return self._within(t)
        k, rem = divmod(t, self.period)
        return k * self.total + self._within(rem)

    def _inverse_within(self, u: float) -> float:
        i = bisect_right(self.starts, u) - 1
        t0, t1, r0, r1 = self.segments[i]
        d = u - self.starts[i]
        if r0 == r1:
            return t0 + d / r0 if r0 > 0 else t1
        slope = (r1 - r0) / (t1 - t0)
        denominator = r0 + math.sqrt(max(r0 * r0 + 2 * slope * d, 0.0))
        tau = 2 * d / denominator if denominator > 0 else 0.0
        return min(t0 + tau, t1)

    def inverse(self, u: float) -> float:
        if self.period is None:
            if u >= self.total:
                return math.inf
            return self._inverse_within(u)
        if self.total <= 0:
            return math.inf
        k, rem = divmod(u, self.total)
        return k * self.period + self._inverse_within(rem)
