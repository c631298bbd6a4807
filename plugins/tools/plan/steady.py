"""How long a workload takes to reach its steady load, so that a plan's short trials are not
judged on a warm-up. Multi-turn chat is the usual case: every conversation resends its growing
history, so the token load rises until the first conversations have run their course."""

from __future__ import annotations

from shuniu.core.traffic import Workload

__all__ = ["SETTLED", "warmup_s"]

SETTLED = 0.9
"""A workload is warm once its offered token load stays at this share of its final level."""


def warmup_s(workload: Workload, duration: float, seed: int = 0) -> float:
    """Simulated seconds until the offered load (prompt plus output tokens arriving per
    second) first reaches :data:`SETTLED` of its level over the last third of ``duration``,
    averaged over three windows; 0 for a load that does not grow. Computed from the workload's
    own requests (without building prompts), so it sees what a run will see."""
    window = max(duration / 60, 2.0)
    count = int(duration // window)
    if count < 6:
        return 0.0
    load = [0.0] * count
    for req in workload.requests(seed=seed, duration=count * window, prompts=False):
        slot = int(req.arrival // window)
        if slot < count:
            load[slot] += req.prompt_tokens + req.output_tokens
    tail = load[count - count // 3 :]
    level = sum(tail) / len(tail)
    if level <= 0:
        return 0.0
    for i in range(count - 2):
        if sum(load[i : i + 3]) / 3 >= SETTLED * level:
            return i * window
    return (count - count // 3) * window
