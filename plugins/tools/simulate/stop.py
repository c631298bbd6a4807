"""When a simulation may stop early: its verdict against an SLO is already settled.

A run that misses its SLO by far is the slowest kind to simulate to the end (queues grow,
every iteration is full), and a search (``shuniu plan``) only needs to know *that* it misses.
Each rule counts events that can only grow — requests slower than a TTFT, inter-token gaps
longer than an ITL, requests that missed their own thresholds — against how many the whole
run may have and still meet the target; past that, no later request can bring the p99 (or
the goodput share) back. The allowances come from the expected number of requests and tokens
over the horizon, so a run that brings more than expected could in principle have met:
:func:`stop_allowance` keeps a margin for that.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shuniu.backends.sim import LogHistogram

if TYPE_CHECKING:
    from shuniu.plugins.tools.simulate.results import SimulationResult

__all__ = ["MARGIN", "StopRule", "stop_allowance"]

MARGIN = 1.1
"""Expected counts are raised by this factor before the allowed share is taken of them (a run
may bring somewhat more requests or tokens than its mean rate says)."""


def stop_allowance(share: float, expected: float) -> int:
    """How many events above a target a run of ``expected`` events may have while ``share``
    of them may be above it (1% for a p99), with :data:`MARGIN`; at least 1."""
    return max(1, math.floor(share * expected * MARGIN))


@dataclass(frozen=True)
class StopRule:
    """Stop a run once any of its set limits is passed (``None``: that limit is not watched).
    Checked every 64 arrivals; the requests still running are left unfinished."""

    ttft_s: float | None = None
    """A time to first token ..."""
    ttft_most: int = 0
    """... more requests than this may take longer than."""
    itl_s: float | None = None
    """An inter-token gap (engine-side, every token of every request) ..."""
    itl_most: int = 0
    """... more gaps than this may be longer than."""
    missed_most: int | None = None
    """More completed requests than this may miss their own SLO thresholds (the goodput)."""

    def settled(self, result: SimulationResult, itl: Iterable[LogHistogram]) -> str | None:
        """Why the run's verdict is settled (``None``: not yet); ``itl``: the engines'
        inter-token-latency histograms."""
        if self.ttft_s is not None:
            slow = result.ttft.count - result.ttft.count_le(self.ttft_s)
            if slow > self.ttft_most:
                return f"over {self.ttft_most:,} requests above TTFT {_secs(self.ttft_s)}"
        if self.itl_s is not None:
            slow = sum(h.count - h.count_le(self.itl_s) for h in itl)
            if slow > self.itl_most:
                return f"over {self.itl_most:,} inter-token gaps above {_secs(self.itl_s)}"
        if self.missed_most is not None:
            missed = result.requests_completed - result.met_slo
            if missed > self.missed_most:
                return f"over {self.missed_most:,} requests missed their SLO thresholds"
        return None


def _secs(s: float) -> str:
    return f"{s * 1000:.3g} ms" if s < 1 else f"{s:.3g} s"
