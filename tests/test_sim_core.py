"""The engine core on its own: batching, chunked prefill, prefix caching, eviction,
preemption, aborts, priorities. Time is passed in by hand."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shuniu.backends.sim.engine import FINISHED, RUNNING, WAITING, EngineConfig, EngineCore, Seq
from shuniu.backends.sim.options import SimOptions


def _core(**kw: object) -> EngineCore:
    return EngineCore(EngineConfig(**{"num_blocks": 64, "block_size": 16, **kw}))  # type: ignore[arg-type]


def _run(core: EngineCore, steps: int = 10_000) -> list[list[tuple[str, int]]]:
    """Run iterations until idle; return what each iteration scheduled."""
    log = []
    t = 0.0
    for _ in range(steps):
        batch = core.schedule()
        if batch is None:
            break
        log.append([(s.id, n) for s, n in batch.items])
        t += 1.0
        core.apply(batch, t)
    return log


def test_continuous_batching_and_exact_token_counts() -> None:
    core = _core()
    a, b = Seq("a", list(range(20)), 3), Seq("b", list(range(100, 110)), 5)
    core.add(a)
    core.add(b)
    log = _run(core)
    assert log[0] == [("a", 20), ("b", 10)]  # both prompts in one iteration
    assert log[1] == [("a", 1), ("b", 1)]  # then both decode together
    assert (a.output_count, b.output_count) == (3, 5)
    assert a.status == b.status == FINISHED
    assert len(log) == 5  # b: 1 prefill + 4 decodes
    assert core.generated_tokens == 8 and core.completed == 2
    assert core.pool.used == 0


def test_chunked_prefill_splits_long_prompts() -> None:
    core = _core(max_num_batched_tokens=32)
    seq = Seq("long", list(range(100)), 2)
    core.add(seq)
    log = _run(core)
    assert [n for [(_, n)] in log] == [32, 32, 32, 4, 1]
    assert seq.first_token_at == 4.0  # the first token comes with the last prefill chunk

    whole = _core(max_num_batched_tokens=32, chunked_prefill=False)
    whole.add(Seq("long", list(range(100)), 2))
    assert whole.schedule() is None  # a prompt over the budget cannot start without chunking


def test_v0_scheduling_runs_a_new_prompt_before_the_decodes_never_with_them() -> None:
    # b arrives while a decodes. V1 (the default) takes b's prompt into a's next decode
    # iteration; V0 (prefill_first) gives it an iteration of its own, at once, and a's next
    # token waits for it.
    for prefill_first, second in ((False, [("a", 1), ("b", 10)]), (True, [("b", 10)])):
        core = _core(chunked_prefill=not prefill_first, prefill_first=prefill_first)
        a = Seq("a", list(range(20)), 4)
        core.add(a)
        first = core.schedule()
        assert first is not None and [(s.id, n) for s, n in first.items] == [("a", 20)]
        core.apply(first, 1.0)
        core.add(Seq("b", list(range(100, 110)), 3))
        log = _run(core)
        assert log[0] == second
        if prefill_first:
            assert log[1] == [("a", 1), ("b", 1)]  # then everyone decodes together
            assert all(len({n == 1 for _, n in step}) == 1 for step in log)  # never mixed
        assert a.output_count == 4 and core.completed == 2


def test_prefix_cache_hits_on_shared_prompts() -> None:
    core = _core()
    shared = list(range(48))
    core.add(Seq("first", [*shared, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], 2))
    _run(core)
    assert core.prefix_hits == 0 and core.prefix_queries == 64
    second = Seq("second", [*shared, 99, 98], 2)
    core.add(second)
    log = _run(core)
    assert core.prefix_hits == 48  # three full blocks reused
    assert log[0] == [("second", 2)]  # only the new tokens are computed
    # A prompt that is cached whole still computes its last token.
    again = Seq("again", [*shared, 99, 98], 1)
    core.add(again)
    log = _run(core)
    assert log[0] == [("again", 2)] and core.prefix_hits == 96


def test_a_prompt_admitted_twice_in_one_step_is_computed_once() -> None:
    # vLLM V1 caches a block when its tokens are scheduled (KVCacheManager.allocate_slots), so
    # the second of two equal prompts admitted in one step finds the first's blocks
    # (tests/test_kv_events_real.py checks a real vLLM). V0 marked blocks computed only after
    # the step: both prompts compute everything.
    for prefill_first, hits, second in ((False, 48, 2), (True, 0, 50)):
        core = _core(chunked_prefill=not prefill_first, prefill_first=prefill_first)
        prompt = list(range(50))
        core.add(Seq("a", prompt, 2))
        core.add(Seq("b", list(prompt), 2))
        batch = core.schedule()
        assert batch is not None and [(s.id, n) for s, n in batch.items] == [("a", 50), ("b", second)]
        assert core.prefix_hits == hits
        core.apply(batch, 1.0)
        _run(core)
        assert core.completed == 2 and core.pool.used == 0


def test_a_chunk_in_flight_is_found_by_the_next_admission() -> None:
    # A long prompt's first chunk is scheduled; a request with the same prefix admitted in
    # that step finds the chunk's full blocks (not the rest of the prompt, not yet scheduled).
    core = _core(max_num_batched_tokens=40)
    shared = list(range(64))
    core.add(Seq("long", shared, 1))
    core.add(Seq("short", [*shared[:20], 7], 1))
    batch = core.schedule()
    assert batch is not None and [(s.id, n) for s, n in batch.items] == [("long", 40)]
    core.apply(batch, 1.0)
    follower = Seq("follower", [*shared[:48], 9], 1)
    core.add(follower)
    batch = core.schedule()
    assert batch is not None
    # long's second chunk (24 tokens) fills blocks 2-3 in this step; short (20 tokens, block 0
    # cached) and follower (49 tokens, blocks 0-2 cached once long's chunk is scheduled) follow
    assert [(s.id, n) for s, n in batch.items] == [("long", 24), ("short", 5), ("follower", 1)]
    assert follower.cached_tokens == 48


def test_a_steps_evictions_are_published_before_its_stores() -> None:
    # Blocks are stored when a step is scheduled, and the allocations of that step evict
    # first: a subscriber applying the events in order must end with the new blocks held
    # and the evicted ones gone, whatever hashes the two share.
    core = _core(num_blocks=4)
    core.publish_kv_events()
    old = Seq("old", list(range(48)), 1)
    core.add(old)
    _run(core)  # three full blocks cached, then free (evictable)
    assert core.kv_events is not None
    core.kv_events = []
    new = Seq("new", list(range(500, 548)), 1)
    core.add(new)
    batch = core.schedule()
    assert batch is not None
    kinds = [type(e).__name__ for e in core.kv_events]
    assert kinds == ["BlockRemoved", "BlockStored"], kinds
    removed, stored = core.kv_events
    # one block of four was never used; the other two come from old's, its tail first
    assert set(removed.block_hashes) == {old.hashes[1], old.hashes[2]}  # type: ignore[union-attr]
    assert stored.block_hashes == new.hashes[:3]  # type: ignore[union-attr]


def test_output_blocks_are_cached_for_the_next_turn() -> None:
    core = _core()
    turn1 = Seq("t1", list(range(16)), 32, output_seed=7)
    core.add(turn1)
    _run(core)
    history = list(range(16)) + core._ids(7, 32, 0)
    turn2 = Seq("t2", [*history, 5, 5, 5], 1)
    core.add(turn2)
    _run(core)
    # prompt block + the first of the answer's blocks (the last answer token was never computed)
    assert core.prefix_hits == 32


def test_lru_eviction_under_pressure() -> None:
    core = _core(num_blocks=8)
    core.add(Seq("a", list(range(64)), 1))  # 4 blocks + 1 for the sampled token
    _run(core)
    assert core.pool.evictions == 0 and core.pool.used == 0
    core.add(Seq("b", list(range(1000, 1100)), 1))  # needs 7 blocks: evicts a's cached ones
    _run(core)
    assert core.pool.evictions > 0
    core.add(Seq("a2", list(range(64)), 1))
    _run(core)
    assert core.prefix_hits < 48  # a's prefix was (at least partly) evicted


def test_preemption_by_recompute() -> None:
    core = _core(num_blocks=10)
    a, b = Seq("a", list(range(60)), 40), Seq("b", list(range(200, 260)), 40)
    core.add(a)
    core.add(b)
    _run(core)
    assert core.preemptions >= 1
    assert b.preemptions >= 1 and a.preemptions == 0  # the later request is the victim
    assert (a.output_count, b.output_count) == (40, 40)  # the victim still finishes
    assert core.pool.used == 0


def test_abort_frees_blocks_waiting_or_running() -> None:
    core = _core(max_num_seqs=1)
    a, b = Seq("a", list(range(40)), 100), Seq("b", list(range(40)), 100)
    core.add(a)
    core.add(b)
    batch = core.schedule()
    assert batch is not None and [s.id for s, _ in batch.items] == ["a"]
    core.apply(batch, 1.0)
    assert a.status == RUNNING and b.status == WAITING and core.pool.used == 3
    core.abort(b)
    core.abort(a)
    assert core.pool.used == 0 and core.aborted == 2 and core.num_waiting == 0
    assert core.schedule() is None


def test_priority_policy_orders_the_waiting_queue() -> None:
    core = _core(max_num_seqs=1, priority=True)
    for name, prio, arrival in [("low", 5, 0.0), ("high", 0, 1.0), ("mid", 2, 0.5)]:
        core.add(Seq(name, list(range(8)), 1, priority=prio, arrival=arrival))
    order = [ids[0][0] for ids in _run(core)]
    assert order == ["high", "mid", "low"]


def test_kv_usage_and_load() -> None:
    core = _core(num_blocks=10)
    core.add(Seq("a", list(range(40)), 10))
    batch = core.schedule()
    assert batch is not None
    core.apply(batch, 1.0)
    load = core.load()
    assert load.running == 1 and load.waiting == 0
    assert load.kv_usage == 0.3  # 41 tokens in 16-token blocks


def test_v0_scheduling_needs_chunked_prefill_off() -> None:
    with pytest.raises(ValidationError, match=r"\(V0 scheduling\) needs enable_chunked_prefill: false"):
        SimOptions(prefill_first=True)
    assert SimOptions(prefill_first=True, enable_chunked_prefill=False).prefill_first
