"""The roofline starting guess of the replica search: the replica-equivalents of work a
workload brings at one tensor-parallel size (optimistic: queueing is ignored)."""

from __future__ import annotations

from typing import Any

from shuniu.core.traffic import Workload

__all__ = ["PREFILL_CHUNK", "fresh_tokens_rate", "replica_work"]

PREFILL_CHUNK = 2048
"""Prompt tokens per iteration used to price prefill in the starting guess."""


def _dist_mean(dist: Any) -> float:
    """Mean of a workload distribution (clamping ignored: a rough figure for the estimate)."""
    if dist is None:
        return 0.0
    if getattr(dist, "dist", None) == "fixed":
        return float(dist.value)
    if getattr(dist, "dist", None) == "uniform":
        return (dist.min + dist.max) / 2
    return float(getattr(dist, "mean", 0.0))


def fresh_tokens_rate(workload: Workload, desc: dict[str, Any]) -> float:
    """Prompt tokens per second a prefix cache would not hold, roughly: shared system prompts
    and conversation history are taken as cached."""
    total = 0.0
    for stream, s in zip(workload.streams, desc["streams"], strict=True):
        mean_in = s["mean_input_tokens"]
        if s["type"] == "chat":
            fresh = _dist_mean(stream.user_tokens)
        elif s["type"] == "trace":
            fresh = mean_in if not s["prefix_groups"] else mean_in / 2
        else:
            system = stream.system_prompts
            fresh = mean_in - (_dist_mean(system.tokens) if system is not None else 0.0)
        total += s["request_rate"] * max(fresh, 1.0)
    return total


def replica_work(
    cm: Any,
    desc: dict[str, Any],
    fresh_rate: float,
    kv_tokens: int,
    max_num_seqs: int,
    itl_target: float | None,
) -> tuple[float, float]:
    """Replica-equivalents of work the workload brings at this TP size, as (decode, prefill):
    decode at the largest batch whose iteration fits the ITL target and the KV cache, and
    prefill of the fresh prompt tokens (a replica takes both; the engines of a prefill/decode
    split take one each). Queueing is ignored, so this is optimistic."""
    rate = desc["request_rate"]
    if rate <= 0:
        return 0.0, 0.0
    mean_in, mean_out = desc["mean_input_tokens"], desc["mean_output_tokens"]
    ctx = max(1, round(mean_in + mean_out / 2))
    bmax = max(1, min(max_num_seqs, int(kv_tokens // max(1.0, mean_in + mean_out))))
    batch = bmax
    if itl_target is not None and cm.decode_time(bmax, ctx) > itl_target:
        lo, hi = 1, bmax  # largest batch whose decode iteration fits the target
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cm.decode_time(mid, ctx) <= itl_target:
                lo = mid
            else:
                hi = mid - 1
        batch = lo
    decode = rate * mean_out * cm.decode_time(batch, ctx) / batch
    prefill = fresh_rate * cm.prefill_time(PREFILL_CHUNK) / PREFILL_CHUNK
    return decode, prefill
