"""Options of the ``sim`` backend."""

from __future__ import annotations

from pydantic import Field, model_validator

from shuniu.core.config import Options

__all__ = ["SimOptions"]


class SimOptions(Options):
    ttft_ms: float = Field(30.0, ge=0)
    """Fixed time before the first token (queueing in the engine not included)."""
    prefill_tokens_per_s: float = Field(20000.0, ge=0)
    """Prompt tokens processed per second; adds prompt/rate to the first-token time. 0 = free."""
    tokens_per_s: float = Field(60.0, ge=0)
    """Decode speed of one request in tokens per second. 0 = as fast as possible."""
    max_num_seqs: int = Field(256, ge=1)
    """Requests the engine runs at once; more wait inside the engine (reported as waiting)."""
    max_model_len: int = Field(8192, ge=16)
    """Context window in tokens."""
    output_tokens_min: int = Field(16, ge=1)
    """Shortest natural answer (when ``max_tokens`` does not stop it first)."""
    output_tokens_max: int = Field(256, ge=1)
    """Longest natural answer."""

    @model_validator(mode="after")
    def _range(self) -> SimOptions:
        if self.output_tokens_min > self.output_tokens_max:
            raise ValueError("output_tokens_min must not exceed output_tokens_max")
        return self
