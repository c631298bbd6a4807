"""The cost model's optional terms: admission cost, host roof, step jitter, CPU KV sizing —
each off by default, so profiles without them price iterations as before."""

from __future__ import annotations

import asyncio
import math
import random
import statistics

import pytest

from shuniu.backends.sim.costmodel import CostModel, jitter_factor
from shuniu.backends.sim.engine import EngineConfig, EngineCore, Seq, SimEngine
from shuniu.backends.sim.profiles import (
    ENV_PROFILE_PATH,
    GIB,
    HardwareProfile,
    kv_bytes_per_token,
    kv_cache_tokens,
    list_hardware,
    load_hardware,
    load_model,
)
from shuniu.core.traffic import synthetic_ids
from shuniu.plugins.tools.simulate import run_virtual


@pytest.fixture(autouse=True)
def _no_user_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PROFILE_PATH, raising=False)


def _hw(name: str = "cpu-tiny", **update: object) -> HardwareProfile:
    return load_hardware(name).model_copy(update=update)


def _cm(**update: object) -> CostModel:
    return CostModel(load_model("tiny-llama"), _hw(**update))


SHAPES = [(0, 0.0, 1, 200), (0, 0.0, 64, 64 * 232), (200, 20000.0, 0, 0), (512, 512 * 256.0, 32, 32 * 300)]


def test_defaults_leave_shipped_profiles_unchanged() -> None:
    for name in list_hardware():
        hw = load_hardware(name)
        if name == "cpu-tiny":
            continue
        assert hw.request_overhead_ms == 0 and hw.host_seq_us == 0 and hw.step_jitter_sigma == 0
        assert hw.kv_cache_space_gib is None
    model = load_model("llama-3.1-8b")
    cm = CostModel(model, load_hardware("h200"))
    assert cm.jitter_sigma == 0
    for shape in SHAPES:
        base = cm.step_time(*shape)
        # new sequences cost nothing without an admission cost
        assert cm.step_time(*shape, 5) == base
        b = cm.breakdown(*shape)
        assert b.host_s == 0 and b.request_s == 0
        # the kernels under their roofs + overhead + per-sequence time (+ no comm at tp 1)
        assert base == pytest.approx(b.kernels_s + 1.5e-3 + shape[2] * 5e-6, rel=1e-12)


def test_admission_cost_is_added_once_per_new_sequence() -> None:
    cm0, cm = _cm(request_overhead_ms=0.0), _cm(request_overhead_ms=2.0)
    for shape in SHAPES:
        for new in (0, 1, 3):
            assert cm.step_time(*shape, new) == pytest.approx(cm0.step_time(*shape) + new * 2e-3)
            assert cm.breakdown(*shape, new).total_s == pytest.approx(cm.step_time(*shape, new))


def test_engine_counts_each_request_once_as_new() -> None:
    core = EngineCore(EngineConfig(num_blocks=256, block_size=16, max_num_batched_tokens=64))
    for i in range(3):  # 100-token prompts: chunked over several iterations
        core.add(Seq(str(i), synthetic_ids(i + 1, 100), 4, output_seed=i, arrival=0.0))
    new_total, now = 0, 0.0
    while core.has_work:
        batch = core.schedule()
        assert batch is not None
        new_total += batch.new_seqs
        now += 0.01
        core.apply(batch, now)
    assert new_total == 3
    assert core.completed == 3


def test_host_roof_binds_only_when_it_exceeds_the_device_path() -> None:
    base = _cm(host_seq_us=0.0)
    small = _cm(host_seq_us=1.0)  # never above the device path
    big = _cm(host_seq_us=500.0)  # always above it for a decode
    for b in (1, 8, 64, 128):
        shape = (0, 0.0, b, b * 232)
        assert small.step_time(*shape) == pytest.approx(base.step_time(*shape))
        fixed = big.hardware.iteration_overhead_ms * 1e-3
        assert big.step_time(*shape) == pytest.approx(b * 500e-6 + fixed)
        assert big.breakdown(*shape).bound == "host"
    # prefill-only iterations have no decoding sequence on the host roof
    assert big.step_time(200, 20000.0, 0, 0) == pytest.approx(base.step_time(200, 20000.0, 0, 0))
    # convex in the batch: the step's slope grows once the host roof binds
    # (a memory-bound GPU decode: ~4 ms of weight reads, which 100 us x B passes at B ~ 40)
    gpu = CostModel(load_model("llama-3.1-8b"), _hw("h200", host_seq_us=100.0))
    t = [gpu.step_time(0, 0.0, b, b * 1024) for b in (8, 16, 96, 128)]
    assert gpu.breakdown(0, 0.0, 8, 8 * 1024).bound == "memory"
    assert gpu.breakdown(0, 0.0, 128, 128 * 1024).bound == "host"
    assert (t[3] - t[2]) / 32 > 2 * (t[1] - t[0]) / 8


def test_jitter_factor_is_mean_one_and_reproducible() -> None:
    assert jitter_factor(random.Random(1), 0.0) == 1.0
    draws = [jitter_factor(random.Random(7), 0.3) for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]
    rng = random.Random(42)
    xs = [jitter_factor(rng, 0.3) for _ in range(40_000)]
    assert statistics.fmean(xs) == pytest.approx(1.0, abs=0.01)
    assert statistics.stdev(math.log(x) for x in xs) == pytest.approx(0.3, rel=0.03)


def _run_engine(sigma: float, seed: int) -> list[float]:
    cost = _cm(step_jitter_sigma=sigma)
    core = EngineCore(EngineConfig(num_blocks=1024, block_size=16))
    engine = SimEngine(core, cost, seed=seed)
    ends: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        seqs = []
        for i in range(8):
            seq = Seq(str(i), synthetic_ids(i + 1, 50), 20, output_seed=i, arrival=loop.time())
            seq.done = loop.create_future()
            engine.submit(seq)
            seqs.append(seq)
        for seq in seqs:
            await seq.done
            ends.append(loop.time())
        await engine.stop()

    run_virtual(main())
    return ends


def test_engine_jitter_is_seeded_and_off_by_default() -> None:
    plain = _run_engine(0.0, 1)
    assert plain == _run_engine(0.0, 2)  # no jitter: the seed does not matter
    a, b, c = _run_engine(0.3, 1), _run_engine(0.3, 1), _run_engine(0.3, 2)
    assert a == b
    assert a != c and a != plain


def test_cpu_kv_cache_space_overrides_the_gpu_formula() -> None:
    model = load_model("tiny-llama")
    hw = _hw("cpu", kv_cache_space_gib=1.0)
    per_token = kv_bytes_per_token(model)
    assert kv_cache_tokens(model, hw) == GIB // per_token
    assert kv_cache_tokens(model, hw, gpu_memory_utilization=0.5) == GIB // per_token
    assert kv_cache_tokens(model, load_hardware("cpu-tiny")) == 1_048_576  # VLLM_CPU_KVCACHE_SPACE=1
    assert kv_cache_tokens(model, _hw("cpu")) != GIB // per_token  # the formula without it


def test_shared_host_core_solves_its_fixed_point() -> None:
    base = _cm(host_token_us=0.0, host_seq_us=0.0)
    shared = _cm(host_token_us=150.0, host_seq_us=0.0)
    c = 150e-6
    for b in (1, 8, 64, 128):
        shape = (0, 0.0, b, b * 232)
        t0, t = base.step_time(*shape), shared.step_time(*shape)
        assert t > t0  # streaming steals host time from the iteration's own host work
        assert t >= b * c  # never faster than the host core can stream the tokens
        # the fixed point: T = device + host parts / (1 - c n / T), where the host parts are
        # what the iteration costs beyond its roofline (overheads), the same parts as without
        bd = base.breakdown(*shape)
        device = bd.kernels_s
        host_parts = t0 - device
        assert t == pytest.approx(device + host_parts / (1 - b * c / t), rel=1e-9)
        assert shared.host_share(t, b, 0) == pytest.approx(b * c / t)
    # a prefill-only iteration samples one token per new request
    assert shared.step_time(200, 20000.0, 0, 0, 1) > base.step_time(200, 20000.0, 0, 0, 1)
    assert shared.host_share(0.01, 0, 1) == pytest.approx(c / 0.01)
    assert base.host_share(0.01, 64, 1) == 0.0


def test_front_end_delay_grows_with_the_host_share() -> None:
    """A request's admission (the sim endpoint's ``ttft_ms``) waits behind the host core's
    streaming: with 64 sequences decoding it takes ``ttft_ms / (1 - host share)``."""

    def admission(busy: int) -> tuple[float, float]:
        admitted: dict[str, float] = {}

        class Recording(SimEngine):
            def _add(self, seq: Seq) -> None:  # where the front-end delay ends
                admitted[seq.id] = asyncio.get_running_loop().time()
                super()._add(seq)

        cost = _cm(host_token_us=150.0)
        engine = Recording(
            EngineCore(EngineConfig(num_blocks=4096, block_size=16)), cost, admission_delay=0.01
        )
        out: list[float] = []

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for i in range(busy):
                engine.submit(Seq(str(i), synthetic_ids(i + 1, 50), 500, output_seed=i, arrival=loop.time()))
            await asyncio.sleep(2.0)  # virtual time: all admitted, the batch is decoding
            share = engine.host_share
            probe = Seq("probe", synthetic_ids(999, 50), 2, output_seed=0, arrival=loop.time())
            probe.done = loop.create_future()
            start = loop.time()
            engine.submit(probe)
            await probe.done
            out.extend([admitted["probe"] - start, share])
            await engine.stop()

        run_virtual(main())
        return out[0], out[1]

    idle_delay, idle_share = admission(0)
    busy_delay, busy_share = admission(64)
    assert idle_share == 0.0 and idle_delay == pytest.approx(0.01, abs=2e-4)
    assert 0.2 < busy_share < 0.95
    assert busy_delay == pytest.approx(0.01 / (1 - busy_share), abs=2e-4)


def test_front_end_work_is_served_one_request_at_a_time() -> None:
    """With a shared host core the front end is one core: three requests arriving together
    are admitted one front-end delay apart; without one, all after the same delay."""

    def admissions(host_token_us: float) -> list[float]:
        admitted: list[float] = []

        class Recording(SimEngine):
            def _add(self, seq: Seq) -> None:
                admitted.append(asyncio.get_running_loop().time())
                super()._add(seq)

        cost = _cm(host_token_us=host_token_us)
        engine = Recording(
            EngineCore(EngineConfig(num_blocks=4096, block_size=16)), cost, admission_delay=0.01
        )

        async def main() -> None:
            loop = asyncio.get_running_loop()
            seqs = [
                Seq(str(i), synthetic_ids(i + 1, 50), 2, output_seed=i, arrival=loop.time()) for i in range(3)
            ]
            for seq in seqs:
                seq.done = loop.create_future()
                engine.submit(seq)
            for seq in seqs:
                await seq.done
            await engine.stop()

        run_virtual(main())
        return admitted

    assert admissions(0.0) == pytest.approx([0.01, 0.01, 0.01])
    assert admissions(50.0) == pytest.approx([0.01, 0.02, 0.03])
