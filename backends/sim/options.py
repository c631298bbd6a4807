"""Options of the ``sim`` backend."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from shuniu.backends.sim.faults import FaultOptions
from shuniu.core.config import Options

__all__ = ["SimOptions"]


class SimOptions(Options):
    hardware: str | None = None
    """Hardware profile (``h200``, ``h100-sxm``, ``a100-80gb``, ``l40s``, ``rtx-4090``,
    ``ascend-910b``, ``ascend-910b-eager``, ``cpu``, ... or a path to a profile YAML). With
    ``model``, iteration times come from the roofline cost model and the KV cache is sized
    from device memory."""
    model: str | None = None
    """Model profile (``qwen2.5-7b``, ``llama-3.1-8b``, ... or a path to a profile YAML)."""
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    """Devices one replica spans (weights and KV split across them); with
    ``pipeline_parallel_size``, the devices of each stage."""
    pipeline_parallel_size: int = Field(1, ge=1, le=16)
    """Pipeline stages one replica spans, each a node of ``tensor_parallel_size`` devices
    (the layers split across them; vLLM's ``--pipeline-parallel-size``), for a model that
    does not fit one node."""
    weight_precision: str | None = None
    """Override the model profile's weight precision (``bf16``, ``fp8``, ``int8``, ``int4-awq``, ...)."""
    kv_precision: str | None = None
    """Override the KV-cache precision (``bf16``, ``fp16``, ``fp8`` or ``fp32``)."""
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    """Share of device memory the engine may use (vLLM's knob of the same name)."""
    ttft_ms: float | None = Field(None, ge=0)
    """Fixed extra delay before a request reaches the engine (network, tokenizer). Default:
    30 ms with fixed-rate timing, the hardware profile's ``frontend_ms`` with profiles."""
    prefill_tokens_per_s: float = Field(20000.0, ge=0)
    """Fixed-rate timing (no profiles): prompt tokens per second. 0 = free."""
    tokens_per_s: float = Field(60.0, ge=0)
    """Fixed-rate timing (no profiles): iterations per second, so each running request decodes
    this many tokens per second whatever the batch size. 0 = as fast as possible."""
    kv_cache_tokens: int | None = Field(None, ge=16)
    """KV-cache capacity in tokens. Default: from the profiles' memory arithmetic, or 262144
    with fixed-rate timing."""
    block_size: int = Field(16, ge=1, le=1024)
    """Tokens per KV block (prefix caching works on full blocks)."""
    max_num_seqs: int = Field(256, ge=1)
    """Sequences the engine runs at once; more wait inside the engine (reported as waiting)."""
    max_num_batched_tokens: int = Field(8192, ge=1)
    """Token budget of one iteration, shared by decodes and prefill chunks."""
    enable_chunked_prefill: bool = True
    """Split long prompts over several iterations instead of waiting for a whole budget."""
    prefill_first: bool = False
    """vLLM's V0 scheduling (the V0 engine without chunked prefill; vllm-ascend up to about
    v0.8): an iteration either prefills waiting requests, first whenever one can start, or
    decodes the running ones, never both. Arrivals then keep a short TTFT and stall every
    running sequence's next token instead (TPOT grows with the arrival rate). Needs
    ``enable_chunked_prefill: false``."""
    enable_prefix_caching: bool = True
    """Reuse the KV blocks of prompts that share a prefix."""
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    """Order of the engine's waiting queue; ``priority`` also picks preemption victims by it."""
    max_model_len: int | None = Field(None, ge=16)
    """Context window in tokens. Default: the model's, else 8192."""
    output_tokens_min: int = Field(16, ge=1)
    """Shortest natural answer (when ``max_tokens`` does not stop it first)."""
    output_tokens_max: int = Field(256, ge=1)
    """Longest natural answer."""
    embedding_dim: int = Field(384, ge=1, le=16384)
    """Size of the vectors the simulated engine returns for embeddings (``dimensions`` may
    ask for fewer, as of a Matryoshka model)."""
    faults: FaultOptions | None = None
    """Injected faults (errors, latency spikes, crashes, hangs), for resilience testing."""
    prefill_engines: int = Field(0, ge=0, le=64)
    """A prefill/decode split (disaggregated serving): the endpoint is a unit of this many
    prefill engines and ``decode_engines`` decode engines, each configured by the options
    above. A request is prefilled on one prefill engine (the one holding the longest cached
    prefix, then the least loaded), its KV cache sent over the link, and decoded on the least
    loaded decode engine. 0: one engine, no split."""
    decode_engines: int = Field(0, ge=0, le=64)
    """Decode engines of a prefill/decode split (with ``prefill_engines``)."""
    kv_transfer_gb_s: float | None = Field(None, gt=0)
    """Bandwidth of a prefill/decode split's KV transfer, decimal GB/s. Default: every device
    of a prefill engine sends its share over its own node link (the hardware profile's
    ``node_link_gb_s`` x the engine's devices), each transfer also paying its
    ``node_link_latency_us``."""

    @model_validator(mode="after")
    def _check(self) -> SimOptions:
        if self.output_tokens_min > self.output_tokens_max:
            raise ValueError("output_tokens_min must not exceed output_tokens_max")
        if (self.hardware is None) != (self.model is None):
            raise ValueError("give both `hardware` and `model` profiles, or neither")
        if self.prefill_first and self.enable_chunked_prefill:
            raise ValueError("prefill_first (V0 scheduling) needs enable_chunked_prefill: false")
        if (self.prefill_engines == 0) != (self.decode_engines == 0):
            raise ValueError("a prefill/decode split needs both `prefill_engines` and `decode_engines`")
        if self.hardware is not None:
            from shuniu.backends.sim.build import resolve_profiles

            resolve_profiles(self)  # unknown profile, bad TP size, or no room: a config error here
        return self
