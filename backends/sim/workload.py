"""Workloads as data: what traffic a simulation (or a capacity plan) is run against.

A workload file (YAML) names one or more *streams* of requests, merged by arrival time:

- ``type: plain`` — requests from an arrival process with input/output length distributions,
  optionally a weighted mix of request ``classes`` (long/short) and optionally shared system
  prompts;
- ``type: chat`` — multi-turn conversations of ``users`` spread over ``tenants``, each user
  bound to one of K shared system prompts; every turn's prompt is the system prompt, the
  whole history so far (earlier user messages and the earlier answers' token ids) and a new
  user message, so a prefix cache can hit across users (system prompt) and across turns;
- ``type: trace`` — replay of a JSONL trace (arrival, prompt and output tokens, prefix group).

:meth:`Workload.requests` yields :class:`SimRequest` lazily in arrival order; only live
conversations keep state (a few integers per turn, never token lists), so a million requests
cost no more memory than one. Everything is deterministic under the ``seed`` argument.
Token ids come from :func:`shuniu.backends.sim.synthetic.synthetic_ids`; the simulated engine
generates an answer as ``synthetic_ids(output_seed, output_tokens)``, which is how the next
turn can carry it in its history.

``load_workload`` validates a file with pydantic and reports every problem with its field
path and YAML line, as deployment files are reported (:class:`WorkloadError` is a
:class:`~shuniu.core.errors.ConfigError`).
"""

from __future__ import annotations

import hashlib
import math
import random
from bisect import bisect_right
from collections.abc import Callable, Iterator
from functools import lru_cache
from heapq import heappop, heappush, merge
from itertools import accumulate
from operator import attrgetter
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    model_validator,
)

from shuniu.backends.sim.synthetic import synthetic_ids
from shuniu.core.config import Options
from shuniu.core.config_loader import _line_for, _path, interpolate_env, parse_yaml
from shuniu.core.errors import ConfigError, Problem

__all__ = [
    "Arrival",
    "ChatStream",
    "Exponential",
    "Fixed",
    "LogNormal",
    "PlainStream",
    "RatePoint",
    "RequestClass",
    "SimRequest",
    "Slo",
    "SystemPrompts",
    "TenantShare",
    "TraceLine",
    "TraceStream",
    "Uniform",
    "Workload",
    "WorkloadError",
    "describe",
    "load_workload",
]


# --------------------------------------------------------------------------- the request


class SimRequest(msgspec.Struct, gc=False):
    """One simulated request, as :meth:`Workload.requests` yields it."""

    arrival: float
    """Seconds from the start of the run."""
    prompt: list[int]
    """Prompt token ids (empty when generated with ``prompts=False``)."""
    output_tokens: int
    """Tokens the engine generates for it (as with ``ignore_eos``)."""
    output_seed: int
    """The engine's answer is ``synthetic_ids(output_seed, output_tokens)``."""
    tenant: str = "default"
    tier: str = "default"
    priority: int = 0
    """Smaller runs first (vLLM's convention)."""
    session: str | None = None
    """Conversation id (chat streams, or a trace's ``session``); for session affinity."""
    prefix_group: str | None = None
    """Name of the shared prefix (system prompt) the prompt starts with, if any."""
    kind: str = "chat"
    """API the request is sent to: ``chat`` or ``completions``."""
    prompt_tokens: int = -1
    """Prompt length; equals ``len(prompt)`` when prompts are generated (filled in from
    ``prompt`` when left at -1)."""
    prefix_tokens: int = 0
    """Length of the shared prefix at the start of the prompt (the system prompt)."""
    id: int = 0
    """Position in arrival order, from 0."""
    stream: str = ""
    """The stream (``name`` or ``name/class``) the request comes from, for per-class stats."""
    user: str | None = None
    turn: int = 0
    """Turn number within the conversation, from 0."""

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0:
            self.prompt_tokens = len(self.prompt)


# --------------------------------------------------------------------------- errors


class WorkloadError(ConfigError):
    """A workload file that cannot be used, with every problem found."""

    what = "workload"


class _At(ValueError):
    """A validation error that belongs to a field below the model that raised it."""

    def __init__(self, loc: tuple[Any, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


# --------------------------------------------------------------------------- distributions


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
            raise _At(("max",), f"max ({self.max:g}) is below min ({self.min:g})")
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
            raise _At(("max",), f"max ({self.max:g}) is below min ({self.min:g})")
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
            raise _At((name,), f"a count must be a whole number >= 1 (got {value:g})")
    return dist


_AnyDist = Annotated[Fixed | Uniform | LogNormal | Exponential, Field(discriminator="dist")]
Count = Annotated[_AnyDist, BeforeValidator(_number_is_fixed), AfterValidator(_whole_counts)]
"""A distribution of whole numbers >= 1 (token counts, turns): a bare integer is ``fixed``;
samples are rounded."""
Seconds = Annotated[_AnyDist, BeforeValidator(_number_is_fixed)]
"""A distribution of durations in seconds; a bare number is ``fixed``."""


def _sample_count(dist: Dist, rng: random.Random) -> int:
    if isinstance(dist, Fixed):
        return int(dist.value)
    if isinstance(dist, Uniform):
        return rng.randint(int(dist.min), int(dist.max))
    return max(1, round(dist.sample(rng)))


def _count_sampler(dist: Dist) -> Any:
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
    return lambda rng: _sample_count(dist, rng)


@lru_cache(maxsize=256)
def _moments(dist: Dist, count: bool) -> tuple[float, float]:
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
    xs = [_sample_count(dist, rng) if count else dist.sample(rng) for _ in range(n)]
    return sum(xs) / n, sum(x * x for x in xs) / n


# --------------------------------------------------------------------------- arrivals


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
            raise _At(("cv",), "required for process: gamma (1.0 is Poisson; larger is burstier)")
        if self.process != "gamma" and self.cv is not None:
            raise _At(("cv",), f"only process: gamma takes a cv (process is {self.process})")
        if self.schedule is not None:
            if self.schedule[0].at_s != 0:
                raise _At(("schedule", 0, "at_s"), "the first point must be at 0")
            if self.schedule[0].ramp:
                raise _At(("schedule", 0, "ramp"), "the first point has nothing to ramp from")
            for i in range(1, len(self.schedule)):
                if self.schedule[i].at_s <= self.schedule[i - 1].at_s:
                    raise _At(("schedule", i, "at_s"), "times must increase from point to point")
            if self.repeat_s is not None and self.repeat_s < self.schedule[-1].at_s:
                raise _At(("repeat_s",), "must be at least the last point's at_s")
        elif self.repeat_s is not None:
            raise _At(("repeat_s",), "only a schedule repeats")
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


# --------------------------------------------------------------------------- streams


class TenantShare(Options):
    """A tenant's share of a stream's traffic (of its users, for ``chat`` streams)."""

    name: str
    """Tenant name."""
    weight: float = Field(1.0, gt=0)
    """Relative share."""
    tier: str | None = None
    """Tier of this tenant's requests (default: the stream's ``tier``)."""
    priority: int | None = None
    """Priority of this tenant's requests (default: the stream's ``priority``)."""


class SystemPrompts(Options):
    """K shared system prompts, each a prefix group ``<stream>/system-<k>``."""

    count: int = Field(ge=1, le=1_000_000)
    """How many distinct system prompts (K)."""
    tokens: Count
    """Length of each (drawn once per prompt)."""


class RequestClass(Options):
    """One class of a mix (e.g. short and long requests), chosen with probability
    proportional to ``weight``."""

    name: str
    """Class name; requests carry ``stream: <stream>/<class>``."""
    weight: float = Field(gt=0)
    """Relative frequency."""
    input_tokens: Count
    """Prompt length (after the system prompt, if the stream has any)."""
    output_tokens: Count
    """Tokens generated."""
    tenant: str | None = None
    """Overrides the stream's (and its tenants') tenant."""
    tier: str | None = None
    """Overrides the stream's (and its tenants') tier."""
    priority: int | None = None
    """Overrides the stream's (and its tenants') priority."""


class _Traffic(Options):
    name: str | None = None
    """Stream name, unique in the workload (default: its type, numbered if repeated); part
    of every request's ``stream`` label and of the seeds, so renaming changes the draws."""
    tenant: str = "default"
    """Tenant of the requests (when ``tenants`` is not given)."""
    tier: str = "default"
    """Tier of the requests, unless a tenant or class says otherwise."""
    priority: int = 0
    """Priority of the requests (smaller runs first), unless a tenant or class says otherwise."""
    tenants: list[TenantShare] | None = Field(None, min_length=1)
    """Spread the traffic over several tenants by weight."""
    api: Literal["chat", "completions"] = "chat"
    """API the requests are sent to (``SimRequest.kind``)."""


class PlainStream(_Traffic):
    """Independent requests: an arrival process and length distributions (or a mix of
    classes); with ``system_prompts``, each prompt starts with one of them, chosen at random."""

    type: Literal["plain"] = "plain"
    """Stream type (``plain`` is the default)."""
    arrival: Arrival
    """When requests arrive."""
    input_tokens: Count | None = None
    """Prompt length (after the system prompt, if any). Or give ``classes``."""
    output_tokens: Count | None = None
    """Tokens generated. Or give ``classes``."""
    classes: list[RequestClass] | None = Field(None, min_length=1)
    """A weighted mix of request classes, instead of ``input_tokens``/``output_tokens``."""
    system_prompts: SystemPrompts | None = None
    """Shared prefixes, one picked uniformly at random per request."""

    @model_validator(mode="after")
    def _lengths(self) -> PlainStream:
        if self.classes is None:
            for name in ("input_tokens", "output_tokens"):
                if getattr(self, name) is None:
                    raise _At((name,), "required field is missing (or give `classes`)")
        else:
            for name in ("input_tokens", "output_tokens"):
                if getattr(self, name) is not None:
                    raise _At((name,), "give either `classes` or input_tokens/output_tokens")
        return self


class ChatStream(_Traffic):
    """Multi-turn conversations. A conversation starts at each arrival, for a user drawn
    uniformly from ``users``; user ``u`` belongs to a tenant (``tenants`` split the users in
    contiguous blocks by weight) and uses system prompt ``u mod K``. Turn ``j``'s prompt is the
    system prompt, then every earlier turn's user message and answer, then a new user message;
    turn ``j+1`` arrives ``think_time_s`` after turn ``j`` arrived (open loop: choose think
    times longer than an answer takes). A conversation ends after its ``turns``, or before a
    turn whose prompt plus answer would exceed ``max_prompt_tokens``."""

    type: Literal["chat"]
    """Stream type."""
    arrival: Arrival
    """When conversations start."""
    users: int = Field(100, ge=1)
    """Number of distinct users (M)."""
    system_prompts: SystemPrompts | None = None
    """Shared system prompts (none: conversations share no prefix)."""
    turns: Count
    """Turns per conversation."""
    think_time_s: Seconds
    """Seconds from one turn's arrival to the next."""
    user_tokens: Count
    """Length of each new user message."""
    output_tokens: Count
    """Length of each answer."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """End a conversation before a turn whose prompt + answer would exceed this (the
    model's context window)."""


class TraceStream(_Traffic):
    """Replay of a JSONL trace: one request per line, ``arrival`` non-decreasing. Required
    keys: ``arrival`` (s), ``prompt_tokens``, ``output_tokens``; optional: ``prefix_group`` with
    ``prefix_tokens`` (the prompt starts with that group's first ``prefix_tokens`` ids, shared
    by every line, and every trace stream, naming the group), ``tenant``, ``tier``,
    ``priority``, ``session``, ``api``. Other keys are errors."""

    type: Literal["trace"]
    """Stream type."""
    path: str
    """The JSONL file, relative to the workload file."""
    rate_multiplier: float = Field(1.0, gt=0)
    """Replay this many times faster (arrival times are divided by it)."""
    loop: bool = False
    """Start again at the end (each pass offset by the trace's span plus one mean gap)."""


def _stream_type(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("type", "plain")
    return getattr(value, "type", None)


Stream = Annotated[
    Annotated[PlainStream, Tag("plain")]
    | Annotated[ChatStream, Tag("chat")]
    | Annotated[TraceStream, Tag("trace")],
    Discriminator(_stream_type),
]


# --------------------------------------------------------------------------- SLO


class Slo(Options):
    """Service-level objective. The ``*_p99_s`` targets judge a whole run; the per-request
    thresholds decide whether one request counts toward goodput (a request meets the SLO when
    its TTFT, mean inter-token latency and end-to-end latency are all within the thresholds
    given). A per-request threshold left out defaults to the matching p99 target."""

    ttft_p99_s: float | None = Field(None, gt=0)
    """Target for the 99th percentile of time to first token."""
    itl_p99_s: float | None = Field(None, gt=0)
    """Target for the 99th percentile of inter-token latency."""
    e2e_p99_s: float | None = Field(None, gt=0)
    """Target for the 99th percentile of end-to-end latency."""
    ttft_s: float | None = Field(None, gt=0)
    """Per-request TTFT threshold for goodput (default: ``ttft_p99_s``)."""
    itl_s: float | None = Field(None, gt=0)
    """Per-request threshold on the request's mean inter-token latency (TPOT) for goodput
    (default: ``itl_p99_s``)."""
    e2e_s: float | None = Field(None, gt=0)
    """Per-request end-to-end threshold for goodput (default: ``e2e_p99_s``)."""

    @property
    def request_thresholds(self) -> tuple[float | None, float | None, float | None]:
        """(TTFT, ITL, E2E) thresholds a single request is judged by."""
        return (
            self.ttft_s if self.ttft_s is not None else self.ttft_p99_s,
            self.itl_s if self.itl_s is not None else self.itl_p99_s,
            self.e2e_s if self.e2e_s is not None else self.e2e_p99_s,
        )

    def meets(self, ttft: float, itl: float | None = None, e2e: float | None = None) -> bool:
        """Whether one request meets the SLO; ``itl`` is its mean inter-token latency (None
        for a single-token answer), ``e2e`` its end-to-end latency."""
        t, i, e = self.request_thresholds
        if t is not None and ttft > t:
            return False
        if i is not None and itl is not None and itl > i:
            return False
        return not (e is not None and e2e is not None and e2e > e)

    def satisfied(
        self, ttft_p99: float | None = None, itl_p99: float | None = None, e2e_p99: float | None = None
    ) -> bool:
        """Whether a run's p99s meet every p99 target set (a target with no value given fails)."""
        for target, value in (
            (self.ttft_p99_s, ttft_p99),
            (self.itl_p99_s, itl_p99),
            (self.e2e_p99_s, e2e_p99),
        ):
            if target is not None and (value is None or value > target):
                return False
        return True


# --------------------------------------------------------------------------- the workload


class Workload(Options):
    """A workload: streams of requests merged by arrival time, and an optional SLO."""

    name: str | None = None
    """Name shown in reports (default: the file name without extension)."""
    description: str = ""
    """What the workload models."""
    duration_s: float = Field(600.0, gt=0)
    """Default length of a run, seconds (``--duration`` overrides)."""
    slo: Slo | None = None
    """Service-level objective, for goodput and capacity planning."""
    streams: list[Stream] = Field(min_length=1)
    """The traffic: ``plain``, ``chat`` and ``trace`` streams, merged by arrival time."""

    _base_dir: Path | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _unique_names(self) -> Workload:
        seen: dict[str, int] = {}
        for i, name in enumerate(self.stream_names):
            if name in seen:
                raise _At(("streams", i, "name"), f"stream name {name!r} is used by streams[{seen[name]}]")
            seen[name] = i
        return self

    @property
    def stream_names(self) -> list[str]:
        """Each stream's name (its ``name``, or its type, numbered if the type repeats)."""
        types = [s.type for s in self.streams]
        return [
            s.name if s.name is not None else (s.type if types.count(s.type) == 1 else f"{s.type}-{i}")
            for i, s in enumerate(self.streams)
        ]

    @property
    def base_dir(self) -> Path:
        """Where relative trace paths are looked up (the workload file's folder)."""
        return self._base_dir if self._base_dir is not None else Path.cwd()

    def with_base_dir(self, base_dir: str | Path) -> Workload:
        copy = self.model_copy()
        copy._base_dir = Path(base_dir)
        return copy

    def scaled(self, factor: float) -> Workload:
        """The same workload with every arrival rate multiplied by ``factor`` (conversation
        starts for chat streams; replay speed for traces)."""
        if not factor > 0:
            raise ValueError("the scale factor must be positive")
        streams: list[Any] = []
        for s in self.streams:
            if isinstance(s, TraceStream):
                streams.append(s.model_copy(update={"rate_multiplier": s.rate_multiplier * factor}))
            else:
                streams.append(s.model_copy(update={"arrival": s.arrival.scaled(factor)}))
        copy = self.model_copy(update={"streams": streams})
        copy._base_dir = self._base_dir
        return copy

    def requests(
        self, seed: int = 0, duration: float | None = None, *, prompts: bool = True
    ) -> Iterator[SimRequest]:
        """The requests arriving before ``duration`` (default ``duration_s``; ``math.inf``
        for no end), lazily, in arrival order, with ids 0, 1, 2, ... With ``prompts=False``
        prompts are left empty (``prompt_tokens`` still set): much faster, for statistics."""
        end = self.duration_s if duration is None else duration
        gens = [
            _generate(stream, name, seed, end, prompts, self.base_dir)
            for stream, name in zip(self.streams, self.stream_names, strict=True)
        ]
        merged = gens[0] if len(gens) == 1 else merge(*gens, key=attrgetter("arrival"))
        for i, req in enumerate(merged):
            req.id = i
            yield req


# --------------------------------------------------------------------------- generation


def _seed(*parts: Any) -> int:
    """A stable 64-bit seed from ``parts`` (Python's ``hash`` of a str is salted per run)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


def _generate(
    stream: Any, name: str, seed: int, end: float, prompts: bool, base_dir: Path
) -> Iterator[SimRequest]:
    if isinstance(stream, PlainStream):
        return _plain(stream, name, seed, end, prompts)
    if isinstance(stream, ChatStream):
        return _chat(stream, name, seed, end, prompts)
    return _trace(stream, name, seed, end, prompts, base_dir)


class _SystemPrompts:
    """A stream's K system prompts: lengths drawn up front, ids made on first use."""

    def __init__(self, cfg: SystemPrompts | None, stream: str, seed: int) -> None:
        self.count = cfg.count if cfg is not None else 0
        rng = random.Random(_seed(seed, stream, "system-prompts"))
        self.lengths = [_sample_count(cfg.tokens, rng) for _ in range(self.count)] if cfg else []
        self.seeds = [rng.getrandbits(64) for _ in range(self.count)]
        self.names = [f"{stream}/system-{k}" for k in range(self.count)]
        self._ids: dict[int, list[int]] = {}

    def ids(self, k: int) -> list[int]:
        found = self._ids.get(k)
        if found is None:
            found = self._ids[k] = synthetic_ids(self.seeds[k], self.lengths[k])
        return found


def _people(s: _Traffic, tenants: list[TenantShare]) -> list[tuple[str, str, int]]:
    """(tenant, tier, priority) of each tenant share, the stream's values filling in."""
    return [
        (
            t.name,
            t.tier if t.tier is not None else s.tier,
            t.priority if t.priority is not None else s.priority,
        )
        for t in tenants
    ]


def _pick(cumulative: list[float]) -> Any:
    total = cumulative[-1]
    return lambda rng: bisect_right(cumulative, rng.random() * total)


def _plain(s: PlainStream, name: str, seed: int, end: float, prompts: bool) -> Iterator[SimRequest]:
    times = s.arrival.times(random.Random(_seed(seed, name, "arrivals")))
    rng = random.Random(_seed(seed, name, "content"))
    system = _SystemPrompts(s.system_prompts, name, seed)
    tenants = s.tenants or [TenantShare(name=s.tenant)]
    people = _people(s, tenants)
    pick_tenant = _pick(list(accumulate(t.weight for t in tenants)))
    if s.classes is None:
        assert s.input_tokens is not None and s.output_tokens is not None
        classes = [(name, _count_sampler(s.input_tokens), _count_sampler(s.output_tokens), None, None, None)]
        pick_class = None
    else:
        classes = [
            (
                f"{name}/{c.name}",
                _count_sampler(c.input_tokens),
                _count_sampler(c.output_tokens),
                c.tenant,
                c.tier,
                c.priority,
            )
            for c in s.classes
        ]
        pick_class = _pick(list(accumulate(c.weight for c in s.classes)))
    getrandbits, randrange, kind = rng.getrandbits, rng.randrange, s.api
    for t in times:
        if t >= end:
            return
        label, input_len, output_len, c_tenant, c_tier, c_priority = classes[
            pick_class(rng) if pick_class else 0
        ]
        tenant, tier, priority = people[pick_tenant(rng)] if len(people) > 1 else people[0]
        n_in = input_len(rng)
        n_out = output_len(rng)
        prompt_seed = getrandbits(64)
        output_seed = getrandbits(64)
        group, prefix_len, prefix = None, 0, None
        if system.count:
            k = randrange(system.count)
            group, prefix_len = system.names[k], system.lengths[k]
            if prompts:
                prefix = system.ids(k)
        if prompts:
            prompt = synthetic_ids(prompt_seed, n_in)
            if prefix is not None:
                prompt = prefix + prompt
        else:
            prompt = []
        yield SimRequest(
            t,
            prompt,
            n_out,
            output_seed,
            c_tenant if c_tenant is not None else tenant,
            c_tier if c_tier is not None else tier,
            c_priority if c_priority is not None else priority,
            None,
            group,
            kind,
            prefix_len + n_in,
            prefix_len,
            0,
            label,
        )


class _Conversation:
    """A live conversation: a few numbers per turn, never token lists."""

    __slots__ = ("history", "index", "length", "rng", "turn", "turns", "user")

    def __init__(self, index: int, user: int, turns: int, rng: random.Random) -> None:
        self.index = index
        self.user = user
        self.turns = turns
        self.rng = rng
        self.turn = 0
        self.history: list[tuple[int, int]] = []
        """(seed, length) of each earlier user message and answer, in order."""
        self.length = 0
        """Tokens of history."""


def _chat(s: ChatStream, name: str, seed: int, end: float, prompts: bool) -> Iterator[SimRequest]:
    starts = s.arrival.times(random.Random(_seed(seed, name, "arrivals")))
    system = _SystemPrompts(s.system_prompts, name, seed)
    tenants = s.tenants or [TenantShare(name=s.tenant)]
    total = sum(t.weight for t in tenants)
    # Users split into contiguous blocks by tenant weight: bounds[i] = first user of tenant i+1.
    bounds = [round(s.users * c / total) for c in accumulate(t.weight for t in tenants)]
    people = _people(s, tenants)
    turns, think, user_len, output_len = (
        _count_sampler(s.turns),
        s.think_time_s,
        _count_sampler(s.user_tokens),
        _count_sampler(s.output_tokens),
    )
    limit = s.max_prompt_tokens
    heap: list[tuple[float, int, _Conversation]] = []
    next_start = next(starts, math.inf)
    started = 0
    while True:
        if heap and heap[0][0] <= next_start:
            at, _, conv = heappop(heap)
        else:
            at = next_start
            if at >= end:
                return
            rng = random.Random(_seed(seed, name, "conversation", started))
            conv = _Conversation(started, rng.randrange(s.users), turns(rng), rng)
            started += 1
            next_start = next(starts, math.inf)
        if at >= end:
            return  # the heap's earliest turn is past the end, and so is every later event
        rng = conv.rng
        user = conv.user
        n_user = user_len(rng)
        n_out = output_len(rng)
        k = user % system.count if system.count else -1
        prefix_len = system.lengths[k] if k >= 0 else 0
        n_prompt = prefix_len + conv.length + n_user
        if limit is not None and n_prompt + n_out > limit:
            continue  # the conversation ends: its context is full
        user_seed = rng.getrandbits(64)
        output_seed = rng.getrandbits(64)
        if prompts:
            prompt = list(system.ids(k)) if k >= 0 else []
            for part_seed, part_len in conv.history:
                prompt += synthetic_ids(part_seed, part_len)
            prompt += synthetic_ids(user_seed, n_user)
        else:
            prompt = []
        tenant, tier, priority = people[bisect_right(bounds, user)] if len(people) > 1 else people[0]
        yield SimRequest(
            at,
            prompt,
            n_out,
            output_seed,
            tenant,
            tier,
            priority,
            f"{name}/c{conv.index}",
            system.names[k] if k >= 0 else None,
            s.api,
            n_prompt,
            prefix_len,
            0,
            name,
            f"{name}/u{user}",
            conv.turn,
        )
        conv.turn += 1
        if conv.turn < conv.turns:
            conv.history.append((user_seed, n_user))
            conv.history.append((output_seed, n_out))
            conv.length += n_user + n_out
            heappush(heap, (at + think.sample(rng), conv.index, conv))


# --------------------------------------------------------------------------- traces


class TraceLine(msgspec.Struct, forbid_unknown_fields=True):
    """One line of a JSONL trace."""

    arrival: Annotated[float, msgspec.Meta(ge=0)]
    prompt_tokens: Annotated[int, msgspec.Meta(ge=1)]
    output_tokens: Annotated[int, msgspec.Meta(ge=1)]
    prefix_group: str | None = None
    prefix_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    tenant: str | None = None
    tier: str | None = None
    priority: int | None = None
    session: str | None = None
    api: Literal["chat", "completions"] | None = None


_decode_line = msgspec.json.Decoder(TraceLine).decode


class _TraceStats(msgspec.Struct):
    count: int = 0
    last_arrival: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    groups: int = 0
    problems: list[str] = msgspec.field(default_factory=list)

    @property
    def period(self) -> float:
        """Replay period of a looped trace: its span plus one mean gap."""
        if self.count <= 1:
            return max(self.last_arrival, 1.0)
        return self.last_arrival * self.count / (self.count - 1)


def _check_line(line: TraceLine) -> str | None:
    if line.prefix_group is not None and line.prefix_tokens is None:
        return "`prefix_group` needs `prefix_tokens`"
    if line.prefix_tokens is not None:
        if line.prefix_group is None:
            return "`prefix_tokens` needs `prefix_group`"
        if line.prefix_tokens > line.prompt_tokens:
            return f"`prefix_tokens` ({line.prefix_tokens}) exceeds `prompt_tokens` ({line.prompt_tokens})"
    return None


def _scan_trace(path: Path, max_problems: int = 20) -> _TraceStats:
    """Validate a trace file in one streaming pass and summarize it."""
    key = path.resolve()
    try:
        stat = key.stat()
    except OSError as exc:
        return _TraceStats(problems=[f"cannot read trace file {str(path)!r}: {exc.strerror}"])
    return _scan_cached(key, stat.st_mtime_ns, stat.st_size, max_problems)


@lru_cache(maxsize=32)
def _scan_cached(path: Path, mtime_ns: int, size: int, max_problems: int) -> _TraceStats:
    stats = _TraceStats()
    groups: set[str] = set()
    previous = 0.0
    try:
        with path.open("rb") as f:
            for number, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    line = _decode_line(raw)
                except msgspec.ValidationError as exc:
                    stats.problems.append(f"{path.name} line {number}: {exc}")
                except msgspec.DecodeError as exc:
                    stats.problems.append(f"{path.name} line {number}: not valid JSON ({exc})")
                else:
                    problem = _check_line(line)
                    if problem is None and line.arrival < previous:
                        problem = f"arrival {line.arrival:g} is before the previous line's ({previous:g})"
                    if problem is not None:
                        stats.problems.append(f"{path.name} line {number}: {problem}")
                    else:
                        previous = line.arrival
                        stats.count += 1
                        stats.last_arrival = line.arrival
                        stats.prompt_tokens += line.prompt_tokens
                        stats.output_tokens += line.output_tokens
                        if line.prefix_group is not None:
                            groups.add(line.prefix_group)
                if len(stats.problems) >= max_problems:
                    stats.problems.append("(more problems not shown)")
                    break
    except OSError as exc:
        stats.problems.append(f"cannot read trace file {str(path)!r}: {exc.strerror}")
    if not stats.problems and stats.count == 0:
        stats.problems.append(f"{path.name} holds no requests")
    stats.groups = len(groups)
    return stats


def _trace(
    s: TraceStream, name: str, seed: int, end: float, prompts: bool, base_dir: Path
) -> Iterator[SimRequest]:
    path = base_dir / s.path
    stats = _scan_trace(path)
    if stats.problems:
        raise WorkloadError([Problem("path", p) for p in stats.problems], str(path))
    rng = random.Random(_seed(seed, name, "content"))
    scale = 1.0 / s.rate_multiplier
    prefixes: dict[str, list[int]] = {}
    passes = range(1_000_000_000) if s.loop else range(1)
    for k in passes:
        offset = k * stats.period
        suffix = f"#{k}" if k else ""
        with path.open("rb") as f:
            for raw in f:
                if not raw.strip():
                    continue
                line = _decode_line(raw)
                at = (line.arrival + offset) * scale
                if at >= end:
                    return
                prefix_len = line.prefix_tokens or 0
                unique_seed = rng.getrandbits(64)
                output_seed = rng.getrandbits(64)
                if prompts:
                    prompt = synthetic_ids(unique_seed, line.prompt_tokens - prefix_len)
                    if line.prefix_group is not None and prefix_len:
                        ids = prefixes.get(line.prefix_group)
                        if ids is None or len(ids) < prefix_len:
                            if len(prefixes) > 4096:
                                prefixes.clear()
                            ids = prefixes[line.prefix_group] = synthetic_ids(
                                _seed(seed, "group", line.prefix_group), prefix_len
                            )
                        prompt = ids[:prefix_len] + prompt
                else:
                    prompt = []
                yield SimRequest(
                    at,
                    prompt,
                    line.output_tokens,
                    output_seed,
                    line.tenant if line.tenant is not None else s.tenant,
                    line.tier if line.tier is not None else s.tier,
                    line.priority if line.priority is not None else s.priority,
                    line.session + suffix if line.session is not None else None,
                    line.prefix_group,
                    line.api if line.api is not None else s.api,
                    line.prompt_tokens,
                    prefix_len,
                    0,
                    name,
                )


# --------------------------------------------------------------------------- loading


_TAGGED: dict[str, type[Options]] = {
    "plain": PlainStream,
    "chat": ChatStream,
    "trace": TraceStream,
    "fixed": Fixed,
    "uniform": Uniform,
    "lognormal": LogNormal,
    "exponential": Exponential,
}


def _model_in(annotation: Any) -> type[Options] | None:
    """The first pydantic model inside an annotation (list[X], X | None, Annotated[X, ...])."""
    if isinstance(annotation, type) and issubclass(annotation, Options):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or getattr(annotation, "__metadata__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    origin = getattr(annotation, "__origin__", None)
    return _model_in(origin) if origin is not None and origin is not annotation else None


def _model_at(loc: tuple[Any, ...]) -> type[Options] | None:
    """The model at a pydantic error location (union tags pick the member)."""
    current: type[Options] | None = Workload
    for part in loc:
        if isinstance(part, int):
            continue
        if current is not None and part in current.model_fields:
            current = _model_in(current.model_fields[part].annotation)
        elif part in _TAGGED:
            current = _TAGGED[part]
        else:
            return None
    return current


def _clean(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """An error location as a path in the data: pydantic's union tags removed, and a last
    step that is not in the data kept only where it names a missing field of a mapping."""
    out: list[Any] = []
    for i, part in enumerate(loc):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        elif i < len(loc) - 1 or part in _TAGGED or not isinstance(data, dict):
            continue
        out.append(part)
    return tuple(out)


def _problems(exc: ValidationError, data: Any, lines: dict[tuple[Any, ...], int]) -> list[Problem]:
    problems = []
    for err in exc.errors(include_url=False):
        raw = tuple(err["loc"])
        loc = _clean(raw, data)
        kind, message = err["type"], err["msg"]
        ctx = err.get("ctx") or {}
        if kind == "value_error" and isinstance(ctx.get("error"), _At):
            loc = _clean((*loc, *ctx["error"].loc), data)
            message = ctx["error"].message
        elif kind == "value_error":
            message = str(ctx.get("error", message))
        elif kind == "extra_forbidden":
            model = _model_at(raw[:-1])
            message = f"unknown field {raw[-1]!r}"
            if model is not None:
                message += "; expected one of: " + ", ".join(sorted(model.model_fields))
        elif kind == "missing":
            message = "required field is missing"
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            field = "dist" if "dist" in str(ctx.get("discriminator", "")) else "type"
            loc = (*loc, field)
            expected = ctx.get("expected_tags") or (
                "'fixed', 'uniform', 'lognormal', 'exponential'"
                if field == "dist"
                else "'plain', 'chat', 'trace'"
            )
            got = f"{ctx['tag']!r}" if "tag" in ctx else "nothing"
            message = f"expected one of {expected} (got {got})"
            if kind == "union_tag_not_found" and field == "dist":
                message = f"required field is missing; one of {expected}"
        elif kind in ("model_attributes_type", "model_type") and _model_at(raw) is Fixed:
            message = f"expected a number or a mapping with `dist:` (got {err.get('input')!r})"
        elif "input" in err and not isinstance(err["input"], dict | list):
            message += f" (got {err['input']!r})"
        problems.append(Problem(_path(loc), message, _line_for(lines, loc)))
    return problems


def load_workload(
    source: str | Path, *, text: str | None = None, env: dict[str, str] | None = None
) -> Workload:
    """Read and validate a workload: ``source`` is a file path, or YAML text (a ``str``
    holding a newline); ``text`` gives the YAML with ``source`` naming it. ``${VAR}`` and
    ``${VAR:-default}`` are interpolated as in deployment files. Relative trace paths are
    resolved against the file's folder (the working directory for text). Raises
    :class:`WorkloadError` (a :class:`ConfigError`) listing every problem with its line."""
    base_dir = Path.cwd()
    if text is None and isinstance(source, str) and "\n" in source:
        text, name = source, "<text>"
    elif text is None:
        name = str(source)
        try:
            text = Path(source).read_text("utf-8")
        except OSError as exc:
            raise WorkloadError([Problem("", f"cannot read file: {exc.strerror}")], name) from None
        base_dir = Path(source).parent
    else:
        name = str(source)
    data, lines = parse_yaml(text, name, WorkloadError)
    if not isinstance(data, dict):
        raise WorkloadError([Problem("", "the file must be a YAML mapping with a `streams:` list", 1)], name)
    problems: list[Problem] = []
    data = interpolate_env(data, problems, env, lines=lines)
    try:
        workload: Workload | None = Workload.model_validate(data)
    except ValidationError as exc:
        problems.extend(_problems(exc, data, lines))
        workload = None
    if workload is not None:
        for i, stream in enumerate(workload.streams):
            if isinstance(stream, TraceStream):
                loc = ("streams", i, "path")
                for message in _scan_trace(base_dir / stream.path).problems:
                    problems.append(Problem(_path(loc), message, _line_for(lines, loc)))
    if workload is None or problems:
        raise WorkloadError(problems, name)
    if workload.name is None and name != "<text>":
        workload = workload.model_copy(update={"name": Path(name).stem})
    return workload.with_base_dir(base_dir)


# --------------------------------------------------------------------------- describe


def _stream_summary(stream: Any, name: str, duration: float, base_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "type": stream.type}
    system_mean, groups = 0.0, 0
    if not isinstance(stream, TraceStream) and stream.system_prompts is not None:
        system_mean = _moments(stream.system_prompts.tokens, True)[0]
        groups = stream.system_prompts.count
    if isinstance(stream, PlainStream):
        rate = stream.arrival.mean_rate(duration)
        if stream.classes is None:
            assert stream.input_tokens is not None and stream.output_tokens is not None
            mean_in = _moments(stream.input_tokens, True)[0]
            mean_out = _moments(stream.output_tokens, True)[0]
        else:
            total = sum(c.weight for c in stream.classes)
            mean_in = sum(c.weight * _moments(c.input_tokens, True)[0] for c in stream.classes) / total
            mean_out = sum(c.weight * _moments(c.output_tokens, True)[0] for c in stream.classes) / total
            out["classes"] = {c.name: round(c.weight / total, 4) for c in stream.classes}
        mean_in += system_mean
    elif isinstance(stream, ChatStream):
        conversations = stream.arrival.mean_rate(duration)
        t1, t2 = _moments(stream.turns, True)
        user = _moments(stream.user_tokens, True)[0]
        mean_out = _moments(stream.output_tokens, True)[0]
        # Turn j (from 0) carries j earlier exchanges: E[sum_j j] / E[T] = E[T(T-1)] / (2 E[T]).
        mean_in = system_mean + user + (user + mean_out) * (t2 - t1) / (2 * t1)
        rate = conversations * t1
        out["conversation_rate"] = conversations
        out["mean_turns"] = t1
        out["users"] = stream.users
    else:
        stats = _scan_trace(base_dir / stream.path)
        count = max(stats.count, 1)
        rate = stats.count / (stats.period if stream.loop else max(stats.last_arrival, 1e-9))
        rate *= stream.rate_multiplier
        if not stream.loop:
            rate = min(rate, stats.count / duration)
        mean_in, mean_out, groups = stats.prompt_tokens / count, stats.output_tokens / count, stats.groups
    out.update(
        request_rate=rate,
        mean_input_tokens=mean_in,
        mean_output_tokens=mean_out,
        prefix_groups=groups,
    )
    return out


def describe(workload: Workload, duration: float | None = None) -> dict[str, Any]:
    """Expected request rate (averaged over the run for schedules), mean input and output
    tokens and the number of prefix groups, per stream and in total. Chat streams are given in
    steady state: rate = conversation rate x mean turns (the first conversations take a
    while to build up, and conversations still going at the end are cut), input = the mean
    over turns of the growing prompt, ignoring ``max_prompt_tokens`` cut-offs. Traces are
    summarized from the file."""
    d = workload.duration_s if duration is None else duration
    streams = [
        _stream_summary(s, name, d, workload.base_dir)
        for s, name in zip(workload.streams, workload.stream_names, strict=True)
    ]
    rate = sum(s["request_rate"] for s in streams)
    weight = rate or 1.0
    return {
        "name": workload.name,
        "duration_s": d,
        "request_rate": rate,
        "expected_requests": rate * d,
        "mean_input_tokens": sum(s["request_rate"] * s["mean_input_tokens"] for s in streams) / weight,
        "mean_output_tokens": sum(s["request_rate"] * s["mean_output_tokens"] for s in streams) / weight,
        "prefix_groups": sum(s["prefix_groups"] for s in streams),
        "slo": workload.slo.model_dump(exclude_none=True) if workload.slo is not None else None,
        "streams": streams,
    }
