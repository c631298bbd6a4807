"""Where a request with a known prefix match goes: the cost model both prefix balancers
(``precise_prefix``, ``prefix_affinity``) share, once each endpoint's matched blocks are known.

The cost of each candidate is the prompt tokens it would have to compute (those it does not
hold) plus the prefill work already in its queue; see
:mod:`~shuniu.plugins.balancers.precise_prefix` for the model. A regular install compiles
this module with mypyc (``core/compiled.py``): it runs for every request either balancer
places.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain
from typing import Any

from shuniu.core.contracts import EndpointView
from shuniu.core.pools.load import LoadWeights, load_score
from shuniu.core.pools.prefix import prefix_hashes
from shuniu.core.types import InferenceRequest
from shuniu.plugins.balancers.new_prefixes import NewPrefixes

__all__ = ["Affinity", "Costs", "cheapest", "place"]


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


class Costs:
    """The options :func:`place` weighs with, copied once from a prefix balancer's (frozen)
    options: :func:`place` reads them for every request, and a pydantic model answers each
    read through its ``__getattr__`` hook, a plain object (a native one compiled) directly."""

    waiting_cost_tokens: float
    past_limit_cost_tokens: float
    cold_weight: float
    slack_tokens: float
    balance_abs: float
    balance_rel: float

    def __init__(self, o: Any) -> None:
        """``o``: ``PrefixAffinityOptions`` or ``PrecisePrefixOptions`` (both have these six)."""
        self.waiting_cost_tokens = o.waiting_cost_tokens
        self.past_limit_cost_tokens = o.past_limit_cost_tokens
        self.cold_weight = o.cold_weight
        self.slack_tokens = o.slack_tokens
        self.balance_abs = o.balance_abs
        self.balance_rel = o.balance_rel


def place(
    req: InferenceRequest,
    endpoints: Sequence[EndpointView],
    depths: dict[int, int],
    block_tokens: int,
    block_chars: int,
    o: Costs,
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


class Affinity:
    """``prefix_affinity``'s choice for one request: the prompt's blocks, the endpoints that
    hold its prefix (from the balancer's index), :func:`place`, and the index told where it
    went. Here rather than in the balancer's module so that it runs compiled: the balancer
    calls :meth:`pick` once per request, and everything it calls in this module and in
    :mod:`~shuniu.core.pools.prefix` is a C call."""

    index: Any
    """The balancer's ``AgingPrefixIndex`` (interpreted: called the usual way)."""
    costs: Costs
    bound: LoadWeights
    block_chars: int
    block_tokens: int
    min_match: int
    """Fewest leading blocks an endpoint must hold to count as holding the prefix."""
    new: NewPrefixes | None
    turn: int
    """Requests placed (where a tie between equal endpoints starts)."""

    def __init__(
        self,
        index: Any,
        costs: Costs,
        bound: LoadWeights,
        block_chars: int,
        block_tokens: int,
        min_match: int,
        new: NewPrefixes | None,
    ) -> None:
        self.index = index
        self.costs = costs
        self.bound = bound
        self.block_chars = block_chars
        self.block_tokens = block_tokens
        self.min_match = min_match
        self.new = new
        self.turn = 0

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
        if not endpoints:
            return None
        hashes = prefix_hashes(req, self.block_chars, self.block_tokens)
        depths: dict[int, int] = {}
        if hashes:
            alive = 0
            for e in endpoints:
                alive |= 1 << e.index
            least = self.min_match
            for i, d in self.index.match_sparse(hashes, alive).items():
                if d >= least:
                    depths[i] = d
        chosen = place(
            req,
            endpoints,
            depths,
            self.block_tokens,
            self.block_chars,
            self.costs,
            self.bound,
            self.turn,
            self.new,
        )
        self.turn += 1
        if chosen is not None and hashes:  # (a prompt shorter than a block: nothing to record)
            self.index.record(hashes, chosen)
        return chosen
