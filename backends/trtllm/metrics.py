"""Reading TensorRT-LLM's load into an :class:`EndpointLoad`, from the three places it is
published:

- ``trtllm-serve``'s ``GET /metrics``: a JSON list of per-iteration statistics (the
  executor's ``IterationStats`` as JSON: ``numActiveRequests``, ``numQueuedRequests``,
  ``kvCacheStats`` {``maxNumBlocks``, ``freeNumBlocks``, ``usedNumBlocks``,
  ``tokensPerBlock``, ``reusedBlocks``, ``missedBlocks`` ...}), drained on every read;
- ``trtllm-serve``'s ``GET /prometheus/metrics`` (servers run with
  ``return_perf_metrics: true``): ``trtllm_num_requests_running``,
  ``trtllm_num_requests_waiting``, ``trtllm_kv_cache_utilization`` ...;
- Triton's metrics port: ``nv_trt_llm_request_metrics{request_type=...}``,
  ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=...}`` (the TensorRT-LLM
  backend's custom metrics) and Triton's own ``nv_inference_pending_request_count``.

The Prometheus pages are read the way the ``vllm`` backend reads its page: one compiled
regular expression picks only the wanted lines out of the raw bytes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

from shuniu.backends.http import MetricsError, label_dict, samples, series_pattern
from shuniu.core.types import EndpointLoad

__all__ = [
    "MetricsError",
    "StatsView",
    "parse_iteration_stats",
    "parse_triton_metrics",
    "parse_trtllm_prometheus",
]


# -- trtllm-serve's JSON iteration statistics ----------------------------------------------


class StatsView:
    """The load view built from ``trtllm-serve``'s iteration statistics across reads.

    Each read of ``/metrics`` returns only the iterations since the previous read, so the
    view keeps what it needs between reads: whether statistics were ever seen (an empty
    list before that means they are switched off, after it that the engine is idle) and
    the last KV-cache counters (cumulative, still true while idle)."""

    __slots__ = ("last", "seen")

    def __init__(self) -> None:
        self.seen = False
        self.last: EndpointLoad | None = None

    def update(self, entries: Sequence[Any]) -> EndpointLoad:
        """The load after one read of ``/metrics`` (its decoded JSON list).

        Several entries per read are normal (one per iteration, and with attention data
        parallelism one per rank): the newest entry of each rank counts, and ranks are
        summed. An empty list after statistics were seen means no iteration ran since the
        previous read: an idle engine (nothing running or queued, no KV blocks held by
        requests). Raises :class:`MetricsError` when nothing was ever seen."""
        load = parse_iteration_stats(entries)
        if load is None:
            if not self.seen:
                raise MetricsError(
                    "trtllm-serve returned no iteration statistics yet (the PyTorch backend "
                    "publishes them only with enable_iter_perf_stats: true; a server run with "
                    "return_perf_metrics: true drains them itself: use load_from: prometheus)"
                )
            last = self.last
            load = EndpointLoad(
                running=0,
                waiting=0,
                kv_usage=0.0 if last is not None and last.kv_usage is not None else None,
                prefix_queries=last.prefix_queries if last is not None else None,
                prefix_hits=last.prefix_hits if last is not None else None,
            )
        self.seen = True
        self.last = load
        return load


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value):
        return None
    return int(value)


def _rank(entry: dict[str, Any]) -> int:
    # attentionDpRank tags every entry of current releases; the per-rank dicts of attention
    # data parallelism carry "rank"; older releases have neither (one rank).
    for key in ("attentionDpRank", "rank"):
        value = _int(entry.get(key))
        if value is not None:
            return value
    return 0


def parse_iteration_stats(entries: Sequence[Any]) -> EndpointLoad | None:
    """The load in one ``/metrics`` answer of ``trtllm-serve``, or ``None`` for an empty
    list. ``running`` is ``numActiveRequests`` (requests in the executor's batch, context
    and generation), ``waiting`` is ``numQueuedRequests``, ``kv_usage`` is
    ``usedNumBlocks / maxNumBlocks``; prefix queries and hits are the cumulative
    ``reusedBlocks + missedBlocks`` and ``reusedBlocks`` in tokens (times
    ``tokensPerBlock``)."""
    newest: dict[int, dict[str, Any]] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        rank = _rank(entry)
        held = newest.get(rank)
        if held is None or (_int(entry.get("iter")) or 0) >= (_int(held.get("iter")) or 0):
            newest[rank] = entry
    if not newest:
        return None
    running = waiting = 0
    used = total = 0
    queries = hits = 0
    have_kv = have_prefix = False
    for entry in newest.values():
        running += _int(entry.get("numActiveRequests")) or 0
        waiting += _int(entry.get("numQueuedRequests")) or 0
        kv = entry.get("kvCacheStats")
        if isinstance(kv, dict):
            max_blocks = _int(kv.get("maxNumBlocks"))
            used_blocks = _int(kv.get("usedNumBlocks"))
            if used_blocks is None and max_blocks is not None:
                free = _int(kv.get("freeNumBlocks"))
                used_blocks = max_blocks - free if free is not None else None
            if max_blocks and used_blocks is not None:
                used += used_blocks
                total += max_blocks
                have_kv = True
            per_block = _int(kv.get("tokensPerBlock"))
            reused, missed = _int(kv.get("reusedBlocks")), _int(kv.get("missedBlocks"))
            if per_block and reused is not None and missed is not None:
                queries += (reused + missed) * per_block
                hits += reused * per_block
                have_prefix = True
    return EndpointLoad(
        running=running,
        waiting=waiting,
        kv_usage=min(1.0, max(0.0, used / total)) if have_kv and total else None,
        prefix_queries=queries if have_prefix else None,
        prefix_hits=hits if have_prefix else None,
    )


# -- Prometheus text -----------------------------------------------------------------------


def _lines(raw: bytes, pattern: re.Pattern[bytes]) -> Iterator[tuple[bytes, dict[bytes, bytes], float]]:
    """(name, labels, value) of every wanted sample line with a finite value."""
    for name, labels, v in samples(raw, pattern):
        yield name, label_dict(labels), v


TRTLLM_SERIES: tuple[str, ...] = (
    "trtllm_num_requests_running",
    "trtllm_num_requests_waiting",
    "trtllm_kv_cache_utilization",
    "trtllm_kv_cache_used_blocks",
    "trtllm_kv_cache_max_blocks",
    "trtllm_kv_cache_tokens_per_block",
    "trtllm_kv_cache_reused_blocks_total",
    "trtllm_kv_cache_missed_blocks_total",
    "trtllm_generation_tokens_total",
    "trtllm_request_success_total",
)
"""The series read from ``trtllm-serve``'s ``/prometheus/metrics`` (TensorRT-LLM's
``MetricsCollector``; the request and KV gauges exist since the iteration-level metrics
were added to it)."""

_TRTLLM_LINE = series_pattern(TRTLLM_SERIES)


def parse_trtllm_prometheus(text: bytes | str) -> EndpointLoad:
    """The load in ``trtllm-serve``'s ``/prometheus/metrics`` page. Values are summed over
    label sets (the multiprocess collector adds a ``pid`` label), the utilisation averaged.
    ``kv_usage`` is ``trtllm_kv_cache_utilization``, or used over max blocks; aborted
    requests are ``trtllm_request_success_total{finished_reason="cancelled"}``. Raises
    :class:`MetricsError` without ``trtllm_num_requests_running`` and ``_waiting``."""
    raw = text.encode() if isinstance(text, str) else text
    sums: dict[bytes, float] = {}
    counts: dict[bytes, int] = {}
    cancelled: float | None = None
    for name, labels, value in _lines(raw, _TRTLLM_LINE):
        if name == b"trtllm_request_success_total":
            if labels.get(b"finished_reason") == b"cancelled":
                cancelled = (cancelled or 0.0) + value
            continue
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
    running = sums.get(b"trtllm_num_requests_running")
    waiting = sums.get(b"trtllm_num_requests_waiting")
    if running is None and waiting is None:
        raise MetricsError("no trtllm_num_requests_running or trtllm_num_requests_waiting series")
    kv: float | None = None
    if b"trtllm_kv_cache_utilization" in sums:
        kv = sums[b"trtllm_kv_cache_utilization"] / counts[b"trtllm_kv_cache_utilization"]
    elif sums.get(b"trtllm_kv_cache_max_blocks") and b"trtllm_kv_cache_used_blocks" in sums:
        kv = sums[b"trtllm_kv_cache_used_blocks"] / sums[b"trtllm_kv_cache_max_blocks"]
    per_block = sums.get(b"trtllm_kv_cache_tokens_per_block")
    if per_block is not None:
        per_block /= counts[b"trtllm_kv_cache_tokens_per_block"]
    reused = sums.get(b"trtllm_kv_cache_reused_blocks_total")
    missed = sums.get(b"trtllm_kv_cache_missed_blocks_total")
    have_prefix = bool(per_block) and reused is not None and missed is not None
    generated = sums.get(b"trtllm_generation_tokens_total")
    return EndpointLoad(
        running=int(running or 0),
        waiting=int(waiting or 0),
        kv_usage=min(1.0, max(0.0, kv)) if kv is not None else None,
        prefix_queries=int((reused + missed) * per_block) if have_prefix else None,  # type: ignore[operator]
        prefix_hits=int(reused * per_block) if have_prefix else None,  # type: ignore[operator]
        generated_tokens=int(generated) if generated is not None else None,
        aborted=int(cancelled) if cancelled is not None else None,
    )


TRITON_SERIES: tuple[str, ...] = (
    "nv_trt_llm_request_metrics",
    "nv_trt_llm_kv_cache_block_metrics",
    "nv_inference_pending_request_count",
    "nv_llm_output_token_len_sum",
)
"""The series read from Triton's metrics port."""

_TRITON_LINE = series_pattern(TRITON_SERIES)


def parse_triton_metrics(text: bytes | str, model: str | None = None) -> EndpointLoad:
    """The load in Triton's ``/metrics`` page (its metrics port, 8002 by default).

    The TensorRT-LLM backend reports ``nv_trt_llm_request_metrics`` with ``request_type``
    ``active`` (requests in the executor), ``scheduled`` (in this iteration's batch),
    ``waiting`` (active but not scheduled; releases since 2024), ``context`` and ``max``.
    ``running`` is ``active - waiting`` (``active`` when ``waiting`` is absent);
    ``waiting`` is that ``waiting`` plus Triton's own queue,
    ``nv_inference_pending_request_count`` (requests not yet handed to the backend).
    ``kv_usage`` is ``kv_cache_block_type="fraction"`` (or ``used / max``). With ``model``
    only series labelled ``model="<model>"`` count; otherwise they are summed. Raises
    :class:`MetricsError` without any ``nv_trt_llm_request_metrics`` series."""
    raw = text.encode() if isinstance(text, str) else text
    want = model.encode() if model is not None else None
    request: dict[bytes, float] = {}
    kv: dict[bytes, float] = {}
    kv_n: dict[bytes, int] = {}
    pending = 0.0
    generated: float | None = None
    for name, labels, value in _lines(raw, _TRITON_LINE):
        if want is not None and labels.get(b"model") != want:
            continue
        if name == b"nv_trt_llm_request_metrics":
            kind = labels.get(b"request_type", b"")
            request[kind] = request.get(kind, 0.0) + value
        elif name == b"nv_trt_llm_kv_cache_block_metrics":
            kind = labels.get(b"kv_cache_block_type", b"")
            kv[kind] = kv.get(kind, 0.0) + value
            kv_n[kind] = kv_n.get(kind, 0) + 1
        elif name == b"nv_inference_pending_request_count":
            pending += value
        else:  # the output-length histogram's sum: tokens generated
            generated = (generated or 0.0) + value
    if not request:
        where = f" for model {model!r}" if model is not None else ""
        raise MetricsError(f"no nv_trt_llm_request_metrics series{where}")
    active = request.get(b"active", 0.0)
    engine_waiting = request.get(b"waiting")
    running = active - engine_waiting if engine_waiting is not None else active
    usage: float | None = None
    if b"fraction" in kv:
        usage = kv[b"fraction"] / kv_n[b"fraction"]
    elif kv.get(b"max") and b"used" in kv:
        usage = kv[b"used"] / kv[b"max"]
    return EndpointLoad(
        running=max(0, int(running)),
        waiting=int((engine_waiting or 0.0) + pending),
        kv_usage=min(1.0, max(0.0, usage)) if usage is not None else None,
        generated_tokens=int(generated) if generated is not None else None,
    )
