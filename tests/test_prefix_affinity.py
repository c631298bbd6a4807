"""Prefix hashing, the bounded prefix index, the ``prefix_affinity`` balancer and scorer."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from shuniu.core.api.openai import parse_request
from shuniu.core.contracts import BackendBase
from shuniu.core.pools.pool import EndpointState
from shuniu.core.pools.prefix import prefix_hashes
from shuniu.core.types import InferenceRequest
from shuniu.plugins.balancers.prefix_affinity import (
    PrefixAffinity,
    PrefixAffinityOptions,
    PrefixOptions,
    PrefixScorer,
)
from shuniu.plugins.balancers.prefix_index import PrefixIndex


def _ids(ids: list[int]) -> InferenceRequest:
    return InferenceRequest(
        id="r", api="completions", model="m", body={}, prompt="", prompt_tokens=len(ids), token_ids=ids
    )


def _text(text: str) -> InferenceRequest:
    body = {"model": "m", "prompt": text}
    return parse_request(json.dumps(body).encode(), "completions", "r", 0.0)


def _endpoints(n: int) -> list[EndpointState]:
    eps = [EndpointState(f"e{i}", BackendBase()) for i in range(n)]
    for i, e in enumerate(eps):
        e.index = i
    return eps


def test_hash_chain_identifies_prefixes_not_blocks() -> None:
    a = prefix_hashes(_ids(list(range(64))), 256, 16)
    b = prefix_hashes(_ids([*range(16), *range(100, 148)]), 256, 16)
    assert len(a) == 4
    assert a[0] == b[0]
    assert a[1] != b[1]
    # the same block content after a different prefix has a different hash
    c = prefix_hashes(_ids([*range(100, 116), *range(16, 32)]), 256, 16)
    assert c[1] != a[1]
    # only full blocks count
    assert len(prefix_hashes(_ids(list(range(63))), 256, 16)) == 3
    # text prompts are cut into character blocks
    t1 = prefix_hashes(_text("x" * 600), 256, 16)
    t2 = prefix_hashes(_text("x" * 300 + "y" * 300), 256, 16)
    assert len(t1) == 2 and t1[0] == t2[0] and t1[1] != t2[1]


def test_hashes_are_cached_per_block_size() -> None:
    req = _ids(list(range(64)))
    first = prefix_hashes(req, 256, 16)
    assert prefix_hashes(req, 256, 16) is first
    assert len(prefix_hashes(req, 256, 32)) == 2


def test_index_match_gives_each_endpoint_its_depth() -> None:
    eps = _endpoints(3)
    idx = PrefixIndex(1000)
    hashes = prefix_hashes(_ids(list(range(80))), 256, 16)  # 5 blocks
    idx.record(hashes[:2], eps[0])
    idx.record(hashes, eps[1])
    assert idx.match(hashes, eps) == [2, 5, 0]
    assert idx.match(hashes, eps[1:]) == [5, 0]
    assert idx.match(hashes[:1], [eps[2]]) == [0]
    idx.forget(eps[1])
    assert idx.match(hashes, eps) == [2, 0, 0]


def test_index_memory_is_bounded_and_least_recent_goes_first() -> None:
    eps = _endpoints(1)
    idx = PrefixIndex(100)
    old = prefix_hashes(_ids(list(range(16 * 10))), 256, 16)
    idx.record(old, eps[0])
    for k in range(50):
        idx.record(prefix_hashes(_ids([k + 1000] * (16 * 10)), 256, 16), eps[0])
        assert len(idx) <= 100
    assert idx.match(old, eps) == [0]


def test_affinity_follows_the_prefix() -> None:
    bal = PrefixAffinity()
    eps = _endpoints(4)
    shared = list(range(512))
    first = bal.pick(_ids([*shared, 1, 2, 3]), eps)
    assert first is not None
    # Some load elsewhere does not move the conversation away from its prefix.
    for e in eps:
        e.in_flight = 1
    again = [bal.pick(_ids([*shared, 9, k]), eps) for k in range(5)]
    assert all(e is first for e in again)


def test_new_prefixes_spread_by_load() -> None:
    bal = PrefixAffinity()
    eps = _endpoints(4)
    chosen = []
    for k in range(4):
        e = bal.pick(_ids([k] * 256), eps)
        assert e is not None
        e.in_flight += 1
        chosen.append(e.name)
    assert sorted(chosen) == ["e0", "e1", "e2", "e3"]


def test_affinity_yields_when_the_match_is_much_busier() -> None:
    opts = PrefixAffinityOptions(balance_abs=4, balance_rel=1.5)
    bal = PrefixAffinity(opts)
    eps = _endpoints(2)
    shared = list(range(512))
    home = bal.pick(_ids(shared), eps)
    assert home is not None
    other = eps[1 - home.index]
    home.in_flight = 5  # 5 more than the other: over balance_abs, and 6 > 1.5 x 1
    assert bal.pick(_ids(shared), eps) is other
    # the other now holds the prefix too, so later requests may use either
    home.in_flight = 0
    other.in_flight = 3
    assert bal.pick(_ids(shared), eps) is home


def test_affinity_stays_within_the_bound() -> None:
    bal = PrefixAffinity(PrefixAffinityOptions(balance_abs=4, balance_rel=10))
    eps = _endpoints(2)
    home = bal.pick(_ids(list(range(512))), eps)
    assert home is not None
    home.in_flight = 4
    assert bal.pick(_ids(list(range(512))), eps) is home


def test_scorer_scores_the_matched_share() -> None:
    sc = PrefixScorer(PrefixOptions(block_tokens=16))
    eps = _endpoints(2)
    full = _ids(list(range(64)))
    sc.picked(full, eps[0])
    half = _ids([*range(32), *range(500, 532)])
    assert sc.score(half, eps) == [0.5, 0.0]
    assert sc.score(_ids([7] * 10), eps) == [0.0, 0.0]  # shorter than a block


def test_options_are_checked() -> None:
    with pytest.raises(ValidationError):
        PrefixAffinityOptions(balance_rel=0.5)
    with pytest.raises(ValidationError):
        PrefixAffinityOptions(block_tokens=0)
    with pytest.raises(ValidationError):
        PrefixAffinityOptions(blocks=3)  # type: ignore[call-arg]


def test_sparse_match_agrees_with_match() -> None:
    import random

    rng = random.Random(5)
    eps = _endpoints(12)
    idx = PrefixIndex(10_000)
    prompts = [[rng.randrange(4) for _ in range(16 * 6)] for _ in range(40)]
    for p in prompts:
        idx.record(prefix_hashes(_ids(p), 256, 16)[: rng.randrange(1, 7)], rng.choice(eps))
    for p in prompts:
        hashes = prefix_hashes(_ids(p), 256, 16)
        subset = rng.sample(eps, 7)
        mask = 0
        for e in subset:
            mask |= 1 << e.index
        dense = idx.match(hashes, subset)
        sparse = idx.match_sparse(hashes, mask)
        assert {e.index: d for e, d in zip(subset, dense, strict=True) if d} == sparse
