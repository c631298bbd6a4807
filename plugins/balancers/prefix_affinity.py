"""``prefix_affinity``: send a prompt where its prefix is probably cached, within a load
bound; and the ``prefix`` scorer for composed balancers.

A replica that already holds a prompt's leading blocks in its KV cache skips their prefill,
so its time to first token is several times shorter. The balancer remembers which endpoints
recently received which blocks (:class:`PrefixIndex`, bounded) and prefers the longest
match — unless that endpoint's load exceeds the least-loaded candidate's by more than the
configured bound (both absolute and relative), in which case the least-loaded one gets the
request (and from then on holds the prefix too). The bound is what keeps a popular system
prompt from pulling all traffic onto one replica (the "death spiral" of naive affinity).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Balancer, EndpointView, RegisterBalancer, RegisterScorer, Scorer
from shuniu.core.pools.load import LoadWeights, load_score
from shuniu.core.pools.prefix import prefix_hashes
from shuniu.core.types import InferenceRequest
from shuniu.plugins.balancers.least_load import LoadOptions
from shuniu.plugins.balancers.prefix_index import PrefixIndex

__all__ = ["PrefixAffinity", "PrefixAffinityOptions", "PrefixOptions", "PrefixScorer"]


class PrefixOptions(Options):
    """How prompts are cut into blocks and how much is remembered."""

    block_chars: int = Field(256, ge=16)
    """Block size in bytes of the prompt text, UTF-8 (used when token ids are unknown, i.e.
    for ordinary text requests); about 64 tokens of English."""
    block_tokens: int = Field(16, ge=1)
    """Block size in tokens, for requests that carry token ids (the simulator, completions
    sent as ids). Match it to the engine's KV block size."""
    max_blocks: int = Field(262_144, ge=1)
    """Blocks remembered across all endpoints (least recently used forgotten first); about
    100 bytes each."""


class PrefixAffinityOptions(PrefixOptions):
    """Prefix affinity with a load bound."""

    balance_abs: float = Field(4.0, ge=0)
    """Affinity yields to the least-loaded endpoint when the matched one carries more than
    this many extra requests (in flight, plus the engine's queue and KV pressure as
    ``load`` weighs them, but not tokens: a prompt sent where its prefix is cached costs
    little of its length, so counting it would push conversations off their cache just as
    they grow) ..."""
    balance_rel: float = Field(1.5, ge=1)
    """... and more than this multiple of the least-loaded one's load (plus one)."""
    min_match_blocks: int = Field(1, ge=1)
    """Shorter matches than this are ignored (a shared greeting is not worth a detour)."""
    load: LoadOptions = Field(default_factory=LoadOptions)
    """How load is measured (as ``least_load`` does)."""


class PrefixAffinity(Balancer):
    """Longest known prefix, bounded by load; least load when nothing matches."""

    __slots__ = ("_turn", "bound_weights", "index", "options", "weights")

    def __init__(self, options: PrefixAffinityOptions | None = None) -> None:
        self.options = options or PrefixAffinityOptions()
        self.weights = w = self.options.load.weights()
        # The bound compares requests, not tokens (see ``balance_abs``).
        self.bound_weights = LoadWeights(w.waiting, math.inf, w.kv, w.kv_knee)
        self.index = PrefixIndex(self.options.max_blocks)
        self._turn = 0

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
        n = len(endpoints)
        if n == 0:
            return None
        o = self.options
        hashes = prefix_hashes(req, o.block_chars, o.block_tokens)
        w = self.weights
        # One pass: every candidate's load, the least loaded (scanning from a rotating start
        # so ties share), and the bit mask of candidates for the prefix match.
        start = self._turn % n
        self._turn = start + 1
        loads: dict[int, float] = {}
        alive = 0
        least = endpoints[start]
        least_load = load_score(least, w)
        for k in range(n):
            e = endpoints[(start + k) % n]
            x = load_score(e, w) if k else least_load
            loads[e.index] = x
            alive |= 1 << e.index
            if x < least_load:
                least, least_load = e, x
        chosen = least
        if hashes:
            depths = self.index.match_sparse(hashes, alive)
            if depths:
                best_i = -1
                best_depth = 0
                for i, d in depths.items():
                    if d > best_depth or (d == best_depth and loads[i] < loads[best_i]):
                        best_i, best_depth = i, d
                if best_depth >= o.min_match_blocks:
                    best = least
                    for e in endpoints:
                        if e.index == best_i:
                            best = e
                            break
                    bw = self.bound_weights
                    home, low = load_score(best, bw), load_score(least, bw)
                    if home - low <= o.balance_abs or home + 1.0 <= o.balance_rel * (low + 1.0):
                        chosen = best
        self.index.record(hashes, chosen)
        return chosen

    def shared_index(self) -> PrefixIndex:
        return self.index


class PrefixScorer(Scorer):
    """Scores each candidate by the share of the prompt's blocks it is known to hold (0..1)."""

    __slots__ = ("index", "options")

    def __init__(self, options: PrefixOptions | None = None) -> None:
        self.options = options or PrefixOptions()
        self.index = PrefixIndex(self.options.max_blocks)

    def score(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> list[float]:
        o = self.options
        hashes = prefix_hashes(req, o.block_chars, o.block_tokens)
        if not hashes:
            return [0.0] * len(endpoints)
        total = len(hashes)
        return [d / total for d in self.index.match(hashes, endpoints)]

    def picked(self, req: InferenceRequest, endpoint: EndpointView) -> None:
        o = self.options
        self.index.record(prefix_hashes(req, o.block_chars, o.block_tokens), endpoint)

    def shared_index(self) -> PrefixIndex:
        return self.index


@hookimpl
def register_balancers(register: RegisterBalancer) -> None:
    register(
        "prefix_affinity",
        PrefixAffinity,
        options=PrefixAffinityOptions,
        description="Where the prompt's prefix is probably cached, unless that replica is much busier.",
    )


@hookimpl
def register_scorers(register: RegisterScorer) -> None:
    register(
        "prefix",
        PrefixScorer,
        options=PrefixOptions,
        description="Share of the prompt's leading blocks the endpoint is known to hold.",
    )
