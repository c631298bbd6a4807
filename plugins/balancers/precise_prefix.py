"""``precise_prefix``: send a prompt where its first token comes soonest, knowing exactly which
engine holds which of its blocks (from the engines' KV events), and without piling a pool onto
one engine.

Where it runs: as the pool's balancer, at dispatch, with the candidates that have a free slot
and those at their adaptive limit (``takes_full_endpoints``: one of those only for a cached
prefix, when waiting there beats a cold prefill elsewhere).

**What each engine holds** comes from the engines' own KV-cache events
(:class:`~shuniu.core.kv_events.KvBlockIndex`; endpoints with ``kv_events:``, and the in-process
``sim`` backend, feed it), matched against the request's real token ids (a prompt sent as ids,
the simulator's, or the model's ``tokenizer:``). Between a dispatch and the engine's report of
the blocks it computed (a prefill later), the balancer remembers for ``recent_s`` where it sent
each prefix, so a burst of one new prefix does not scatter. A request without token ids is
matched by its text blocks against that memory alone (as ``prefix_affinity`` does).

**Where the first token comes soonest**: each candidate's cost is, in prompt tokens, the
uncached prompt tokens of the requests already sent there and still in prefill
(``prefill_tokens``), plus this prompt's tokens it does not hold, plus ``waiting_cost_tokens``
for each request waiting in the engine's own queue. A request therefore stays on the engine
that holds its prefix while the wait there is shorter than a cold prefill elsewhere, and moves
once it is not — a comparison of times, not of request counts, which is what a count bound
gets wrong under load: it pushes requests off their cache just when the extra prefills hurt
most. A loose bound on request load (``balance_abs`` and ``balance_rel`` over the least
loaded) still keeps one popular prefix from taking every slot of one engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Balancer, EndpointView, RegisterBalancer
from shuniu.core.kv_events import KvBlockIndex
from shuniu.core.pools.load import LoadWeights
from shuniu.core.pools.prefix import prefix_hashes
from shuniu.core.types import InferenceRequest
from shuniu.plugins.balancers.least_load import LoadOptions
from shuniu.plugins.balancers.new_prefixes import NewPrefixes
from shuniu.plugins.balancers.placement import Costs, cheapest, place
from shuniu.plugins.balancers.prefix_index import AgingPrefixIndex

__all__ = ["PrecisePrefix", "PrecisePrefixOptions", "cheapest", "place"]


class PrecisePrefixOptions(Options):
    """Exact prefix routing from KV events, weighed by time to first token."""

    block_tokens: int = Field(16, ge=1)
    """The engines' KV block size in tokens (vLLM's ``--block-size``; taken from the events
    once they arrive)."""
    block_chars: int = Field(256, ge=16)
    """Block size in bytes for requests without token ids (matched against recent dispatches
    only)."""
    max_blocks: int = Field(1_000_000, ge=1)
    """Blocks the exact index keeps, across endpoints (about 250 bytes each)."""
    recent_s: float = Field(5.0, gt=0)
    """How long a dispatch counts as placing its prefix on its engine before the engine's
    events say so (or not)."""
    recent_blocks: int = Field(65_536, ge=1)
    """Blocks that memory of recent dispatches keeps at most."""
    waiting_cost_tokens: float = Field(0.0, ge=0)
    """Prompt tokens one request waiting in an engine's own queue costs (the engine admits
    it before this prompt). 0 by default: that queue is read from a load snapshot, so between
    snapshots every request of a prefix sees the same count, and a busy moment moved a burst
    of them off their cache at once (docs/scheduling.md)."""
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
    balance_abs: float = Field(32.0, ge=0)
    """Never choose an endpoint carrying more than this many requests above the least loaded
    candidate ..."""
    balance_rel: float = Field(2.0, ge=1)
    """... and more than this multiple of its load (plus one): the bound that keeps a pool
    from piling onto one engine."""
    load: LoadOptions = Field(default_factory=LoadOptions)
    """How request load is measured for that bound (as ``least_load`` does; tokens do not
    count in it: the cost above weighs them)."""


class PrecisePrefix(Balancer):
    """Soonest first token, from an exact index of the engines' blocks."""

    __slots__ = ("_block_chars", "_block_tokens", "_turn", "bound_weights", "costs", "index", "new",
                 "options", "recent")  # fmt: skip
    takes_full_endpoints = True

    def __init__(self, options: PrecisePrefixOptions | None = None) -> None:
        self.options = o = options or PrecisePrefixOptions()
        # Read per request: copied from the (frozen) options, whose reads cost more.
        self.costs = Costs(o)
        self._block_chars = o.block_chars
        self._block_tokens = o.block_tokens
        w = o.load.weights()
        self.bound_weights = LoadWeights(w.waiting, math.inf, w.kv, w.kv_knee)
        self.index = KvBlockIndex(o.max_blocks)
        self.recent = AgingPrefixIndex(o.recent_blocks, o.recent_s)
        self.new = NewPrefixes(o.new_prefix_window_s) if o.new_prefix_window_s > 0 else None
        # What an engine says it evicted, or lost, is no longer "recently sent there" either.
        self.index.on_removed = self.recent.drop
        self.index.on_cleared = self._cleared
        self._turn = 0

    def _cleared(self, endpoint: int) -> None:
        self.recent.forget_index(endpoint)
        if self.new is not None:
            self.new.forget(endpoint)

    def kv_index(self) -> KvBlockIndex:
        """The index the endpoints' KV events feed (the gateway wires them at start)."""
        return self.index

    def engine_lost(self, endpoint: EndpointView) -> None:
        # At once, not at the restarted engine's first event batch (which clears it too):
        # requests meanwhile would be sent to a cache that is gone.
        self.index.clear(endpoint.index)

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
        if not endpoints:
            return None
        ids = req.token_ids if req.token_ids is not None else req.prompt_ids
        block = self.index.block_size or self._block_tokens
        hashes = prefix_hashes(req, self._block_chars, block)
        depths: dict[int, int] = {}
        if hashes:
            alive = 0
            for e in endpoints:
                alive |= 1 << e.index
            depths = self.recent.match_sparse(hashes, alive)
            if ids is not None:
                for i, d in self.index.match_sparse(hashes, alive).items():
                    if d > depths.get(i, 0):
                        depths[i] = d
        chars, bound = self._block_chars, self.bound_weights
        chosen = place(req, endpoints, depths, block, chars, self.costs, bound, self._turn, self.new)
        self._turn += 1
        if chosen is not None:
            self.recent.record(hashes, chosen)
        return chosen


@hookimpl
def register_balancers(register: RegisterBalancer) -> None:
    register(
        "precise_prefix",
        PrecisePrefix,
        options=PrecisePrefixOptions,
        description="Soonest first token, from the engines' own KV-cache events (exact prefix hits).",
    )
