"""What a workload amounts to, without generating it: expected request rate, mean lengths and
prefix groups, per stream and in total."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shuniu.core.traffic.distributions import moments
from shuniu.core.traffic.streams import ChatStream, PlainStream, TraceStream
from shuniu.core.traffic.trace import scan_trace
from shuniu.core.traffic.workload import Workload

__all__ = ["describe"]


def _stream_summary(stream: Any, name: str, duration: float, base_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "type": stream.type}
    system_mean, groups = 0.0, 0
    if not isinstance(stream, TraceStream) and stream.system_prompts is not None:
        system_mean = moments(stream.system_prompts.tokens, True)[0]
        groups = stream.system_prompts.count
    if isinstance(stream, PlainStream):
        rate = stream.arrival.mean_rate(duration)
        if stream.classes is None:
            assert stream.input_tokens is not None and stream.output_tokens is not None
            mean_in = moments(stream.input_tokens, True)[0]
            mean_out = moments(stream.output_tokens, True)[0]
        else:
            total = sum(c.weight for c in stream.classes)
            mean_in = sum(c.weight * moments(c.input_tokens, True)[0] for c in stream.classes) / total
            mean_out = sum(c.weight * moments(c.output_tokens, True)[0] for c in stream.classes) / total
            out["classes"] = {c.name: round(c.weight / total, 4) for c in stream.classes}
        mean_in += system_mean
    elif isinstance(stream, ChatStream):
        conversations = stream.arrival.mean_rate(duration)
        t1, t2 = moments(stream.turns, True)
        user = moments(stream.user_tokens, True)[0]
        mean_out = moments(stream.output_tokens, True)[0]
        # Turn j (from 0) carries j earlier exchanges: E[sum_j j] / E[T] = E[T(T-1)] / (2 E[T]).
        mean_in = system_mean + user + (user + mean_out) * (t2 - t1) / (2 * t1)
        rate = conversations * t1
        out["conversation_rate"] = conversations
        out["mean_turns"] = t1
        out["users"] = stream.users
    else:
        stats = scan_trace(base_dir / stream.path)
        count = max(stats.count, 1)
        rate = stats.count / (stats.period if stream.loop else max(stats.last_arrival, 1e-9))
        rate *= stream.rate_multiplier
        if not stream.loop:
            rate = min(rate, stats.count / duration)
        mean_in, mean_out, groups = stats.prompt_tokens / count, stats.output_tokens / count, stats.groups
    out.update(
        request_rate=rate,
        mean_input_tokens=mean_in,
        mean_output_tokens=mean_out,
        prefix_groups=groups,
    )
    return out


def describe(workload: Workload, duration: float | None = None) -> dict[str, Any]:
    """Expected request rate (averaged over the run for schedules), mean input and output
    tokens and the number of prefix groups, per stream and in total. Chat streams are given in
    steady state: rate = conversation rate x mean turns (the first conversations take a
    while to build up, and conversations still going at the end are cut), input = the mean
    over turns of the growing prompt, ignoring ``max_prompt_tokens`` cut-offs. Traces are
    summarized from the file."""
    d = workload.duration_s if duration is None else duration
    streams = [
        _stream_summary(s, name, d, workload.base_dir)
        for s, name in zip(workload.streams, workload.stream_names, strict=True)
    ]
    rate = sum(s["request_rate"] for s in streams)
    weight = rate or 1.0
    return {
        "name": workload.name,
        "duration_s": d,
        "request_rate": rate,
        "expected_requests": rate * d,
        "mean_input_tokens": sum(s["request_rate"] * s["mean_input_tokens"] for s in streams) / weight,
        "mean_output_tokens": sum(s["request_rate"] * s["mean_output_tokens"] for s in streams) / weight,
        "prefix_groups": sum(s["prefix_groups"] for s in streams),
        "slo": workload.slo.model_dump(exclude_none=True) if workload.slo is not None else None,
        "streams": streams,
    }
