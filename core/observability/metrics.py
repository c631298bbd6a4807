"""The gateway's Prometheus metrics (``GET /metrics``).

Two kinds, chosen so the request path pays as little as possible:

- **Per request**, updated by an observer once the request has ended (one dictionary
  lookup per metric for the label set, then an increment or an observation): request
  counts, latency histograms (end-to-end, time to first token, inter-token latency, queue
  wait) and token counters.
- **Live state**, read only when Prometheus scrapes: in-flight and queued requests,
  endpoint health and limits, each engine's reported load, managed engines, scheduler
  refusals, the response cache, and the hardware probes' readings. Nothing on the request
  path updates these.

Labels are bounded by the deployment: model (the pool's own name), endpoint, tier, status
code, outcome and error code (codes the gateway itself produces, anything else is
``other``). No per-request, per-tenant or per-key label.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from shuniu.core.observability.gc_pauses import GcPauses
from shuniu.core.observability.hardware import HardwareReadings
from shuniu.core.state import StateView, shared_stores
from shuniu.core.types import RequestRecord
from shuniu.core.version import __version__

__all__ = ["CONTENT_TYPE", "KNOWN_CODES", "GatewayMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The `*_created` series double the page and nothing here uses them (prometheus_client only
# offers a process-wide switch).
disable_created_metrics()

# Buckets for LLM latencies: a first token in 10 ms .. a minute; whole answers up to 10 min.
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 30, 60)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600)
_ITL_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1,
    2,
)
_QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)

KNOWN_CODES = frozenset(
    {
        "invalid_json",
        "missing_required_parameter",
        "invalid_type",
        "invalid_value",
        "empty_array",
        "unsupported_value",
        "context_length_exceeded",
        "model_not_found",
        "request_too_large",
        "headers_too_large",
        "too_many_messages",
        "prompt_too_long",
        "max_tokens_exceeded",
        "missing_api_key",
        "invalid_api_key",
        "unknown_tier",
        "invalid_version",
        "rate_limit_exceeded",
        "rate_limiter_unavailable",
        "queue_full",
        "queue_wait_exceeded",
        "queue_timeout",
        "shed",
        "deadline_exceeded",
        "no_healthy_endpoint",
        "upstream_error",
        "upstream_protocol_error",
        "internal_error",
        "ttft_timeout",
        "idle_timeout",
        "request_timeout",
        "overloaded",
    }
)
"""Error codes used as label values; an engine's own codes are reported as ``other``."""


class _Hist:
    """A histogram's buckets as plain counters: ``observe`` is a bisect and two adds (no
    lock: everything runs on the event loop); exported at scrape time."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        out = []
        total = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            total += count
            out.append((floatToGoString(bound), total))
        out.append(("+Inf", total + self.counts[-1]))
        return out


class _HistFamily:
    __slots__ = ("bounds", "doc", "labels", "name", "series")

    def __init__(self, name: str, doc: str, labels: list[str], bounds: tuple[float, ...]) -> None:
        self.name, self.doc, self.labels, self.bounds = name, doc, labels, bounds
        self.series: dict[tuple[str, ...], _Hist] = {}

    def get(self, key: tuple[str, ...]) -> _Hist:
        h = self.series.get(key)
        if h is None:
            h = self.series[key] = _Hist(self.bounds)
        return h

    def family(self) -> HistogramMetricFamily:
        f = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for key, h in self.series.items():
            f.add_metric(list(key), h.buckets(), h.sum)
        return f


class _CounterFamily:
    __slots__ = ("doc", "labels", "name", "series")

    def __init__(self, name: str, doc: str, labels: list[str]) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.series: dict[tuple[str, ...], float] = {}

    def inc(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        self.series[key] = self.series.get(key, 0.0) + amount

    def family(self) -> CounterMetricFamily:
        f = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for key, value in self.series.items():
            f.add_metric(list(key), value)
        return f


class GatewayMetrics:
    """The metrics of one gateway: its own registry, an observer, and a live collector.

    The per-request metrics are plain dictionaries of counters and bucket arrays (about a
    microsecond per request), turned into Prometheus families only when scraped:
    prometheus_client's own metric objects cost ~15 µs per request here (a lock and label
    handling per update)."""

    def __init__(
        self, view: StateView, hardware: HardwareReadings, fleet: Any = None, discoveries: Any = None
    ) -> None:
        """``fleet``: the gateway's :class:`~shuniu.core.fleet.FleetSync` (``fleet:``), whose
        state is exported as ``shuniu_fleet_*``; ``discoveries``: its
        :class:`~shuniu.core.pools.discovery.Discoveries` (``shuniu_discovery_*``)."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = _CounterFamily(
            "shuniu_requests",
            "Requests finished, by model, endpoint, tier, HTTP status, outcome and error code.",
            ["model", "endpoint", "tier", "status", "outcome", "code"],
        )
        self.e2e = _HistFamily(
            "shuniu_request_duration_seconds",
            "Time from arrival to the last byte, of requests that reached an engine or the cache.",
            ["model", "tier", "stream"],
            _E2E_BUCKETS,
        )
        self.ttft = _HistFamily(
            "shuniu_time_to_first_token_seconds",
            "Time from arrival to the first streamed token (streamed requests).",
            ["model", "tier"],
            _TTFT_BUCKETS,
        )
        self.itl = _HistFamily(
            "shuniu_inter_token_latency_seconds",
            "Mean gap between the tokens of a streamed answer, observed once per request.",
            ["model", "tier"],
            _ITL_BUCKETS,
        )
        self.queue = _HistFamily(
            "shuniu_queue_wait_seconds",
            "Time from arrival to being given an endpoint (admitted requests).",
            ["model", "tier"],
            _QUEUE_BUCKETS,
        )
        self.prompt_tokens = _CounterFamily(
            "shuniu_prompt_tokens", "Prompt tokens of finished requests.", ["model", "tier"]
        )
        self.completion_tokens = _CounterFamily(
            "shuniu_completion_tokens", "Completion tokens of finished requests.", ["model", "tier"]
        )
        self.cached_tokens = _CounterFamily(
            "shuniu_cached_tokens",
            "Prompt plus completion tokens of answers served from the response cache.",
            ["model", "tier"],
        )
        self.registry.register(_RequestCollector(self))
        self.registry.register(_LiveCollector(view, hardware, fleet, discoveries))
        self.gc = GcPauses()
        """The collector's pauses (``shuniu_gc_*``); watched between the gateway's start and stop."""
        self.registry.register(self.gc)
        self._status: dict[int, str] = {}

    def observe(self, record: RequestRecord) -> None:
        """The ``request_finished`` observer."""
        model = record.pool or ""
        tier = record.principal.tier
        code = record.error_code or ""
        if code and code not in KNOWN_CODES:
            code = "other"
        status = self._status.get(record.status)
        if status is None:
            status = self._status[record.status] = str(record.status)
        # The outcome is a StrEnum: the member is its value as a label (``.value`` is a
        # property written in Python, a call per request).
        self.requests.inc((model, record.endpoint or "", tier, status, record.outcome, code))
        if not model:
            return
        mt = (model, tier)
        if record.prompt_tokens:
            self.prompt_tokens.inc(mt, record.prompt_tokens)
        if record.completion_tokens:
            self.completion_tokens.inc(mt, record.completion_tokens)
        if record.cached:
            self.cached_tokens.inc(mt, record.prompt_tokens + record.completion_tokens)
        admitted = record.admitted
        if admitted is not None:
            self.queue.get(mt).observe(max(0.0, admitted - record.arrival))
        first = record.first_token
        if first is None:
            return
        self.e2e.get((model, tier, "true" if record.stream else "false")).observe(
            record.finished - record.arrival
        )
        if record.stream:
            self.ttft.get(mt).observe(first - record.arrival)
            if record.completion_tokens > 1 and record.status == 200:
                gap = (record.finished - first) / (record.completion_tokens - 1)
                self.itl.get(mt).observe(gap)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _RequestCollector(Collector):
    """The per-request families, exported from :class:`GatewayMetrics`' plain counters."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.m = metrics

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        m = self.m
        for family in (
            m.requests,
            m.e2e,
            m.ttft,
            m.itl,
            m.queue,
            m.prompt_tokens,
            m.completion_tokens,
            m.cached_tokens,
        ):
            yield family.family()


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _kv_event_metrics(gw: StateView) -> Iterable[Metric]:
    """The prefill queued per endpoint, and the KV-event feeds of pools that route by them."""
    ep = ["model", "endpoint"]
    prefill = _gauge(
        "shuniu_endpoint_prefill_tokens",
        "Uncached prompt tokens of this gateway's requests on the endpoint not answering yet.",
        ep,
    )
    expected = CounterMetricFamily(
        "shuniu_prefix_expected_hits",
        "Prompt tokens the prefix balancer expected the endpoint's engine to find cached.",
        labels=ep,
    )
    for name, pool in gw.pools.items():
        for e in pool.endpoints:
            prefill.add_metric([name, e.name], e.prefill_tokens)
            expected.add_metric([name, e.name], e.expected_hits)
    yield prefill
    yield expected
    feeds = gw.kv_events.feeds
    if not feeds:
        return
    batches = CounterMetricFamily(
        "shuniu_kv_event_batches", "KV-event batches applied from the endpoint's engine.", labels=ep
    )
    resets = CounterMetricFamily(
        "shuniu_kv_event_resets",
        "Times the endpoint's entries were cleared (engine restart, events lost, cache reset).",
        labels=ep,
    )
    gaps = CounterMetricFamily("shuniu_kv_event_gaps", "Times the endpoint's events had a gap.", labels=ep)
    blocks = _gauge("shuniu_kv_index_blocks", "KV blocks the index knows the endpoint's engine holds.", ep)
    skipped = CounterMetricFamily(
        "shuniu_kv_event_skipped_blocks",
        "Stored blocks from the endpoint's events the index could not key: reason orphan (a "
        "parent never seen), malformed (fewer token ids than the blocks hold).",
        labels=[*ep, "reason"],
    )
    for name, pool_feeds in feeds.items():
        for feed in pool_feeds:
            labels = [name, feed.name]
            batches.add_metric(labels, feed.applied)
            resets.add_metric(labels, feed.resets)
            gaps.add_metric(labels, feed.gaps)
            blocks.add_metric(labels, feed.index.blocks(feed.endpoint))
            skipped.add_metric([*labels, "orphan"], feed.index.orphaned.get(feed.endpoint, 0))
            skipped.add_metric([*labels, "malformed"], feed.index.malformed.get(feed.endpoint, 0))
    yield from (batches, resets, gaps, blocks, skipped)


class _LiveCollector(Collector):
    """Reads the gateway's state at scrape time."""

    def __init__(
        self, view: StateView, hardware: HardwareReadings, fleet: Any = None, discoveries: Any = None
    ) -> None:
        self.view = view
        self.hardware = hardware
        self.fleet = fleet
        self.discoveries = discoveries

    def describe(self) -> Iterable[Metric]:
        return []  # the metric set depends on what the deployment uses

    def collect(self) -> Iterable[Metric]:
        gw = self.view
        info = _gauge("shuniu_build_info", "The shuniu version serving (value 1).", ["version"])
        info.add_metric([__version__], 1)
        yield info
        ep = ["model", "endpoint"]
        in_flight = _gauge(
            "shuniu_in_flight_requests", "Requests dispatched to an endpoint, not finished.", ep
        )
        in_flight_tokens = _gauge(
            "shuniu_in_flight_tokens", "Prompt plus expected output tokens of in-flight requests.", ep
        )
        limit = _gauge(
            "shuniu_endpoint_concurrency_limit", "The endpoint's current concurrency limit (0: none).", ep
        )
        healthy = _gauge("shuniu_endpoint_healthy", "1 while the endpoint is in balancing, else 0.", ep)
        completed = CounterMetricFamily(
            "shuniu_endpoint_completed", "Requests the endpoint finished.", labels=ep
        )
        errors = CounterMetricFamily(
            "shuniu_endpoint_errors", "Requests that failed on the endpoint.", labels=ep
        )
        queued = _gauge("shuniu_queued_requests", "Requests waiting in the model's queue.", ["model"])
        running = _gauge("shuniu_engine_running_requests", "Requests the engine reports running.", ep)
        waiting = _gauge("shuniu_engine_waiting_requests", "Requests the engine reports waiting.", ep)
        kv = _gauge("shuniu_engine_kv_cache_usage_ratio", "KV-cache use the engine reports, 0..1.", ep)
        pq = CounterMetricFamily(
            "shuniu_engine_prefix_cache_queries", "Engine prefix-cache queries (tokens).", labels=ep
        )
        ph = CounterMetricFamily(
            "shuniu_engine_prefix_cache_hits", "Engine prefix-cache hits (tokens).", labels=ep
        )
        weight = _gauge(
            "shuniu_engine_load_freshness",
            "How much the engine's last load report still counts (1 fresh, 0 stale).",
            ep,
        )
        rejected = CounterMetricFamily(
            "shuniu_scheduler_rejected",
            "Requests the scheduler refused, by error code.",
            labels=["model", "code"],
        )
        ejected = _gauge("shuniu_endpoint_ejected", "1 while outlier detection keeps the endpoint out.", ep)
        ejections = CounterMetricFamily(
            "shuniu_endpoint_ejections", "Times outlier detection ejected the endpoint.", labels=ep
        )
        retries = CounterMetricFamily(
            "shuniu_retries",
            "Attempts on another endpoint or the fallback model, by the error that caused them.",
            labels=["model", "reason"],
        )
        gave_up = CounterMetricFamily(
            "shuniu_retries_gave_up",
            "Failed attempts answered with their error instead of a retry, by why "
            "(max_retries, no_alternative, budget, fallback_cannot_serve).",
            labels=["model", "why"],
        )
        for name, pool in gw.pools.items():
            q = pool.scheduler.queued
            if q is not None:
                queued.add_metric([name], q)
            for code, count in pool.scheduler.rejected.items():
                rejected.add_metric([name, code], count)
            res = gw.resilience.get(name)
            if res is not None:
                for reason, count in res.retries_by_reason.items():
                    retries.add_metric([name, reason if reason in KNOWN_CODES else "other"], count)
                for why, count in res.gave_up.items():
                    gave_up.add_metric([name, why], count)
            for e in pool.endpoints:
                labels = [name, e.name]
                in_flight.add_metric(labels, e.in_flight)
                in_flight_tokens.add_metric(labels, e.in_flight_tokens)
                limit.add_metric(labels, e.limit or 0)
                healthy.add_metric(labels, 1 if e.healthy else 0)
                ejected.add_metric(labels, 1 if e.ejected else 0)
                ejections.add_metric(labels, e.ejections)
                completed.add_metric(labels, e.completed)
                errors.add_metric(labels, e.errors)
                load = e.load
                weight.add_metric(labels, e.load_weight)
                if load is not None:
                    running.add_metric(labels, load.running)
                    waiting.add_metric(labels, load.waiting)
                    if load.kv_usage is not None:
                        kv.add_metric(labels, load.kv_usage)
                    if load.prefix_queries is not None:
                        pq.add_metric(labels, load.prefix_queries)
                    if load.prefix_hits is not None:
                        ph.add_metric(labels, load.prefix_hits)
        yield from (in_flight, in_flight_tokens, limit, healthy, completed, errors, queued)
        yield from (running, waiting, kv, pq, ph, weight, rejected, ejected, ejections, retries, gave_up)
        yield from _kv_event_metrics(gw)
        yield from self._degradation()
        yield from self._engines()
        yield from self._cache()
        yield from self._stores()
        yield from self._governance()
        yield from self._batches()
        yield from self._fleet()
        yield from self._discovery()
        yield from self._autoscaling()
        yield from self._hardware()

    def _stores(self) -> Iterable[Metric]:
        stores = shared_stores(self.view)
        if not stores:
            return
        degraded = _gauge(
            "shuniu_store_degraded",
            "1 while a shared store (rate limits, response cache) answers without its server.",
            ["store"],
        )
        for name, flag in stores.items():
            degraded.add_metric([name], 1 if flag else 0)
        yield degraded

    def _batches(self) -> Iterable[Metric]:
        runner = self.view.batches
        if runner is None:
            return
        batches = _gauge("shuniu_batches", "Unfinished batches in the queue, by status.", ["status"])
        for status in ("in_progress", "cancelling", "finalizing"):
            batches.add_metric([status], runner.batches.get(status, 0))
        requests = _gauge(
            "shuniu_batch_requests",
            "Requests of unfinished batches, by state (as of the last poll).",
            ["state"],
        )
        for state in ("pending", "running", "done", "failed"):
            requests.add_metric([state], runner.states.get(state, 0))
        running = _gauge("shuniu_batch_requests_running_here", "Batch requests this gateway runs now.", [])
        running.add_metric([], len(runner.running))
        finished = CounterMetricFamily(
            "shuniu_batch_requests_finished",
            "Batch requests this gateway ran to an end, by outcome.",
            labels=["outcome"],
        )
        for outcome, n in sorted(runner.finished.items()):
            finished.add_metric([outcome], n)
        yield from (batches, requests, running, finished)

    def _governance(self) -> Iterable[Metric]:
        governance = self.view.governance
        if governance is None:
            return
        ledger = governance.ledger
        if ledger is not None:
            for name, text, value in (
                (
                    "shuniu_ledger_records",
                    "Records the usage ledger committed to its database.",
                    ledger.written,
                ),
                (
                    "shuniu_ledger_dropped",
                    "Records dropped because the ledger's buffer was full.",
                    ledger.dropped,
                ),
                (
                    "shuniu_ledger_write_errors",
                    "Ledger writes that failed (records kept, retried).",
                    ledger.write_errors,
                ),
            ):
                counter = CounterMetricFamily(name, text)
                counter.add_metric([], value)
                yield counter
            buffered = _gauge("shuniu_ledger_buffered", "Records waiting to be written to the ledger.", [])
            buffered.add_metric([], ledger.buffered)
            degraded = _gauge("shuniu_ledger_degraded", "1 while the ledger's database fails writes.", [])
            degraded.add_metric([], 1 if ledger.degraded else 0)
            yield buffered
            yield degraded
        budgets = governance.budgets
        for name, text, counts in (
            ("shuniu_budget_warnings", "Requests that passed a budget's soft threshold.", budgets.warnings),
            (
                "shuniu_budget_refusals",
                "Requests refused by a budget (429 budget_exceeded).",
                budgets.refusals,
            ),
        ):
            family = CounterMetricFamily(name, text, labels=["level", "period"])
            for (level, period), n in sorted(counts.items()):
                family.add_metric([level, period], n)
            yield family
        if governance.keys is not None:
            keys = _gauge("shuniu_managed_keys", "Keys managed at run time that authenticate now.", [])
            keys.add_metric([], len(governance.keys.table))
            yield keys

    def _fleet(self) -> Iterable[Metric]:
        fleet = self.fleet
        if fleet is None:
            return
        degraded = _gauge("shuniu_fleet_degraded", "1 while the fleet's store cannot be reached.", [])
        degraded.add_metric([], 1 if fleet.degraded else 0)
        peers = _gauge("shuniu_fleet_peers", "Other gateways of the fleet heard from recently.", [])
        peers.add_metric([], len(fleet.status(0.0)["peers"]))
        syncs = CounterMetricFamily("shuniu_fleet_syncs", "Exchanges with the fleet's store.")
        syncs.add_metric([], fleet.syncs)
        failures = CounterMetricFamily("shuniu_fleet_sync_failures", "Exchanges that failed.")
        failures.add_metric([], fleet.failures)
        remote = _gauge(
            "shuniu_fleet_remote_in_flight_requests",
            "Requests the fleet's other gateways have in flight on the endpoint.",
            ["model", "endpoint"],
        )
        for name, pool in self.view.pools.items():
            for e in pool.endpoints:
                remote.add_metric([name, e.name], e.remote_in_flight)
        yield from (degraded, peers, syncs, failures, remote)

    def _discovery(self) -> Iterable[Metric]:
        entries = self.discoveries.entries if self.discoveries is not None else ()
        if not entries:
            return
        endpoints = _gauge(
            "shuniu_discovery_endpoints",
            "Endpoints a discovery entry found, by state (serving, starting: waiting for its "
            "health probe, draining, not_ready: targets not ready to join).",
            ["model", "entry", "state"],
        )
        failures = CounterMetricFamily(
            "shuniu_discovery_failures",
            "Times the entry's discovery source failed (its endpoints were kept).",
            labels=["model", "entry"],
        )
        up = _gauge(
            "shuniu_discovery_up", "1 while the entry's discovery source answers.", ["model", "entry"]
        )
        for e in entries:
            for state, count in e.counts().items():
                endpoints.add_metric([e.model, e.prefix, state], count)
            failures.add_metric([e.model, e.prefix], e.failures)
            up.add_metric([e.model, e.prefix], 0 if e.error else 1)
        yield from (endpoints, failures, up)

    def _autoscaling(self) -> Iterable[Metric]:
        scaled = [(name, pool.scaling) for name, pool in self.view.pools.items() if pool.scaling is not None]
        if not scaled:
            return
        m = ["model"]
        desired = _gauge(
            "shuniu_pool_desired_replicas",
            "Engine replicas the pool needs to meet its SLO at the rate forecast lead_time_s "
            "ahead (within min/max_replicas; the current count until a capacity is known).",
            m,
        )
        demand = _gauge(
            "shuniu_pool_replica_demand",
            "Replicas' worth of work this gateway sees, unrounded: max(rate, forecast) x "
            "(1 + headroom) / replica capacity. Sum it over gateways and workers for a fleet.",
            m,
        )
        rate = _gauge("shuniu_pool_arrival_rate", "Requests per second arriving now (fitted).", m)
        forecast = _gauge(
            "shuniu_pool_forecast_arrival_rate", "Requests per second forecast lead_time_s ahead.", m
        )
        capacity = _gauge(
            "shuniu_pool_replica_capacity",
            "Requests per second one replica serves within the SLO at the observed token mix.",
            m,
        )
        replicas = _gauge("shuniu_pool_replicas", "Endpoints in the pool now (not draining).", m)
        prompt = _gauge("shuniu_pool_mean_prompt_tokens", "Mean prompt length over the window.", m)
        output = _gauge("shuniu_pool_mean_output_tokens", "Mean answer length over the window.", m)
        share = _gauge(
            "shuniu_pool_cached_prompt_share",
            "Share of prompt tokens the engines found in their prefix caches (smoothed).",
            m,
        )
        ready = _gauge(
            "shuniu_pool_autoscaling_ready",
            "1 when the desired count comes from a known capacity (0: holding the current count).",
            m,
        )
        for name, sig in scaled:
            labels = [name]
            desired.add_metric(labels, sig.desired)
            rate.add_metric(labels, sig.rate)
            forecast.add_metric(labels, sig.forecast)
            replicas.add_metric(labels, sig.replicas)
            ready.add_metric(labels, 1 if sig.state == "ready" else 0)
            if sig.demand is not None:
                demand.add_metric(labels, sig.demand)
            if sig.capacity is not None:
                capacity.add_metric(labels, sig.capacity)
            if sig.mix is not None:
                prompt.add_metric(labels, sig.mix.prompt_tokens)
                output.add_metric(labels, sig.mix.output_tokens)
                share.add_metric(labels, sig.mix.cached_share)
        yield from (desired, demand, rate, forecast, capacity, replicas, prompt, output, share, ready)

    def _degradation(self) -> Iterable[Metric]:
        monitor = self.view.overload
        count = CounterMetricFamily(
            "shuniu_degraded_requests",
            "Requests a tier's overload degradation changed, by action (max_tokens, route, shed).",
            labels=["model", "tier", "action"],
        )
        for (model, tier, action), n in monitor.degraded_requests.items():
            count.add_metric([model, tier, action], n)
        state = _gauge(
            "shuniu_tier_degraded", "1 while the tier is degraded on the model.", ["model", "tier"]
        )
        for model, tier in monitor.degraded_pairs:
            state.add_metric([model, tier], 1)
        yield count
        yield state

    def _engines(self) -> Iterable[Metric]:
        engines = self.view.engines
        if not engines:
            return
        up = _gauge("shuniu_managed_engine_up", "1 while a launched engine process is ready.", ["endpoint"])
        restarts = CounterMetricFamily(
            "shuniu_managed_engine_restarts", "Restarts of a launched engine.", labels=["endpoint"]
        )
        for name, engine in engines.items():
            snap = engine.snapshot()
            up.add_metric([name], 1 if snap.get("state") == "ready" else 0)
            restarts.add_metric([name], snap.get("restarts", 0) or 0)
        yield up
        yield restarts

    def _cache(self) -> Iterable[Metric]:
        cache = self.view.cache
        if cache is None:
            return
        for name, value, doc in (
            ("shuniu_cache_hits", cache.hits, "Requests answered from the response cache."),
            (
                "shuniu_cache_misses",
                cache.misses,
                "Cacheable requests that asked an engine and filled the cache.",
            ),
            (
                "shuniu_cache_coalesced",
                cache.coalesced,
                "Misses answered by a concurrent identical request's fill.",
            ),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c

    def _hardware(self) -> Iterable[Metric]:
        snapshot = self.hardware.readings
        if not snapshot:
            return
        labels = ["kind", "device", "name", "uuid"]
        fields: list[tuple[str, str, Callable[[dict[str, Any]], Any]]] = [
            (
                "shuniu_device_memory_used_bytes",
                "Device memory in use.",
                lambda d: d.get("memory_used_bytes"),
            ),
            ("shuniu_device_memory_total_bytes", "Device memory.", lambda d: d.get("memory_total_bytes")),
            (
                "shuniu_device_utilization_ratio",
                "Device busy fraction, 0..1.",
                lambda d: d.get("utilization"),
            ),
            ("shuniu_device_temperature_celsius", "Device temperature.", lambda d: d.get("temperature_c")),
            ("shuniu_device_power_watts", "Device power draw.", lambda d: d.get("power_w")),
        ]
        families = [(_gauge(n, doc, labels), get) for n, doc, get in fields]
        for probe in snapshot.get("probes", []):
            if not probe.get("available"):
                continue
            for d in probe.get("devices", []):
                key = [
                    str(d.get("kind", probe.get("probe"))),
                    str(d.get("index")),
                    str(d.get("name", "")),
                    str(d.get("uuid") or ""),  # joins with DCGM's UUID label
                ]
                for family, get in families:
                    value = get(d)
                    if value is not None and not (isinstance(value, float) and math.isnan(value)):
                        family.add_metric(key, float(value))
        for family, _ in families:
            yield family
