"""Reading a TGI server's Prometheus ``/metrics`` page into an :class:`EndpointLoad`.

TGI's router exports its metrics through the Rust ``metrics-exporter-prometheus`` crate
(text format 0.0.4): plain names without a ``_total`` suffix, ``# HELP`` lines only for the
series TGI describes, and histograms with many buckets (``tgi_batch_next_size`` alone has
1,024), so the page runs to tens of kB. It is scraped every ``load.interval_s``, so it is
not parsed into families: one compiled regular expression, run by the ``re`` engine in C
over the raw bytes, picks out the lines of the few series the load view needs
(:data:`WANTED`) and everything else is skipped unread.

A series only appears once TGI has recorded it: a server that has not served a request yet
shows ``tgi_batch_max_total_tokens`` (set at warm-up, TGI 2.4 and later) and little else,
so missing queue and batch gauges mean an idle engine, not an error. A page with no
``tgi_`` series at all is an error (a wrong ``metrics_path``, or not a TGI server).
"""

from __future__ import annotations

from shuniu.backends.http import MetricsError, samples, series_pattern
from shuniu.core.types import EndpointLoad

__all__ = ["WANTED", "MetricsError", "parse_tgi_metrics"]

WANTED: tuple[str, ...] = (
    "tgi_batch_current_size",
    "tgi_queue_size",
    "tgi_batch_current_max_tokens",
    "tgi_batch_max_total_tokens",
    "tgi_request_generated_tokens_sum",
    "tgi_request_failure",  # only its err="dropped" series is used
)
"""The series read, by their exposed names (TGI v3.3, and the same names back to 1.x;
``tgi_batch_max_total_tokens`` appeared in TGI 2.4, servers up to 2.2 report the budget as
``max_batch_total_tokens`` in ``/info`` instead)."""

# A sample line: NAME, optional {labels} (quoted values may hold any escaped character), a
# space, the VALUE. The name must be followed by "{" or blanks, so tgi_queue_size does not
# match a longer name. The literal "\ntgi_" start lets the engine skip ahead with a fast
# substring search instead of trying the alternation at every position.
_LINE = series_pattern(WANTED)
_DROPPED = b'err="dropped"'


def parse_tgi_metrics(text: bytes | str, max_batch_total_tokens: int | None = None) -> EndpointLoad:
    """The load view in a TGI ``/metrics`` page.

    - ``running``: ``tgi_batch_current_size``, the requests in the batch being decoded.
    - ``waiting``: ``tgi_queue_size``, the requests queued in the router.
    - ``kv_usage``: ``tgi_batch_current_max_tokens / tgi_batch_max_total_tokens``, the share
      of the server's token budget (the KV-cache slots TGI sized at warm-up) that the running
      batch has reserved. TGI exposes no KV-cache percentage of its own; this is what its
      scheduler admits against. Older servers lack the denominator on the page: pass
      ``max_batch_total_tokens`` from ``/info``. ``None`` when neither is known.
    - ``generated_tokens``: ``tgi_request_generated_tokens_sum``, tokens of finished requests.
    - ``aborted``: ``tgi_request_failure{err="dropped"}``, requests TGI dropped because their
      client went away (TGI may count one request at two places, so it is approximate).

    Values are summed over label sets (one router exports one set; a page merged from
    several routers sums). Raises :class:`MetricsError` when the page has no ``tgi_`` line.
    """
    raw = text.encode() if isinstance(text, str) else text
    if not raw.startswith(b"tgi_") and b"\ntgi_" not in raw:
        raise MetricsError("no tgi_ series on the page")
    sums: dict[bytes, float] = {}
    dropped: float | None = None
    for name, labels, v in samples(raw, _LINE):
        if name == b"tgi_request_failure":
            if labels is not None and _DROPPED in labels:
                dropped = (dropped or 0.0) + v
            continue
        sums[name] = sums.get(name, 0.0) + v
    budget = sums.get(b"tgi_batch_max_total_tokens")
    if not budget:
        budget = float(max_batch_total_tokens) if max_batch_total_tokens else None
    reserved = sums.get(b"tgi_batch_current_max_tokens")
    kv: float | None = None
    if budget:
        kv = min(1.0, max(0.0, (reserved or 0.0) / budget))
    generated = sums.get(b"tgi_request_generated_tokens_sum")
    return EndpointLoad(
        running=int(sums.get(b"tgi_batch_current_size", 0.0)),
        waiting=int(sums.get(b"tgi_queue_size", 0.0)),
        kv_usage=kv,
        generated_tokens=int(generated) if generated is not None else None,
        aborted=int(dropped) if dropped is not None else None,
    )
