"""Workloads as data: synthetic ids, arrival processes, length distributions, shared-prefix
chat, mixes, streams, trace replay, laziness and memory, and error reporting."""

from __future__ import annotations

import gc
import itertools
import json
import math
import statistics
import sys
import time
import tracemalloc
from array import array
from pathlib import Path

import msgspec
import pytest

from shuniu.core.errors import ConfigError
from shuniu.core.traffic import (
    VOCAB_SIZE,
    Arrival,
    ChatStream,
    SimRequest,
    Slo,
    Workload,
    WorkloadError,
    describe,
    load_workload,
    synthetic_array,
    synthetic_ids,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples" / "workloads").glob("*.yaml"))


def _load(text: str, **kw: object) -> Workload:
    return load_workload("w.yaml", text=text, **kw)  # type: ignore[arg-type]


def _plain(arrival: str, inp: str = "100", out: str = "10", extra: str = "") -> Workload:
    return _load(
        f"streams:\n  - arrival: {arrival}\n    input_tokens: {inp}\n    output_tokens: {out}\n{extra}"
    )


def _times(w: Workload, duration: float, seed: int = 0) -> list[float]:
    return [r.arrival for r in w.requests(seed, duration, prompts=False)]


def _cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs)


# --------------------------------------------------------------------------- synthetic ids


def test_synthetic_ids_are_a_deterministic_prefix_consistent_stream() -> None:
    a = synthetic_ids(42, 1000)
    assert a == synthetic_ids(42, 1000)
    assert len(a) == 1000 and all(0 <= x < VOCAB_SIZE for x in a)
    assert synthetic_ids(42, 10) == a[:10]
    assert synthetic_ids(42, 300, start=700) == a[700:]
    assert synthetic_ids(42, 1) == a[:1]
    assert synthetic_ids(42, 0) == []
    assert synthetic_array(42, 50, 5).tolist() == a[5:55]
    assert synthetic_ids(43, 1000) != a
    # Values are spread over the vocabulary (top bit of the 15 used, both halves).
    assert len(set(a)) > 950 and max(a) > VOCAB_SIZE * 0.9 and min(a) < VOCAB_SIZE * 0.1
    # Stable across versions and platforms (SHAKE-128): pinned values.
    assert synthetic_ids(0, 4) == synthetic_ids(1 << 64, 4)
    assert synthetic_ids(7, 5) == [11848, 3222, 29521, 3652, 24241]


# --------------------------------------------------------------------------- arrivals


def _as_list(obj: object) -> list[int]:
    """A chat prompt (an ``array('H')``) as JSON encodes a list."""
    if isinstance(obj, array):
        return obj.tolist()
    raise NotImplementedError(type(obj))


def test_requests_are_deterministic_under_a_seed() -> None:
    w = load_workload(ROOT / "examples" / "workloads" / "chat-shared-prefix.yaml")
    enc = msgspec.json.Encoder(enc_hook=_as_list).encode
    first = [enc(r) for r in w.requests(seed=3, duration=60)]
    assert first == [enc(r) for r in w.requests(seed=3, duration=60)]
    assert first != [enc(r) for r in w.requests(seed=4, duration=60)]
    # A shorter run is a prefix of a longer one.
    short = [enc(r) for r in w.requests(seed=3, duration=30)]
    assert first[: len(short)] == short


def test_poisson_rate_and_gaps() -> None:
    times = _times(_plain("{rate: 50}"), 2000)
    rate = len(times) / 2000
    assert rate == pytest.approx(50, rel=0.02)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert _cv(gaps) == pytest.approx(1.0, rel=0.03)
    assert times == sorted(times) and times[0] > 0


def test_gamma_rate_and_cv() -> None:
    for cv in (0.5, 2.0, 4.0):
        times = _times(_plain(f"{{process: gamma, rate: 50, cv: {cv}}}"), 2000)
        assert len(times) / 2000 == pytest.approx(50, rel=0.04), cv
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert _cv(gaps) == pytest.approx(cv, rel=0.05), cv


def test_constant_arrivals_are_evenly_spaced() -> None:
    times = _times(_plain("{process: constant, rate: 4}"), 10)
    assert times == pytest.approx([0.25 * k for k in range(1, 40)])


def test_rate_schedule_steps_ramps_and_repeat() -> None:
    w = _plain(
        """
      schedule:
        - {at_s: 0, rate: 10}
        - {at_s: 100, rate: 100}
        - {at_s: 200, rate: 50, ramp: true}
        - {at_s: 300, rate: 0}"""
    )
    times = _times(w, 1000)

    def count(a: float, b: float) -> int:
        return sum(a <= t < b for t in times)

    assert count(0, 100) == pytest.approx(1000, rel=0.1)
    # The ramp at 200 s runs from the previous point: 100/s at 100 s down to 50/s at 200 s.
    assert count(100, 200) == pytest.approx(7500, rel=0.03)
    assert count(100, 150) == pytest.approx(4375, rel=0.04)  # first half of the ramp: mean 87.5
    assert count(200, 300) == pytest.approx(5000, rel=0.04)
    assert count(300, 1000) == 0  # rate 0 after the last point: the stream ends
    assert describe(w, 300)["request_rate"] == pytest.approx(13500 / 300)

    repeating = _plain(
        """
      repeat_s: 200
      schedule:
        - {at_s: 0, rate: 10}
        - {at_s: 100, rate: 50, ramp: true}"""
    )
    times = _times(repeating, 2000)
    # Each period: ramp 10 -> 50 over 100 s (3000) then 50/s for 100 s (5000).
    assert len(times) == pytest.approx(80000, rel=0.02)
    in_first_halves = sum((t % 200) < 100 for t in times)
    assert in_first_halves == pytest.approx(30000, rel=0.03)
    assert describe(repeating, 2000)["request_rate"] == pytest.approx(40)


def test_gamma_schedule_keeps_the_mean_rate() -> None:
    w = _plain("{process: gamma, cv: 3, schedule: [{at_s: 0, rate: 20}, {at_s: 500, rate: 80}]}")
    times = _times(w, 1500)
    assert sum(t < 500 for t in times) == pytest.approx(10000, rel=0.1)
    assert sum(t >= 500 for t in times) == pytest.approx(80000, rel=0.05)


def test_scaled_multiplies_rates() -> None:
    w = _plain("{process: gamma, rate: 10, cv: 2}")
    fast = w.scaled(3)
    assert fast.streams[0].arrival.rate == 30 and w.streams[0].arrival.rate == 10
    assert len(_times(fast, 500)) == pytest.approx(15000, rel=0.06)
    # Same seed, same operational-time draws: the scaled run is the same run, 3x faster.
    assert _times(fast, 50)[:100] == pytest.approx([t / 3 for t in _times(w, 200)[:100]])
    assert describe(fast)["request_rate"] == pytest.approx(30)
    sched = _plain("{schedule: [{at_s: 0, rate: 5}, {at_s: 10, rate: 7}]}").scaled(2)
    assert [p.rate for p in sched.streams[0].arrival.schedule] == [10, 14]
    with pytest.raises(ValueError):
        w.scaled(0)


# --------------------------------------------------------------------------- lengths


def test_length_distributions_respect_bounds_and_means() -> None:
    w = _load(
        """
streams:
  - name: u
    arrival: {rate: 100}
    input_tokens: {dist: uniform, min: 100, max: 500}
    output_tokens: 77
  - name: ln
    arrival: {rate: 100}
    input_tokens: {dist: lognormal, mean: 1000, sigma: 0.8}
    output_tokens: {dist: lognormal, mean: 300, sigma: 1.0, min: 50, max: 600}
  - name: ex
    arrival: {rate: 100}
    input_tokens: {dist: exponential, mean: 200, min: 10}
    output_tokens: {dist: fixed, value: 5}
"""
    )
    by: dict[str, list[SimRequest]] = {"u": [], "ln": [], "ex": []}
    for r in w.requests(duration=200, prompts=False):
        by[r.stream].append(r)
    u_in = [r.prompt_tokens for r in by["u"]]
    assert min(u_in) == 100 and max(u_in) == 500
    assert statistics.fmean(u_in) == pytest.approx(300, rel=0.02)
    assert {r.output_tokens for r in by["u"]} == {77}
    ln_in = [r.prompt_tokens for r in by["ln"]]
    assert statistics.fmean(ln_in) == pytest.approx(1000, rel=0.03)
    assert statistics.median(ln_in) == pytest.approx(1000 / math.exp(0.32), rel=0.04)
    ln_out = [r.output_tokens for r in by["ln"]]
    assert min(ln_out) == 50 and max(ln_out) == 600  # clamped
    summary = {s["name"]: s for s in describe(w)["streams"]}
    assert statistics.fmean(ln_out) == pytest.approx(summary["ln"]["mean_output_tokens"], rel=0.03)
    ex_in = [r.prompt_tokens for r in by["ex"]]
    assert min(ex_in) == 10 and statistics.fmean(ex_in) == pytest.approx(200, rel=0.04)
    assert {r.output_tokens for r in by["ex"]} == {5}
    assert all(len(r.prompt) == 0 for r in by["u"])  # prompts=False


def test_prompts_are_unique_without_shared_prefixes() -> None:
    reqs = list(_plain("{rate: 10}", "64").requests(duration=20))
    assert all(len(r.prompt) == r.prompt_tokens == 64 for r in reqs)
    assert len({tuple(r.prompt[:16]) for r in reqs}) == len(reqs)
    assert all(r.prefix_group is None and r.prefix_tokens == 0 for r in reqs)
    assert len({r.output_seed for r in reqs}) == len(reqs)


def test_long_short_mix_classes() -> None:
    w = load_workload(ROOT / "examples" / "workloads" / "long-short-mix.yaml")
    reqs = list(w.requests(duration=600, prompts=False))
    short = [r for r in reqs if r.stream == "mix/short"]
    long = [r for r in reqs if r.stream == "mix/long"]
    assert len(short) + len(long) == len(reqs)
    assert len(long) / len(reqs) == pytest.approx(0.2, abs=0.01)
    assert all(100 <= r.prompt_tokens <= 500 and 50 <= r.output_tokens <= 200 for r in short)
    assert all(4000 <= r.prompt_tokens <= 8000 and 300 <= r.output_tokens <= 800 for r in long)
    assert {r.priority for r in long} == {1} and {r.priority for r in short} == {0}
    d = describe(w)
    assert d["request_rate"] == 30
    assert d["mean_input_tokens"] == pytest.approx(0.8 * 300 + 0.2 * 6000)
    assert d["mean_output_tokens"] == pytest.approx(0.8 * 125 + 0.2 * 550)
    assert statistics.fmean(r.prompt_tokens for r in reqs) == pytest.approx(1440, rel=0.03)


# --------------------------------------------------------------------------- shared prefixes


def test_chat_shares_system_prompts_and_grows_history() -> None:
    w = load_workload(ROOT / "examples" / "workloads" / "chat-shared-prefix.yaml")
    stream = w.streams[0]
    assert isinstance(stream, ChatStream)
    reqs = list(w.requests(seed=1, duration=300))
    assert [r.id for r in reqs] == list(range(len(reqs)))
    assert [r.arrival for r in reqs] == sorted(r.arrival for r in reqs)
    by_group: dict[str, list[int]] = {}
    for r in reqs:
        assert r.prefix_group is not None and 1000 <= r.prefix_tokens <= 2000
        assert len(r.prompt) == r.prompt_tokens <= 32000
        system = r.prompt[: r.prefix_tokens]
        assert by_group.setdefault(r.prefix_group, system) == system
    assert len(by_group) == 8
    assert len({tuple(p[:64]) for p in by_group.values()}) == 8  # distinct prompts
    sessions: dict[str, list[SimRequest]] = {}
    for r in reqs:
        sessions.setdefault(r.session or "", []).append(r)
    multi = 0
    for turns in sessions.values():
        assert [t.turn for t in turns] == list(range(len(turns)))
        assert len({t.user for t in turns}) == 1 and len({t.prefix_group for t in turns}) == 1
        assert len(turns) <= 8
        for earlier, later in itertools.pairwise(turns):
            answer = synthetic_ids(earlier.output_seed, earlier.output_tokens)
            assert list(earlier.answer or ()) == answer  # handed to the engine, not made again
            head = [*earlier.prompt, *answer]
            assert list(later.prompt[: len(head)]) == head  # a prefix cache hits on the whole history
            assert len(later.prompt) > len(head)
            assert later.arrival - earlier.arrival >= 4 - 1e-9  # think time min
            multi += 1
    assert multi > 1000
    # A user always uses the same system prompt (u mod K), and tenants split users 5:3:2.
    user_group = {}
    for r in reqs:
        assert user_group.setdefault(r.user, r.prefix_group) == r.prefix_group
    users = {r.user: r.tenant for r in reqs}
    assert len(users) == 200
    tenants = [t for t in users.values()]
    assert (tenants.count("acme"), tenants.count("globex"), tenants.count("initech")) == (100, 60, 40)
    assert {r.tier for r in reqs if r.tenant == "acme"} == {"premium"}
    assert {(r.tier, r.priority) for r in reqs if r.tenant == "initech"} == {("free", 1)}
    d = describe(w)
    assert d["prefix_groups"] == 8 and d["request_rate"] == pytest.approx(6 * 5.5)


def test_chat_ends_conversations_at_the_context_limit() -> None:
    w = _load(
        """
streams:
  - type: chat
    arrival: {rate: 1}
    users: 5
    turns: 50
    think_time_s: 1
    user_tokens: 100
    output_tokens: 100
    max_prompt_tokens: 1000
"""
    )
    reqs = list(w.requests(duration=200))
    assert all(r.prompt_tokens + r.output_tokens <= 1000 for r in reqs)
    assert max(r.turn for r in reqs) == 4  # turn 4: 100 + 4 * 200 in + 100 out = 1000; turn 5: 1200
    assert all(r.prefix_group is None and r.prompt_tokens == 100 + 200 * r.turn for r in reqs)


def test_plain_stream_with_system_prompts() -> None:
    w = _plain(
        "{rate: 50}",
        "{dist: uniform, min: 10, max: 20}",
        extra="    system_prompts: {count: 3, tokens: 500}\n",
    )
    reqs = list(w.requests(duration=20))
    groups: dict[str, list[int]] = {}
    for r in reqs:
        assert r.prefix_tokens == 500 and 510 <= r.prompt_tokens <= 520
        assert groups.setdefault(r.prefix_group or "", r.prompt[:500]) == r.prompt[:500]
    assert sorted(groups) == ["plain/system-0", "plain/system-1", "plain/system-2"]
    assert describe(w)["mean_input_tokens"] == pytest.approx(515)


# --------------------------------------------------------------------------- streams


def test_free_tier_flood_streams_merge_in_arrival_order() -> None:
    w = load_workload(ROOT / "examples" / "workloads" / "free-tier-flood.yaml")
    reqs = list(w.requests(duration=480, prompts=False))
    assert [r.arrival for r in reqs] == sorted(r.arrival for r in reqs)
    assert [r.id for r in reqs] == list(range(len(reqs)))
    premium = [r for r in reqs if r.stream == "premium"]
    free = [r for r in reqs if r.stream == "free"]
    assert {(r.tenant, r.tier, r.priority) for r in premium} == {("bigcorp", "premium", 0)}
    assert {r.tier for r in free} == {"free"} and {r.priority for r in free} == {2}
    assert {r.tenant for r in free} == {"free-a", "free-b", "free-c", "free-d"}
    assert len(premium) / 480 == pytest.approx(15, rel=0.05)
    before = sum(r.arrival < 120 for r in free)
    burst = sum(150 <= r.arrival < 270 for r in free)
    assert before / 120 < 10 and burst / 120 > 50


# --------------------------------------------------------------------------- traces


def test_trace_replay(tmp_path: Path) -> None:
    lines = [
        {"arrival": 0.0, "prompt_tokens": 100, "output_tokens": 10},
        {"arrival": 0.5, "prompt_tokens": 300, "output_tokens": 20, "prefix_group": "g",
         "prefix_tokens": 200},
        {"arrival": 1.0, "prompt_tokens": 250, "output_tokens": 30, "prefix_group": "g",
         "prefix_tokens": 150, "tenant": "t1", "tier": "gold", "priority": 3, "session": "s",
         "api": "completions"},
        {"arrival": 2.0, "prompt_tokens": 50, "output_tokens": 5},
    ]  # fmt: skip
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    (tmp_path / "w.yaml").write_text("streams:\n  - {type: trace, path: t.jsonl, tenant: base}\n")
    w = load_workload(tmp_path / "w.yaml")
    reqs = list(w.requests(duration=10))
    assert [(r.arrival, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (x["arrival"], x["prompt_tokens"], x["output_tokens"]) for x in lines
    ]
    assert all(len(r.prompt) == r.prompt_tokens for r in reqs)
    assert reqs[1].prompt[:150] == reqs[2].prompt[:150]  # the group's stream is shared
    assert reqs[1].prompt[150:200] != reqs[2].prompt[150:200]
    assert (reqs[2].tenant, reqs[2].tier, reqs[2].priority, reqs[2].session, reqs[2].kind) == (
        "t1", "gold", 3, "s", "completions",
    )  # fmt: skip
    assert (reqs[0].tenant, reqs[0].kind, reqs[0].prefix_group) == ("base", "chat", None)
    d = describe(w, 10)
    assert d["prefix_groups"] == 1 and d["request_rate"] == pytest.approx(0.4)
    assert d["mean_input_tokens"] == pytest.approx(175)

    fast = w.scaled(2)
    assert [r.arrival for r in fast.requests(duration=10)] == [0.0, 0.25, 0.5, 1.0]
    (tmp_path / "loop.yaml").write_text(
        "streams:\n  - {type: trace, path: t.jsonl, loop: true, rate_multiplier: 2}\n"
    )
    looped = load_workload(tmp_path / "loop.yaml")
    arrivals = [r.arrival for r in looped.requests(duration=4)]
    # Period: span 2 s + mean gap 2/3 s = 8/3 s, halved.
    assert arrivals == pytest.approx([0, 0.25, 0.5, 1.0, 4 / 3, 4 / 3 + 0.25, 4 / 3 + 0.5, 7 / 3, 8 / 3,
                                      8 / 3 + 0.25, 8 / 3 + 0.5, 11 / 3])  # fmt: skip


def test_example_trace_replay() -> None:
    w = load_workload(ROOT / "examples" / "workloads" / "trace-replay.yaml")
    reqs = list(w.requests(duration=60))
    assert len(reqs) == pytest.approx(60 * describe(w)["request_rate"], rel=0.05)
    groups = {r.prefix_group for r in reqs}
    assert groups == {None, "rag-docs", "agent-tools"}
    rag = [r.prompt[:800] for r in reqs if r.prefix_group == "rag-docs"]
    assert all(p == rag[0] for p in rag)


def test_malformed_trace_lines_are_reported(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(
        "\n".join(
            [
                '{"arrival": 1, "prompt_tokens": 10, "output_tokens": 5}',
                '{"arrival": 2, "prompt_tokens": "ten", "output_tokens": 5}',
                '{"arrival": 3, "prompt_tokens": 10}',
                '{"arrival": 0.5, "prompt_tokens": 10, "output_tokens": 5}',
                '{"arrival": 4, "prompt_tokens": 10, "output_tokens": 5, "prefix_group": "g"}',
                '{"arrival": 5, "prompt_tokens": 10, "output_tokens": 5, "prefix_group": "g", '
                '"prefix_tokens": 11}',
                '{"arrival": 6, "prompt_tokens": 10, "output_tokens": 5, "colour": "red"}',
                "not json",
            ]
        )
    )
    (tmp_path / "w.yaml").write_text("name: x\nstreams:\n  - type: trace\n    path: t.jsonl\n")
    with pytest.raises(WorkloadError) as info:
        load_workload(tmp_path / "w.yaml")
    problems = info.value.problems
    assert {p.path for p in problems} == {"streams[0].path"} and {p.line for p in problems} == {4}
    messages = [p.message for p in problems]
    assert [m.split(":")[0] for m in messages] == [f"t.jsonl line {n}" for n in range(2, 9)]
    assert "Expected `int`, got `str` - at `$.prompt_tokens`" in messages[0]
    assert "missing required field `output_tokens`" in messages[1]
    assert "before the previous line's" in messages[2]
    assert "`prefix_group` needs `prefix_tokens`" in messages[3]
    assert "exceeds `prompt_tokens`" in messages[4]
    assert "unknown field `colour`" in messages[5]
    assert "not valid JSON" in messages[6]
    (tmp_path / "w2.yaml").write_text("streams:\n  - {type: trace, path: missing.jsonl}\n")
    with pytest.raises(WorkloadError, match="cannot read trace file"):
        load_workload(tmp_path / "w2.yaml")


# --------------------------------------------------------------------------- laziness, memory, speed


def test_a_million_requests_stay_lazy() -> None:
    """A million requests with prompts: allocated blocks do not grow with the count (their
    speed is measured by benchmarks/traffic_speed.py)."""
    w = _plain("{rate: 1000}", "{dist: uniform, min: 16, max: 128}", "{dist: uniform, min: 16, max: 256}")
    gc.collect()
    base = sys.getallocatedblocks()
    most = 0
    count = tokens = 0
    for r in w.requests(duration=math.inf):
        count += 1
        tokens += len(r.prompt)
        if count % 50_000 == 0:
            most = max(most, sys.getallocatedblocks() - base)
            if count == 1_000_000:
                break
    assert tokens / count == pytest.approx(72, rel=0.01)
    assert most < 5000  # blocks: nothing accumulates per request


def test_chat_state_is_held_only_for_live_conversations() -> None:
    w = load_workload(ROOT / "examples" / "workloads" / "chat-shared-prefix.yaml").scaled(5)
    gc.collect()
    base = sys.getallocatedblocks()
    samples = []
    for r in w.requests(duration=math.inf, prompts=False):
        if r.id % 20_000 == 0:
            samples.append(sys.getallocatedblocks() - base)
        if r.id == 200_000:
            break
    # Steady state after the first conversations end: no growth from 40k to 200k requests.
    assert max(samples[2:]) < 2 * samples[2] + 5000


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tracemalloc_peak_stays_flat() -> None:
    # The unmarked test above walks 1,000,000 requests counting live blocks; this one measures
    # bytes with tracemalloc, which slows generation ~10x, so it walks 200,000.
    w = _plain("{rate: 1000}", "{dist: uniform, min: 16, max: 128}", "{dist: uniform, min: 16, max: 256}")
    tracemalloc.start()
    try:
        start = time.perf_counter()
        for r in w.requests(duration=math.inf):
            if r.id == 199_999:
                break
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"\n200,000 requests under tracemalloc: peak {peak / 1e6:.2f} MB, {2e5 / elapsed:,.0f} req/s")
    assert peak < 50e6


# --------------------------------------------------------------------------- SLO, describe


def test_slo_thresholds() -> None:
    slo = Slo(ttft_p99_s=1.0, itl_p99_s=0.05)
    assert slo.request_thresholds == (1.0, 0.05, None)
    assert slo.meets(0.9, 0.04) and not slo.meets(1.1, 0.01) and not slo.meets(0.5, 0.06)
    assert slo.meets(0.5, None, 100.0)
    strict = Slo(ttft_p99_s=1.0, ttft_s=0.5, e2e_s=10)
    assert not strict.meets(0.6) and strict.meets(0.4, 1.0, 9) and not strict.meets(0.4, 0.0, 11)
    assert slo.satisfied(ttft_p99=0.9, itl_p99=0.05) and not slo.satisfied(ttft_p99=0.9)
    assert Slo().meets(100, 100, 100) and Slo().satisfied()


def test_every_example_validates_and_generates() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "chat-shared-prefix.yaml",
        "long-short-mix.yaml",
        "free-tier-flood.yaml",
        "poisson-simple.yaml",
        "trace-replay.yaml",
    }
    for path in EXAMPLES:
        text = path.read_text("utf-8")
        assert text.startswith("# "), f"{path.name} must start with a comment saying what it models"
        w = load_workload(path)
        assert w.name == path.stem and w.slo is not None
        d = describe(w)
        assert 10 <= d["request_rate"] <= 100, path.name  # tens of requests/s
        assert d["mean_input_tokens"] > 0 and d["mean_output_tokens"] > 0
        json.dumps(d)
        reqs = list(itertools.islice(w.requests(), 200))
        assert len(reqs) == 200 and all(len(r.prompt) == r.prompt_tokens for r in reqs)


def test_load_from_text_with_env_and_default_names() -> None:
    w = load_workload(
        "streams:\n  - arrival: {rate: '${RATE:-7}'}\n    input_tokens: 5\n    output_tokens: 5\n"
        "  - arrival: {rate: 1}\n    input_tokens: 5\n    output_tokens: 5\n",
        env={"RATE": "9"},
    )
    assert w.name is None and w.streams[0].arrival.rate == 9
    assert w.stream_names == ["plain-0", "plain-1"]
    assert w.duration_s == 600 and w.slo is None


# --------------------------------------------------------------------------- errors


def test_malformed_workload_reports_paths_and_lines() -> None:
    text = """\
name: bad
duration_s: 0
slo: {ttft_p99_s: 1, itl_p99: 0.05}
streams:
  - arrival: {rate: 20, cv: 2}
    input_tokens: {dist: uniform, min: 500, max: 100}
    output_tokens: {dist: normal, mean: 3}
  - type: chat
    arrival:
      process: gamma
      cv: 1.5
      schedule:
        - {at_s: 0, rate: 1}
        - {at_s: 0, rate: 2}
    turns: 2.5
    think_time_s: {dist: lognormal, mean: 10}
    user_tokens: {dist: uniform, min: 1, max: 3, bogus: 1}
    output_tokens: "abc"
    extra_thing: 1
  - type: tracee
  - arrival: {rate: 1}
    input_tokens: 10
  - name: chat
    arrival: {process: gamma, rate: 3}
    classes: [{name: a, weight: 1, input_tokens: 5, output_tokens: 5}]
"""
    with pytest.raises(ConfigError) as info:
        load_workload("bad.yaml", text=text)
    exc = info.value
    assert isinstance(exc, WorkloadError)
    got = [(p.path, p.line, p.message) for p in exc.problems]
    assert got == [
        ("duration_s", 2, "Input should be greater than 0 (got 0)"),
        (
            "slo.itl_p99",
            3,
            "unknown field 'itl_p99'; expected one of: "
            "e2e_p99_s, e2e_s, itl_p99_s, itl_s, ttft_p99_s, ttft_s",
        ),
        ("streams[0].arrival.cv", 5, "only process: gamma takes a cv (process is poisson)"),
        ("streams[0].input_tokens.max", 6, "max (100) is below min (500)"),
        (
            "streams[0].output_tokens.dist",
            7,
            "expected one of 'fixed', 'uniform', 'lognormal', 'exponential' (got 'normal')",
        ),
        ("streams[1].arrival.schedule[1].at_s", 14, "times must increase from point to point"),
        ("streams[1].turns", 15, "a count must be a whole number >= 1 (got 2.5)"),
        ("streams[1].think_time_s.sigma", 16, "required field is missing"),
        ("streams[1].user_tokens.bogus", 17, "unknown field 'bogus'; expected one of: dist, max, min"),
        ("streams[1].output_tokens", 18, "expected a number or a mapping with `dist:` (got 'abc')"),
        (
            "streams[1].extra_thing",
            19,
            "unknown field 'extra_thing'; expected one of: api, arrival, max_prompt_tokens, name, "
            "output_tokens, priority, system_prompts, tenant, tenants, think_time_s, tier, turns, "
            "type, user_tokens, users",
        ),
        ("streams[2].type", 20, "expected one of 'plain', 'chat', 'trace' (got 'tracee')"),
        ("streams[3].output_tokens", 21, "required field is missing (or give `classes`)"),
        ("streams[4].arrival.cv", 24, "required for process: gamma (1.0 is Poisson; larger is burstier)"),
    ]
    assert str(exc).startswith("bad.yaml: 14 problem(s) in the workload:\n  - duration_s (line 2): ")


@pytest.mark.parametrize(
    ("text", "path", "line", "message"),
    [
        ("streams: []\n", "streams", 1, "List should have at least 1 item"),
        ("name: x\n", "streams", 1, "required field is missing"),
        ("- 1\n", "", 1, "the file must be a YAML mapping with a `streams:` list"),
        ("streams: [\n", "", 2, "not valid YAML"),
        (
            "streams:\n  - arrival: {rate: 1}\n    input_tokens: 1\n    output_tokens: 1\n"
            "  - name: plain\n    arrival: {schedule: [{at_s: 1, rate: 1}]}\n    input_tokens: 1\n"
            "    output_tokens: 1\n",
            "streams[1].arrival.schedule[0].at_s",
            6,
            "the first point must be at 0",
        ),
        (
            "streams:\n  - name: a\n    arrival: {rate: 1}\n    input_tokens: 1\n    output_tokens: 1\n"
            "  - name: a\n    arrival: {rate: 1, schedule: [{at_s: 0, rate: 1}]}\n    input_tokens: 1\n"
            "    output_tokens: 1\n",
            "streams[1].arrival",
            7,
            "give either `rate` or `schedule`",
        ),
        (
            "streams:\n  - arrival: {rate: 1}\n    input_tokens: {dist: lognormal, mean: 5, sigma: 1,"
            " min: 9, max: 3}\n    output_tokens: 1\n",
            "streams[0].input_tokens.max",
            3,
            "max (3) is below min (9)",
        ),
        (
            "streams:\n  - arrival: {rate: '${NOPE}'}\n    input_tokens: 1\n    output_tokens: 1\n",
            "streams[0].arrival.rate",
            2,
            "environment variable NOPE is not set",
        ),
    ],
)
def test_workload_problem_cases(text: str, path: str, line: int | None, message: str) -> None:
    with pytest.raises(WorkloadError) as info:
        load_workload("w.yaml", text=text, env={})
    first = info.value.problems[0]
    assert (first.path, first.line) == (path, line)
    assert message in first.message


def test_duplicate_stream_names_and_unreadable_files(tmp_path: Path) -> None:
    text = (
        "streams:\n"
        "  - {name: a, arrival: {rate: 1}, input_tokens: 1, output_tokens: 1}\n"
        "  - {name: a, arrival: {rate: 1}, input_tokens: 1, output_tokens: 1}\n"
    )
    with pytest.raises(WorkloadError) as info:
        load_workload("w.yaml", text=text)
    assert [(p.path, p.line) for p in info.value.problems] == [("streams[1].name", 3)]
    assert "is used by streams[0]" in info.value.problems[0].message
    with pytest.raises(WorkloadError, match="cannot read file"):
        load_workload(tmp_path / "nope.yaml")


def test_arrival_model_direct_use() -> None:
    a = Arrival(process="gamma", rate=2, cv=1)
    assert a.mean_rate(100) == 2
    import random

    times = list(itertools.islice(a.times(random.Random(1)), 5))
    assert times == sorted(times) and times[0] > 0
    assert Arrival(rate=0).mean_rate(10) == 0
    assert list(Arrival(rate=0).times(random.Random(1))) == []
