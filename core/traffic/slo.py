"""The service-level objective a workload is judged by: p99 targets for a run, per-request
thresholds for goodput."""

from __future__ import annotations

from pydantic import Field

from shuniu.core.config import Options

__all__ = ["Slo"]


class Slo(Options):
    """Service-level objective. The ``*_p99_s`` targets judge a whole run; the per-request
    thresholds decide whether one request counts toward goodput (a request meets the SLO when
    its TTFT, mean inter-token latency and end-to-end latency are all within the thresholds
    given). A per-request threshold left out defaults to the matching p99 target."""

    ttft_p99_s: float | None = Field(None, gt=0)
    """Target for the 99th percentile of time to first token."""
    itl_p99_s: float | None = Field(None, gt=0)
    """Target for the 99th percentile of inter-token latency."""
    e2e_p99_s: float | None = Field(None, gt=0)
    """Target for the 99th percentile of end-to-end latency."""
    ttft_s: float | None = Field(None, gt=0)
    """Per-request TTFT threshold for goodput (default: ``ttft_p99_s``)."""
    itl_s: float | None = Field(None, gt=0)
    """Per-request threshold on the request's mean inter-token latency (TPOT) for goodput
    (default: ``itl_p99_s``)."""
    e2e_s: float | None = Field(None, gt=0)
    """Per-request end-to-end threshold for goodput (default: ``e2e_p99_s``)."""

    @property
    def request_thresholds(self) -> tuple[float | None, float | None, float | None]:
        """(TTFT, ITL, E2E) thresholds a single request is judged by."""
        return (
            self.ttft_s if self.ttft_s is not None else self.ttft_p99_s,
            self.itl_s if self.itl_s is not None else self.itl_p99_s,
            self.e2e_s if self.e2e_s is not None else self.e2e_p99_s,
        )

    def meets(self, ttft: float, itl: float | None = None, e2e: float | None = None) -> bool:
        """Whether one request meets the SLO; ``itl`` is its mean inter-token latency (None
        for a single-token answer), ``e2e`` its end-to-end latency."""
        t, i, e = self.request_thresholds
        if t is not None and ttft > t:
            return False
        if i is not None and itl is not None and itl > i:
            return False
        return not (e is not None and e2e is not None and e2e > e)

    def satisfied(
        self, ttft_p99: float | None = None, itl_p99: float | None = None, e2e_p99: float | None = None
    ) -> bool:
        """Whether a run's p99s meet every p99 target set (a target with no value given fails)."""
        for target, value in (
            (self.ttft_p99_s, ttft_p99),
            (self.itl_p99_s, itl_p99),
            (self.e2e_p99_s, e2e_p99),
        ):
            if target is not None and (value is None or value > target):
                return False
        return True
