"""What ``shuniu bench`` sends and when: length distributions, arrival processes, request
bodies, and the plan (an iterator of :class:`Planned` requests) built from the command-line
options or from a simulator workload file.

Distributions and arrival processes are the simulator's own (:mod:`shuniu.core.traffic`), so
``lognormal:mean=500,sigma=0.5`` on the command line means exactly what
``{dist: lognormal, mean: 500, sigma: 0.5}`` means in a workload file, and a rate ramp is a
two-point ``schedule`` of an :class:`~shuniu.core.traffic.Arrival`. The traffic model is
imported lazily, when a plan is built, so that loading this plugin at every ``shuniu`` start
costs nothing.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from itertools import count
from typing import TYPE_CHECKING, Any

import msgspec

from shuniu.plugins.tools.bench.prompts import PromptMaker, ids_to_text

if TYPE_CHECKING:
    from shuniu.core.traffic import Arrival, Workload

__all__ = [
    "BodyBuilder",
    "Planned",
    "arrival_times",
    "describe_length",
    "length_sampler",
    "make_arrival",
    "parse_length",
    "parse_ramp",
    "synthetic_plan",
    "workload_plan",
]

_encode = msgspec.json.Encoder().encode

# --------------------------------------------------------------------------- lengths

_DIST_HELP = (
    "a token count: N, uniform:MIN:MAX, lognormal:mean=M,sigma=S[,min=A,max=B] "
    "or exponential:mean=M[,min=A,max=B]"
)


def parse_length(spec: str) -> Any:
    """A length distribution from its command-line form: ``256`` (fixed), ``uniform:100:400``
    (or ``uniform:min=100,max=400``), ``lognormal:mean=500,sigma=0.5`` and
    ``exponential:mean=200``, the last two optionally with ``min=``/``max=`` clamps. Returns
    the simulator's distribution object; raises ``ValueError`` with the accepted forms."""
    from pydantic import ValidationError

    from shuniu.core.traffic import Exponential, Fixed, LogNormal, Uniform

    text = spec.strip().lower()
    kind, _, rest = text.partition(":")
    fields: dict[str, Any] = {}
    try:
        if not rest:
            value = float(kind)
            cls: Any = Fixed
            fields = {"value": value}
            kind = "fixed"
        elif kind == "fixed":
            cls, fields = Fixed, {"value": float(rest)}
        elif kind in ("uniform", "lognormal", "exponential"):
            cls = {"uniform": Uniform, "lognormal": LogNormal, "exponential": Exponential}[kind]
            parts = [p.strip() for p in rest.split(",") if p.strip()]
            if kind == "uniform" and "=" not in rest:
                parts = [p for p in rest.split(":") if p]
                if len(parts) != 2:
                    raise ValueError("uniform takes two numbers")
                fields = {"min": float(parts[0]), "max": float(parts[1])}
            else:
                for part in parts:
                    key, eq, value = part.partition("=")
                    if not eq:
                        raise ValueError(f"expected key=value, got {part!r}")
                    fields[key.strip()] = float(value)
        else:
            raise ValueError(f"unknown distribution {kind!r}")
        dist = cls(dist=kind, **fields)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or kind}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise ValueError(f"{spec!r}: {problems}") from None
    except ValueError as exc:
        raise ValueError(f"{spec!r}: {exc}; expected {_DIST_HELP}") from None
    checks = [dist.value] if kind == "fixed" else [v for v in (dist.min, dist.max) if v is not None]
    for v in checks:
        if v < 1 or v != int(v):
            raise ValueError(f"{spec!r}: a token count must be a whole number >= 1 (got {v:g})")
    return dist


def length_sampler(dist: Any) -> Callable[[random.Random], int]:
    """``rng -> int`` drawing whole token counts >= 1 as the simulator's workloads do (uniform
    counts are ``randint(min, max)``, continuous ones are rounded)."""
    kind = dist.dist
    if kind == "fixed":
        value = int(dist.value)
        return lambda rng: value
    if kind == "uniform":
        lo, hi = int(dist.min), int(dist.max)
        return lambda rng: rng.randint(lo, hi)
    sample = dist.sample
    return lambda rng: max(1, round(sample(rng)))


def describe_length(dist: Any) -> str:
    """A short text form of a distribution, for reports."""
    kind = dist.dist
    if kind == "fixed":
        return f"{int(dist.value)}"
    if kind == "uniform":
        return f"uniform {int(dist.min)}-{int(dist.max)}"
    out = f"{kind} mean={dist.mean:g}"
    if kind == "lognormal":
        out += f" sigma={dist.sigma:g}"
    if dist.min is not None or dist.max is not None:
        out += f" [{dist.min or 1:g}, {'inf' if dist.max is None else f'{dist.max:g}'}]"
    return out


# --------------------------------------------------------------------------- arrivals


def parse_ramp(spec: str) -> tuple[float, float]:
    """``FROM:TO`` (requests/s) of a linear rate ramp."""
    a, sep, b = spec.partition(":")
    try:
        lo, hi = float(a), float(b)
    except ValueError:
        raise ValueError(f"--ramp takes FROM:TO in requests/s, e.g. 1:20 (got {spec!r})") from None
    if not sep or lo < 0 or hi < 0 or lo == hi == 0:
        raise ValueError(f"--ramp takes FROM:TO with rates >= 0, not both 0 (got {spec!r})")
    return lo, hi


def make_arrival(
    process: str,
    *,
    rate: float | None = None,
    ramp: tuple[float, float] | None = None,
    warmup_s: float = 0.0,
    duration_s: float | None = None,
    cv: float | None = None,
) -> Arrival:
    """The simulator's :class:`Arrival` for a constant ``rate``, or a ``ramp`` (FROM, TO)
    that holds FROM during ``warmup_s`` then rises (or falls) linearly to TO over
    ``duration_s`` and stays there."""
    from shuniu.core.traffic import Arrival

    extra: dict[str, Any] = {"cv": cv if cv is not None else 2.0} if process == "gamma" else {}
    if ramp is None:
        if rate is None or rate <= 0:
            raise ValueError("the request rate must be positive")
        return Arrival(process=process, rate=rate, **extra)
    if duration_s is None or duration_s <= 0:
        raise ValueError("--ramp needs --duration (the ramp spans it)")
    lo, hi = ramp
    points: list[dict[str, Any]] = [{"at_s": 0.0, "rate": lo}]
    if warmup_s > 0:
        points.append({"at_s": warmup_s, "rate": lo})
    points.append({"at_s": warmup_s + duration_s, "rate": hi, "ramp": True})
    return Arrival(process=process, schedule=points, **extra)


def arrival_times(arrival: Arrival, seed: int) -> Iterator[float]:
    """Arrival times (seconds from the start, increasing) of ``arrival`` under ``seed``."""
    return arrival.times(random.Random(seed * 1_000_003 + 17))


# --------------------------------------------------------------------------- bodies


class Planned(msgspec.Struct, gc=False):
    """One request of the plan."""

    at: float
    """Intended send time, seconds from the start (ignored in closed loop)."""
    api: str
    """``chat`` or ``completions``."""
    body: bytes
    """The JSON request body."""
    prompt_tokens: int
    """Prompt length as generated (words), before any chat template."""
    output_tokens: int | None
    """``max_tokens`` asked for (None: not set)."""


POOLING = frozenset({"embeddings", "rerank"})
"""The APIs whose requests carry several inputs and get one answer, never streamed."""

MESSAGES_MAX_TOKENS = 256
"""``max_tokens`` of an Anthropic Messages request when none is asked for (it is required)."""


class BodyBuilder:
    """Request bodies: ``model``, the prompt, ``max_tokens``; with ``stream``,
    ``stream_options.include_usage`` (so the last event counts the tokens); ``ignore_eos``
    (a vLLM extension) when asked; ``extra`` fields merged in last. Embeddings and rerank
    bodies carry ``inputs`` texts (inputs, or documents under a query)."""

    def __init__(
        self,
        model: str,
        *,
        stream: bool,
        ignore_eos: bool = False,
        extra: dict[str, Any] | None = None,
        inputs: int = 1,
    ) -> None:
        self.model = model
        self.stream = stream
        self.ignore_eos = ignore_eos
        self.extra = dict(extra or {})
        self.inputs = inputs

    def build(
        self, api: str, prefix: str, text: str, max_tokens: int | None, more: list[str] | None = None
    ) -> bytes:
        """A chat (or Anthropic Messages) body puts the shared ``prefix`` in a system
        message; a completions body puts it at the start of the prompt; an embeddings body
        has ``text`` and ``more`` as its inputs, a rerank body as its documents (the prefix,
        or the start of ``text``, is the query)."""
        body: dict[str, Any] = {"model": self.model}
        if api in POOLING:
            texts = [f"{prefix} {t}" if prefix else t for t in [text, *(more or ())]]
            if api == "embeddings":
                body["input"] = texts
            else:
                body["query"] = prefix or " ".join(text.split()[:8])
                body["documents"] = [text, *(more or ())]
            if self.extra:
                body.update(self.extra)
            return _encode(body)
        if api == "chat":
            messages = [{"role": "system", "content": prefix}] if prefix else []
            messages.append({"role": "user", "content": text})
            body["messages"] = messages
        elif api == "messages":
            if prefix:
                body["system"] = prefix
            body["messages"] = [{"role": "user", "content": text}]
            body["max_tokens"] = max_tokens if max_tokens is not None else MESSAGES_MAX_TOKENS
        else:
            body["prompt"] = f"{prefix} {text}" if prefix else text
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if self.stream:
            body["stream"] = True
            if api != "messages":
                body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.extra:
            body.update(self.extra)
        return _encode(body)


# --------------------------------------------------------------------------- plans


def synthetic_plan(
    *,
    api: str,
    builder: BodyBuilder,
    prompt_tokens: Any,
    output_tokens: Any | None,
    prompts: PromptMaker,
    seed: int,
    times: Iterator[float] | None = None,
) -> Iterator[Planned]:
    """Endless requests from length distributions (``output_tokens`` None: no
    ``max_tokens``); ``times`` gives their arrival times (None: all at 0, closed loop)."""
    rng = random.Random(seed)
    n_in = length_sampler(prompt_tokens)
    n_out = length_sampler(output_tokens) if output_tokens is not None else None
    prefix_len = prompts.prefix_tokens
    for i in count():
        at = 0.0
        if times is not None:
            at = next(times, math.inf)
            if at == math.inf:
                return
        tokens = n_in(rng)
        out = n_out(rng) if n_out is not None else None
        if api in POOLING:
            # Several inputs a request, each its own text of its own length.
            n = builder.inputs
            lengths = [tokens, *(n_in(rng) for _ in range(n - 1))]
            texts = [prompts.make(i * n + k, length)[1] for k, length in enumerate(lengths)]
            prefix = prompts.make(i * n, 1)[0]
            body = builder.build(api, prefix, texts[0], None, texts[1:])
            yield Planned(at, api, body, sum(lengths) + n * prefix_len, None)
            continue
        prefix, text = prompts.make(i, tokens)
        yield Planned(at, api, builder.build(api, prefix, text, out), prefix_len + tokens, out)


def workload_plan(
    workload: Workload, *, builder: BodyBuilder, seed: int, end_s: float, api: str | None = None
) -> Iterator[Planned]:
    """The workload's requests arriving before ``end_s`` (``math.inf``: no end), with their
    arrival times, lengths and shared prefixes; token ids become words with
    :func:`~shuniu.plugins.tools.bench.prompts.ids_to_text`, so a shared system prompt or a chat's
    history is the same text in every request that shares its ids. ``api`` overrides the
    workload's per-stream API."""
    for r in workload.requests(seed, end_s, prompts=True):
        kind = api or r.kind
        cut = r.prefix_tokens
        if cut and kind == "chat":
            prefix, text = ids_to_text(r.prompt[:cut]), ids_to_text(r.prompt[cut:])
        else:
            prefix, text = "", ids_to_text(r.prompt)
        yield Planned(
            r.arrival,
            kind,
            builder.build(kind, prefix, text, r.output_tokens),
            r.prompt_tokens,
            r.output_tokens,
        )
