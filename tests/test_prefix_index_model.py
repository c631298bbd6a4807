"""The bounded prefix index against a plain model of it: random streams of matches, records
(some right after a match of the same hashes), merges,
drops and forgets; after every step both must hold the same blocks, masks and LRU order,
and a match must answer each endpoint's depth as the model counts it."""

from __future__ import annotations

import gc
import random
from collections import OrderedDict
from types import SimpleNamespace

import pytest

from shuniu.plugins.balancers import prefix_index
from shuniu.plugins.balancers.prefix_index import PrefixIndex


class _Model:
    """What :class:`PrefixIndex` promises, written the obvious way."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.table: OrderedDict[int, int] = OrderedDict()

    def depths(self, hashes: list[int], alive: int) -> dict[int, int]:
        out: dict[int, int] = {}
        for e in range(alive.bit_length()):
            if not alive >> e & 1:
                continue
            d = 0
            while d < len(hashes) and self.table.get(hashes[d], 0) >> e & 1:
                d += 1
            if d:
                out[e] = d
        return out

    def record(self, hashes: list[int], bit: int) -> None:
        for h in hashes:
            self.table[h] = self.table.get(h, 0) | bit
            self.table.move_to_end(h)
        while len(self.table) > self.max_blocks:
            self.table.popitem(last=False)

    def drop(self, e: int, h: int) -> None:
        if h in self.table:
            mask = self.table[h] & ~(1 << e)
            if mask:
                self.table[h] = mask
            else:
                del self.table[h]

    def forget(self, e: int) -> None:
        for h in list(self.table):
            self.drop(e, h)


def _prompt(rng: random.Random, roots: list[list[int]]) -> list[int]:
    """A chain that shares a random part of an earlier one, then goes its own way."""
    base = rng.choice(roots)
    chain = base[: rng.randint(0, len(base))]
    chain += [rng.getrandbits(40) for _ in range(rng.randint(0, 12))]
    if rng.random() < 0.3:
        roots.append(chain)
    return chain


@pytest.mark.parametrize("seed", range(30))
def test_index_agrees_with_its_model(seed: int) -> None:
    rng = random.Random(seed)
    max_blocks = rng.choice([8, 40, 10_000])
    index, model = PrefixIndex(max_blocks), _Model(max_blocks)
    roots: list[list[int]] = [[rng.getrandbits(40) for _ in range(20)] for _ in range(3)]
    endpoints = 4
    for _ in range(300):
        op = rng.random()
        hashes = _prompt(rng, roots)
        if op < 0.55:
            alive = rng.randint(1, (1 << endpoints) - 1)
            assert index.match_sparse(hashes, alive) == model.depths(hashes, alive)
            tail = hashes[rng.randint(0, len(hashes)) :]
            assert index.match_sparse(tail, alive) == model.depths(tail, alive)
            if rng.random() < 0.8:  # the balancer's pick: match, then record the chosen one
                e = rng.randrange(endpoints)
                if rng.random() < 0.2:  # something else changes the table in between
                    h = rng.choice(hashes) if hashes else 0
                    index.drop(e, h)
                    model.drop(e, h)
                if hashes:
                    index.record(hashes, SimpleNamespace(index=e))  # type: ignore[arg-type]
                    model.record(hashes, 1 << e)
        elif op < 0.75:
            e = rng.randrange(endpoints)
            if rng.random() < 0.3:  # not from a chain's start: it may enter a run mid-way
                hashes = hashes[rng.randint(0, len(hashes)) :]
            index.merge(e, hashes)
            model.record(hashes, 1 << e)
        elif op < 0.95 and model.table:
            e, h = rng.randrange(endpoints), rng.choice(list(model.table))
            index.drop(e, h)
            model.drop(e, h)
        else:
            e = rng.randrange(endpoints)
            index.forget_index(e)
            model.forget(e)
        assert list(index.items()) == list(model.table.items()) and len(index) == len(model.table)


@pytest.mark.parametrize("seed", range(20))
def test_aging_index_agrees_with_two_models(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two generations: a match answers the deeper of the two models' depths per
    endpoint (the older generation is skipped where one look-up shows it cannot be deeper)."""
    rng = random.Random(seed)
    now = [0.0]
    monkeypatch.setattr(prefix_index, "loop_time", lambda: now[0])
    index = prefix_index.AgingPrefixIndex(10_000, 10.0)
    new, old, born = _Model(10_000), _Model(10_000), 0.0
    roots: list[list[int]] = [[rng.getrandbits(40) for _ in range(20)] for _ in range(3)]
    for _ in range(300):
        now[0] += rng.expovariate(1.0)
        if now[0] - born > 10.0:
            new, old, born = _Model(10_000), new, now[0]
        hashes = _prompt(rng, roots)
        alive = rng.randint(1, 15)
        want = new.depths(hashes, alive)
        for e, d in old.depths(hashes, alive).items():
            want[e] = max(want.get(e, 0), d)
        assert index.match_sparse(hashes, alive) == want
        if hashes and rng.random() < 0.8:
            e = rng.randrange(4)
            index.record(hashes, SimpleNamespace(index=e))  # type: ignore[arg-type]
            new.record(hashes, 1 << e)
        if rng.random() < 0.1 and new.table:
            e, h = rng.randrange(4), rng.choice(list(new.table))
            index.drop(e, h)
            new.drop(e, h)
            old.drop(e, h)


def test_a_dropped_generation_is_freed_without_the_cycle_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs are linked both ways; an aging index cuts the links of the generation it
    drops, so reference counting frees it at once (not the collector's next full pass)."""
    now = [0.0]
    monkeypatch.setattr(prefix_index, "loop_time", lambda: now[0])

    def live_runs() -> int:  # every run in memory (not the lists' ends, which hold no blocks)
        return sum(1 for o in gc.get_objects() if type(o) is prefix_index._Run and o.hashes)

    gc.collect()
    gc.disable()
    try:
        before = live_runs()
        index = prefix_index.AgingPrefixIndex(10_000, 10.0)
        rng = random.Random(1)
        roots: list[list[int]] = [[rng.getrandbits(40) for _ in range(20)] for _ in range(3)]
        for e in range(40):
            index.record(_prompt(rng, roots), SimpleNamespace(index=e % 4))  # type: ignore[arg-type]
        assert live_runs() - before == len(_runs(index.new)) > 10
        for _ in range(2):  # that generation becomes the old one, then is dropped
            now[0] += 11.0
            index.record(_prompt(rng, roots), SimpleNamespace(index=0))  # type: ignore[arg-type]
        assert live_runs() - before == len(_runs(index.new)) + len(_runs(index.old))
    finally:
        gc.enable()


def _runs(index: PrefixIndex) -> list[object]:
    return list(index._runs())
