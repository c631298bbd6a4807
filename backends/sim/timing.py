"""Fixed-rate iteration timing, for a simulator without hardware and model profiles."""

from __future__ import annotations

__all__ = ["FixedRateCost"]


class FixedRateCost:
    """Each iteration takes ``1 / tokens_per_s`` plus ``prefill_tokens / prefill_tokens_per_s``:
    every running request decodes at ``tokens_per_s`` whatever the batch size."""

    __slots__ = ("_prefill", "_step")

    def __init__(self, tokens_per_s: float, prefill_tokens_per_s: float) -> None:
        self._step = 1.0 / tokens_per_s if tokens_per_s > 0 else 0.0
        self._prefill = 1.0 / prefill_tokens_per_s if prefill_tokens_per_s > 0 else 0.0

    def step_time(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        decode_seqs: int,
        decode_kv_tokens: int,
        new_seqs: int = 0,
    ) -> float:
        if not prefill_tokens and not decode_seqs:
            return 0.0
        return self._step + prefill_tokens * self._prefill
