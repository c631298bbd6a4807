"""Reading MindIE Service's Prometheus ``/metrics`` page into an :class:`EndpointLoad`.

MindIE's series carry vLLM's old names without the ``vllm:`` prefix
(``num_requests_running``, ``num_requests_waiting``, ``npu_cache_usage_perc``, ...), each
with one ``model_name`` label (the served models joined by `` & ``). The page is read like
the ``vllm`` backend reads vLLM's: one compiled regular expression over the raw bytes picks
the handful of lines the load view needs, and nothing else is parsed.

What MindIE does not publish is left ``None``: it reports a prefix-cache *hit rate*
(``npu_prefix_cache_hit_rate``, a gauge over an unstated window), not the query and hit
counters the load view sums, and no count of aborted requests.
"""

from __future__ import annotations

from shuniu.backends.http import MetricsError, samples, series_pattern
from shuniu.core.types import EndpointLoad

__all__ = ["MINDIE_WANTED", "MetricsError", "parse_mindie_metrics"]

MINDIE_WANTED: tuple[str, ...] = (
    "num_requests_running",
    "num_requests_waiting",
    "npu_cache_usage_perc",
    "generation_tokens_total",
)
"""The series read, by their exposed names (MindIE Server's ``prometheus_metrics.cpp``; the
same names on MindIE Motor's coordinator, which sums its instances)."""

# A sample line: NAME at a line start, optional {labels} (quoted values, escapes allowed), a
# space, the VALUE. The name must be followed by "{" or a blank, so num_requests_running
# does not match a longer name, and the leading "\n" keeps vllm:num_requests_running (and
# any other prefixed name) out.
_LINE = series_pattern(MINDIE_WANTED)
_KV = b"npu_cache_usage_perc"


def parse_mindie_metrics(text: bytes | str) -> EndpointLoad:
    """The load view in a MindIE ``/metrics`` page (Prometheus text format 0.0.4).

    ``running`` and ``waiting`` are summed over label sets, ``kv_usage`` (the fraction of
    NPU KV-cache blocks in use) averaged and kept within 0..1, ``generated_tokens`` summed.
    Raises :class:`MetricsError` when neither ``num_requests_running`` nor
    ``num_requests_waiting`` is on the page (not MindIE, or a wrong ``metrics_path``), so an
    unreadable page is not taken for an idle engine.
    """
    sums: dict[bytes, float] = {}
    kv_samples = 0
    for name, _labels, v in samples(text, _LINE):
        sums[name] = sums.get(name, 0.0) + v
        if name == _KV:
            kv_samples += 1
    running = sums.get(b"num_requests_running")
    waiting = sums.get(b"num_requests_waiting")
    if running is None and waiting is None:
        raise MetricsError(
            "no num_requests_running or num_requests_waiting series (is this MindIE's /metrics?)"
        )
    kv = sums.get(_KV)
    generated = sums.get(b"generation_tokens_total")
    return EndpointLoad(
        running=int(running or 0),
        waiting=int(waiting or 0),
        # MindIE computes (total - free) / total blocks; clamp so a broken exporter cannot
        # push the balancers' KV term out of range.
        kv_usage=min(1.0, max(0.0, kv / kv_samples)) if kv is not None else None,
        generated_tokens=int(generated) if generated is not None else None,
    )
