"""Hardware and model profiles of the simulator: shipped data, user profiles, errors, and the
KV-memory arithmetic ``shuniu plan`` prints."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from shuniu.backends.sim.profiles import (
    ENV_PROFILE_PATH,
    KVReport,
    ProfileError,
    bytes_per_weight,
    default_overhead_bytes,
    kv_blocks,
    kv_bytes_per_token,
    kv_bytes_per_token_per_device,
    kv_cache_tokens,
    kv_report,
    list_hardware,
    list_models,
    load_hardware,
    load_model,
    min_tensor_parallel,
    tensor_parallel_problem,
    weight_bytes,
)
from shuniu.core.errors import ConfigError

HARDWARE = ["h200", "h100-sxm", "a100-80gb", "l40s", "rtx-4090", "ascend-910b", "cpu"]
MODELS = [
    "qwen2.5-7b",
    "llama-3.1-8b",
    "qwen2.5-72b",
    "llama-3.1-70b",
    "deepseek-r1-distill-qwen-32b",
    "tiny-llama",
]


@pytest.fixture(autouse=True)
def _no_user_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PROFILE_PATH, raising=False)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), "utf-8")
    return path


# --------------------------------------------------------------------------- shipped data


def test_every_shipped_profile_loads_and_cites_sources() -> None:
    assert set(HARDWARE) <= set(list_hardware())
    assert set(MODELS) <= set(list_models())
    for name in list_hardware():
        hw = load_hardware(name)
        assert hw.name == name and hw.sources and hw.description
        assert hw.peak_flops("bf16") and hw.memory_bytes > 0
    for name in list_models():
        model = load_model(name)
        assert model.name == name and model.sources and model.description
        assert model.weight_precision in ("bf16", "fp32") and model.kv_precision in ("bf16", "fp32")


def test_names_are_case_insensitive() -> None:
    assert load_hardware("H200").name == "h200"
    assert load_model("Llama-3.1-8B").name == "llama-3.1-8b"


@pytest.mark.parametrize("name", MODELS)
def test_published_parameter_counts_match_the_architecture(name: str) -> None:
    model = load_model(name)
    # config.json numbers reproduce the published count (norms and biases are left out)
    assert model.architecture_params == pytest.approx(model.params, rel=0.01)


def test_architecture_numbers() -> None:
    q7 = load_model("qwen2.5-7b")
    assert (q7.hidden_size, q7.num_layers, q7.num_attention_heads, q7.num_kv_heads) == (3584, 28, 28, 4)
    assert (q7.head_dim, q7.intermediate_size, q7.vocab_size, q7.max_position) == (128, 18944, 152064, 32768)
    l70 = load_model("llama-3.1-70b")
    assert (l70.hidden_size, l70.num_layers, l70.intermediate_size, l70.max_position) == (
        8192,
        80,
        28672,
        131072,
    )
    r1 = load_model("deepseek-r1-distill-qwen-32b")
    assert (r1.hidden_size, r1.num_layers, r1.num_attention_heads, r1.num_kv_heads) == (5120, 64, 40, 8)
    h200 = load_hardware("h200")
    assert h200.memory_bandwidth_gb_s == 4800 and h200.peak_tflops.fp8 == pytest.approx(1978.9)
    assert load_hardware("a100-80gb").peak_flops("fp8") is None
    assert load_hardware("ascend-910b").peak_flops("fp8") is None
    assert load_hardware("ascend-910b").peak_flops("fp16") == pytest.approx(313e12)


# --------------------------------------------------------------------------- KV arithmetic


def test_kv_bytes_per_token_is_exact() -> None:
    assert kv_bytes_per_token(load_model("llama-3.1-8b")) == 131072 == 2 * 32 * 8 * 128 * 2
    assert kv_bytes_per_token(load_model("qwen2.5-7b")) == 57344 == 2 * 28 * 4 * 128 * 2
    assert kv_bytes_per_token(load_model("llama-3.1-70b")) == 327680 == 2 * 80 * 8 * 128 * 2
    assert kv_bytes_per_token(load_model("deepseek-r1-distill-qwen-32b")) == 262144
    assert kv_bytes_per_token(load_model("tiny-llama")) == 2 * 2 * 2 * 32 * 4


def test_fp8_kv_halves_kv_bytes() -> None:
    for name in ("llama-3.1-8b", "qwen2.5-7b", "llama-3.1-70b"):
        bf16 = kv_bytes_per_token(load_model(name))
        assert kv_bytes_per_token(load_model(name, kv_precision="fp8")) * 2 == bf16
        assert kv_bytes_per_token(load_model(f"{name}@kv=fp8")) * 2 == bf16


def test_weight_bytes_by_precision() -> None:
    l8 = load_model("llama-3.1-8b")
    assert weight_bytes(l8) == pytest.approx(2 * 8.03e9, rel=1e-6)
    # quantized checkpoints keep embedding and LM head in 16 bits
    fp8 = weight_bytes(load_model("llama-3.1-8b@fp8"))
    assert 8.5e9 < fp8 < 9.5e9  # the published FP8 checkpoint is ~9.1 GB
    assert bytes_per_weight("int4-awq") == bytes_per_weight("int4-gptq") == (4 + 20 / 128) / 8
    assert bytes_per_weight("int8") == bytes_per_weight("fp8") == 1
    l70 = load_model("llama-3.1-70b")
    awq = load_model("llama-3.1-70b", weight_precision="int4-awq")
    ratio = weight_bytes(awq) / weight_bytes(l70)
    assert 0.26 < ratio < 0.30  # ~0.28 x BF16 for a 70B model
    # the quantized body alone: 4 bits + an FP16 scale and 4-bit zero per 128 weights
    body_ratio = (weight_bytes(awq) - 2 * awq.embedding_params * 2) / (
        weight_bytes(l70) - 2 * l70.embedding_params * 2
    )
    assert body_ratio == pytest.approx((4 + 20 / 128) / 16)
    q7_awq = weight_bytes(load_model("qwen2.5-7b@int4-awq"))
    assert 5.3e9 < q7_awq < 5.9e9  # Qwen2.5-7B-Instruct-AWQ's safetensors are ~5.6 GB


def test_precision_overrides() -> None:
    m = load_model("qwen2.5-7b@int4-awq,kv=fp8")
    assert (m.name, m.weight_precision, m.kv_precision) == ("qwen2.5-7b", "int4-awq", "fp8")
    assert m.spec == "qwen2.5-7b@int4-awq,kv=fp8"
    # arguments win over the suffix
    m = load_model("qwen2.5-7b@int4-awq", weight_precision="fp8")
    assert m.weight_precision == "fp8" and m.kv_precision == "bf16"
    assert load_model("qwen2.5-7b@FP8").weight_precision == "fp8"
    # the shipped profile is not changed by an override
    assert load_model("qwen2.5-7b").weight_precision == "bf16"


def test_bad_precision_names_the_field() -> None:
    with pytest.raises(ConfigError) as info:
        load_model("qwen2.5-7b@int3")
    assert info.value.problems[0].path == "weight_precision"
    assert "int4-awq" in str(info.value)
    with pytest.raises(ProfileError) as info:
        load_model("qwen2.5-7b", kv_precision="int8")
    assert info.value.problems[0].path == "kv_precision"
    with pytest.raises(ProfileError, match="NAME@WEIGHTS"):
        load_model("qwen2.5-7b@fp8,colour=blue")


def test_kv_cache_tokens_formula() -> None:
    q7, h200 = load_model("qwen2.5-7b"), load_hardware("h200")
    exact = (h200.memory_bytes * 0.9 - weight_bytes(q7)) // 57344
    assert kv_cache_tokens(q7, h200, overhead_bytes=0) == int(exact)
    tokens = kv_cache_tokens(q7, h200)
    overhead = default_overhead_bytes(q7)
    assert 1.5 * 2**30 < overhead < 3 * 2**30
    assert tokens == int((h200.memory_bytes * 0.9 - weight_bytes(q7) - overhead) // 57344)
    assert 1.9e6 < tokens < 2.2e6  # ~110 GiB of KV at 56 KiB per token
    assert kv_blocks(q7, h200, block_size=16) == tokens // 16
    assert kv_cache_tokens(q7, h200, gpu_memory_utilization=0.5) < tokens
    # with fp8 KV about twice as many tokens fit
    assert kv_cache_tokens(load_model("qwen2.5-7b@kv=fp8"), h200) == pytest.approx(2 * tokens, rel=1e-6)
    # weights that do not fit leave no KV cache (never a negative count)
    assert kv_cache_tokens(load_model("llama-3.1-70b"), load_hardware("h100-sxm")) == 0


def test_tensor_parallel_splits_weights_and_kv_heads() -> None:
    l70, h100 = load_model("llama-3.1-70b"), load_hardware("h100-sxm")
    t2, t4, t8 = (kv_cache_tokens(l70, h100, tp=tp) for tp in (2, 4, 8))
    assert 0 < t2 < t4 < t8
    # tp 8 over 8 KV heads: one head per device, no replication
    assert kv_bytes_per_token_per_device(l70, 8) * 8 == kv_bytes_per_token(l70)
    # tiny-llama has 2 KV heads: over 4 devices each holds a copy of one, so twice the bytes
    tiny = load_model("tiny-llama")
    assert kv_bytes_per_token_per_device(tiny, 4) * 4 == 2 * kv_bytes_per_token(tiny)
    # vLLM's rules: heads must split evenly
    assert tensor_parallel_problem(load_model("qwen2.5-7b"), 8) is not None  # 28 heads
    assert tensor_parallel_problem(load_model("qwen2.5-7b"), 4) is None
    assert tensor_parallel_problem(load_model("deepseek-r1-distill-qwen-32b"), 8) is None  # 40 heads, 8 KV


def test_min_tensor_parallel() -> None:
    h100, h200, a100 = load_hardware("h100-sxm"), load_hardware("h200"), load_hardware("a100-80gb")
    l70 = load_model("llama-3.1-70b")
    l70_fp8 = load_model("llama-3.1-70b@fp8")
    assert min_tensor_parallel(load_model("llama-3.1-8b"), h100) == 1
    # 70B in BF16 (141 GB of weights) needs at least two 80 GB GPUs; four for a full 128K context
    assert min_tensor_parallel(l70, h100, max_model_len=8192) == 2
    assert min_tensor_parallel(l70, h100) == 4
    assert min_tensor_parallel(l70, a100, max_model_len=8192) == 2
    # one H200 holds it only in FP8
    assert min_tensor_parallel(l70, h200) == 2
    assert min_tensor_parallel(l70_fp8, h200) == 1
    assert min_tensor_parallel(l70_fp8, h100) == 2
    assert min_tensor_parallel(load_model("qwen2.5-72b"), h200, max_model_len=8192) == 2
    # eight 24 GB cards hold 70B only with a short context
    assert min_tensor_parallel(l70, load_hardware("rtx-4090")) is None
    assert min_tensor_parallel(l70, load_hardware("rtx-4090"), max_model_len=8192) == 8
    assert min_tensor_parallel(load_model("tiny-llama"), load_hardware("cpu")) == 1


def test_kv_report() -> None:
    q7, h200 = load_model("qwen2.5-7b"), load_hardware("h200")
    report = kv_report(q7, h200, input_tokens=2000, output_tokens=500)
    assert isinstance(report, KVReport)
    assert report.kv_bytes_per_token == 57344
    assert report.kv_cache_tokens == kv_cache_tokens(q7, h200)
    assert report.kv_bytes_per_request == 2512 * 57344  # 2500 tokens in whole 16-token blocks
    assert report.max_concurrent_seqs == report.kv_blocks // 157
    assert report.weight_bytes + report.overhead_bytes + report.kv_cache_bytes <= report.memory_bytes
    capped = kv_report(q7, h200, input_tokens=2000, output_tokens=500, max_num_seqs=256)
    assert capped.max_concurrent_seqs == 256
    text = str(report)
    assert "KV bytes per token" in text and "57,344 B" in text and "max concurrent sequences" in text
    tp2 = kv_report(
        load_model("llama-3.1-70b"), load_hardware("h100-sxm"), tp=2, input_tokens=1000, output_tokens=200
    )
    assert tp2.tensor_parallel == 2 and tp2.max_concurrent_seqs > 0


# --------------------------------------------------------------------------- user profiles

_HW = """\
description: My accelerator
kind: gpu
memory_gib: 32
memory_bandwidth_gb_s: 1000
peak_tflops:
  bf16: 200
interconnect_gb_s: 64
"""

_MODEL = """\
description: My model
hidden_size: 1024
num_layers: 8
num_attention_heads: 16
num_kv_heads: 4
head_dim: 64
intermediate_size: 4096
vocab_size: 32000
max_position: 4096
"""


def test_profile_from_a_path(tmp_path: Path) -> None:
    hw = load_hardware(str(_write(tmp_path / "My-Card.yaml", _HW)))
    assert hw.name == "my-card" and hw.memory_gib == 32 and hw.compute_efficiency == 0.6
    assert hw.peak_flops("fp16") == hw.peak_flops("bf16") == 200e12
    assert hw.peak_flops("fp8") is None
    model = load_model(str(_write(tmp_path / "m.yml", "name: mine\n" + _MODEL)))
    assert model.name == "mine" and model.params_b is None
    assert model.params == model.architecture_params
    assert kv_bytes_per_token(model) == 2 * 8 * 4 * 64 * 2
    # precision suffix on a path
    assert load_model(f"{tmp_path / 'm.yml'}@int8").weight_precision == "int8"


def test_profiles_from_shuniu_profile_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _write(first / "hardware" / "card-a.yaml", _HW)
    # a collection in the second directory, one entry shadowing a shipped name
    _write(
        second / "hardware.yaml",
        "card-b:\n" + textwrap.indent(_HW, "  ") + "h200:\n" + textwrap.indent(_HW.replace("32", "99"), "  "),
    )
    _write(second / "models.yaml", "my-model:\n" + textwrap.indent(_MODEL, "  "))
    monkeypatch.setenv(ENV_PROFILE_PATH, f"{first}{__import__('os').pathsep}{second}")
    assert {"card-a", "card-b", "h200", "h100-sxm"} <= set(list_hardware())
    assert "my-model" in list_models() and "qwen2.5-7b" in list_models()
    assert load_hardware("card-a").description == "My accelerator"
    assert load_hardware("card-b").name == "card-b"
    assert load_hardware("h200").memory_gib == 99  # user directories are searched first
    assert load_model("my-model@fp8").weight_precision == "fp8"
    assert load_model("llama-3.1-8b").num_layers == 32


def test_malformed_profile_names_the_field(tmp_path: Path) -> None:
    bad = _write(
        tmp_path / "bad.yaml",
        """\
        description: bad
        kind: gpu
        memory_gib: 80
        memory_bandwidth_gb_s: fast
        peak_tflops:
          bf16: 100
          fp4: 200
        interconnect_gb_s: 64
        compute_eficiency: 0.5
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_hardware(str(bad))
    problems = {p.path: p for p in info.value.problems}
    assert set(problems) == {"memory_bandwidth_gb_s", "peak_tflops.fp4", "compute_eficiency"}
    assert problems["memory_bandwidth_gb_s"].line == 4
    assert problems["peak_tflops.fp4"].line == 7
    assert "compute_efficiency" in problems["compute_eficiency"].message  # suggests the right one
    assert str(bad) in str(info.value) and "profile" in str(info.value)


def test_malformed_profile_in_a_collection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(
        tmp_path / "models.yaml",
        "ok:\n"
        + textwrap.indent(_MODEL, "  ")
        + "Broken:\n"
        + textwrap.indent(_MODEL, "  ")
        .replace("num_kv_heads: 4", "num_kv_heads: 5")
        .replace("  vocab_size: 32000\n", "")
        + "  weight_precision: int3\n",
    )
    monkeypatch.setenv(ENV_PROFILE_PATH, str(tmp_path))
    assert load_model("ok").num_kv_heads == 4
    with pytest.raises(ProfileError) as info:
        load_model("broken")
    paths = {p.path for p in info.value.problems}
    assert paths == {"Broken.num_kv_heads", "Broken.vocab_size", "Broken.weight_precision"}
    assert all(p.line is not None for p in info.value.problems)


def test_yaml_and_shape_errors(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="not valid YAML") as info:
        load_hardware(str(_write(tmp_path / "a.yaml", "kind: gpu\n  memory_gib: [\n")))
    assert info.value.problems[0].line is not None
    with pytest.raises(ProfileError, match="must be a mapping"):
        load_hardware(str(_write(tmp_path / "b.yaml", "- 1\n- 2\n")))
    with pytest.raises(ProfileError, match="cannot read file"):
        load_hardware(str(tmp_path / "missing.yaml"))
    with pytest.raises(ProfileError) as info:
        load_hardware(str(_write(tmp_path / "c.yaml", "kind: gpu\n")))
    assert {p.path for p in info.value.problems} >= {"memory_gib", "peak_tflops", "interconnect_gb_s"}


def test_unknown_name_lists_the_names() -> None:
    with pytest.raises(ConfigError) as info:
        load_hardware("h300")
    message = str(info.value)
    assert all(name in message for name in HARDWARE) and "h300" in message
    with pytest.raises(ConfigError) as info:
        load_model("gpt-5")
    assert all(name in str(info.value) for name in MODELS)


def test_the_front_end_delay_defaults_to_the_hardware_profile() -> None:
    # Published TTFTs include the serving front end; a profile carries it (frontend_ms) and
    # the sim endpoint's ttft_ms overrides it.
    from shuniu.backends.sim.build import build_engine
    from shuniu.backends.sim.options import SimOptions
    from shuniu.backends.sim.profiles import load_hardware

    for name in ("h100-sxm", "ascend-910b", "cpu"):
        hw = load_hardware(name)
        engine = build_engine(SimOptions(hardware=name, model="llama-3.1-8b")).engine
        assert engine.admission_delay == hw.frontend_ms / 1000
    assert load_hardware("h100-sxm").frontend_ms > 0 and load_hardware("cpu").frontend_ms == 0
    engine = build_engine(SimOptions(hardware="h100-sxm", model="llama-3.1-8b", ttft_ms=0)).engine
    assert engine.admission_delay == 0
