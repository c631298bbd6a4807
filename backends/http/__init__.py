"""The HTTP engine layer every HTTP backend builds on: pooled sessions (:mod:`.session`), the
lean HTTP/1.1 client of the calls on the request path (:mod:`.h1`),
one SSE reader for events of any size (:mod:`.sse`), ordinary stream events forwarded
without decoding (:mod:`.passthrough`), probes for health, metadata and
metrics (:mod:`.probes`), Prometheus sample reading (:mod:`.prometheus`), error mapping and
stream close (:mod:`.errors`, :mod:`.session`), option helpers (:mod:`.options`), and the
OpenAI-protocol engine client (:mod:`.openai`).

It is a library, not a plugin: it registers nothing. Backends import it from here (or from
its modules); no backend imports another backend's internals. The names are loaded on
first use, so a backend's options (validated when a deployment is checked) do not pull in
aiohttp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shuniu.core.lazy import lazy_exports

if TYPE_CHECKING:
    from shuniu.backends.http.errors import (
        PROBE_ERRORS,
        STREAM_BREAKS,
        ProbeError,
        describe_error,
        openai_error,
        post_or_raise,
        read_whole,
        stream_broken,
    )
    from shuniu.backends.http.h1 import H1Pool, H1Response
    from shuniu.backends.http.openai import EventStream, OpenAIEngine, delta_extras
    from shuniu.backends.http.options import OpenAIOptions, http_url, server_root, url_path
    from shuniu.backends.http.passthrough import RawEvents
    from shuniu.backends.http.probes import Prober, short_body
    from shuniu.backends.http.prometheus import MetricsError, label_dict, samples, series_pattern
    from shuniu.backends.http.session import end_stream, open_session, post_json, probe_headers
    from shuniu.backends.http.sse import (
        MAX_LINE_BYTES,
        LineSplitter,
        OversizedEvent,
        SseData,
        SseLines,
        data_payload,
    )

__all__ = [
    "MAX_LINE_BYTES",
    "PROBE_ERRORS",
    "STREAM_BREAKS",
    "EventStream",
    "H1Pool",
    "H1Response",
    "LineSplitter",
    "MetricsError",
    "OpenAIEngine",
    "OpenAIOptions",
    "OversizedEvent",
    "ProbeError",
    "Prober",
    "RawEvents",
    "SseData",
    "SseLines",
    "data_payload",
    "delta_extras",
    "describe_error",
    "end_stream",
    "http_url",
    "label_dict",
    "open_session",
    "openai_error",
    "post_json",
    "post_or_raise",
    "probe_headers",
    "read_whole",
    "samples",
    "series_pattern",
    "server_root",
    "short_body",
    "stream_broken",
    "url_path",
]

_MODULES = {
    "errors": (
        "PROBE_ERRORS",
        "STREAM_BREAKS",
        "ProbeError",
        "describe_error",
        "openai_error",
        "post_or_raise",
        "read_whole",
        "stream_broken",
    ),
    "h1": ("H1Pool", "H1Response"),
    "openai": ("EventStream", "OpenAIEngine", "delta_extras"),
    "options": ("OpenAIOptions", "http_url", "server_root", "url_path"),
    "passthrough": ("RawEvents",),
    "probes": ("Prober", "short_body"),
    "prometheus": ("MetricsError", "label_dict", "samples", "series_pattern"),
    "session": ("end_stream", "open_session", "post_json", "probe_headers"),
    "sse": ("MAX_LINE_BYTES", "LineSplitter", "OversizedEvent", "SseData", "SseLines", "data_payload"),
}

__getattr__, __dir__ = lazy_exports(
    __name__, {name: f"{__name__}.{module}" for module, names in _MODULES.items() for name in names}
)
