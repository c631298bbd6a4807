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
from itertools import chain
from typing import Protocol

from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Balancer, EndpointView, RegisterBalancer
from shuniu.core.kv_events import KvBlockIndex
from shuniu.core.pools.load import LoadWeights, load_score
from shuniu.core.pools.prefix import prefix_hashes
from shuniu.core.types import InferenceRequest
from shuniu.plugins.balancers.least_load import LoadOptions
from shuniu.plugins.balancers.new_prefixes import NewPrefixes
from shuniu.plugins.balancers.prefix_index import AgingPrefixIndex

__all__ = ["CostSettings", "PrecisePrefix", "PrecisePrefixOptions", "cheapest", "place"]


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


def cheapest(
    req: InferenceRequest,
    endpoints: Sequence[EndpointView],
    depths: dict[int, int],
    tokens_per_block: float,
    waiting_cost: float,
    bound: LoadWeights,
    balance_abs: float,
    balance_rel: float,
    slack: float,
    cold_weight: float = 1.0,
    start: int = 0,
    past_limit_cost: float = 0.0,
    new: NewPrefixes | None = None,
) -> tuple[EndpointView | None, int]:
    """The candidate where ``req``'s first token should come soonest (see the module), and the
    prompt tokens it holds; ``depths``: endpoint index → leading blocks it holds.

    Costs within ``slack`` tokens of the lowest count as equal (they are estimates, and a
    fleet's gateways see each other's work a sync late: a strict minimum would send them all
    to the same endpoint at once). Among those the deepest match wins, then the less loaded,
    then the first from ``start`` on (a caller that rotates ``start`` spreads equal
    candidates, e.g. the requests of an idle pool with no prefix known). A prompt none of
    them holds an eighth of is a new prefix: with ``new``, the one that took the fewest new
    prompt tokens lately (counted in prompts of this size) wins, then the less loaded, so
    new prefixes spread evenly over the caches (:mod:`~shuniu.plugins.balancers.new_prefixes`)."""
    n = len(endpoints)
    if n == 1:
        # One candidate: what the general case below decides for it, without the lists.
        e = endpoints[0]
        cached = min(req.prompt_tokens, int(depths.get(e.index, 0) * tokens_per_block)) if depths else 0
        if not cached and _past_limit(e) > 0:
            return None, 0
        return e, cached
    loads = [load_score(e, bound) for e in endpoints]
    low = min(loads)
    ceiling = max(low + balance_abs, balance_rel * (low + 1.0) - 1.0)
    prompt = req.prompt_tokens
    costs: list[float] = [math.inf] * n
    held = [0] * n
    for i, e in enumerate(endpoints):
        if loads[i] > ceiling:
            continue
        d = depths.get(e.index)
        if d:
            cached = held[i] = min(prompt, int(d * tokens_per_block))
        else:
            cached = 0  # (held[i] is 0 already)
        cost = e.prefill_tokens + e.remote_prefill_tokens + cold_weight * (prompt - cached)
        snap = e.load
        if snap is not None and snap.waiting and e.load_weight > 0.0:
            cost += waiting_cost * e.load_weight * snap.waiting
        over = _past_limit(e)
        if over > 0:
            # At its adaptive limit (offered only to stay on a cache): the request would wait
            # in the engine's queue behind the others sent past the limit.
            if not cached:
                continue
            cost += past_limit_cost * over
        costs[i] = cost
    lowest = min(costs)
    if lowest == math.inf:
        # Every endpoint under the bound is full and holds nothing of the prompt: the least
        # loaded free one, or none (the request waits in the gateway).
        free = [i for i, e in enumerate(endpoints) if _past_limit(e) <= 0]
        if not free:
            return None, 0
        best = min(free, key=loads.__getitem__)
        return endpoints[best], held[best]
    limit = lowest + slack
    best, most, least = -1, -1, 0.0  # the choice so far, what it holds, its load
    start %= n
    for i in chain(range(start, n), range(start)):  # from `start` on, round
        if costs[i] <= limit:
            h = held[i]
            if h > most or (h == most and loads[i] < least):
                best, most, least = i, h, loads[i]
    if new is not None and 8 * held[best] < prompt:
        # A new prefix (what any of them holds is a shared opening at most): the one that
        # took the fewest new prompt tokens lately, in prompts of this size, then load.
        now = new.now()
        unit = max(prompt, 1)
        key: tuple[int, float] | None = None
        for k in range(n):
            i = (start + k) % n
            if costs[i] > limit:
                continue
            mine = (round(new.tokens(endpoints[i].index, now) / unit), loads[i])
            if key is None or mine < key:
                best, key = i, mine
    return endpoints[best], held[best]


def _past_limit(e: EndpointView) -> int:
    """How many requests one more would put ``e`` past its concurrency limit (> 0: it is at
    its adaptive limit, offered only to stay on a cached prefix)."""
    return e.in_flight + e.remote_in_flight - e.limit + 1 if e.limit else 0


class CostSettings(Protocol):
    """The options :func:`place` reads (both prefix balancers' options have them)."""

    waiting_cost_tokens: float
    past_limit_cost_tokens: float
    cold_weight: float
    slack_tokens: float
    balance_abs: float
    balance_rel: float


def place(
    req: InferenceRequest,
    endpoints: Sequence[EndpointView],
    depths: dict[int, int],
    block_tokens: int,
    block_chars: int,
    o: CostSettings,
    bound: LoadWeights,
    turn: int,
    new: NewPrefixes | None = None,
) -> EndpointView | None:
    """:func:`cheapest` for ``req``, given each endpoint's matched blocks (of ``block_tokens``
    token ids, or of ``block_chars`` bytes of text for a request without ids); sets
    ``req.expected_cached`` to what the chosen endpoint holds, and records a new prefix's
    placement in ``new``. Call it after :func:`~shuniu.core.pools.prefix.prefix_hashes`."""
    if not req.prefix_hashes:
        # Shorter than one block: it starts no cached prefix anywhere, so where it goes is a
        # matter of load alone, and it is no new prefix to count.
        new = None
    per_block = 0.0  # tokens per matched block: nothing to weigh when nothing matched
    if depths:
        ids = req.token_ids if req.token_ids is not None else req.prompt_ids
        # Text blocks are bytes; characters are close enough for a token estimate, and free.
        units = len(ids) if ids is not None else len(req.prompt)
        block = block_tokens if ids is not None else block_chars
        per_block = req.prompt_tokens * block / units if units else 0.0
        # An engine computes a prompt's last token even when every block of it is cached (it
        # needs that token's logits): vLLM and the simulator reuse at most (units - 1) // block
        # blocks, so a prompt that ends on a block boundary expects one block less.
        usable = (units - 1) // block if units else 0
        for i, d in depths.items():
            if d > usable:
                depths[i] = usable
    chosen, cached = cheapest(
        req,
        endpoints,
        depths,
        per_block,
        o.waiting_cost_tokens,
        bound,
        o.balance_abs,
        o.balance_rel,
        o.slack_tokens,
        o.cold_weight,
        turn % len(endpoints),
        o.past_limit_cost_tokens,
        new,
    )
    req.expected_cached = cached
    if new is not None and chosen is not None and 8 * cached < req.prompt_tokens:
        new.placed(chosen.index, req.prompt_tokens - cached, new.now())
    return chosen


class PrecisePrefix(Balancer):
    """Soonest first token, from an exact index of the engines' blocks."""

    __slots__ = ("_turn", "bound_weights", "index", "new", "options", "recent")
    takes_full_endpoints = True

    def __init__(self, options: PrecisePrefixOptions | None = None) -> None:
        self.options = o = options or PrecisePrefixOptions()
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
        o = self.options
        ids = req.token_ids if req.token_ids is not None else req.prompt_ids
        block = self.index.block_size or o.block_tokens
        hashes = prefix_hashes(req, o.block_chars, block)
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
        chosen = place(
            req, endpoints, depths, block, o.block_chars, o, self.bound_weights, self._turn, self.new
        )
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
