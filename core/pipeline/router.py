"""Routing before balancing: which pool serves a request, and on which version.

Per model, ``routes`` rules (by request kind, prompt length, tier, input modality, tools,
reasoning effort, response format, the classifier's label) may send a request to another
model's pool — one hop, the target's own rules are not applied, so rules
cannot loop. Then the pool's ``traffic`` split draws the version label the request runs on
(a canary), unless the request pins one with the model's ``version_header``.
"""

from __future__ import annotations

import bisect
import itertools
import random
from dataclasses import dataclass

from shuniu.core.config import ModelConfig
from shuniu.core.errors import bad_request
from shuniu.core.pools.pool import Pool
from shuniu.core.types import InferenceRequest

__all__ = ["Router", "response_format"]


def response_format(req: InferenceRequest) -> str:
    """The request's ``response_format.type`` (``text`` when it sets none)."""
    fmt = req.body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    return kind if isinstance(kind, str) else "text"


@dataclass(frozen=True, slots=True)
class _Rule:
    apis: frozenset[str] | None
    tiers: frozenset[str] | None
    min_tokens: int | None
    max_tokens: int | None
    to: Pool
    modalities: frozenset[str] | None = None
    tools: bool | None = None
    efforts: frozenset[str] | None = None
    formats: frozenset[str] | None = None
    labels: frozenset[str] | None = None

    def matches(self, req: InferenceRequest) -> bool:
        if not (
            (self.apis is None or req.api in self.apis)
            and (self.tiers is None or req.principal.tier in self.tiers)
            and (self.min_tokens is None or req.prompt_tokens >= self.min_tokens)
            and (self.max_tokens is None or req.prompt_tokens <= self.max_tokens)
            and (self.modalities is None or not self.modalities.isdisjoint(req.modalities))
            and (self.labels is None or req.label in self.labels)
        ):
            return False
        body = req.body
        return (
            (self.tools is None or bool(body.get("tools")) == self.tools)
            and (self.efforts is None or body.get("reasoning_effort") in self.efforts)
            and (self.formats is None or response_format(req) in self.formats)
        )


class _Split:
    """Weighted draw of a version label (cumulative weights + bisect)."""

    __slots__ = ("cumulative", "rng", "total", "versions")

    def __init__(self, traffic: dict[str, float], rng: random.Random) -> None:
        items = [(v, w) for v, w in traffic.items() if w > 0]
        self.versions = [v for v, _ in items]
        self.cumulative = list(itertools.accumulate(w for _, w in items))
        self.total = self.cumulative[-1]
        self.rng = rng

    def draw(self) -> str:
        if len(self.versions) == 1:
            return self.versions[0]
        return self.versions[bisect.bisect_right(self.cumulative, self.rng.random() * self.total)]


class Router:
    """Resolves ``(request, the pool its model names)`` to the pool that serves it."""

    __slots__ = ("_pin_header", "_rng", "_rules", "_splits")

    def __init__(
        self, models: dict[str, ModelConfig], pools: dict[str, Pool], *, seed: int | None = None
    ) -> None:
        rng = self._rng = random.Random(seed)
        self._rules: dict[str, tuple[_Rule, ...]] = {}
        self._splits: dict[str, _Split] = {}
        self._pin_header: dict[str, bytes] = {}
        for name, model in models.items():
            rules = tuple(
                _Rule(
                    frozenset(r.api) if r.api is not None else None,
                    frozenset(r.tiers) if r.tiers is not None else None,
                    r.min_prompt_tokens,
                    r.max_prompt_tokens,
                    pools[r.to],
                    frozenset(r.modalities) if r.modalities is not None else None,
                    r.tools,
                    frozenset(r.reasoning_effort) if r.reasoning_effort is not None else None,
                    frozenset(r.response_format) if r.response_format is not None else None,
                    frozenset(r.labels) if r.labels is not None else None,
                )
                for r in model.routes
            )
            if rules:
                self._rules[name] = rules
            if model.traffic:
                self._splits[name] = _Split(model.traffic, rng)
            self._pin_header[name] = model.version_header.lower().encode("latin-1")

    def traffic(self, model: str) -> dict[str, float]:
        """The model's current version weights (empty: no split)."""
        split = self._splits.get(model)
        if split is None:
            return {}
        weights = [b - a for a, b in zip([0.0, *split.cumulative], split.cumulative, strict=False)]
        return dict(zip(split.versions, weights, strict=True))

    def set_traffic(self, model: str, weights: dict[str, float]) -> None:
        """Replace the model's split (empty: none). The caller validated the versions."""
        if weights and any(w > 0 for w in weights.values()):
            self._splits[model] = _Split(weights, self._rng)
        else:
            self._splits.pop(model, None)

    def resolve(self, req: InferenceRequest, pool: Pool) -> Pool:
        """The pool for ``req`` (its rules applied), with ``req.version`` set when the pool
        splits traffic or the request pins a version. Raises 400 for an unknown pin."""
        rules = self._rules.get(pool.name)
        if rules is not None:
            for rule in rules:
                if rule.matches(req):
                    pool = rule.to
                    break
        name = pool.name
        pin = req.header(self._pin_header[name]) if req.headers else None
        if pin is not None:
            version = pin.decode("latin-1").strip()
            if version not in pool.versions:
                raise bad_request(
                    f"Version {version!r} of model `{req.model}` does not exist; versions: "
                    + ", ".join(sorted(pool.versions))
                    + ".",
                    None,
                    "invalid_version",
                )
            req.version = version
            return pool
        split = self._splits.get(name)
        if split is not None:
            req.version = split.draw()
        return pool
