"""vLLM's Prometheus metrics, computed from a simulated engine's counters.

:func:`render_metrics` writes what ``vllm serve`` answers on ``/metrics`` (the Prometheus
text exposition format 0.0.4, as ``prometheus_client.generate_latest`` writes it): the same
metric names, help texts, label set (``engine``, ``model_name``), histogram bucket
boundaries, and the ``_created`` series ``prometheus_client`` adds to counters and
histograms. A router or dashboard built for vLLM reads the simulator unchanged.

Nothing is recorded per request here: every value is read from the
:class:`~shuniu.backends.sim.engine.EngineCore` when scraped. Histogram buckets come from the
core's log-bucket histograms, so a bucket's count is exact to their 1% resolution (a value
up to 1% above a boundary may be counted in it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from shuniu.backends.sim.engine import EngineCore
from shuniu.backends.sim.stats import LogHistogram

__all__ = [
    "CONTENT_TYPE",
    "E2E_BUCKETS",
    "FINISH_REASONS",
    "ITL_BUCKETS",
    "TTFT_BUCKETS",
    "render_metrics",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The content type of the Prometheus text format (``prometheus_client.CONTENT_TYPE_LATEST``)."""

# Bucket boundaries as vLLM publishes them (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort")
"""The ``finished_reason`` label values of ``vllm:request_success_total`` (vLLM's
``FinishReason``: ``str(FinishReason.STOP)`` is ``"stop"``, ...)."""


def _go(value: float) -> str:
    """A number as ``prometheus_client`` writes it (Go's formatting: ``1.0``, ``+Inf``,
    ``1.7e+09``)."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _Writer:
    __slots__ = ("created", "labels", "lines")

    def __init__(self, model_name: str, created: float | None) -> None:
        # Label pairs sorted by name, as prometheus_client writes them; ``le`` and
        # ``finished_reason`` fall between ``engine`` and ``model_name``.
        self.labels = ('engine="0"', f'model_name="{_escape(model_name)}"')
        self.lines: list[str] = []
        self.created = created

    def _label_str(self, extra: str | None = None) -> str:
        engine, model = self.labels
        return "{" + ",".join((engine, extra, model) if extra else (engine, model)) + "}"

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, extra: str | None = None) -> None:
        self.lines.append(f"{name}{self._label_str(extra)} {_go(value)}")

    def created_family(self, base: str, help_text: str, extras: Iterable[str | None] = (None,)) -> None:
        if self.created is None:
            return
        self.family(f"{base}_created", "gauge", help_text)
        for extra in extras:
            self.sample(f"{base}_created", self.created, extra)

    def gauge(self, name: str, help_text: str, value: float) -> None:
        self.family(name, "gauge", help_text)
        self.sample(name, value)

    def counter(self, base: str, help_text: str, value: float) -> None:
        self.family(f"{base}_total", "counter", help_text)
        self.sample(f"{base}_total", value)
        self.created_family(base, help_text)

    def histogram(self, name: str, help_text: str, hist: LogHistogram, bounds: tuple[float, ...]) -> None:
        self.family(name, "histogram", help_text)
        count = hist.count
        for bound in bounds:
            # LogHistogram.count_le may overshoot by the values within 1% above the bound;
            # a bucket never holds more than the whole histogram.
            self.sample(f"{name}_bucket", min(hist.count_le(bound), count), f'le="{_go(bound)}"')
        self.sample(f"{name}_bucket", count, 'le="+Inf"')
        self.sample(f"{name}_count", count)
        self.sample(f"{name}_sum", hist.total)
        self.created_family(name, help_text)


def render_metrics(
    core: EngineCore,
    model_name: str,
    *,
    finish_reasons: Mapping[str, int] | None = None,
    created: float | None = None,
) -> bytes:
    """The engine's state and counters in vLLM's Prometheus format.

    ``finish_reasons`` counts the requests the engine completed by why they ended (``stop``,
    ``length``); the engine core itself does not know (a stop string and an end-of-sequence
    token look alike to it), so the adapter that knows passes the tally. Without it, every
    completed request is reported as ``stop``. ``abort`` is always the core's count of
    requests dropped because their client went away. ``created`` (Unix time the counters
    started, usually server start) adds the ``_created`` series ``prometheus_client`` writes;
    ``None`` leaves them out.
    """
    w = _Writer(model_name, created)
    w.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        len(core.running),
    )
    w.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        core.num_waiting,
    )
    w.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        core.pool.usage(),
    )
    w.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        core.prefix_queries,
    )
    w.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        core.prefix_hits,
    )
    w.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        core.preemptions,
    )
    w.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", core.prompt_tokens)
    w.counter("vllm:generation_tokens", "Number of generation tokens processed.", core.generated_tokens)

    if finish_reasons is None:
        finished = {"stop": core.completed, "length": 0}
    else:
        finished = {reason: finish_reasons.get(reason, 0) for reason in ("stop", "length")}
    finished["abort"] = core.aborted
    help_text = "Count of successfully processed requests."
    w.family("vllm:request_success_total", "counter", help_text)
    reasons = [f'finished_reason="{reason}"' for reason in FINISH_REASONS]
    for reason, label in zip(FINISH_REASONS, reasons, strict=True):
        w.sample("vllm:request_success_total", finished[reason], label)
    w.created_family("vllm:request_success", help_text, reasons)

    w.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        core.ttft,
        TTFT_BUCKETS,
    )
    w.histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        core.itl,
        ITL_BUCKETS,
    )
    w.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        core.e2e,
        E2E_BUCKETS,
    )
    w.lines.append("")
    return "\n".join(w.lines).encode()
