"""Distributions of token counts and durations (``fixed``, ``uniform``, ``lognormal``,
``exponential``), how a workload file writes them (:data:`Count`, :data:`Seconds`), fast
samplers and their moments."""

from __future__ import annotations

import math
import random
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from shuniu.core.config import Options
from shuniu.core.traffic.errors import FieldError

__all__ = [
    "Count",
    "Dist",
    "Exponential",
    "Fixed",
    "LogNormal",
    "Seconds",
    "Uniform",
    "count_sampler",
    "moments",
    "sample_count",
]


class Fixed(Options):
    """Always the same value."""

    dist: Literal["fixed"]
    value: float = Field(ge=0)
    """The value."""

    def sample(self, rng: random.Random) -> float:
        return self.value


class Uniform(Options):
    """Uniform between ``min`` and ``max`` inclusive (whole numbers for token counts)."""

    dist: Literal["uniform"]
    min: float = Field(ge=0)
    """Smallest value."""
    max: float = Field(ge=0)
    """Largest value."""

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.max < self.min:
            raise FieldError(("max",), f"max ({self.max:g}) is below min ({self.min:g})")
        return self

    def sample(self, rng: random.Random) -> float:
        return self.min + (self.max - self.min) * rng.random()


class _Clamped(Options):
    min: float | None = Field(None, ge=0)
    """Samples below are raised to this (optional)."""
    max: float | None = Field(None, ge=0)
    """Samples above are lowered to this (optional)."""

    @model_validator(mode="after")
    def _ordered(self) -> _Clamped:
        if self.min is not None and self.max is not None and self.max < self.min:
            raise FieldError(("max",), f"max ({self.max:g}) is below min ({self.min:g})")
        return self

    def _clamp(self, x: float) -> float:
        if self.min is not None and x < self.min:
            return self.min
        if self.max is not None and x > self.max:
            return self.max
        return x


class LogNormal(_Clamped):
    """Log-normal with the given arithmetic ``mean`` and shape ``sigma`` (the standard
    deviation of the logarithm: 0.5 is moderate spread, 1.0 heavy-tailed; the median is
    ``mean / exp(sigma**2 / 2)``), optionally clamped to ``[min, max]``."""

    dist: Literal["lognormal"]
    mean: float = Field(gt=0)
    """Mean of the (unclamped) distribution."""
    sigma: float = Field(ge=0, le=4)
    """Standard deviation of ln(x)."""

    def sample(self, rng: random.Random) -> float:
        mu = math.log(self.mean) - self.sigma * self.sigma / 2
        return self._clamp(rng.lognormvariate(mu, self.sigma))


class Exponential(_Clamped):
    """Exponential with the given ``mean``, optionally clamped to ``[min, max]``."""

    dist: Literal["exponential"]
    mean: float = Field(gt=0)
    """Mean of the (unclamped) distribution."""

    def sample(self, rng: random.Random) -> float:
        return self._clamp(rng.expovariate(1.0 / self.mean))


Dist = Fixed | Uniform | LogNormal | Exponential


def _number_is_fixed(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


def _whole_counts(dist: Dist) -> Dist:
    if isinstance(dist, Fixed):
        checks = [("value", dist.value)]
    else:
        checks = [("min", dist.min), ("max", dist.max)]
    for name, value in checks:
        if value is not None and (value < 1 or value != int(value)):
            raise FieldError((name,), f"a count must be a whole number >= 1 (got {value:g})")
    return dist


_AnyDist = Annotated[Fixed | Uniform | LogNormal | Exponential, Field(discriminator="dist")]
Count = Annotated[_AnyDist, BeforeValidator(_number_is_fixed), AfterValidator(_whole_counts)]
"""A distribution of whole numbers >= 1 (token counts, turns): a bare integer is ``fixed``;
samples are rounded."""
Seconds = Annotated[_AnyDist, BeforeValidator(_number_is_fixed)]
"""A distribution of durations in seconds; a bare number is ``fixed``."""


def sample_count(dist: Dist, rng: random.Random) -> int:
    """One sample of a count distribution, rounded to a whole number >= 1."""
    if isinstance(dist, Fixed):
        return int(dist.value)
    if isinstance(dist, Uniform):
        return rng.randint(int(dist.min), int(dist.max))
    return max(1, round(dist.sample(rng)))


def count_sampler(dist: Dist) -> Any:
    """A fast ``rng -> int`` for a count distribution."""
    if isinstance(dist, Fixed):
        value = int(dist.value)
        return lambda rng: value
    if isinstance(dist, Uniform):
        lo, hi = int(dist.min), int(dist.max)
        return lambda rng: rng.randint(lo, hi)
    if isinstance(dist, LogNormal):
        mu, sigma = math.log(dist.mean) - dist.sigma**2 / 2, dist.sigma
        lo = max(1, dist.min or 1)
        hi = math.inf if dist.max is None else dist.max

        def lognormal(rng: random.Random) -> int:
            x = round(rng.lognormvariate(mu, sigma))
            return int(lo if x < lo else hi if x > hi else x)

        return lognormal
    return lambda rng: sample_count(dist, rng)


@lru_cache(maxsize=256)
def moments(dist: Dist, count: bool) -> tuple[float, float]:
    """E[X] and E[X^2] of a distribution (of its rounded samples when ``count``)."""
    if isinstance(dist, Fixed):
        v = int(dist.value) if count else dist.value
        return v, v * v
    if isinstance(dist, Uniform):
        mean = (dist.min + dist.max) / 2
        width = dist.max - dist.min
        var = ((width + 1) ** 2 - 1) / 12 if count else width**2 / 12
        return mean, var + mean * mean
    rng = random.Random(0x5EED)
    n = 40000
    xs = [sample_count(dist, rng) if count else dist.sample(rng) for _ in range(n)]
    return sum(xs) / n, sum(x * x for x in xs) / n
