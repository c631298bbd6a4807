"""Forwarding to ``trtllm-serve`` (TensorRT-LLM's OpenAI-compatible server) and reading its
load.

The request path is the ``openai`` backend's (pooled keep-alive aiohttp connections with
TCP_NODELAY, the client's body forwarded, error mapping, SSE parsing, usage always asked
for); this subclass adds what ``trtllm-serve`` has beyond the OpenAI API: ``/health``, the
served model in ``/v1/models``, and its load, from the JSON iteration statistics of
``/metrics`` or from ``/prometheus/metrics``.

``/metrics`` is unusual: every read drains the server's queue of iteration statistics and
then waits until no new iteration arrived for 2 s before answering, so one read takes
seconds. It is therefore read by a background task, never on the gateway's load poll: the
poll gets the latest snapshot at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from dataclasses import replace
from typing import Any, ClassVar

import aiohttp
import msgspec

from shuniu.backends.http import (
    PROBE_ERRORS,
    OpenAIEngine,
    OpenAIOptions,
    ProbeError,
    Prober,
    describe_error,
    probe_headers,
)
from shuniu.backends.trtllm.metrics import MetricsError, StatsView, parse_trtllm_prometheus
from shuniu.backends.trtllm.options import TrtllmOptions
from shuniu.core.contracts import GENERATION, EndpointSpec
from shuniu.core.types import EndpointLoad, Health, InferenceRequest

__all__ = ["TrtllmServeBackend", "engine_priority"]

_STATS_MIN_INTERVAL_S = 0.5
"""Shortest time between two statistics reads (an idle server may answer ``[]`` at once)."""
_STATS_RETRY_S = 1.0
"""Wait after a failed statistics read."""


def engine_priority(priority: int) -> float:
    """The gateway's priority (smaller runs first, 0 the default) as ``trtllm-serve``'s
    (0..1, higher first, 0.5 the default): monotonic, 0 maps to 0.5."""
    return round(0.5 - math.atan(priority) / math.pi, 6)


class TrtllmServeBackend(OpenAIEngine):
    serves: frozenset[str] = GENERATION
    kind: ClassVar[str] = "trtllm"
    discovery: ClassVar[str | None] = "GET /v1/models"

    def __init__(self, spec: EndpointSpec) -> None:
        opts = spec.options
        assert isinstance(opts, TrtllmOptions)
        # The openai backend forwards to an API root; ours is the server root (for /health
        # and /metrics), so it gets its own options with every field it knows, at /v1.
        api = OpenAIOptions.model_validate(
            {
                **{name: getattr(opts, name) for name in OpenAIOptions.model_fields},
                "base_url": f"{opts.base_url}/v1",
                "health_path": "/models",
            }
        )
        super().__init__(replace(spec, options=api))
        self.trtllm_options = opts
        self.public_model = spec.model
        self._models_url = f"{opts.base_url}/v1/models"
        self._health_url = opts.health_url
        self._stats_url = opts.base_url + opts.stats_path
        self._prometheus_url = opts.prometheus_url
        self.prober = Prober(
            lambda: self._session, probe_headers(opts.headers, opts.api_key), opts.probe_timeout_s
        )
        # auto resolves on the first load() read (see load()).
        self._source: str = "auto" if opts.load_from == "auto" else opts.load_source
        self.served_model: str | None = None
        """The upstream model name once ``/v1/models`` confirmed it."""
        self.model_problem: str | None = None
        """Why ``/v1/models`` did not settle the served model (health reports it)."""
        self._send_model = opts.model or spec.model  # until /v1/models says otherwise
        self._stats = StatsView()
        self._stats_load: EndpointLoad | None = None
        self._stats_at = 0.0
        self.stats_problem: str | None = None
        """Why the last statistics read gave nothing (shown when ``load()`` fails)."""
        self._poller: asyncio.Task[None] | None = None

    # -- lifecycle and probes ---------------------------------------------------------------

    async def start(self) -> None:
        """Open the pool, read the served model from ``/v1/models`` (a server that is not up
        yet is not an error: health checks read it later), and start the statistics reader."""
        await super().start()  # runs discover() once (/v1/models)
        if self._source == "stats":
            self._start_poller()

    def _start_poller(self) -> None:
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll_stats(), name=f"trtllm-stats-{self.name}")

    async def stop(self) -> None:
        await self._stop_poller()
        await super().stop()

    async def _stop_poller(self) -> None:
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller

    def _discovery_failed(self, problem: str) -> None:
        self.model_problem = problem

    async def discover(self) -> None:
        """Read ``/v1/models`` and settle the model name sent upstream. Raises on transport
        errors and non-200 answers."""
        data = await self.prober.fetch_json(self._models_url, "GET /v1/models")
        listed = data.get("data") if isinstance(data, dict) else None
        entries = [e for e in listed or () if isinstance(e, dict) and isinstance(e.get("id"), str)]
        ids = [e["id"] for e in entries]
        configured = self.trtllm_options.model
        entry: dict[str, Any] | None = None
        if configured is not None:
            entry = next((e for e in entries if e["id"] == configured), None)
            served = ", ".join(ids) or "no models"
            self.model_problem = None if entry else f"the server serves {served}, not {configured!r}"
        else:
            entry = next((e for e in entries if e["id"] == self.public_model), None)
            if entry is None and len(entries) == 1:
                entry = entries[0]
            if entry is not None:
                self.model_problem = None
            elif entries:
                self.model_problem = f"the server serves several models ({', '.join(ids)}); set options.model"
            else:
                self.model_problem = "the server lists no models in /v1/models"
        if entry is None:
            return
        self.served_model = self._send_model = entry["id"]
        if self.max_model_len is None and isinstance(entry.get("max_model_len"), int):
            self.max_model_len = entry["max_model_len"]

    async def health(self) -> Health:
        """``/health`` answers 200 (trtllm-serve answers 503 once its executor died), and the
        served model is known (``/v1/models`` is read until it is)."""
        pending = self._read_served_model if self.served_model is None else None
        return await self.prober.health(self._health_url, started=self._session is not None, pending=pending)

    async def _read_served_model(self) -> str | None:
        await self.discover()
        return None if self.served_model is not None else self.model_problem or "no served model"

    # -- load -------------------------------------------------------------------------------

    @property
    def load_source(self) -> str:
        """Where the load is read: ``stats``, ``prometheus``, ``none``, or ``auto`` until
        the first read settled it."""
        return self._source

    async def load(self) -> EndpointLoad | None:
        """The engine's load: a fresh ``/prometheus/metrics`` scrape (``prometheus``), the
        latest iteration-statistics snapshot (``stats``), or ``None`` (``none``: the
        gateway then counts its own requests). Raises when there is no usable snapshot;
        the gateway ages the last one.

        ``auto`` decides from ``/prometheus/metrics``: no such page (404) means a server
        without ``return_perf_metrics``: ``stats`` from then on. A page with TensorRT-LLM's
        load gauges settles on ``prometheus`` (such a server's own collector drains the
        statistics ``/metrics`` would show). A page without them (no iteration yet, or a
        release whose page has per-request metrics only) leaves it open, with the
        statistics read meanwhile."""
        if self._source == "none":
            return None
        if self._source == "stats":
            return self._stats_snapshot()
        status, raw = await self.prober.get(self._prometheus_url)
        if self._source == "prometheus":
            if status != 200:
                raise ProbeError(f"GET {self._prometheus_url}: HTTP {status}")
            return parse_trtllm_prometheus(raw)
        if status == 404:
            self._source = "stats"
            self._start_poller()
            return self._stats_snapshot()
        if status != 200:
            raise ProbeError(f"GET {self._prometheus_url}: HTTP {status}")
        try:
            snap = parse_trtllm_prometheus(raw)
        except MetricsError:
            self._start_poller()
            return self._stats_snapshot()
        self._source = "prometheus"
        await self._stop_poller()
        return snap

    def _stats_snapshot(self) -> EndpointLoad:
        snap = self._stats_load
        if snap is None:
            raise ProbeError(self.stats_problem or "no iteration statistics read yet")
        age = asyncio.get_running_loop().time() - self._stats_at
        if age > self.trtllm_options.stats_max_age_s:
            why = f" ({self.stats_problem})" if self.stats_problem else ""
            raise ProbeError(f"the last iteration statistics are {age:.1f} s old{why}")
        return snap

    async def _poll_stats(self) -> None:
        """Read ``stats_path`` over and over; keep the latest load and when it arrived."""
        loop = asyncio.get_running_loop()
        timeout = aiohttp.ClientTimeout(total=self.trtllm_options.stats_timeout_s)
        path = self.trtllm_options.stats_path
        while True:
            started = loop.time()
            ok = False
            try:
                if self._session is None:
                    return
                status, raw = await self.prober.get(self._stats_url, timeout)
                if status != 200:
                    raise ProbeError(f"GET {path}: HTTP {status}")
                entries = msgspec.json.decode(raw)
                if not isinstance(entries, list):
                    raise ProbeError(f"GET {path}: not a JSON list")
                self._stats_load = self._stats.update(entries)
                self._stats_at = loop.time()
                self.stats_problem = None
                ok = True
            except (ProbeError, MetricsError) as exc:
                self.stats_problem = str(exc)
            except PROBE_ERRORS as exc:
                self.stats_problem = f"GET {path}: {describe_error(exc)}"
            pause = _STATS_MIN_INTERVAL_S - (loop.time() - started) if ok else _STATS_RETRY_S
            await asyncio.sleep(max(pause, 0.0))

    # -- the request body -------------------------------------------------------------------

    def prepare_body(self, req: InferenceRequest) -> dict[str, Any]:
        """The client's body as forwarded: the served model name, and ``priority`` mapped
        from the scheduler's (or removed). A shallow copy; ``req.body`` is left alone."""
        body = dict(req.body)
        body["model"] = self._send_model
        if self.trtllm_options.forward_priority:
            body["priority"] = engine_priority(req.priority)
        else:
            body.pop("priority", None)
        return body

    def _payload(self, req: InferenceRequest, stream: bool) -> bytes:
        # The openai backend's body hook: it adds stream options and encodes.
        return super()._payload(msgspec.structs.replace(req, body=self.prepare_body(req)), stream)
