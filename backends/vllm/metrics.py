"""Reading a vLLM server's Prometheus ``/metrics`` page into an :class:`EndpointLoad`.

The page is large (tens of kB: every histogram has a line per bucket, every counter a
``_created`` twin) and is scraped by every gateway every ``load.interval_s``, so it is not
parsed into families: one compiled regular expression, run by the ``re`` engine in C over
the raw bytes, picks out only the lines of the handful of series the load view needs
(:data:`WANTED`), and Python touches nothing else. ``# HELP``/``# TYPE`` comments,
``_created`` series, histogram buckets and every other metric never match.

Values are summed over label sets (several engines of a data-parallel server, several
``model_name`` labels); the KV-cache usage fraction is averaged instead, since a sum of
fractions means nothing.
"""

from __future__ import annotations

from shuniu.backends.http import MetricsError, samples, series_pattern
from shuniu.core.types import EndpointLoad

__all__ = ["WANTED", "MetricsError", "parse_vllm_metrics"]

WANTED: tuple[str, ...] = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",  # vLLM before 0.10 (V0 engine, early V1)
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries_total",  # vLLM 0.8-0.10
    "vllm:gpu_prefix_cache_hits_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",  # only its finished_reason="abort" series is used
)
"""The series read, by their exposed names. Older vLLM releases exposed the KV usage and the
prefix-cache counters under ``gpu_`` names; the current name wins when both are present."""

# A sample line: NAME, optional {labels} (label values are quoted and may hold any
# character, escaped), a space, the VALUE, an optional timestamp. The name must be followed
# by "{" or " ", so vllm:num_requests_waiting does not match
# vllm:num_requests_waiting_by_reason. The pattern starts with the literal "\nvllm:" so the
# engine skips ahead with a fast substring search instead of trying the alternation at every
# line start (5x cheaper than a ^-anchored MULTILINE pattern on a 50 kB page).
_LINE = series_pattern(WANTED)
_ABORT = b'finished_reason="abort"'
_KV, _KV_OLD = b"vllm:kv_cache_usage_perc", b"vllm:gpu_cache_usage_perc"
_QUERIES, _QUERIES_OLD = b"vllm:prefix_cache_queries_total", b"vllm:gpu_prefix_cache_queries_total"


def parse_vllm_metrics(text: bytes | str) -> EndpointLoad:
    """The load view in a vLLM ``/metrics`` page (Prometheus text format 0.0.4).

    ``running`` and ``waiting`` are summed over label sets, ``kv_usage`` averaged; the
    prefix-cache query and hit counters (in tokens), generated tokens and aborted requests
    (``vllm:request_success_total{finished_reason="abort"}``) are summed, and ``None`` when
    the page lacks them. Raises :class:`MetricsError` when neither
    ``vllm:num_requests_running`` nor ``vllm:num_requests_waiting`` is on the page, so that
    a wrong ``metrics_path`` is not taken for an idle engine.
    """
    sums: dict[bytes, float] = {}
    kv_count: dict[bytes, int] = {}
    aborted: float | None = None
    for name, labels, v in samples(text, _LINE):
        if name == b"vllm:request_success_total":
            if labels is not None and _ABORT in labels:
                aborted = (aborted or 0.0) + v
            continue
        sums[name] = sums.get(name, 0.0) + v
        if name.endswith(b"usage_perc"):
            kv_count[name] = kv_count.get(name, 0) + 1
    running = sums.get(b"vllm:num_requests_running")
    waiting = sums.get(b"vllm:num_requests_waiting")
    if running is None and waiting is None:
        raise MetricsError("no vllm:num_requests_running or vllm:num_requests_waiting series")
    kv_name = (
        b"vllm:kv_cache_usage_perc" if b"vllm:kv_cache_usage_perc" in sums else b"vllm:gpu_cache_usage_perc"
    )
    kv = sums.get(kv_name)
    return EndpointLoad(
        running=int(running or 0),
        waiting=int(waiting or 0),
        kv_usage=kv / kv_count[kv_name] if kv is not None else None,
        prefix_queries=_count(
            sums, b"vllm:prefix_cache_queries_total", b"vllm:gpu_prefix_cache_queries_total"
        ),
        prefix_hits=_count(sums, b"vllm:prefix_cache_hits_total", b"vllm:gpu_prefix_cache_hits_total"),
        generated_tokens=_count(sums, b"vllm:generation_tokens_total"),
        aborted=int(aborted) if aborted is not None else None,
    )


def _count(sums: dict[bytes, float], *names: bytes) -> int | None:
    """The first of ``names`` present, as an integer counter."""
    for name in names:
        value = sums.get(name)
        if value is not None:
            return int(value)
    return None
