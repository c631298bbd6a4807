"""Building a simulated engine from ``sim`` options: profiles → cost model and KV size."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shuniu.backends.sim.disagg import DisaggregatedEngine
from shuniu.backends.sim.engine import CostFunction, EngineConfig, EngineCore, SimEngine
from shuniu.backends.sim.options import SimOptions
from shuniu.backends.sim.timing import FixedRateCost

__all__ = ["EngineSetup", "build_engine"]

DEFAULT_KV_TOKENS = 262144
DEFAULT_MAX_MODEL_LEN = 8192


@dataclass
class EngineSetup:
    engine: SimEngine | DisaggregatedEngine
    max_model_len: int
    description: str


def resolve_profiles(options: SimOptions) -> tuple[Any, Any, int]:
    """The model and hardware profiles the options name, and the KV-cache size in tokens;
    ``ValueError`` with a plain message when they are unknown or the model does not fit."""
    from shuniu.backends.sim.costmodel import CostModel
    from shuniu.backends.sim.profiles import (
        default_overhead_bytes,
        kv_cache_tokens,
        load_hardware,
        load_model,
    )
    from shuniu.core.errors import ConfigError

    assert options.hardware is not None and options.model is not None
    try:
        hw = load_hardware(options.hardware)
        model = load_model(
            options.model, weight_precision=options.weight_precision, kv_precision=options.kv_precision
        )
    except ConfigError as exc:
        raise ValueError("; ".join(str(p) for p in exc.problems)) from None
    tp = options.tensor_parallel_size
    pp = options.pipeline_parallel_size
    CostModel(model, hw, tp, pp)  # raises ValueError for a split the model or hardware cannot use
    overhead = default_overhead_bytes(model, tp, options.max_num_batched_tokens, options.max_num_seqs, pp)
    kv_tokens = options.kv_cache_tokens or kv_cache_tokens(
        model,
        hw,
        tp=tp,
        gpu_memory_utilization=options.gpu_memory_utilization,
        overhead_bytes=overhead,
        pp=pp,
    )
    if kv_tokens < options.block_size:
        raise ValueError(
            f"{model.name} does not fit on {tp * pp} x {hw.name} with room for a KV cache "
            "(use a larger tensor_parallel_size or pipeline_parallel_size, or a smaller weight precision)"
        )
    return model, hw, kv_tokens


def build_engine(options: SimOptions, max_model_len: int | None = None, seed: int = 0) -> EngineSetup:
    """An engine as the options describe it; ``max_model_len`` is the deployment's value,
    used when the options give none; ``seed`` starts the engine's random stream (step jitter)."""
    cost: CostFunction
    if options.hardware is not None and options.model is not None:
        from shuniu.backends.sim.costmodel import CostModel

        model, hw, kv_tokens = resolve_profiles(options)
        tp = options.tensor_parallel_size
        pp = options.pipeline_parallel_size
        cost = CostModel(model, hw, tp, pp)
        limit = options.max_model_len or max_model_len or model.max_position
        delay = (hw.frontend_ms if options.ttft_ms is None else options.ttft_ms) / 1000
        description = f"{model.name} on {tp * pp}x {hw.name}" + (f" (TP {tp} x PP {pp})" if pp > 1 else "")
        transfer = _transfer(options, model, hw)
    else:
        cost = FixedRateCost(options.tokens_per_s, options.prefill_tokens_per_s)
        kv_tokens = options.kv_cache_tokens or DEFAULT_KV_TOKENS
        limit = options.max_model_len or max_model_len or DEFAULT_MAX_MODEL_LEN
        delay = (30.0 if options.ttft_ms is None else options.ttft_ms) / 1000
        description = f"fixed-rate, {options.tokens_per_s:g} tokens/s per request"
        transfer = _free  # fixed-rate timing knows no bytes per token
    if not options.enable_chunked_prefill and options.max_num_batched_tokens < limit:
        # vLLM refuses this too: a prompt longer than one iteration's budget could never start.
        raise ValueError(
            f"without chunked prefill, max_num_batched_tokens ({options.max_num_batched_tokens}) "
            f"must be at least max_model_len ({limit})"
        )
    config = EngineConfig(
        num_blocks=max(kv_tokens // options.block_size, 1),
        block_size=options.block_size,
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens,
        chunked_prefill=options.enable_chunked_prefill,
        prefix_caching=options.enable_prefix_caching,
        priority=options.scheduling_policy == "priority",
        prefill_first=options.prefill_first,
    )
    if not options.prefill_engines:
        engine = SimEngine(EngineCore(config), cost, admission_delay=delay, seed=seed)
        return EngineSetup(engine, limit, description)
    # A prefill/decode split: its engines, each seeded on its own (independent jitter). The
    # front end runs once, at the unit's intake (the prefill engines); a decode engine takes
    # the request from the unit's hand-off, not from a client. (A deployment where each
    # engine is a server of its own pays a second front end there: give it in ttft_ms.)
    n_prefill = options.prefill_engines
    engines = [
        SimEngine(
            EngineCore(config), cost, admission_delay=delay if i < n_prefill else 0.0, seed=seed + 1 + i
        )
        for i in range(n_prefill + options.decode_engines)
    ]
    unit = DisaggregatedEngine(
        engines[: options.prefill_engines], engines[options.prefill_engines :], transfer
    )
    description += f", {options.prefill_engines} prefill + {options.decode_engines} decode engines"
    return EngineSetup(unit, limit, description)


def _transfer(options: SimOptions, model: Any, hw: Any) -> Callable[[int], float]:
    """Seconds a prompt's KV of ``n`` tokens takes from a prefill engine to a decode engine of
    ``model`` on ``hw``: its bytes over the link (``kv_transfer_gb_s``, else every device's
    node link), plus the link's latency."""
    from shuniu.backends.sim.profiles import kv_bytes_per_token_per_device

    tp = options.tensor_parallel_size
    devices = tp * options.pipeline_parallel_size
    per_token = tp * kv_bytes_per_token_per_device(model, tp)  # the whole replica's KV
    gb_s = options.kv_transfer_gb_s or hw.node_link_gb_s * devices
    seconds_per_token = per_token / (gb_s * 1e9)
    latency = hw.node_link_latency_us * 1e-6

    def transfer(tokens: int) -> float:
        return latency + tokens * seconds_per_token

    return transfer


def _free(tokens: int) -> float:
    return 0.0
