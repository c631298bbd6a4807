"""Which tensor-parallel sizes a plan tries: the smallest that holds the weights with KV room
for one full-length sequence, and the next powers of two that fit (or the one pinned)."""

from __future__ import annotations

from shuniu.backends.sim import (
    GIB,
    HardwareProfile,
    ModelProfile,
    kv_cache_tokens,
    min_tensor_parallel,
    tensor_parallel_problem,
    weight_bytes,
)
from shuniu.core.errors import Problem
from shuniu.plugins.tools.plan.results import PlanError

__all__ = ["EXTRA_TP_SIZES", "tp_candidates"]

EXTRA_TP_SIZES = 2
"""Powers of two tried above the smallest TP size that fits."""


def _fits(model: ModelProfile, hw: HardwareProfile, tp: int, util: float, need: int) -> str | None:
    """Why ``tp`` devices cannot hold a replica, or None."""
    problem = tensor_parallel_problem(model, tp)
    if problem is not None:
        return problem
    if tp > hw.max_tensor_parallel:
        return f"{hw.name} allows at most {hw.max_tensor_parallel} devices per replica"
    room = kv_cache_tokens(model, hw, tp, util)
    if room < need:
        return (
            f"{tp} x {hw.name} leave room for {room:,} KV tokens, less than one {need:,}-token "
            f"sequence ({weight_bytes(model) / GIB:,.1f} GiB of weights on "
            f"{tp * hw.memory_gib * util:,.1f} GiB usable)"
        )
    return None


def tp_candidates(
    model: ModelProfile, hw: HardwareProfile, util: float, max_model_len: int | None, pinned: int | None
) -> list[int]:
    need = max_model_len if max_model_len is not None else model.max_position
    if pinned is not None:
        why = _fits(model, hw, pinned, util, need)
        if why is not None:
            raise PlanError([Problem("--tensor-parallel-size", why)], "options")
        return [pinned]
    smallest = min_tensor_parallel(model, hw, util, max_model_len)
    if smallest is None:
        message = (
            f"{model.name} ({weight_bytes(model) / GIB:,.1f} GiB of {model.weight_precision} weights) does "
            f"not fit on up to {hw.max_tensor_parallel} x {hw.name} ({hw.memory_gib:g} GiB each, "
            f"{util:.0%} usable) with KV room for one {need:,}-token sequence; try a smaller "
            f"weight precision (e.g. {model.name}@fp8 or @int4-awq), a smaller --max-model-len, "
            "or other hardware"
        )
        raise PlanError([Problem("--model", message)], "options")
    sizes = [smallest]
    tp = smallest * 2
    while len(sizes) <= EXTRA_TP_SIZES and tp <= hw.max_tensor_parallel:
        if _fits(model, hw, tp, util, need) is None:
            sizes.append(tp)
        tp *= 2
    return sizes
