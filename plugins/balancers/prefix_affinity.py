"""``prefix_affinity``: send a prompt where its prefix is probably cached, unless its first
token would come sooner elsewhere; and the ``prefix`` scorer for composed balancers.

A replica that already holds a prompt's leading blocks in its KV cache skips their prefill,
so its time to first token is several times shorter. The balancer remembers which endpoints
recently received which blocks (:class:`PrefixIndex`, bounded) and weighs, per candidate, the
prefill work already waiting there against the prompt tokens it would have to compute — the
same cost as ``precise_prefix``, which knows the blocks exactly from the engines' events
(:func:`~shuniu.plugins.balancers.placement.cheapest`). A request stays on its cached
replica while the wait there is shorter than a cold prefill elsewhere. A loose bound on
request load (``balance_abs``, ``balance_rel``) keeps a popular system prompt from pulling
all traffic onto one replica (the "death spiral" of naive affinity).

Why not a bound on request counts alone (this balancer's first design): under load, the
replica holding a prefix is often a few requests busier than the least loaded one; moving
requests off it then costs a full prefill each and leaves a copy of the prefix in a second
cache, which evicts others — hits fall and load rises together, and the pool collapses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Balancer, EndpointView, RegisterBalancer, RegisterScorer, Scorer
from shuniu.core.pools.load import LoadWeights
from shuniu.core.pools.prefix import prefix_hashes
from shuniu.core.types import InferenceRequest
from shuniu.plugins.balancers.least_load import LoadOptions
from shuniu.plugins.balancers.new_prefixes import NewPrefixes
from shuniu.plugins.balancers.placement import Affinity, Costs
from shuniu.plugins.balancers.prefix_index import AgingPrefixIndex

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
    memory_s: float = Field(30.0, gt=0)
    """How long a dispatch counts as leaving its prefix in the engine's cache (forgotten
    ``memory_s`` to twice that after the prefix was last sent there): about how long an
    unused block survives in the engines' caches under the pool's load."""


class PrefixAffinityOptions(PrefixOptions):
    """Prefix affinity, weighed by time to first token, within a load bound."""

    balance_abs: float = Field(32.0, ge=0)
    """Never choose an endpoint carrying more than this many requests above the least
    loaded candidate (in flight, plus the engine's queue and KV pressure as ``load`` weighs
    them, but not tokens: the cost weighs those) ..."""
    balance_rel: float = Field(2.0, ge=1)
    """... and more than this multiple of the least loaded one's load (plus one)."""
    waiting_cost_tokens: float = Field(0.0, ge=0)
    """Prompt tokens one request waiting in an engine's own queue costs. 0 by default: that
    queue is read from a load snapshot, so between snapshots every request of a prefix sees
    the same count, and a busy moment moved a burst of them off their cache at once
    (docs/scheduling.md)."""
    past_limit_cost_tokens: float = Field(0.0, ge=0)
    """Prompt tokens each request this gateway already sent past an engine's adaptive limit
    costs there (it waits in that engine's queue). 0 by default: measured, staying on the
    cache beat moving a request cold, and the balance bound still stops a pile-up."""
    cold_weight: float = Field(1.0, ge=1)
    """How much more a prompt token to compute costs than one already queued: a cold
    prefill also delays every request behind it there and evicts other prefixes to make room,
    so moving a request off its cached engine must win by more than its own wait."""
    slack_tokens: float = Field(4096.0, ge=0)
    """Costs this close to the lowest count as equal; among them the longest cached prefix
    wins (estimates are rough, and gateways of a fleet see each other's work late)."""
    new_prefix_window_s: float = Field(10.0, ge=0)
    """A prompt no candidate holds an eighth of goes to the endpoint sent the fewest such new
    prompt tokens in this many seconds (then the less loaded), so new prefixes spread evenly
    over the engines' caches; 0: by load alone."""
    min_match_blocks: int = Field(1, ge=1)
    """Shorter matches than this are ignored (a shared greeting is not worth a detour)."""
    load: LoadOptions = Field(default_factory=LoadOptions)
    """How load is measured for the bound (as ``least_load`` does)."""


class PrefixAffinity(Balancer):
    """Soonest first token, from the prefixes this gateway (and its fleet) dispatched."""

    __slots__ = ("affinity", "bound_weights", "costs", "index", "new", "options")
    takes_full_endpoints = True

    def __init__(self, options: PrefixAffinityOptions | None = None) -> None:
        self.options = o = options or PrefixAffinityOptions()
        # Read per request: copied from the (frozen) options, whose reads cost more.
        self.costs = Costs(o)
        w = o.load.weights()
        # The bound compares requests, not tokens (see ``balance_abs``).
        self.bound_weights = LoadWeights(w.waiting, math.inf, w.kv, w.kv_knee)
        self.index = AgingPrefixIndex(o.max_blocks, o.memory_s)
        self.new = NewPrefixes(o.new_prefix_window_s) if o.new_prefix_window_s > 0 else None
        self.affinity = Affinity(
            self.index,
            self.costs,
            self.bound_weights,
            o.block_chars,
            o.block_tokens,
            o.min_match_blocks,
            self.new,
        )
        """The choice itself (compiled with placement; see there)."""

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
        return self.affinity.pick(req, endpoints)

    def shared_index(self) -> AgingPrefixIndex:
        return self.index

    def engine_lost(self, endpoint: EndpointView) -> None:
        self.index.forget(endpoint)
        if self.new is not None:
            self.new.forget(endpoint.index)


class PrefixScorer(Scorer):
    """Scores each candidate by the share of the prompt's blocks it is known to hold (0..1)."""

    __slots__ = ("index", "options")

    def __init__(self, options: PrefixOptions | None = None) -> None:
        self.options = options or PrefixOptions()
        self.index = AgingPrefixIndex(self.options.max_blocks, self.options.memory_s)

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

    def shared_index(self) -> AgingPrefixIndex:
        return self.index


@hookimpl
def register_balancers(register: RegisterBalancer) -> None:
    register(
        "prefix_affinity",
        PrefixAffinity,
        options=PrefixAffinityOptions,
        description="Where the prompt's prefix is probably cached, unless it would wait longer there.",
    )


@hookimpl
def register_scorers(register: RegisterScorer) -> None:
    register(
        "prefix",
        PrefixScorer,
        options=PrefixOptions,
        description="Share of the prompt's leading blocks the endpoint is known to hold.",
    )
