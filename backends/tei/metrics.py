"""Reading a TEI server's Prometheus ``/metrics`` page into an :class:`EndpointLoad`.

TEI exports its router's metrics through ``metrics-exporter-prometheus``, as TGI does:
names without a ``_total`` suffix, no ``# HELP`` lines, and a series only once first
recorded (an idle server that has served nothing shows almost none, which means idle, not
an error). Only the lines of :data:`WANTED` are picked out of the page.
"""

from __future__ import annotations

from shuniu.backends.http import MetricsError, samples, series_pattern
from shuniu.core.types import EndpointLoad

__all__ = ["WANTED", "parse_tei_metrics"]

WANTED: tuple[str, ...] = (
    "te_queue_size",
    "te_request_count",
    "te_request_success",
    "te_request_failure",
)
"""The series read, by their exposed names (TEI 1.x)."""

_LINE = series_pattern(WANTED)
_DROPPED = b'err="dropped"'


def parse_tei_metrics(text: bytes | str) -> EndpointLoad:
    """The load view in a TEI ``/metrics`` page.

    - ``waiting``: ``te_queue_size``, the inputs queued for a batch.
    - ``running``: requests in flight, ``te_request_count`` less ``te_request_success`` and
      ``te_request_failure`` (approximate: TEI counts some failures per input).
    - ``aborted``: ``te_request_failure{err="dropped"}``, inputs dropped because their
      client went away.

    Raises :class:`MetricsError` when the page has no ``te_`` line at all and is not empty
    (a wrong ``metrics_path``, or not a TEI server).
    """
    raw = text.encode() if isinstance(text, str) else text
    if raw.strip() and not raw.startswith(b"te_") and b"\nte_" not in raw:
        raise MetricsError("no te_ series on the page")
    sums: dict[bytes, float] = {}
    dropped: float | None = None
    for name, labels, v in samples(raw, _LINE):
        if name == b"te_request_failure" and labels is not None and _DROPPED in labels:
            dropped = (dropped or 0.0) + v
        sums[name] = sums.get(name, 0.0) + v
    started = sums.get(b"te_request_count", 0.0)
    ended = sums.get(b"te_request_success", 0.0) + sums.get(b"te_request_failure", 0.0)
    return EndpointLoad(
        running=max(0, int(started - ended)),
        waiting=int(sums.get(b"te_queue_size", 0.0)),
        aborted=int(dropped) if dropped is not None else None,
    )
