"""Hardware and model profiles of the engine simulator, and the KV-cache arithmetic.

Profiles are data: ``shuniu/backends/sim/data/hardware.yaml`` and ``models.yaml`` ship with the
package (each number cited in the file). Users add their own:

- a *name that is a path* to a YAML file (it ends in ``.yaml``/``.yml`` or holds a path
  separator) loads that file, which holds one profile (its fields at the top level; the name
  defaults to the file's stem);
- ``SHUNIU_PROFILE_PATH`` lists directories (``os.pathsep``-separated) searched before the
  shipped data, in order. Each is laid out like the shipped data: ``hardware.yaml`` and
  ``models.yaml`` map names to profiles, and ``hardware/NAME.yaml`` and ``models/NAME.yaml`` hold
  one profile each (the single files win over the collection in the same directory).

A model name may carry precision overrides after an ``@``: ``llama-3.1-70b@fp8`` (weights in
FP8), ``qwen2.5-7b@int4-awq,kv=fp8`` (INT4 AWQ weights, FP8 KV cache), ``llama-3.1-8b@kv=fp8``
(KV only). :func:`load_model`'s ``weight_precision`` / ``kv_precision`` arguments win over the
suffix. Names are case-insensitive.

A malformed profile raises :class:`ProfileError` (a :class:`shuniu.core.errors.ConfigError`)
whose problems name the field path and line, like a malformed deployment file; an unknown name
lists the names available.

Memory arithmetic (what ``shuniu plan`` prints):

- KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element.
- Weight bytes: the decoder's parameters at the weight precision, plus the embedding and LM
  head at 16 bits (quantized checkpoints — FP8, INT8, AWQ, GPTQ — keep them unquantized). INT4
  adds its group scales: 128-weight groups with an FP16 scale and a 4-bit zero point, i.e.
  20/128 = 0.156 extra bits per weight (this reproduces the published AWQ checkpoint sizes).
- KV capacity = (device memory x utilization x tp - weights - overhead) / KV bytes per token,
  per device as vLLM computes it: with tensor parallelism the memory adds up, weights and KV
  heads are split (KV heads are replicated when tp exceeds their count). The default overhead
  per device is 1 GiB (CUDA context, NCCL/cuBLAS workspaces, CUDA graphs) plus an activation
  peak for an 8192-token batch and the FP32 logits of 256 sequences
  (:func:`default_overhead_bytes`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from shuniu.core.config.loader import parse_yaml, pydantic_problems
from shuniu.core.errors import ConfigError, Problem

__all__ = [
    "ENV_PROFILE_PATH",
    "HardwareProfile",
    "KVPrecision",
    "KVReport",
    "ModelProfile",
    "PeakTflops",
    "ProfileError",
    "WeightPrecision",
    "bytes_per_weight",
    "compute_precision",
    "default_overhead_bytes",
    "kv_blocks",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_device",
    "kv_cache_bytes",
    "kv_cache_tokens",
    "kv_report",
    "list_hardware",
    "list_models",
    "load_hardware",
    "load_model",
    "min_tensor_parallel",
    "pipeline_parallel_problem",
    "pipeline_split",
    "tensor_parallel_problem",
    "weight_bytes",
]

ENV_PROFILE_PATH = "SHUNIU_PROFILE_PATH"

WeightPrecision = Literal["bf16", "fp16", "fp32", "fp8", "int8", "int4-awq", "int4-gptq"]
KVPrecision = Literal["bf16", "fp16", "fp32", "fp8"]
WEIGHT_PRECISIONS: tuple[str, ...] = get_args(WeightPrecision)
KV_PRECISIONS: tuple[str, ...] = get_args(KVPrecision)

INT4_GROUP_SIZE = 128
INT4_GROUP_OVERHEAD_BITS = 16 + 4
"""Per group of :data:`INT4_GROUP_SIZE` weights: an FP16 scale and a 4-bit zero point."""

_BYTES_PER_WEIGHT: dict[str, float] = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp32": 4.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4-awq": (4 + INT4_GROUP_OVERHEAD_BITS / INT4_GROUP_SIZE) / 8,
    "int4-gptq": (4 + INT4_GROUP_OVERHEAD_BITS / INT4_GROUP_SIZE) / 8,
}
_BYTES_PER_KV: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}

GIB = 1 << 30
FIXED_OVERHEAD_PER_DEVICE = 1 * GIB
"""CUDA context, NCCL and cuBLAS workspaces, CUDA graphs: memory no KV block can use."""


class ProfileError(ConfigError):
    """A hardware or model profile that cannot be loaded, with every problem found."""

    what = "profile"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)


class PeakTflops(_Strict):
    """Dense (no 2:4 sparsity) peak throughput per precision, in TFLOP/s (TOPS for int8)."""

    bf16: float = Field(gt=0)
    """BF16 tensor-core peak, dense."""
    fp16: float | None = Field(None, gt=0)
    """FP16 peak, dense; default: the BF16 peak."""
    fp8: float | None = Field(None, gt=0)
    """FP8 peak, dense; absent or null when the hardware has no FP8 (then FP8 weights compute
    in BF16 and only read fewer bytes)."""
    int8: float | None = Field(None, gt=0)
    """INT8 peak in TOPS, dense (informational: INT8 weight-only quantization computes in BF16)."""
    fp32: float | None = Field(None, gt=0)
    """FP32 peak (non-tensor); default: a quarter of the BF16 peak."""


class HardwareProfile(_Strict):
    """One accelerator (or CPU) as the roofline cost model sees it."""

    name: str = ""
    """Profile name (the key in a collection file, else the file's stem)."""
    description: str = ""
    """Human-readable name of the part."""
    kind: Literal["gpu", "npu", "cpu"]
    """Device family."""
    memory_gib: float = Field(gt=0)
    """Device memory the runtime sees, GiB (2^30 bytes)."""
    memory_bandwidth_gb_s: float = Field(gt=0)
    """Peak memory bandwidth, decimal GB/s, as published."""
    peak_tflops: PeakTflops
    """Dense peak compute per precision."""
    interconnect: str = ""
    """Name of the device-to-device link (NVLink 4, PCIe Gen4 x16, HCCS, ...)."""
    interconnect_gb_s: float = Field(gt=0)
    """Device-to-device bandwidth as published (bidirectional aggregate per device); the cost
    model uses half of it per direction."""
    max_tensor_parallel: int = Field(8, ge=1)
    """Most devices one tensor-parallel group may span (devices in a node on the fast link):
    a replica without pipeline parallelism, or one pipeline stage."""
    max_pipeline_parallel: int = Field(4, ge=1)
    """Most pipeline stages one replica may span, each a node of up to
    ``max_tensor_parallel`` devices (``pipeline_parallel_size``, for a model that does not
    fit one node). 1: a replica stays within one node."""
    node_link_gb_s: float = Field(50.0, gt=0)
    """Bandwidth between nodes per device, decimal GB/s in one direction (a 400 Gb/s
    InfiniBand or RoCE NIC per device: 50). Pipeline stages pass activations over it."""
    node_link_latency_us: float = Field(20.0, ge=0)
    """Latency of one hop between pipeline stages on different nodes (sending a
    microbatch's activations and receiving them)."""
    compute_efficiency: float = Field(0.6, gt=0, le=1)
    """Fraction of the dense peak FLOP/s an engine reaches on large matmuls."""
    bandwidth_efficiency: float = Field(0.8, gt=0, le=1)
    """Fraction of the peak memory bandwidth reached streaming weights and KV."""
    interconnect_efficiency: float = Field(0.7, gt=0, le=1)
    """Fraction of the one-direction link bandwidth an all-reduce reaches."""
    iteration_overhead_ms: float = Field(1.5, ge=0)
    """Fixed time per engine iteration outside the kernels: scheduler, input preparation,
    sampling, launch gaps."""
    seq_overhead_us: float = Field(5.0, ge=0)
    """Extra host time per decoding sequence in an iteration (input preparation, sampling)."""
    allreduce_latency_us: float = Field(10.0, ge=0)
    """Fixed latency of one all-reduce across the tensor-parallel group."""
    request_overhead_ms: float = Field(0.0, ge=0)
    """Extra time, per request, of the iteration that schedules it (first or after a
    preemption): block allocation, prefix hashing, adding it to the worker's persistent batch,
    the front end's request intake. Added to the iteration outside both roofs. Default 0 (the
    shipped GPU profiles have no measurement of it)."""
    frontend_ms: float = Field(0.0, ge=0)
    """The serving front end's delay before a request reaches the engine: HTTP, the chat
    template and tokenizer, the hand-off to the engine core (and, seen by the client, the
    first token's detokenizing and streaming). Published TTFTs include it; the engine's
    iterations do not. The ``sim`` endpoint's ``ttft_ms`` when its options give none (with
    ``host_token_us``, it grows with the token rate and requests are served one at a time).
    Default 0."""
    host_seq_us: float = Field(0.0, ge=0)
    """Host time per decoding sequence on a *host roof*: the iteration lasts
    ``max(device time, host_seq_us x decoding sequences) + iteration_overhead_ms``, where the
    device time is the roofline plus ``seq_overhead_us`` per decoding sequence. Models a host
    core (scheduler, detokenizer, streaming) that works in parallel with the device and binds
    only at large batches, which makes the step convex in the batch. Default 0: no host roof."""
    host_token_us: float = Field(0.0, ge=0)
    """Host-core time per sampled token: the serving front end's output path (the engine
    core's output processing, detokenizing, streaming the chunk) on the core it shares with
    the scheduler. That work takes a share ``rho = host_token_us x tokens sampled / iteration
    time`` of the core, and the iteration's host-side parts (``iteration_overhead_ms``,
    ``seq_overhead_us`` per decoding sequence, ``request_overhead_ms`` per new request) run on
    the rest, stretched by ``1 / (1 - rho)``; the iteration time is the fixed point, solved
    exactly. Iterations that stream more tokens per second take longer, and the front-end
    delay (the ``sim`` endpoint's ``ttft_ms``) grows with the token rate, as the engine's
    ``host_share`` reports it. Default 0: no shared host core."""
    step_jitter_sigma: float = Field(0.0, ge=0, le=2)
    """Multiplicative jitter of iteration times: each iteration's time is multiplied by a
    lognormal factor with this log-space sigma and mean 1 (so mean throughput is kept), drawn
    from the engine's seeded random stream (runs stay reproducible). Default 0: deterministic."""
    kv_cache_space_gib: float | None = Field(None, gt=0)
    """A fixed KV-cache size per device (worker process), GiB, instead of the GPU memory
    formula (memory x utilization - weights - overhead): what vLLM's CPU build takes from
    ``VLLM_CPU_KVCACHE_SPACE``. Default: the formula."""
    price_per_hour: float | None = Field(None, ge=0)
    """What one device costs per hour (any currency; ``shuniu plan`` ranks configurations by
    devices x hours x this, and ``--price`` overrides it). ``None``: unknown, configurations
    are ranked by device count."""
    sources: list[str] = Field(default_factory=list)
    """Where each number comes from (datasheet, whitepaper, measurement)."""

    @property
    def memory_bytes(self) -> int:
        """Device memory in bytes."""
        return int(self.memory_gib * GIB)

    def peak_flops(self, precision: str) -> float | None:
        """Dense peak in FLOP/s for ``bf16``, ``fp16``, ``fp8``, ``int8`` or ``fp32``; ``None``
        when the hardware does not support it."""
        p = self.peak_tflops
        if precision == "bf16":
            value: float | None = p.bf16
        elif precision == "fp16":
            value = p.fp16 if p.fp16 is not None else p.bf16
        elif precision == "fp32":
            value = p.fp32 if p.fp32 is not None else p.bf16 / 4
        elif precision == "fp8":
            value = p.fp8
        elif precision == "int8":
            value = p.int8
        else:
            raise ValueError(f"unknown compute precision {precision!r}")
        return None if value is None else value * 1e12


class ModelProfile(_Strict):
    """A dense decoder-only transformer (Llama / Qwen2 family), from its ``config.json``."""

    name: str = ""
    """Profile name (the key in a collection file, else the file's stem)."""
    description: str = ""
    """Human-readable model name."""
    hf_repo: str | None = None
    """Hugging Face repository the numbers come from."""
    architecture: str = "LlamaForCausalLM"
    """``architectures[0]`` of the config (informational)."""
    hidden_size: int = Field(gt=0)
    """``hidden_size``."""
    num_layers: int = Field(gt=0)
    """``num_hidden_layers``."""
    num_attention_heads: int = Field(gt=0)
    """``num_attention_heads`` (query heads)."""
    num_kv_heads: int = Field(gt=0)
    """``num_key_value_heads`` (grouped-query attention)."""
    head_dim: int = Field(gt=0)
    """``head_dim`` (else ``hidden_size / num_attention_heads``)."""
    intermediate_size: int = Field(gt=0)
    """``intermediate_size`` of the gated MLP (gate, up and down projections)."""
    vocab_size: int = Field(gt=0)
    """``vocab_size``."""
    max_position: int = Field(gt=0)
    """``max_position_embeddings``: the longest context the model serves by default."""
    tie_word_embeddings: bool = False
    """``tie_word_embeddings``: the LM head shares the embedding matrix."""
    params_b: float | None = Field(None, gt=0)
    """Total parameters in billions, as published; default: counted from the architecture."""
    active_params_b: float | None = Field(None, gt=0)
    """Parameters one token passes through, billions (mixture-of-experts); default: all. Only
    the FLOPs use it; every weight is still read once per iteration."""
    weight_precision: WeightPrecision = "bf16"
    """Precision of the decoder's weights: bf16, fp16, fp32, fp8, int8, int4-awq, int4-gptq."""
    kv_precision: KVPrecision = "bf16"
    """Precision of the KV cache: bf16, fp16, fp32 or fp8."""
    sources: list[str] = Field(default_factory=list)
    """Where each number comes from (config.json, model card)."""

    @field_validator("num_kv_heads")
    @classmethod
    def _kv_heads_divide(cls, value: int, info: ValidationInfo) -> int:
        heads = info.data.get("num_attention_heads")
        if heads is not None and heads % value:
            raise ValueError(f"num_attention_heads ({heads}) must be a multiple of num_kv_heads ({value})")
        return value

    @field_validator("active_params_b")
    @classmethod
    def _active_within_total(cls, value: float | None, info: ValidationInfo) -> float | None:
        total = info.data.get("params_b")
        if value is not None and total is not None and value > total:
            raise ValueError(f"active_params_b ({value}) must not exceed params_b ({total})")
        return value

    @property
    def embedding_params(self) -> int:
        """Parameters of the token embedding (``vocab_size x hidden_size``)."""
        return self.vocab_size * self.hidden_size

    @property
    def layer_params(self) -> int:
        """Matmul parameters of one decoder layer, counted from the architecture."""
        h, hd = self.hidden_size, self.head_dim
        attn = h * self.num_attention_heads * hd * 2 + h * self.num_kv_heads * hd * 2
        return attn + 3 * h * self.intermediate_size

    @property
    def architecture_params(self) -> int:
        """Total parameters counted from the architecture (norms and biases left out)."""
        heads = 1 if self.tie_word_embeddings else 2
        return self.num_layers * self.layer_params + heads * self.embedding_params

    @property
    def params(self) -> float:
        """Total parameters: the published count, else the architecture's."""
        return self.params_b * 1e9 if self.params_b is not None else float(self.architecture_params)

    @property
    def body_params(self) -> float:
        """Parameters outside the embedding and the LM head (the quantizable decoder)."""
        heads = 1 if self.tie_word_embeddings else 2
        return self.params - heads * self.embedding_params

    @property
    def active_body_params(self) -> float:
        """Decoder parameters one token's forward pass multiplies by."""
        if self.active_params_b is None:
            return self.body_params
        heads = 1 if self.tie_word_embeddings else 2
        return self.active_params_b * 1e9 - heads * self.embedding_params

    @property
    def spec(self) -> str:
        """Name with the precisions, e.g. ``llama-3.1-70b@fp8,kv=fp8``."""
        return f"{self.name}@{self.weight_precision},kv={self.kv_precision}"


# --------------------------------------------------------------------------- arithmetic


def bytes_per_weight(precision: str) -> float:
    """Bytes one decoder weight takes at ``precision`` (INT4 includes its group scales)."""
    return _BYTES_PER_WEIGHT[precision]


def _head_bytes(model: ModelProfile) -> int:
    """Bytes per element of the unquantized embedding and LM head."""
    return 4 if model.weight_precision == "fp32" else 2


def kv_bytes_per_token(model: ModelProfile) -> int:
    """KV-cache bytes one token takes: 2 x layers x kv_heads x head_dim x bytes per element."""
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * _BYTES_PER_KV[model.kv_precision]


def kv_bytes_per_token_per_device(model: ModelProfile, tp: int = 1) -> int:
    """KV bytes one token takes on each of ``tp`` devices (KV heads split, or replicated when
    ``tp`` exceeds their number), over all layers: with pipeline parallelism each stage's
    devices hold their share of the layers, so a replica holds ``tp`` times this per token
    whatever the number of stages."""
    heads = -(-model.num_kv_heads // tp)
    return 2 * model.num_layers * heads * model.head_dim * _BYTES_PER_KV[model.kv_precision]


def weight_bytes(model: ModelProfile) -> int:
    """Bytes of all weights: the decoder at ``weight_precision``, embedding and LM head at 16
    bits (32 for an fp32 model)."""
    heads = 1 if model.tie_word_embeddings else 2
    return int(
        model.body_params * _BYTES_PER_WEIGHT[model.weight_precision]
        + heads * model.embedding_params * _head_bytes(model)
    )


def compute_precision(model: ModelProfile, hw: HardwareProfile) -> str:
    """Precision the decoder's matmuls run in: FP8 for FP8 weights on hardware with FP8, FP32
    for FP32 models, FP16 for FP16 ones, else BF16 (weight-only INT8/INT4 dequantize to BF16)."""
    if model.weight_precision == "fp8" and hw.peak_tflops.fp8 is not None:
        return "fp8"
    if model.weight_precision in ("fp32", "fp16"):
        return model.weight_precision
    return "bf16"


def tensor_parallel_problem(model: ModelProfile, tp: int) -> str | None:
    """Why ``model`` cannot be split over ``tp`` devices (vLLM's rules), or ``None``."""
    if tp < 1:
        return f"tensor parallel size must be at least 1, not {tp}"
    if model.num_attention_heads % tp:
        return (
            f"{model.name or 'the model'} has {model.num_attention_heads} attention heads, "
            f"not divisible by tensor parallel size {tp}"
        )
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        return (
            f"{model.name or 'the model'} has {model.num_kv_heads} KV heads; tensor parallel size "
            f"{tp} must divide them or be a multiple of them"
        )
    return None


def pipeline_parallel_problem(model: ModelProfile, pp: int) -> str | None:
    """Why ``model`` cannot be split into ``pp`` pipeline stages, or ``None`` (every stage
    needs at least one layer)."""
    if pp < 1:
        return f"pipeline parallel size must be at least 1, not {pp}"
    if pp > model.num_layers:
        return f"{model.name or 'the model'} has {model.num_layers} layers, fewer than {pp} pipeline stages"
    return None


def default_overhead_bytes(
    model: ModelProfile,
    tp: int = 1,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    pp: int = 1,
) -> int:
    """Memory of a replica (all ``tp`` x ``pp`` devices) that holds neither weights nor KV:
    per device 1 GiB fixed plus the activation peak of a ``max_num_batched_tokens`` batch
    (residual, QKV, gate/up and down projections of one layer) and ``max_num_seqs`` rows of
    FP32 logits (counted on every stage: a small over-estimate for the stages before the last)."""
    act = 4 if model.weight_precision == "fp32" else 2
    width = (
        2 * model.hidden_size
        + (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim // tp
        + 2 * model.intermediate_size // tp
    )
    per_device = FIXED_OVERHEAD_PER_DEVICE + max_num_batched_tokens * width * act
    per_device += max_num_seqs * model.vocab_size * 4
    return tp * pp * per_device


def kv_cache_bytes(
    model: ModelProfile,
    hw: HardwareProfile,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    overhead_bytes: int | None = None,
    pp: int = 1,
) -> int:
    """Bytes left for the KV cache on the replica: memory x utilization x tp x pp - weights -
    overhead (``overhead_bytes`` for the whole replica; default :func:`default_overhead_bytes`).
    0 when the weights do not fit. A profile with ``kv_cache_space_gib`` (a CPU) gives that
    size instead, whatever the utilization."""
    devices = tp * pp
    if hw.kv_cache_space_gib is not None:
        return int(hw.kv_cache_space_gib * GIB * devices)  # the CPU build's VLLM_CPU_KVCACHE_SPACE
    if overhead_bytes is None:
        overhead_bytes = default_overhead_bytes(model, tp, pp=pp)
    free = hw.memory_bytes * gpu_memory_utilization * devices - weight_bytes(model) - overhead_bytes
    return max(int(free), 0)


def kv_cache_tokens(
    model: ModelProfile,
    hw: HardwareProfile,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    overhead_bytes: int | None = None,
    pp: int = 1,
) -> int:
    """Tokens the KV cache of one replica holds: :func:`kv_cache_bytes` over the KV bytes per
    token (per device, so replicated KV heads count). 0 when the weights do not fit."""
    free = kv_cache_bytes(model, hw, tp, gpu_memory_utilization, overhead_bytes, pp)
    return free // (tp * kv_bytes_per_token_per_device(model, tp))


def kv_blocks(
    model: ModelProfile,
    hw: HardwareProfile,
    tp: int = 1,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    overhead_bytes: int | None = None,
    pp: int = 1,
) -> int:
    """Paged KV blocks of ``block_size`` tokens one replica holds."""
    return kv_cache_tokens(model, hw, tp, gpu_memory_utilization, overhead_bytes, pp) // block_size


def min_tensor_parallel(
    model: ModelProfile,
    hw: HardwareProfile,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    pp: int = 1,
) -> int | None:
    """Smallest power-of-two tensor-parallel size (up to ``hw.max_tensor_parallel``) that holds
    the weights with KV room for one sequence of ``max_model_len`` tokens (default: the model's
    ``max_position``) — the check vLLM makes at start-up — and splits the model's heads evenly,
    over ``pp`` pipeline stages of that size. ``None`` when no size fits."""
    need = max_model_len if max_model_len is not None else model.max_position
    tp = 1
    while tp <= hw.max_tensor_parallel:
        if tensor_parallel_problem(model, tp) is None:
            if kv_cache_tokens(model, hw, tp, gpu_memory_utilization, pp=pp) >= need:
                return tp
        tp *= 2
    return None


def pipeline_split(
    model: ModelProfile,
    hw: HardwareProfile,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
) -> tuple[int, int] | None:
    """For a model that fits no node (:func:`min_tensor_parallel` is ``None``): the
    tensor-parallel size of a whole node (the largest power of two up to
    ``hw.max_tensor_parallel`` that splits the heads) and the fewest pipeline stages (up to
    ``hw.max_pipeline_parallel``) that hold the weights with room for one sequence of
    ``max_model_len`` tokens, as ``(tp, pp)``; ``None`` when no split fits."""
    need = max_model_len if max_model_len is not None else model.max_position
    tp = 1
    while tp * 2 <= hw.max_tensor_parallel and tensor_parallel_problem(model, tp * 2) is None:
        tp *= 2
    for pp in range(2, hw.max_pipeline_parallel + 1):
        if pipeline_parallel_problem(model, pp) is not None:
            break
        if kv_cache_tokens(model, hw, tp, gpu_memory_utilization, pp=pp) >= need:
            return tp, pp
    return None


@dataclass(frozen=True)
class KVReport:
    """The KV-memory arithmetic of one replica, as ``shuniu plan`` prints it."""

    model: str
    hardware: str
    tensor_parallel: int
    weight_precision: str
    kv_precision: str
    memory_bytes: int
    """Device memory of the replica (all devices) times the utilization."""
    weight_bytes: int
    overhead_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    kv_cache_tokens: int
    block_size: int
    kv_blocks: int
    input_tokens: int
    output_tokens: int
    kv_bytes_per_request: int
    """KV bytes of one request at full length (input + output tokens, whole blocks)."""
    max_concurrent_seqs: int
    """Requests at full length the KV cache holds at once (capped by ``max_num_seqs``)."""
    pipeline_parallel: int = 1

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) pairs for a table."""
        gib = GIB
        return [
            ("model", f"{self.model} ({self.weight_precision} weights, {self.kv_precision} KV)"),
            ("hardware", f"{self.devices} x {self.hardware}{self._stages()}"),
            ("usable memory", f"{self.memory_bytes / gib:,.1f} GiB"),
            ("weights", f"{self.weight_bytes / gib:,.2f} GiB"),
            ("activations + runtime", f"{self.overhead_bytes / gib:,.2f} GiB"),
            ("KV cache", f"{self.kv_cache_bytes / gib:,.2f} GiB"),
            ("KV bytes per token", f"{self.kv_bytes_per_token:,} B"),
            ("KV cache tokens", f"{self.kv_cache_tokens:,} ({self.kv_blocks:,} blocks of {self.block_size})"),
            (
                "KV per request",
                f"{self.kv_bytes_per_request / 2**20:,.1f} MiB "
                f"({self.input_tokens:,} in + {self.output_tokens:,} out tokens)",
            ),
            ("max concurrent sequences", f"{self.max_concurrent_seqs:,}"),
        ]

    @property
    def devices(self) -> int:
        """Devices of the replica (tensor parallel x pipeline parallel)."""
        return self.tensor_parallel * self.pipeline_parallel

    def _stages(self) -> str:
        if self.pipeline_parallel == 1:
            return ""
        return f" (TP {self.tensor_parallel} x PP {self.pipeline_parallel})"

    def __str__(self) -> str:
        width = max(len(k) for k, _ in self.rows())
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self.rows())


def kv_report(
    model: ModelProfile,
    hw: HardwareProfile,
    *,
    input_tokens: int,
    output_tokens: int,
    tp: int = 1,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    max_num_seqs: int | None = None,
    overhead_bytes: int | None = None,
    pp: int = 1,
) -> KVReport:
    """The KV arithmetic of one replica for requests of ``input_tokens`` + ``output_tokens``."""
    if overhead_bytes is None:
        overhead_bytes = default_overhead_bytes(model, tp, pp=pp)
    tokens = kv_cache_tokens(model, hw, tp, gpu_memory_utilization, overhead_bytes, pp)
    blocks = tokens // block_size
    per_token = tp * kv_bytes_per_token_per_device(model, tp)
    request_blocks = max(-(-(input_tokens + output_tokens) // block_size), 1)
    concurrent = blocks // request_blocks
    if max_num_seqs is not None:
        concurrent = min(concurrent, max_num_seqs)
    return KVReport(
        model=model.name,
        hardware=hw.name,
        tensor_parallel=tp,
        weight_precision=model.weight_precision,
        kv_precision=model.kv_precision,
        memory_bytes=int(hw.memory_bytes * gpu_memory_utilization * tp * pp),
        weight_bytes=weight_bytes(model),
        overhead_bytes=overhead_bytes,
        kv_cache_bytes=kv_cache_bytes(model, hw, tp, gpu_memory_utilization, overhead_bytes, pp),
        kv_bytes_per_token=per_token,
        kv_cache_tokens=tokens,
        block_size=block_size,
        kv_blocks=blocks,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        kv_bytes_per_request=request_blocks * block_size * per_token,
        max_concurrent_seqs=concurrent,
        pipeline_parallel=pp,
    )


# --------------------------------------------------------------------------- loading

_P = TypeVar("_P", HardwareProfile, ModelProfile)
_KINDS: dict[type[BaseModel], tuple[str, str, str]] = {
    # profile class -> (collection file, directory of single files, word used in messages)
    HardwareProfile: ("hardware.yaml", "hardware", "hardware"),
    ModelProfile: ("models.yaml", "models", "model"),
}


def _user_dirs() -> list[Path]:
    raw = os.environ.get(ENV_PROFILE_PATH, "")
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()]


def _is_path(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or "/" in name or os.sep in name


def _parse(text: str, source: str) -> tuple[Any, dict[tuple[Any, ...], int]]:
    return parse_yaml(text, source, ProfileError)


def _read(path: Path) -> tuple[Any, dict[tuple[Any, ...], int]]:
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise ProfileError([Problem("", f"cannot read file: {exc.strerror or exc}")], str(path)) from None
    return _parse(text, str(path))


@functools.cache
def _shipped(filename: str) -> tuple[Any, dict[tuple[Any, ...], int]]:
    text = resources.files("shuniu.backends.sim.data").joinpath(filename).read_text("utf-8")
    return _parse(text, f"<shipped {filename}>")


def _collection(data: Any, source: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ProfileError([Problem("", "a profile collection must map names to profiles", 1)], source)
    return {str(k).lower(): v for k, v in data.items()}


def _original(data: dict[Any, Any], key: str) -> Any:
    """The key as written in the file (names are matched case-insensitively)."""
    return next(k for k in data if str(k).lower() == key)


def _validate(
    cls: type[_P],
    data: Any,
    name: str,
    prefix: tuple[Any, ...],
    lines: dict[tuple[Any, ...], int],
    source: str,
) -> _P:
    if not isinstance(data, dict):
        line = lines.get(prefix)
        raise ProfileError([Problem(".".join(map(str, prefix)), "a profile must be a mapping", line)], source)
    if prefix:  # in a collection the key is the name
        data = {**data, "name": name}
    else:
        data = {**data, "name": str(data.get("name") or name)}
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(pydantic_problems(exc, prefix, lines, cls), source) from None


def _names(cls: type[BaseModel]) -> list[str]:
    collection, folder, _ = _KINDS[cls]
    names: set[str] = set()
    for d in _user_dirs():
        sub = d / folder
        if sub.is_dir():
            names.update(p.stem.lower() for p in sub.iterdir() if p.suffix in (".yaml", ".yml"))
        if (d / collection).is_file():
            try:
                names.update(_collection(_read(d / collection)[0], str(d / collection)))
            except ProfileError:
                pass  # reported when one of its profiles is loaded
    names.update(_collection(_shipped(collection)[0], collection))
    return sorted(names)


def _load(cls: type[_P], name: str) -> _P:
    collection, folder, word = _KINDS[cls]
    if _is_path(name):
        path = Path(name).expanduser()
        data, lines = _read(path)
        return _validate(cls, data, path.stem.lower(), (), lines, str(path))
    key = name.strip().lower()
    for d in _user_dirs():
        for ext in (".yaml", ".yml"):
            single = d / folder / f"{key}{ext}"
            if single.is_file():
                data, lines = _read(single)
                return _validate(cls, data, key, (), lines, str(single))
        if (d / collection).is_file():
            data, lines = _read(d / collection)
            entries = _collection(data, str(d / collection))
            if key in entries:
                return _validate(cls, entries[key], key, (_original(data, key),), lines, str(d / collection))
    data, lines = _shipped(collection)
    entries = _collection(data, collection)
    if key in entries:
        return _validate(cls, entries[key], key, (_original(data, key),), lines, f"<shipped {collection}>")
    available = ", ".join(_names(cls))
    hint = f" (or a path to a YAML file; more directories via {ENV_PROFILE_PATH})"
    raise ProfileError(
        [Problem(word, f"unknown {word} profile {name!r}; available: {available}{hint}")], name
    )


def list_hardware() -> list[str]:
    """Names of every hardware profile: the user's directories' and the shipped ones."""
    return _names(HardwareProfile)


def list_models() -> list[str]:
    """Names of every model profile: the user's directories' and the shipped ones."""
    return _names(ModelProfile)


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A hardware profile by name (case-insensitive) or from a YAML file's path; raises
    :class:`ProfileError` (a ``ConfigError``) naming the field of a malformed one."""
    return _load(HardwareProfile, name_or_path)


def _split_spec(name: str) -> tuple[str, str | None, str | None]:
    """``name@fp8,kv=fp8`` -> (name, weight precision, KV precision)."""
    base, at, spec = name.rpartition("@")
    if not at or "/" in spec or os.sep in spec:
        return name, None, None
    weight: str | None = None
    kv: str | None = None
    problems = []
    for item in (s.strip().lower() for s in spec.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            key, value = "w", key
        if key in ("kv", "kv_precision"):
            kv = value
        elif key in ("w", "weights", "weight_precision"):
            weight = value
        else:
            problems.append(
                Problem(
                    "",
                    f"cannot read {item!r} in {name!r}: write NAME@WEIGHTS, NAME@kv=KV or NAME@WEIGHTS,kv=KV",
                )
            )
    if problems:
        raise ProfileError(problems, name)
    return base, weight, kv


def load_model(
    name_or_path: str, weight_precision: str | None = None, kv_precision: str | None = None
) -> ModelProfile:
    """A model profile by name (case-insensitive) or from a YAML file's path, with optional
    precision overrides (arguments win over a ``@weights,kv=...`` suffix on the name); raises
    :class:`ProfileError` (a ``ConfigError``) naming the field of a malformed one."""
    base, spec_weight, spec_kv = _split_spec(name_or_path)
    profile = _load(ModelProfile, base)
    weight = (weight_precision or spec_weight or "").lower() or None
    kv = (kv_precision or spec_kv or "").lower() or None
    problems = []
    if weight is not None and weight not in WEIGHT_PRECISIONS:
        problems.append(
            Problem(
                "weight_precision",
                f"unknown precision {weight!r}; expected one of: {', '.join(WEIGHT_PRECISIONS)}",
            )
        )
    if kv is not None and kv not in KV_PRECISIONS:
        problems.append(
            Problem("kv_precision", f"unknown precision {kv!r}; expected one of: {', '.join(KV_PRECISIONS)}")
        )
    if problems:
        raise ProfileError(problems, name_or_path)
    update: dict[str, str] = {}
    if weight is not None:
        update["weight_precision"] = weight
    if kv is not None:
        update["kv_precision"] = kv
    return profile.model_copy(update=update) if update else profile
