"""Hash chains of token blocks: the shared formula, the memo of prompts that start alike, and
the prefix-cache walks built on them (the prefix index's match and record; the KV pool's
look-up is in test_kvcache.py)."""

from __future__ import annotations

import itertools
import random
from array import array
from pathlib import Path

import pytest

from shuniu.core.blockhash import PrefixChain, common_length, extend_chain
from shuniu.core.pools.prefix import match_depths
from shuniu.core.traffic import load_workload
from shuniu.core.traffic.synthetic import synthetic_ids
from shuniu.plugins.balancers.prefix_index import PrefixIndex
from tests.conftest import ROOT


def _fresh(ids: list[int], block: int) -> list[int]:
    """The chain computed from scratch, block by block, as the engines define it."""
    out, h = [], block
    for b in range(len(ids) // block):
        h = hash((h, tuple(ids[b * block : (b + 1) * block])))
        out.append(h)
    return out


def test_a_conversation_chain_matches_hashing_each_turn_from_scratch() -> None:
    chain = PrefixChain()
    prompt = synthetic_ids(1, 37)
    for turn in range(6):
        for block in (16, 32):
            assert chain.hashes(prompt, block, len(prompt)) == _fresh(prompt, block)
        prompt = prompt + synthetic_ids(100 + turn, 50 + 7 * turn)  # the next turn starts with this one


def test_a_compact_array_of_ids_hashes_as_its_list() -> None:
    # Workloads keep prompts as array('H'); the chain must not depend on the container,
    # from the start or continued from any block.
    ids = synthetic_ids(3, 300)
    compact = array("H", ids)
    for block in (1, 16, 64):
        for have in (0, 1, 5):
            want = _fresh(ids, block)
            assert extend_chain(want[:have], compact, block, len(ids) // block) == want


def test_a_shared_system_prompt_is_remembered_but_not_the_rest() -> None:
    chain = PrefixChain()
    system = synthetic_ids(2, 100)  # 6 full blocks and 4 tokens
    for user in range(5):
        prompt = system + synthetic_ids(200 + user, 40 + user)
        got = chain.hashes(prompt, 16, len(system))
        assert got == _fresh(prompt, 16)
    # A prompt shorter than the shared part is still hashed right.
    assert chain.hashes(system[:40], 16, len(system)) == _fresh(system[:40], 16)
    assert extend_chain([], system, 16, 3) == _fresh(system, 16)[:3]


def test_a_chain_hashed_elsewhere_is_adopted_as_it_is() -> None:
    # A conversation whose engine hashed each turn's prompt and answer (the same formula):
    # the next turn takes those hashes, the very objects, and hashes only its new message.
    system = synthetic_ids(3, 70)
    family = PrefixChain()
    chain = PrefixChain()
    chain.adopt(family.known([*system, 1, 2, 3], 16, len(system)), 16, len(system))
    assert family.known(system, 16, len(system)) == _fresh(system, 16)
    prompt = system + synthetic_ids(300, 45)
    for turn in range(4):
        got = chain.hashes(prompt, 16, len(prompt))
        assert got == _fresh(prompt, 16)
        answer = synthetic_ids(400 + turn, 33 + turn)
        engine = extend_chain(list(got), prompt + answer, 16, (len(prompt) + len(answer)) // 16)
        chain.adopt(engine, 16, len(prompt) + len(answer))
        prompt = prompt + answer + synthetic_ids(500 + turn, 20)
        again = chain.hashes(prompt, 16, len(prompt))
        assert again == _fresh(prompt, 16)
        assert all(a is b for a, b in zip(again, engine, strict=False))  # adopted, not rehashed
    # Adopting less than is known, or another block size, changes nothing known.
    known = list(chain.known(prompt, 16, 0))
    chain.adopt(known[:3], 16, 10_000)
    assert chain.known(prompt, 16, 0) == known


def test_chat_turns_declare_what_the_next_turn_shares() -> None:
    w = load_workload(ROOT / "examples" / "workloads" / "chat-shared-prefix.yaml")
    by_conversation: dict[str, list] = {}
    for r in w.requests(seed=1, duration=120):
        by_conversation.setdefault(r.session, []).append(r)
    checked = 0
    for turns in by_conversation.values():
        assert len({t.chain_key for t in turns}) == 1 and turns[0].chain_key is not None
        for a, b in itertools.pairwise(turns):
            assert a.chain_tokens == len(a.prompt)
            # The promise PrefixChain relies on: the next turn starts with this whole prompt
            # and then this turn's answer.
            assert b.prompt[: len(a.prompt)] == a.prompt
            answer = b.prompt[len(a.prompt) : len(a.prompt) + a.output_tokens]
            assert list(answer) == synthetic_ids(a.output_seed, a.output_tokens)
            checked += 1
    assert checked > 50


def _depths(table: dict[int, int], hashes: list[int], alive: int) -> dict[int, int]:
    """Each endpoint's depth counted one block at a time."""
    out = {}
    for i in range(alive.bit_length()):
        if alive >> i & 1:
            d = 0
            while d < len(hashes) and table.get(hashes[d], 0) >> i & 1:
                d += 1
            if d:
                out[i] = d
    return out


def test_match_depths_agrees_with_counting_block_by_block() -> None:
    rng = random.Random(3)
    for _ in range(300):
        hashes = [rng.randrange(1 << 40) for _ in range(rng.randrange(0, 30))]
        table = {}
        for h in hashes:
            if rng.random() < 0.9:
                table[h] = rng.choice([0b1111, 0b1111, 0b0111, 0b0101, 0b1000, 0b0001])
        alive = rng.randrange(1, 16)
        assert match_depths(table, hashes, alive) == _depths(table, hashes, alive)


def test_common_length_counts_the_equal_leading_hashes() -> None:
    rng = random.Random(5)
    for _ in range(500):
        run = [rng.randrange(4) for _ in range(rng.randint(1, 40))]
        hashes = [rng.randrange(4) for _ in range(rng.randint(0, 10))] + run[: rng.randint(1, len(run))]
        hashes += [rng.randrange(4) for _ in range(rng.randint(0, 40))]
        i = hashes.index(run[0])
        n = min(len(run), len(hashes) - i, rng.randint(1, 50))
        naive = 0
        while naive < n and run[naive] == hashes[i + naive]:
            naive += 1
        assert common_length(run, hashes, i, n) == naive


def test_recording_a_known_prefix_again_makes_it_the_most_recent() -> None:
    idx = PrefixIndex(12)
    a, b, c = ([rng * 100 + k for k in range(5)] for rng in (1, 2, 3))
    idx._record(a, 0b1)
    idx._record(b, 0b1)
    idx._record(a, 0b1)  # every block known there already: the fast path
    idx._record(c, 0b10)  # two over the bound: b's oldest blocks go, not a's
    assert idx.match_sparse(a, 0b1) == {0: 5}
    assert idx.match_sparse(b, 0b1) == {}  # its first block was evicted
    assert idx.match_sparse(c, 0b11) == {1: 5}
    idx._record(a[:3], 0b10)  # known blocks, a new endpoint: the slow path ORs the bit in
    assert idx.match_sparse(a, 0b11) == {0: 5, 1: 3}


EXAMPLES = sorted((ROOT / "examples" / "workloads").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_keeps_the_promise_of_its_chain_keys(path: Path) -> None:
    """Requests of one ``chain_key`` agree on their shared tokens, whatever the stream kind."""
    w = load_workload(path)
    longest: dict[str, list[int]] = {}
    for r in w.requests(seed=2, duration=60):
        if r.chain_key is None:
            continue
        assert 0 <= r.chain_tokens <= len(r.prompt)
        seen = longest.get(r.chain_key)
        if seen is not None:
            n = min(len(seen), r.chain_tokens)
            assert list(r.prompt[:n]) == seen[:n], r.chain_key
        if seen is None or r.chain_tokens > len(seen):
            longest[r.chain_key] = list(r.prompt[: r.chain_tokens])
