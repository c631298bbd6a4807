"""Which splits of a replica a plan tries, as ``(tensor parallel, pipeline parallel)``: the
smallest tensor-parallel size that holds the weights with KV room for one full-length
sequence and the next powers of two that fit (or the one pinned); for a model that fits no
node, a whole node per stage and the fewest pipeline stages that hold it."""

from __future__ import annotations

from shuniu.backends.sim import (
    GIB,
    HardwareProfile,
    ModelProfile,
    kv_cache_tokens,
    min_tensor_parallel,
    pipeline_split,
    tensor_parallel_problem,
    weight_bytes,
)
from shuniu.core.errors import Problem
from shuniu.plugins.tools.plan.results import PlanError

__all__ = ["EXTRA_TP_SIZES", "Split", "tp_candidates"]

Split = tuple[int, int]
"""A replica's devices as ``(tensor_parallel, pipeline_parallel)``."""

EXTRA_TP_SIZES = 2
"""Powers of two tried above the smallest TP size that fits."""


def _fits(
    model: ModelProfile, hw: HardwareProfile, tp: int, util: float, need: int, pp: int = 1
) -> str | None:
    """Why ``tp`` x ``pp`` devices cannot hold a replica, or None."""
    problem = tensor_parallel_problem(model, tp)
    if problem is not None:
        return problem
    if tp > hw.max_tensor_parallel:
        return f"{hw.name} allows at most {hw.max_tensor_parallel} devices per tensor-parallel group"
    if pp > hw.max_pipeline_parallel:
        return f"{hw.name} allows at most {hw.max_pipeline_parallel} pipeline stages"
    room = kv_cache_tokens(model, hw, tp, util, pp=pp)
    if room < need:
        return (
            f"{tp * pp} x {hw.name} leave room for {room:,} KV tokens, less than one {need:,}-token "
            f"sequence ({weight_bytes(model) / GIB:,.1f} GiB of weights on "
            f"{tp * pp * hw.memory_gib * util:,.1f} GiB usable)"
        )
    return None


def tp_candidates(
    model: ModelProfile,
    hw: HardwareProfile,
    util: float,
    max_model_len: int | None,
    pinned: int | None,
    pinned_pp: int | None = None,
) -> list[Split]:
    """The splits a plan tries for ``model`` at its precisions; :class:`PlanError` naming the
    option (or the model) when none holds it."""
    need = max_model_len if max_model_len is not None else model.max_position
    if pinned is not None or pinned_pp is not None:
        split = _pinned(model, hw, util, max_model_len, pinned, pinned_pp)
        why = _fits(model, hw, split[0], util, need, split[1])
        if why is not None:
            option = "--pipeline-parallel-size" if pinned_pp is not None else "--tensor-parallel-size"
            raise PlanError([Problem(option, why)], "options")
        return [split]
    smallest = min_tensor_parallel(model, hw, util, max_model_len)
    if smallest is None:
        staged = pipeline_split(model, hw, util, max_model_len)
        if staged is not None:
            return [staged]
        message = (
            f"{model.name} ({weight_bytes(model) / GIB:,.1f} GiB of {model.weight_precision} weights) does "
            f"not fit on up to {hw.max_pipeline_parallel} nodes of {hw.max_tensor_parallel} x {hw.name} "
            f"({hw.memory_gib:g} GiB each, {util:.0%} usable) with KV room for one {need:,}-token "
            f"sequence; try a smaller weight precision (e.g. {model.name}@fp8 or @int4-awq), a smaller "
            "--max-model-len, or other hardware"
        )
        raise PlanError([Problem("--model", message)], "options")
    sizes = [(smallest, 1)]
    tp = smallest * 2
    while len(sizes) <= EXTRA_TP_SIZES and tp <= hw.max_tensor_parallel:
        if _fits(model, hw, tp, util, need) is None:
            sizes.append((tp, 1))
        tp *= 2
    return sizes


def _pinned(
    model: ModelProfile,
    hw: HardwareProfile,
    util: float,
    max_model_len: int | None,
    tp: int | None,
    pp: int | None,
) -> Split:
    """The split the user pinned; a pinned stage count without a TP size takes the smallest
    TP size that holds the model over that many stages (else a whole node, which
    :func:`_fits` then explains)."""
    if tp is not None:
        return tp, pp or 1
    assert pp is not None
    return min_tensor_parallel(model, hw, util, max_model_len, pp) or hw.max_tensor_parallel, pp
