"""The engine's cohort (decodes advanced in aggregate) against the same engine handling every
sequence one by one: random streams of arrivals, aborts, early stops, iterations and decode
leaps committed in pieces, under KV pressure, priorities, small token budgets, with and
without chunked prefill and prefix caching. Every plan, every KV event, every sequence's
outcome and every counter and histogram must be the same."""

from __future__ import annotations

import random
from typing import Any

import pytest

from shuniu.backends.sim.engine import EngineConfig, EngineCore, Seq


def _drive(
    aggregate: bool, seed: int, config: dict[str, Any], steps: int = 700, events_on: bool = True
) -> dict[str, Any]:
    rng = random.Random(seed)
    core = EngineCore(EngineConfig(block_size=16, **config))
    if events_on:  # without them the engine registers blocks by other paths
        core.publish_kv_events()
    shared = [[rng.randrange(50_000) for _ in range(rng.choice((16, 40, 90)))] for _ in range(4)]
    seqs: list[Seq] = []
    plans: list[tuple[Any, ...]] = []
    in_cohort = 0  # plans that ran members
    events: list[Any] = []
    t = 0.0
    for step in range(steps):
        for _ in range(rng.choice((0, 0, 0, 1, 1, 2))):
            prompt = rng.choice(shared) + [rng.randrange(50_000) for _ in range(rng.randrange(1, 70))]
            answer = rng.randrange(6)
            if seqs and rng.random() < 0.15:  # a request again: its blocks another holds
                twin = rng.choice(seqs)
                prompt, answer = list(twin.prompt), twin.output_seed
            seq = Seq(
                f"s{len(seqs)}",
                prompt,
                rng.randint(1, 90),
                output_seed=answer,
                priority=rng.randrange(3),
                arrival=t,
            )
            seq.per_token = not aggregate
            core.add(seq)
            seqs.append(seq)
        if core.running and rng.random() < 0.03:
            victim = rng.choice(core.running)
            if rng.random() < 0.5:
                core.abort(victim, now=t)  # the client went away
            else:
                core.abort(victim, aborted=False, now=t)  # a stop string ended it
        batch = core.schedule()
        if batch is None:
            t += 0.01
            continue
        k = core.leap_length(batch, rng.choice((1, 3, 16, 64)))
        in_cohort += batch.cohort > 0
        plans.append(
            (
                step,
                batch.decode_seqs,
                batch.decode_kv_tokens,
                batch.prefill_tokens,
                batch.prefill_attn,
                batch.new_seqs,
                batch.preempted,
                k,
                len(core.running),
                core.num_waiting,
                core.pool.used,
            )
        )
        if k == 1:
            t += 0.01 + 0.001 * (step % 7)
            core.apply(batch, t)
        else:
            ends = [t + 0.01 * (i + 1) + 0.0003 * (i % 5) for i in range(k)]
            done = 0
            while done < k:  # committed in pieces, as loads read mid-leap commit them
                stop = rng.randint(done + 1, k)
                core.advance(batch, ends, done, stop, k)
                done = stop
            t = ends[-1]
        if core.kv_events:
            events += core.kv_events
            core.kv_events = []
    core.cohort.disband()  # members brought up to date
    return {
        "plans": plans,
        "events": events,
        "seqs": [
            (
                s.status,
                s.output_count,
                s.num_computed,
                s.num_blocks,
                s.num_hashed,
                s.first_token_at,
                s.last_token_at,
                s.finished_at,
                s.cached_tokens,
                s.preemptions,
            )
            for s in seqs
        ],
        "counters": (
            core.requests,
            core.completed,
            core.aborted,
            core.preemptions,
            core.prefix_queries,
            core.prefix_hits,
            core.generated_tokens,
            core.prompt_tokens,
            core.iterations,
            core.pool.used,
            core.pool.available,
            core.pool.cached,
            core.pool.evictions,
        ),
        "histograms": [(dict(h._counts), h.count, h.total, h.max) for h in (core.ttft, core.itl, core.e2e)],
        "running": [s.id for s in core.running],
        "in_cohort": in_cohort,
    }


CONFIGS = {
    "roomy": {"num_blocks": 4_000, "max_num_seqs": 64, "max_num_batched_tokens": 512},
    "kv_pressure": {"num_blocks": 90, "max_num_seqs": 32, "max_num_batched_tokens": 256},
    "priority": {"num_blocks": 110, "max_num_seqs": 32, "max_num_batched_tokens": 256, "priority": True},
    "small_budget": {"num_blocks": 2_000, "max_num_seqs": 64, "max_num_batched_tokens": 40},
    "more_decodes_than_budget": {"num_blocks": 3_000, "max_num_seqs": 64, "max_num_batched_tokens": 12},
    "no_chunking": {
        "num_blocks": 400,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 200,
        "chunked_prefill": False,
    },
    "no_prefix_cache": {
        "num_blocks": 150,
        "max_num_seqs": 32,
        "max_num_batched_tokens": 256,
        "prefix_caching": False,
    },
}


@pytest.mark.parametrize("events_on", [True, False], ids=["kv_events", "no_kv_events"])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_cohort_changes_nothing_but_the_work(name: str, seed: int, events_on: bool) -> None:
    alone = _drive(False, seed, CONFIGS[name], events_on=events_on)
    together = _drive(True, seed, CONFIGS[name], events_on=events_on)
    assert alone["counters"][1] > 20  # the stream did finish requests
    assert alone["in_cohort"] == 0 and together["in_cohort"] > len(together["plans"]) // 4
    for key in ("plans", "events", "seqs", "counters", "histograms", "running"):
        assert together[key] == alone[key], key


def test_the_cohort_is_used() -> None:
    # The comparison above means something only if sequences do join the cohort.
    core = EngineCore(EngineConfig(num_blocks=1_000, block_size=16, max_num_batched_tokens=512))
    for i in range(8):
        seq = Seq(f"s{i}", list(range(i, i + 40)), 60)
        seq.per_token = False
        core.add(seq)
    t = 0.0
    sizes = []
    for _ in range(30):
        batch = core.schedule()
        assert batch is not None
        sizes.append((batch.cohort, len(batch.items)))
        t += 0.01
        core.apply(batch, t)
    assert sizes[0] == (0, 8)  # the prompts, one by one
    assert max(c for c, _ in sizes) == 8 and min(i for _, i in sizes[1:]) == 0
