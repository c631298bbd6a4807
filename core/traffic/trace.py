"""Trace files: the JSONL format (:class:`TraceLine`), a streaming check and summary of a
file (:func:`scan_trace`, cached by path, modification time and size) and its replay."""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from shuniu.core.errors import Problem
from shuniu.core.traffic.errors import WorkloadError
from shuniu.core.traffic.request import SimRequest
from shuniu.core.traffic.streams import TraceStream
from shuniu.core.traffic.synthetic import stable_seed, synthetic_ids

__all__ = ["TraceLine", "TraceStats", "scan_trace", "trace_requests"]


class TraceLine(msgspec.Struct, forbid_unknown_fields=True):
    """One line of a JSONL trace."""

    arrival: Annotated[float, msgspec.Meta(ge=0)]
    prompt_tokens: Annotated[int, msgspec.Meta(ge=1)]
    output_tokens: Annotated[int, msgspec.Meta(ge=1)]
    prefix_group: str | None = None
    prefix_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    tenant: str | None = None
    tier: str | None = None
    priority: int | None = None
    session: str | None = None
    api: Literal["chat", "completions"] | None = None


_decode_line = msgspec.json.Decoder(TraceLine).decode


class TraceStats(msgspec.Struct):
    """What a pass over a trace file found: its requests, token totals, prefix groups, problems."""

    count: int = 0
    last_arrival: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    groups: int = 0
    problems: list[str] = msgspec.field(default_factory=list)

    @property
    def period(self) -> float:
        """Replay period of a looped trace: its span plus one mean gap."""
        if self.count <= 1:
            return max(self.last_arrival, 1.0)
        return self.last_arrival * self.count / (self.count - 1)


def _check_line(line: TraceLine) -> str | None:
    if line.prefix_group is not None and line.prefix_tokens is None:
        return "`prefix_group` needs `prefix_tokens`"
    if line.prefix_tokens is not None:
        if line.prefix_group is None:
            return "`prefix_tokens` needs `prefix_group`"
        if line.prefix_tokens > line.prompt_tokens:
            return f"`prefix_tokens` ({line.prefix_tokens}) exceeds `prompt_tokens` ({line.prompt_tokens})"
    return None


def scan_trace(path: Path, max_problems: int = 20) -> TraceStats:
    """Validate a trace file in one streaming pass and summarize it."""
    key = path.resolve()
    try:
        stat = key.stat()
    except OSError as exc:
        return TraceStats(problems=[f"cannot read trace file {str(path)!r}: {exc.strerror}"])
    return _scan_cached(key, stat.st_mtime_ns, stat.st_size, max_problems)


@lru_cache(maxsize=32)
def _scan_cached(path: Path, mtime_ns: int, size: int, max_problems: int) -> TraceStats:
    stats = TraceStats()
    groups: set[str] = set()
    previous = 0.0
    try:
        with path.open("rb") as f:
            for number, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    line = _decode_line(raw)
                except msgspec.ValidationError as exc:
                    stats.problems.append(f"{path.name} line {number}: {exc}")
                except msgspec.DecodeError as exc:
                    stats.problems.append(f"{path.name} line {number}: not valid JSON ({exc})")
                else:
                    problem = _check_line(line)
                    if problem is None and line.arrival < previous:
                        problem = f"arrival {line.arrival:g} is before the previous line's ({previous:g})"
                    if problem is not None:
                        stats.problems.append(f"{path.name} line {number}: {problem}")
                    else:
                        previous = line.arrival
                        stats.count += 1
                        stats.last_arrival = line.arrival
                        stats.prompt_tokens += line.prompt_tokens
                        stats.output_tokens += line.output_tokens
                        if line.prefix_group is not None:
                            groups.add(line.prefix_group)
                if len(stats.problems) >= max_problems:
                    stats.problems.append("(more problems not shown)")
                    break
    except OSError as exc:
        stats.problems.append(f"cannot read trace file {str(path)!r}: {exc.strerror}")
    if not stats.problems and stats.count == 0:
        stats.problems.append(f"{path.name} holds no requests")
    stats.groups = len(groups)
    return stats


def trace_requests(
    s: TraceStream, name: str, seed: int, end: float, prompts: bool, base_dir: Path
) -> Iterator[SimRequest]:
    """The requests of a trace stream arriving before ``end`` (passes repeat with ``loop``)."""
    path = base_dir / s.path
    stats = scan_trace(path)
    if stats.problems:
        raise WorkloadError([Problem("path", p) for p in stats.problems], str(path))
    rng = random.Random(stable_seed(seed, name, "content"))
    scale = 1.0 / s.rate_multiplier
    prefixes: dict[str, list[int]] = {}
    passes = range(1_000_000_000) if s.loop else range(1)
    for k in passes:
        offset = k * stats.period
        suffix = f"#{k}" if k else ""
        with path.open("rb") as f:
            for raw in f:
                if not raw.strip():
                    continue
                line = _decode_line(raw)
                at = (line.arrival + offset) * scale
                if at >= end:
                    return
                prefix_len = line.prefix_tokens or 0
                unique_seed = rng.getrandbits(64)
                output_seed = rng.getrandbits(64)
                if prompts:
                    prompt = synthetic_ids(unique_seed, line.prompt_tokens - prefix_len)
                    if line.prefix_group is not None and prefix_len:
                        ids = prefixes.get(line.prefix_group)
                        if ids is None or len(ids) < prefix_len:
                            if len(prefixes) > 4096:
                                prefixes.clear()
                            ids = prefixes[line.prefix_group] = synthetic_ids(
                                stable_seed(seed, "group", line.prefix_group), prefix_len
                            )
                        prompt = ids[:prefix_len] + prompt
                else:
                    prompt = []
                yield SimRequest(
                    at,
                    prompt,
                    line.output_tokens,
                    output_seed,
                    line.tenant if line.tenant is not None else s.tenant,
                    line.tier if line.tier is not None else s.tier,
                    line.priority if line.priority is not None else s.priority,
                    line.session + suffix if line.session is not None else None,
                    line.prefix_group,
                    line.api if line.api is not None else s.api,
                    line.prompt_tokens,
                    prefix_len,
                    0,
                    name,
                    chain_key=f"group:{line.prefix_group}"
                    if prompts and line.prefix_group is not None
                    else None,
                    chain_tokens=prefix_len,
                )
