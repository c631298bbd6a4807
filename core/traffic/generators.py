"""Requests generated from a stream's description: ``plain`` streams (arrivals, lengths,
classes, shared system prompts) and ``chat`` streams (conversations whose turns carry their
history); ``trace`` streams are replayed by :mod:`shuniu.core.traffic.trace`.

Only live conversations keep state (their token history, two bytes a token, when prompts
are generated), so a million requests cost no more memory than the
conversations open at once.
"""

from __future__ import annotations

import math
import random
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from heapq import heappop, heappush
from itertools import accumulate
from pathlib import Path
from typing import Any

from shuniu.core.traffic.distributions import count_sampler, sample_count
from shuniu.core.traffic.request import SimRequest
from shuniu.core.traffic.streams import ChatStream, PlainStream, StreamBase, SystemPrompts, TenantShare
from shuniu.core.traffic.synthetic import stable_seed, synthetic_array, synthetic_ids
from shuniu.core.traffic.trace import trace_requests

__all__ = ["generate"]


def generate(
    stream: Any, name: str, seed: int, end: float, prompts: bool, base_dir: Path
) -> Iterator[SimRequest]:
    """The requests of one stream (named ``name`` in its workload) arriving before ``end``."""
    if isinstance(stream, PlainStream):
        return _plain(stream, name, seed, end, prompts)
    if isinstance(stream, ChatStream):
        return _chat(stream, name, seed, end, prompts)
    return trace_requests(stream, name, seed, end, prompts, base_dir)


class _SystemPrompts:
    """A stream's K system prompts: lengths drawn up front, ids made on first use."""

    def __init__(self, cfg: SystemPrompts | None, stream: str, seed: int) -> None:
        self.count = cfg.count if cfg is not None else 0
        rng = random.Random(stable_seed(seed, stream, "system-prompts"))
        self.lengths = [sample_count(cfg.tokens, rng) for _ in range(self.count)] if cfg else []
        self.seeds = [rng.getrandbits(64) for _ in range(self.count)]
        self.names = [f"{stream}/system-{k}" for k in range(self.count)]
        self._ids: dict[int, list[int]] = {}
        self._arrays: dict[int, array] = {}

    def ids(self, k: int) -> list[int]:
        found = self._ids.get(k)
        if found is None:
            found = self._ids[k] = synthetic_ids(self.seeds[k], self.lengths[k])
        return found

    def array(self, k: int) -> array:
        """:meth:`ids` as a compact ``array('H')``, a fresh copy to extend (a conversation
        starts with it)."""
        found = self._arrays.get(k)
        if found is None:
            found = self._arrays[k] = synthetic_array(self.seeds[k], self.lengths[k])
        return found[:]


def _people(s: StreamBase, tenants: list[TenantShare]) -> list[tuple[str, str, int]]:
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
    times = s.arrival.times(random.Random(stable_seed(seed, name, "arrivals")))
    rng = random.Random(stable_seed(seed, name, "content"))
    system = _SystemPrompts(s.system_prompts, name, seed)
    tenants = s.tenants or [TenantShare(name=s.tenant)]
    people = _people(s, tenants)
    pick_tenant = _pick(list(accumulate(t.weight for t in tenants)))
    if s.classes is None:
        assert s.input_tokens is not None and s.output_tokens is not None
        classes = [(name, count_sampler(s.input_tokens), count_sampler(s.output_tokens), None, None, None)]
        pick_class = None
    else:
        classes = [
            (
                f"{name}/{c.name}",
                count_sampler(c.input_tokens),
                count_sampler(c.output_tokens),
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
            chain_key=f"system:{group}" if prompts and group is not None else None,
            chain_tokens=prefix_len,
        )


class _Conversation:
    """A live conversation: its history's length and, when prompts are generated, its token
    ids (compact), so each turn makes only its new part."""

    __slots__ = ("index", "length", "rng", "tokens", "turn", "turns", "user")

    def __init__(self, index: int, user: int, turns: int, rng: random.Random) -> None:
        self.index = index
        self.user = user
        self.turns = turns
        self.rng = rng
        self.turn = 0
        self.length = 0
        """Tokens of history."""
        self.tokens: array | None = None
        """The system prompt and the history so far (``None`` until the first turn, or
        without prompts)."""


def _chat(s: ChatStream, name: str, seed: int, end: float, prompts: bool) -> Iterator[SimRequest]:
    starts = s.arrival.times(random.Random(stable_seed(seed, name, "arrivals")))
    system = _SystemPrompts(s.system_prompts, name, seed)
    tenants = s.tenants or [TenantShare(name=s.tenant)]
    total = sum(t.weight for t in tenants)
    # Users split into contiguous blocks by tenant weight: bounds[i] = first user of tenant i+1.
    bounds = [round(s.users * c / total) for c in accumulate(t.weight for t in tenants)]
    people = _people(s, tenants)
    turns, think, user_len, output_len = (
        count_sampler(s.turns),
        s.think_time_s,
        count_sampler(s.user_tokens),
        count_sampler(s.output_tokens),
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
            rng = random.Random(stable_seed(seed, name, "conversation", started))
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
            if conv.tokens is None:
                conv.tokens = system.array(k) if k >= 0 else array("H")
            user_ids = synthetic_array(user_seed, n_user)
            # A compact array, not a list: a long history as Python ints cost more than the
            # rest of generating the request, and only the blocks past the conversation's
            # earlier turns are ever read (their hashes are kept per conversation).
            prompt: Sequence[int] = conv.tokens + user_ids
            if conv.turn + 1 < conv.turns:  # the next turn's history: this prompt and its answer
                answer = synthetic_array(output_seed, n_out)
                conv.tokens += user_ids
                conv.tokens += answer
            else:
                answer = None
        else:
            prompt = []
            answer = None
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
            f"chat:{name}/c{conv.index}" if prompts else None,
            n_prompt,
            answer,
        )
        conv.turn += 1
        if conv.turn < conv.turns:
            conv.length += n_user + n_out
            heappush(heap, (at + think.sample(rng), conv.index, conv))
