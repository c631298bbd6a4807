"""The simulator's roofline cost model: sanity against published figures, monotonicity, the
memory/compute crossover, tensor parallelism, precision, and the cost of one call."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from shuniu.backends.sim.costmodel import CostModel
from shuniu.backends.sim.profiles import (
    ENV_PROFILE_PATH,
    list_hardware,
    list_models,
    load_hardware,
    load_model,
    tensor_parallel_problem,
    weight_bytes,
)


@pytest.fixture(autouse=True)
def _no_user_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PROFILE_PATH, raising=False)


def _cm(model: str, hw: str, tp: int = 1) -> CostModel:
    return CostModel(load_model(model), load_hardware(hw), tp)


def test_empty_batch_costs_nothing() -> None:
    cm = _cm("llama-3.1-8b", "h100-sxm")
    assert cm.step_time(0, 0.0, 0, 0) == 0.0
    assert cm.breakdown(0, 0.0, 0, 0).total_s == 0.0


def test_every_profile_pair_gives_finite_positive_times() -> None:
    for hw_name in list_hardware():
        hw = load_hardware(hw_name)
        for model_name in list_models():
            model = load_model(model_name)
            tp = 1
            while tp <= hw.max_tensor_parallel:
                if tensor_parallel_problem(model, tp) is None:
                    cm = CostModel(model, hw, tp)
                    for t in (cm.decode_time(1, 100), cm.decode_time(64, 2000), cm.prefill_time(4096, 1024)):
                        assert math.isfinite(t) and t > 0
                tp *= 2


def test_llama_8b_against_published_figures() -> None:
    # Single-request decode is weight streaming: ~15 GB over 3.35 / 4.8 TB/s plus overhead;
    # vLLM and TensorRT-LLM report ~5-8 ms per token for Llama-3-8B BF16 on one H100/H200.
    for hw in ("h100-sxm", "h200"):
        cm = _cm("llama-3.1-8b", hw)
        assert 0.005 <= cm.decode_time(1, 512) <= 0.008, hw
        # a 2,000-token prompt is ~29 TFLOP: tens of milliseconds at ~60% of 989 TFLOPS
        assert 0.04 <= cm.prefill_time(2000) <= 0.15, hw
    h100, h200 = _cm("llama-3.1-8b", "h100-sxm"), _cm("llama-3.1-8b", "h200")
    assert h200.decode_time(1, 512) < h100.decode_time(1, 512)  # more bandwidth
    assert h200.prefill_time(2000) == pytest.approx(h100.prefill_time(2000))  # same compute
    # A100: ~1.6x slower decode (bandwidth), ~3x slower prefill (BF16 peak 312 vs 989)
    a100 = _cm("llama-3.1-8b", "a100-80gb")
    assert 1.3 < a100.decode_time(1, 512) / h100.decode_time(1, 512) < 1.8
    assert 2.5 < a100.prefill_time(4000) / h100.prefill_time(4000) < 3.3


def test_seventy_b_decode_with_tensor_parallelism() -> None:
    # Llama-3.1-70B BF16 on 4 x H100: ~35 GB of weights per GPU per token, 15-25 ms
    t = _cm("llama-3.1-70b", "h100-sxm", 4).decode_time(1, 1000)
    assert 0.012 < t < 0.025
    # FP8 on one H200 reads ~72 GB per token: 18-30 ms
    t = CostModel(load_model("llama-3.1-70b@fp8"), load_hardware("h200")).decode_time(1, 1000)
    assert 0.018 < t < 0.030


@pytest.mark.parametrize("hw", ["h100-sxm", "a100-80gb", "rtx-4090", "ascend-910b"])
def test_monotonic_in_tokens_batch_and_context(hw: str) -> None:
    cm = _cm("llama-3.1-8b", hw)
    prev = 0.0
    for n in (1, 16, 128, 512, 2048, 8192):
        t = cm.prefill_time(n)
        assert t > prev
        prev = t
    for ctx in (0, 1000, 8000):
        prev = 0.0
        for batch in (1, 2, 8, 32, 128, 256, 1024):
            t = cm.decode_time(batch, ctx)
            assert t > prev
            prev = t
    assert cm.decode_time(32, 4000) > cm.decode_time(32, 1000)
    assert cm.prefill_time(1000, context=8000) > cm.prefill_time(1000)
    # mixing a prefill chunk into a decode batch costs more than either alone
    mixed = cm.step_time(512, 512 * 256, 64, 64 * 1000)
    assert mixed > max(cm.prefill_time(512), cm.decode_time(64, 1000))


def test_step_time_matches_breakdown() -> None:
    cm = _cm("qwen2.5-72b", "h100-sxm", 4)
    for args in ((0, 0.0, 1, 100), (2048, 2048 * 1024.0, 0, 0), (512, 512 * 4096.0, 100, 300_000)):
        b = cm.breakdown(*args)
        assert cm.step_time(*args) == pytest.approx(b.total_s)
        assert b.total_s == pytest.approx(b.kernels_s + b.overhead_s + b.comm_s)
        assert max(b.compute_s, b.memory_s) <= b.kernels_s <= b.compute_s + b.memory_s
        assert b.comm_s > 0


def test_a_decode_batch_whose_matmuls_are_compute_bound_still_pays_for_its_kv_reads() -> None:
    # 512 sequences of Llama-3.1-8B on an H100: the matmuls are past the ridge, so one
    # roofline over the sums would hide the KV reads of longer contexts behind their FLOPs.
    # The matmuls and attention are separate kernels: each extra context token of each
    # sequence costs its KV bytes over the achievable bandwidth, as the profile says.
    model, hw = load_model("llama-3.1-8b"), load_hardware("h100-sxm")
    cm = CostModel(model, hw, 1)
    batch = 512
    short = cm.breakdown(0, 0.0, batch, batch * 128)
    assert short.compute_s > short.memory_s
    extra = batch * (2000 - 128)
    kv_bytes = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2  # K and V, bf16
    expected = extra * kv_bytes / (hw.memory_bandwidth_gb_s * 1e9 * hw.bandwidth_efficiency)
    grown = cm.step_time(0, 0.0, batch, batch * 2000) - cm.step_time(0, 0.0, batch, batch * 128)
    assert grown == pytest.approx(expected, rel=1e-6)


def test_decode_turns_compute_bound_at_large_batch() -> None:
    cm = _cm("llama-3.1-8b", "h100-sxm")
    assert cm.breakdown(0, 0.0, 1, 128).bound == "memory"
    assert cm.breakdown(0, 0.0, 8, 8 * 128).bound == "memory"
    assert cm.breakdown(4096, 4096 * 2048.0, 0, 0).bound == "compute"  # prefill
    # short contexts: the ridge of ~590 achievable TFLOPS over ~2.7 TB/s is ~220 FLOP/byte,
    # i.e. a few hundred sequences for BF16 weights
    crossover = cm.decode_crossover_batch(context=128)
    assert crossover is not None and 100 < crossover < 500
    below, above = math.floor(crossover * 0.8), math.ceil(crossover * 1.2)
    assert cm.breakdown(0, 0.0, below, below * 128).bound == "memory"
    assert cm.breakdown(0, 0.0, above, above * 128).bound == "compute"
    # at long contexts the KV reads grow faster than the FLOPs: decode stays memory-bound
    assert cm.decode_crossover_batch(context=4000) is None
    assert cm.breakdown(0, 0.0, 1024, 1024 * 4000).bound == "memory"
    # the crossover sits lower where compute is scarcer relative to bandwidth (A100)
    assert _cm("llama-3.1-8b", "a100-80gb").decode_crossover_batch(128) < crossover
    print(f"\nllama-3.1-8b decode crossover on H100 at 128-token context: {crossover:.0f} sequences")


def test_tensor_parallel_speeds_up_large_prefill() -> None:
    tp2, tp4, tp8 = (_cm("llama-3.1-70b@fp8", "h100-sxm", tp) for tp in (2, 4, 8))
    assert tp2.prefill_time(8192) > tp4.prefill_time(8192) > tp8.prefill_time(8192)
    assert tp4.prefill_time(8192) / tp2.prefill_time(8192) < 0.65  # near-linear, minus all-reduce
    small = _cm("llama-3.1-8b", "h100-sxm")
    split = _cm("llama-3.1-8b", "h100-sxm", 2)
    assert split.prefill_time(8192) < small.prefill_time(8192)
    # all-reduce: two per layer, each with a fixed latency, even for one token
    b = split.breakdown(0, 0.0, 1, 100)
    assert b.comm_s >= 2 * 32 * 8e-6
    # over PCIe (no P2P on GeForce) all-reduce costs much more than over NVLink
    pcie = _cm("llama-3.1-8b", "rtx-4090", 2).breakdown(8192, 8192 * 4096.0, 0, 0).comm_s
    nvlink = split.breakdown(8192, 8192 * 4096.0, 0, 0).comm_s
    assert pcie > 5 * nvlink


def test_invalid_tensor_parallel_is_refused() -> None:
    with pytest.raises(ValueError, match="28 attention heads"):
        _cm("qwen2.5-7b", "h100-sxm", 8)
    with pytest.raises(ValueError, match="at most 2"):
        _cm("tiny-llama", "cpu", 4)


def test_fp8_weights_use_fp8_peak_only_where_the_hardware_has_it() -> None:
    for hw, faster_prefill in (("h100-sxm", True), ("h200", True), ("l40s", True), ("a100-80gb", False)):
        bf16 = CostModel(load_model("llama-3.1-8b"), load_hardware(hw))
        fp8 = CostModel(load_model("llama-3.1-8b@fp8"), load_hardware(hw))
        assert fp8.compute_precision == ("fp8" if faster_prefill else "bf16")
        ratio = fp8.prefill_time(4096) / bf16.prefill_time(4096)
        if faster_prefill:
            assert 0.45 < ratio < 0.7, hw
        else:
            assert ratio == pytest.approx(1.0, abs=0.01), hw
        # decode reads half the weight bytes everywhere (W8A16 on A100)
        assert fp8.decode_time(1, 512) < 0.75 * bf16.decode_time(1, 512), hw


def test_weight_only_int4_reads_less_but_computes_in_bf16() -> None:
    bf16 = _cm("qwen2.5-7b", "a100-80gb")
    awq = _cm("qwen2.5-7b@int4-awq", "a100-80gb")
    assert awq.compute_precision == "bf16"
    assert awq.prefill_time(4096) == pytest.approx(bf16.prefill_time(4096), rel=0.01)
    ratio = awq.breakdown(0, 0.0, 1, 0).memory_s / bf16.breakdown(0, 0.0, 1, 0).memory_s
    assert ratio < 0.45
    # and an FP8 KV cache halves the KV traffic of long-context decode
    kv8 = _cm("qwen2.5-7b@kv=fp8", "a100-80gb")
    long_bf16 = bf16.breakdown(0, 0.0, 64, 64 * 16000)
    long_kv8 = kv8.breakdown(0, 0.0, 64, 64 * 16000)
    weights_s = weight_bytes(bf16.model) / (2039e9 * 0.8)
    assert long_kv8.memory_s - weights_s < 0.55 * (long_bf16.memory_s - weights_s)


def test_cpu_profile_runs_the_tiny_model() -> None:
    cm = _cm("tiny-llama", "cpu")
    assert cm.compute_precision == "fp32"
    # the tiny model's step is all overhead: within a few percent of the fixed cost
    assert cm.decode_time(1, 100) == pytest.approx(0.010, rel=0.05)


def test_sanity_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    """Print the headline predictions (quoted in docs/simulator.md); the asserts are loose."""
    lines = []
    for hw in ("h100-sxm", "h200"):
        cm = _cm("llama-3.1-8b", hw)
        d1, d64 = cm.decode_time(1, 1000), cm.decode_time(64, 1000)
        p2k = cm.prefill_time(2000)
        lines.append(
            f"llama-3.1-8b on {hw}: decode {d1 * 1e3:.2f} ms/token at batch 1, "
            f"{d64 * 1e3:.2f} ms at batch 64 (1k context); 2k-token prefill {p2k * 1e3:.1f} ms"
        )
        assert d1 < d64 < 4 * d1
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_step_time_is_cheap() -> None:
    cm = _cm("llama-3.1-70b", "h100-sxm", 4)
    step = cm.step_time
    n = 200_000
    args = [(i % 3 * 256, float(i % 3 * 256 * 1024), i % 200, (i % 200) * 900) for i in range(1000)]
    start = time.perf_counter()
    for i in range(n):
        a = args[i % 1000]
        step(a[0], a[1], a[2], a[3])
    elapsed = time.perf_counter() - start
    # the loop's own cost is included: this is an upper bound on one call
    print(f"\nCostModel.step_time: {elapsed / n * 1e9:.0f} ns per call (loop included)")


def test_decode_steps_are_step_time_to_the_last_bit() -> None:
    # Every profile pair the planner may pick (tensor and pipeline parallel, shared host
    # cores, compute- and memory-bound batches): a leap timed in one call must take the
    # very floats that timing its iterations one by one takes, or leaps and stepping part.
    checked = 0
    for cm in _cost_models(((1, 1), (2, 1), (8, 1), (1, 2))):
        for seqs, kv in ((1, 17), (7, 3_001), (64, 90_000), (512, 2_000_000)):
            steps = cm.decode_steps(seqs, kv, 3, 40)
            assert steps == [cm.step_time(0, 0.0, seqs, kv + i * seqs, 0) for i in range(3, 40)]
            checked += 1
    assert checked > 100


def test_decode_steps_across_the_roofs_are_step_time_to_the_last_bit() -> None:
    # Where the attention roof and the KV-read roof cross, and where the host roof binds, a
    # leap may time its iterations as one expression only where every iteration takes the
    # same branch: ranges of 1 to 60 iterations starting on both sides of the crossing (a
    # few sequences' tokens from it), and a host roof set to bind mid-range, all give
    # step_time's floats.
    checked = 0
    for cm in _cost_models(((1, 1),)):
        if cm.host_token or cm._c_pair <= cm._m_kv:
            continue
        for d in (1, 5, 64):
            cross = int(d * cm._m_kv / (cm._c_pair - cm._m_kv))
            for kv in {max(0, cross + j * d + k) for j in range(-4, 4) for k in (-1, 0, 1)}:
                for host in (cm._host_seq, None):
                    if host is None:  # binding at the middle of the longest range
                        busy = cm.step_time(0, 0.0, d, kv + 30 * d, 0) - cm._fixed - d * cm._c_comm
                        host = busy / d
                    saved, cm._host_seq = cm._host_seq, host
                    try:
                        for stop in (1, 2, 3, 60):
                            steps = cm.decode_steps(d, kv, 0, stop)
                            assert steps == [cm.step_time(0, 0.0, d, kv + i * d, 0) for i in range(stop)]
                            checked += 1
                    finally:
                        cm._host_seq = saved
    assert checked > 1_000


def _cost_models(splits: tuple[tuple[int, int], ...]) -> Iterator[CostModel]:
    """A cost model for every hardware and model profile pair, at each (TP, PP) of ``splits``
    that the pair can run."""
    for hw_name in list_hardware():
        hw = load_hardware(hw_name)
        for model_name in list_models():
            model = load_model(model_name)
            for tp, pp in splits:
                if tp > hw.max_tensor_parallel or tensor_parallel_problem(model, tp) is not None:
                    continue
                try:
                    cm = CostModel(model, hw, tp, pp=pp)
                except ValueError:
                    continue
                yield cm
