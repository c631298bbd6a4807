"""A protocol-faithful fake of Hugging Face Text Generation Inference (TGI), for tests.

Why this file is long: it is one fake server, and it is kept whole so that it can be read
side by side with TGI's router source and OpenAPI document it was built from (routes,
validation order, error bodies, the batching that the metrics report); split, the
correspondence would be lost.

TGI needs a GPU and cannot run where the suite runs, so the ``tgi`` backend is tested
against this fake, as docs/testing.md describes. It is a FAKE: there is
no model and no tokenizer. A token is a whitespace-separated word of the input, generated
token ``i`` is ``" w{i}"``, and an "engine" step produces one token for every request in
the running batch. Everything a client can observe on the wire is built from TGI's
published API and its router source, read (never copied) at these versions:

- TGI **v3.3.7** (github.com/huggingface/text-generation-inference, tag ``v3.3.7``, commit
  ``dfb3fbe78e0d``):

  - ``docs/openapi.json`` (``info.version`` 3.3.6-dev0): the routes, the request and
    response schemas (``GenerateParameters``, ``StreamResponse``, ``StreamDetails``,
    ``Details``, ``Info``, ``ChatRequest``, ``ChatCompletionChunk``) and the error examples;
  - ``router/src/server.rs``: ``/generate`` (its ``x-prompt-tokens`` ... headers),
    ``/generate_stream`` (HTTP 200 first, then one event per token, errors as events,
    no ``[DONE]``), ``/v1/chat/completions`` (chunks, the usage chunk, ``[DONE]``),
    ``/health`` (503 ``{"error":"unhealthy","error_type":"healthcheck"}``), ``/info``,
    ``/metrics``, the ``--api-key`` check (401 on the generation routes only), the metric
    descriptions and histogram buckets, and the ``InferError`` → HTTP status table
    (422 validation, 424 generation, 429 overloaded, 500 incomplete);
  - ``router/src/lib.rs``: field names, order and defaults (``details`` and ``do_sample``
    false when ``parameters`` is sent, ``max_tokens`` alias ``max_completion_tokens``),
    ``FinishReason`` (``length``, ``eos_token``, ``stop_sequence``; ``stop`` in chat);
  - ``router/src/validation.rs``: the order of the checks and their messages, the default
    ``max_new_tokens`` (the rest of the context window) and the 1,024-token chunk;
  - ``router/src/infer/mod.rs``: the concurrency permit (``Model is overloaded``), the
    ``InferError`` messages and ``error_type`` values, and the Messages API error event
    (``{"error":{"message":...,"http_status_code":422}}`` whatever the error);
  - ``router/src/chat.rs``: one chunk per token, the last with ``finish_reason``;
  - ``backends/v3/src/backend.rs``, ``queue.rs``, ``lib.rs``: when the gauges
    ``tgi_batch_current_size``, ``tgi_batch_current_max_tokens``, ``tgi_queue_size`` and
    ``tgi_batch_max_total_tokens`` move, and ``tgi_request_failure{err="dropped"}``;
  - ``docs/source/reference/metrics.md``: the metric names and types.

- axum 0.7 ``response/sse.rs``: events are ``data:<compact json>\\n\\n`` (no space after the
  colon), keep-alives ``:\\n\\n`` (every 15 s by default), ``text/event-stream``.
- metrics-exporter-prometheus 0.15 (TGI's pin) ``formatting.rs`` and ``recorder.rs``:
  ``# HELP`` only for described metrics, ``# TYPE`` always, a blank line after each
  family, counters as integers, gauges and sums in Rust's float notation, histogram
  buckets then ``+Inf``, ``_sum``, ``_count``; a series appears once first recorded.
- TGI **v1.4.5** ``router/src/lib.rs`` and ``server.rs`` for ``version="1.4.5"``: ``/info``
  with ``max_input_length`` and ``max_batch_total_tokens``, stream details without
  ``input_length``, chat chunks without usage and with TGI's own finish reasons, metrics
  without ``# HELP`` lines or ``tgi_batch_max_total_tokens``.

Not modelled: real tokenization, prefix caching, speculation, best_of, grammars, tools,
images, ``/v1/completions``; ``/tokenize`` and ``/chat_tokenize`` answer in TGI's shape
with the fake's own tokens (whitespace-separated words); axum's JSON rejections are imitated for a few
field types only and their column numbers are not TGI's.

Fault switches for tests (``FakeTGI.fault``): ``overloaded``, ``generation_error`` (after
``fault_after`` tokens), ``drop`` (the connection is cut after ``fault_after`` tokens),
``incomplete`` (the engine stops after ``fault_after`` tokens without an end),
``unhealthy`` (``/health`` answers 503). ``token_delay_s`` and ``prefill_delay_s`` slow the
engine so queue and batch gauges can be watched; ``max_batch_size`` bounds the batch.

Run on its own as a stand-in for ``text-generation-launcher`` (same flag names)::

    python -m tests.fake_tgi --model-id tiny --hostname 127.0.0.1 --port 8080
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from aiohttp import web

__all__ = ["FakeTGI", "Received", "main", "rust_float"]

DEFAULT_GENERATION_LENGTH = 1024
"""validation.rs: a request is scheduled in chunks of at most this many new tokens."""
EOS_TOKEN = {"id": 2, "text": "</s>", "logprob": -0.5, "special": True}
LOGPROB = -0.5
_LE_INF = 'le="+Inf"'
_DESERIALIZE = "Failed to deserialize the JSON body into the target type:"

# The metrics TGI describes (server.rs; the first description of a name wins, as in the
# exporter), and the unit the exporter would use for a suffix (not enabled by TGI).
DESCRIPTIONS = {
    "tgi_request_success": "Number of successful requests",
    "tgi_request_duration": "Request duration",
    "tgi_request_validation_duration": "Request validation duration",
    "tgi_request_queue_duration": "Request queue duration",
    "tgi_request_inference_duration": "Request inference duration",
    "tgi_request_mean_time_per_token_duration": "Mean time per token per request",
    "tgi_request_generated_tokens": "Generated tokens per request",
    "tgi_batch_inference_count": "Inference calls per method (prefill or decode)",
    "tgi_request_count": "Total number of requests",
    "tgi_batch_inference_success": "Number of successful inference calls per method (prefill or decode)",
    "tgi_batch_current_size": "Current batch size",
    "tgi_queue_size": "Current queue size",
    "tgi_batch_current_max_tokens": "Maximum tokens for the current batch",
    "tgi_batch_total_tokens": "Maximum amount of tokens in total.",
    "tgi_request_max_new_tokens": "Maximum new tokens per request",
    "tgi_batch_inference_duration": "Batch inference duration",
    "tgi_batch_forward_duration": "Batch forward duration per method (prefill or decode)",
    "tgi_request_skipped_tokens": "Speculated tokens per request",
    "tgi_batch_filter_duration": (
        "Time spent filtering batches and sending generated tokens per method (prefill or decode)"
    ),
    "tgi_batch_decode_duration": "Time spent decoding a batch per method (prefill or decode)",
    "tgi_request_input_length": "Input token length per request",
    "tgi_batch_next_size": "Batch size of the next batch",
}


def rust_float(value: float) -> str:
    """``value`` as Rust's ``Display`` for f64 writes it (how the exporter writes gauges,
    sums and bucket bounds): no exponent, no trailing ``.0``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value.is_integer():
        return str(int(value))
    return format(Decimal(repr(value)), "f")


def _json(obj: Any) -> str:
    """serde_json's compact form (no spaces, non-ASCII kept)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class TgiError(Exception):
    """One of TGI's ``InferError`` values: its message (Display), ``error_type`` and status."""

    def __init__(self, message: str, error_type: str, status: int) -> None:
        super().__init__(message)
        self.message, self.error_type, self.status = message, error_type, status

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}


def _validation(text: str) -> TgiError:
    return TgiError(f"Input validation error: {text}", "validation", 422)


class _Rejected(Exception):
    """axum's ``Json`` extractor refusing a body before TGI sees it (plain text)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


@dataclass
class Received:
    """One request the fake received."""

    path: str
    body: dict[str, Any] | None
    headers: dict[str, str]
    peer: tuple[str, int] | None = None
    """The client's address and port: one port for many requests means a pooled connection."""


# -- metrics, as metrics-exporter-prometheus renders them --------------------------------


class _Metrics:
    def __init__(self, max_input_tokens: int, max_total_tokens: int, describe: bool) -> None:
        duration = []
        value = 0.0001
        for _ in range(35):  # server.rs: 35 geometric buckets from 0.0001 * 1.5
            value *= 1.5
            duration.append(value)
        self._duration = duration
        self._buckets = {
            "tgi_request_input_length": [(max_input_tokens / 100.0) * (x + 1) for x in range(100)],
            "tgi_request_generated_tokens": [(max_total_tokens / 100.0) * (x + 1) for x in range(100)],
            "tgi_request_max_new_tokens": [(max_total_tokens / 100.0) * (x + 1) for x in range(100)],
            "tgi_batch_next_size": [float(x + 1) for x in range(1024)],
        }
        self.describe = describe
        self.counters: dict[str, dict[tuple[tuple[str, str], ...], int]] = {}
        self.gauges: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        self.histograms: dict[str, dict[tuple[tuple[str, str], ...], list[Any]]] = {}

    def inc(self, name: str, n: int = 1, **labels: str) -> None:
        series = self.counters.setdefault(name, {})
        key = tuple(labels.items())
        series[key] = series.get(key, 0) + n

    def set(self, name: str, value: float) -> None:
        self.gauges.setdefault(name, {})[()] = float(value)

    def add(self, name: str, delta: float) -> None:
        series = self.gauges.setdefault(name, {})
        series[()] = series.get((), 0.0) + delta

    def observe(self, name: str, value: float, **labels: str) -> None:
        bounds = self._buckets.get(name, self._duration if name.endswith("duration") else None)
        assert bounds is not None, name
        series = self.histograms.setdefault(name, {})
        key = tuple(labels.items())
        entry = series.get(key)
        if entry is None:
            entry = series[key] = [[0] * len(bounds), 0.0, 0, bounds]
        for i, bound in enumerate(bounds):
            if value <= bound:
                entry[0][i] += 1
        entry[1] += value
        entry[2] += 1

    def _head(self, out: list[str], name: str, kind: str) -> None:
        if self.describe and name in DESCRIPTIONS:
            out.append(f"# HELP {name} {DESCRIPTIONS[name]}")
        out.append(f"# TYPE {name} {kind}")

    @staticmethod
    def _labels(key: tuple[tuple[str, str], ...], extra: str = "") -> str:
        parts = [f'{k}="{v}"' for k, v in key]
        if extra:
            parts.append(extra)
        return "{" + ",".join(parts) + "}" if parts else ""

    def render(self) -> str:
        # The exporter walks hash maps (the order varies between renders); sorted here, by
        # kind as the exporter groups them: counters, gauges, histograms.
        out: list[str] = []
        for name in sorted(self.counters):
            self._head(out, name, "counter")
            for key, value in self.counters[name].items():
                out.append(f"{name}{self._labels(key)} {value}")
            out.append("")
        for name in sorted(self.gauges):
            self._head(out, name, "gauge")
            for key, gauge in self.gauges[name].items():
                out.append(f"{name}{self._labels(key)} {rust_float(gauge)}")
            out.append("")
        for name in sorted(self.histograms):
            self._head(out, name, "histogram")
            for key, (counts, total, count, bounds) in self.histograms[name].items():
                for bound, n in zip(bounds, counts, strict=True):
                    le = 'le="' + rust_float(bound) + '"'
                    out.append(f"{name}_bucket{self._labels(key, le)} {n}")
                out.append(f"{name}_bucket{self._labels(key, _LE_INF)} {count}")
                out.append(f"{name}_sum{self._labels(key)} {rust_float(total)}")
                out.append(f"{name}_count{self._labels(key)} {count}")
            out.append("")
        return "\n".join(out) + ("\n" if out else "")


# -- the engine: a queue, a running batch, one token per step -----------------------------


@dataclass(eq=False)
class _Seq:
    input_length: int
    max_new: int
    """Tokens this request may generate (the rest of the window when not asked)."""
    chunk: int
    """``max_new_tokens`` as validation.rs records it (at most 1,024 per scheduling)."""
    stop: list[str]
    sampling: bool
    seed: int | None
    queued: float
    out: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    started: float | None = None
    tokens: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""
    cancelled: bool = False

    @property
    def reserved(self) -> int:
        # What the scheduler budgets for the request: its prompt and its (chunked) output.
        return self.input_length + self.chunk


class _Engine:
    def __init__(self, fake: FakeTGI) -> None:
        self.fake = fake
        self.queue: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.reserved = 0
        self.wake = asyncio.Event()

    def append(self, seq: _Seq) -> None:
        self.queue.append(seq)
        self.fake.metrics.add("tgi_queue_size", 1.0)
        self.wake.set()

    def _admit(self) -> list[_Seq]:
        fake, m = self.fake, self.fake.metrics
        admitted: list[_Seq] = []
        while self.queue:
            seq = self.queue[0]
            if seq.cancelled:
                self.queue.popleft()
                m.inc("tgi_request_failure", err="dropped")
                continue
            if fake.max_batch_size is not None and len(self.running) + len(admitted) >= fake.max_batch_size:
                break
            if self.reserved + seq.reserved > fake.max_batch_total_tokens:
                break
            self.queue.popleft()
            seq.started = time.monotonic()
            self.reserved += seq.reserved
            admitted.append(seq)
        if admitted:
            m.observe("tgi_batch_next_size", float(len(admitted)))
            if self.running:
                m.inc("tgi_batch_concat", reason="wait_exceeded")
            m.set("tgi_queue_size", float(len(self.queue)))
        return admitted

    def _token(self, seq: _Seq) -> tuple[dict[str, Any], str | None]:
        i = len(seq.tokens)
        eos_after = self.fake.eos_after
        if eos_after is not None and i >= eos_after:
            token = dict(EOS_TOKEN)
            seq.tokens.append(token)
            return token, "eos_token"
        token = {"id": 1000 + i, "text": f" w{i}", "logprob": LOGPROB, "special": False}
        seq.tokens.append(token)
        seq.text += token["text"]
        if any(seq.text.endswith(s) for s in seq.stop):
            return token, "stop_sequence"
        if len(seq.tokens) >= seq.max_new:
            return token, "length"
        return token, None

    def _finish(self, seq: _Seq) -> None:
        self.running.remove(seq)
        self.reserved -= seq.reserved

    async def run(self) -> None:
        fake, m = self.fake, self.fake.metrics
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.queue or self.running:
                admitted = self._admit()
                self.running.extend(admitted)
                if not self.running:
                    await asyncio.sleep(0.001)  # only cancelled entries were queued
                    continue
                m.set("tgi_batch_current_size", float(len(self.running)))
                m.set("tgi_batch_current_max_tokens", float(self.reserved))
                method = "prefill" if admitted else "decode"
                m.inc("tgi_batch_inference_count", method=method)
                t0 = time.monotonic()
                await asyncio.sleep(fake.prefill_delay_s if admitted else fake.token_delay_s)
                spent = time.monotonic() - t0
                for name in (
                    "tgi_batch_forward_duration",
                    "tgi_batch_decode_duration",
                    "tgi_batch_filter_duration",
                    "tgi_batch_inference_duration",
                ):
                    m.observe(
                        name, spent if name != "tgi_batch_filter_duration" else spent / 10, method=method
                    )
                m.inc("tgi_batch_inference_success", method=method)
                for seq in list(self.running):
                    if seq.cancelled:
                        self._finish(seq)
                        m.inc("tgi_request_failure", err="dropped")
                        continue
                    fault = fake.fault
                    if fault in ("generation_error", "incomplete") and len(seq.tokens) >= fake.fault_after:
                        self._finish(seq)
                        if fault == "generation_error":
                            seq.out.put_nowait(
                                (
                                    "error",
                                    TgiError(
                                        "Request failed during generation: Server error: CUDA out of memory. "
                                        "Tried to allocate 2.00 GiB",
                                        "generation",
                                        424,
                                    ),
                                )
                            )
                        else:
                            seq.out.put_nowait(("incomplete", None))
                        continue
                    token, finish = self._token(seq)
                    if finish is None:
                        seq.out.put_nowait(("token", token))
                    else:
                        self._finish(seq)
                        seq.out.put_nowait(("end", (token, finish)))
            m.set("tgi_batch_current_size", 0.0)
            m.set("tgi_batch_current_max_tokens", 0.0)


# -- the server -----------------------------------------------------------------------------


_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "typical_p")


class FakeTGI:
    """The fake server. ``start()`` runs it on its own event loop in a thread (so a test
    and a ``shuniu serve`` subprocess can both talk to it); :func:`main` runs it alone."""

    def __init__(
        self,
        *,
        model_id: str = "fake/tiny-llama",
        version: str = "3.3.7",
        max_input_tokens: int = 1024,
        max_total_tokens: int = 2048,
        max_batch_total_tokens: int = 16384,
        max_batch_size: int | None = None,
        max_concurrent_requests: int = 128,
        max_stop_sequences: int = 4,
        max_best_of: int = 2,
        api_key: str | None = None,
        token_delay_s: float = 0.0,
        prefill_delay_s: float = 0.0,
        keepalive_s: float = 15.0,
        eos_after: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if version not in ("3.3.7", "1.4.5"):
            raise ValueError("version must be 3.3.7 or 1.4.5")
        if max_batch_total_tokens < max_total_tokens:
            # TGI refuses to start so: one request could never fit the batch.
            raise ValueError("max_batch_total_tokens must be at least max_total_tokens")
        self.model_id = model_id
        self.version = version
        self.legacy = version == "1.4.5"
        self.max_input_tokens = max_input_tokens
        self.max_total_tokens = max_total_tokens
        self.max_batch_total_tokens = max_batch_total_tokens
        self.max_batch_size = max_batch_size
        self.max_concurrent_requests = max_concurrent_requests
        self.max_stop_sequences = max_stop_sequences
        self.max_best_of = max_best_of
        self.api_key = api_key
        self.token_delay_s = token_delay_s
        self.prefill_delay_s = prefill_delay_s
        self.keepalive_s = keepalive_s
        self.eos_after = eos_after
        self.host = host
        self.port = port
        self.fault: str | None = None
        """``overloaded``, ``generation_error``, ``drop``, ``incomplete``, ``unhealthy``."""
        self.fault_after = 2
        self.requests: list[Received] = []
        self.in_flight = 0
        self.tokenize_calls = 0
        """Requests to ``/tokenize`` and ``/chat_tokenize``."""
        self.metrics = _Metrics(max_input_tokens, max_total_tokens, describe=not self.legacy)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._engine: _Engine | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- running ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/generate_stream", self.generate_stream)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/chat_tokenize", self.chat_tokenize)
        app.router.add_get("/info", self.info)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_page)
        return app

    async def serve(self, started: Callable[[], None] | None = None) -> None:
        """Serve until :meth:`stop` (or the loop ends)."""
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._engine = _Engine(self)
        engine_task = asyncio.create_task(self._engine.run())
        if not self.legacy:
            # lib.rs: set once the model is warmed up, before any request.
            self.metrics.set("tgi_batch_max_total_tokens", float(self.max_batch_total_tokens))
        # A stopped fake does not wait for requests still generating (tests stop it mid-way).
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if started is not None:
            started()
        try:
            await self._stop.wait()
        finally:
            engine_task.cancel()
            await runner.cleanup()

    def start(self) -> FakeTGI:
        """Serve from a daemon thread; returns once listening."""

        def run() -> None:
            try:
                asyncio.run(self.serve(self._ready.set))
            except BaseException as exc:  # reported by start()
                self._error = exc
                self._ready.set()

        self._thread = threading.Thread(target=run, name="fake-tgi", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise RuntimeError(f"the fake TGI did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's loop (for reading its state from a test thread)."""
        assert self.loop is not None

        async def wrapped() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(10)

    def metrics_text(self) -> str:
        return str(self.call(self.metrics.render))

    # -- helpers ----------------------------------------------------------------------------

    def _record(self, request: web.Request, body: dict[str, Any] | None) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        self.requests.append(
            Received(request.path, body, dict(request.headers), tuple(peer) if peer else None)
        )

    def _authorized(self, request: web.Request) -> bool:
        if self.api_key is None:
            return True
        return request.headers.get("authorization", "").lower() == f"bearer {self.api_key}".lower()

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        """The JSON body as axum's ``Json`` extractor takes it, or :class:`_Rejected`."""
        if not request.content_type.startswith("application/json"):
            raise _Rejected(415, "Expected request with `Content-Type: application/json`")
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise _Rejected(400, f"Failed to parse the request body as JSON: {exc}") from None
        if not isinstance(body, dict):
            raise _Rejected(422, f"{_DESERIALIZE} invalid type: expected a map")
        return body

    @staticmethod
    def _deserialize_error(path: str, what: str, raw_len: int) -> _Rejected:
        return _Rejected(
            422,
            f"{_DESERIALIZE} {path}: {what} at line 1 column {raw_len}",
        )

    def _check_types(self, fields: dict[str, Any], prefix: str, raw_len: int) -> None:
        """serde's type checks for the numeric and list fields the fake reads."""
        unsigned = ("max_new_tokens", "max_tokens", "max_completion_tokens", "seed", "top_k", "top_n_tokens")
        for key, value in fields.items():
            path = f"{prefix}{key}"
            if value is None:
                continue
            if key in unsigned:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise self._deserialize_error(
                        path, f"invalid type: {_kind(value)}, expected u32", raw_len
                    )
                if value < 0:
                    expected = "u64" if key == "seed" else "u32"
                    raise self._deserialize_error(
                        path, f"invalid value: integer `{value}`, expected {expected}", raw_len
                    )
            elif key in ("temperature", "top_p", "typical_p", "frequency_penalty", "repetition_penalty"):
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise self._deserialize_error(
                        path, f"invalid type: {_kind(value)}, expected f32", raw_len
                    )
            elif key == "stop" and not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
                raise self._deserialize_error(
                    path, f"invalid type: {_kind(value)}, expected a sequence", raw_len
                )
            elif key in ("details", "do_sample", "decoder_input_details", "stream") and not isinstance(
                value, bool
            ):
                raise self._deserialize_error(
                    path, f"invalid type: {_kind(value)}, expected a boolean", raw_len
                )

    def _validate(self, inputs: str, params: dict[str, Any], stream: bool) -> _Seq:
        """validation.rs ``validate`` (and generate_stream_internal's checks), in its order."""
        best_of = params.get("best_of") or 1
        if stream and best_of != 1:
            raise _validation("`best_of` != 1 is not supported when streaming tokens")
        if stream and params.get("decoder_input_details"):
            raise _validation("`decoder_input_details` == true is not supported when streaming tokens")
        sampling = bool(params.get("do_sample")) or any(params.get(k) is not None for k in _SAMPLING_KEYS)
        if best_of > 1 and not sampling:
            raise _validation("you must use sampling when `best_of` is > 1")
        if best_of > self.max_best_of:
            raise _validation(f"`best_of` must be > 0 and <= {self.max_best_of}. Given: {best_of}")
        temperature = params.get("temperature")
        if temperature is not None and temperature <= 0:
            raise _validation("`temperature` must be strictly positive")
        repetition = params.get("repetition_penalty")
        if repetition is not None and repetition <= 0:
            raise _validation("`repetition_penalty` must be strictly positive")
        frequency = params.get("frequency_penalty")
        if frequency is not None and not -2.0 <= frequency <= 2.0:
            raise _validation("`frequency_penalty` must be >= -2.0 and <= 2.0")
        top_p = params.get("top_p")
        if top_p is not None and not 0.0 < top_p < 1.0:
            raise _validation("`top_p` must be > 0.0 and < 1.0")
        typical_p = params.get("typical_p")
        if typical_p is not None and not 0.0 < typical_p < 1.0:
            raise _validation("`typical_p` must be > 0.0 and < 1.0")
        top_k = params.get("top_k")
        if top_k is not None and top_k <= 0:
            raise _validation("`top_k` must be strictly positive")
        max_new_tokens = params.get("max_new_tokens")
        if max_new_tokens == 0:
            raise _validation("`max_new_tokens` must be strictly positive")
        stop = params.get("stop") or []
        if len(stop) > self.max_stop_sequences:
            raise _validation(
                f"`stop` supports up to {self.max_stop_sequences} stop sequences. Given: {len(stop)}"
            )
        seed = params.get("seed")
        if seed is not None and best_of > 1:
            raise _validation("`seed` must not be set when `best_of` > 1")
        if not inputs:
            raise _validation("`inputs` cannot be empty")
        truncate = params.get("truncate")
        if truncate is not None and (truncate == 0 or truncate > self.max_input_tokens):
            raise _validation(
                "`truncate` must be strictly positive and less than "
                f"{self.max_input_tokens}. Given: {truncate}"
            )
        input_length = len(inputs.split())  # the fake's "tokenizer"
        if truncate is not None:
            input_length = min(input_length, truncate)
        if max_new_tokens is not None:
            chunk, total_new = min(max_new_tokens, DEFAULT_GENERATION_LENGTH), max_new_tokens
        else:
            total_new = max(0, self.max_total_tokens - input_length)
            chunk = min(total_new, DEFAULT_GENERATION_LENGTH)
        if input_length + chunk > self.max_total_tokens:
            raise _validation(
                f"`inputs` tokens + `max_new_tokens` must be <= {self.max_total_tokens}. "
                f"Given: {input_length} `inputs` tokens and {chunk} `max_new_tokens`"
            )
        if input_length > self.max_input_tokens:
            raise _validation(
                f"`inputs` must have less than {self.max_input_tokens} tokens. Given: {input_length}"
            )
        self.metrics.observe("tgi_request_input_length", float(input_length))
        self.metrics.observe("tgi_request_max_new_tokens", float(chunk))
        if sampling and seed is None:
            seed = random.getrandbits(63)
        # Chunked requests are continued until the window is full (infer/mod.rs).
        max_new = max(1, min(total_new, self.max_total_tokens - input_length))
        return _Seq(
            input_length=input_length,
            max_new=max_new,
            chunk=chunk,
            stop=list(stop),
            sampling=sampling,
            seed=seed if sampling else None,
            queued=time.monotonic(),
        )

    def _acquire(self) -> None:
        """infer/mod.rs: a permit of ``--max-concurrent-requests`` before validation."""
        if self.fault == "overloaded" or self.in_flight >= self.max_concurrent_requests:
            self.metrics.inc("tgi_request_failure", err="overloaded")
            raise TgiError("Model is overloaded", "overloaded", 429)
        self.in_flight += 1

    def _start(self, inputs: str, params: dict[str, Any], stream: bool) -> _Seq:
        """Permit, validation, queue: what ``Infer::generate_stream`` does before tokens."""
        self._acquire()
        try:
            seq = self._validate(inputs, params, stream)
        except TgiError:
            self.in_flight -= 1
            self.metrics.inc("tgi_request_failure", err="validation")
            raise
        assert self._engine is not None
        self._engine.append(seq)
        return seq

    def _succeeded(self, seq: _Seq, begun: float) -> None:
        m, now = self.metrics, time.monotonic()
        started = seq.started or now
        inference = now - started
        m.inc("tgi_request_success")
        m.observe("tgi_request_duration", now - begun)
        m.observe("tgi_request_validation_duration", max(0.0, seq.queued - begun))
        m.observe("tgi_request_queue_duration", max(0.0, started - seq.queued))
        m.observe("tgi_request_inference_duration", inference)
        m.observe("tgi_request_mean_time_per_token_duration", inference / max(1, len(seq.tokens)))
        m.observe("tgi_request_generated_tokens", float(len(seq.tokens)))

    def _generated_text(self, seq: _Seq) -> str:
        return "".join(t["text"] for t in seq.tokens if not t["special"])

    def _stream_details(self, seq: _Seq, finish: str) -> dict[str, Any]:
        details: dict[str, Any] = {
            "finish_reason": finish,
            "generated_tokens": len(seq.tokens),
            "seed": seq.seed,
        }
        if not self.legacy:
            details["input_length"] = seq.input_length
        return details

    async def _next(self, seq: _Seq, resp: web.StreamResponse | None) -> tuple[str, Any]:
        """The engine's next output for ``seq``; keep-alive comments while it is slow."""
        while True:
            try:
                return await asyncio.wait_for(seq.out.get(), self.keepalive_s)
            except TimeoutError:
                if resp is not None:
                    await resp.write(b":\n\n")

    @staticmethod
    async def _event(resp: web.StreamResponse, data: Any) -> None:
        text = data if isinstance(data, str) else _json(data)
        await resp.write(b"data:" + text.encode() + b"\n\n")

    def _sse(self, inputs: str) -> web.StreamResponse:
        return web.StreamResponse(
            status=200,
            headers={
                "content-type": "text/event-stream",
                "cache-control": "no-cache",
                "x-compute-type": "gpu+optimized",
                "x-compute-characters": str(len(inputs)),
                "x-accel-buffering": "no",
            },
        )

    @staticmethod
    def _cut(request: web.Request) -> None:
        """The ``drop`` fault: the connection goes away mid-body."""
        if request.transport is not None:
            request.transport.abort()

    # -- native API -------------------------------------------------------------------------

    async def _parse_generate(self, request: web.Request) -> tuple[str, dict[str, Any], int]:
        body = await self._body(request)
        raw_len = request.content_length or 0
        self._record(request, body)
        inputs = body.get("inputs")
        if not isinstance(inputs, str):
            what = (
                "missing field `inputs`"
                if inputs is None
                else f"inputs: invalid type: {_kind(inputs)}, expected a string"
            )
            raise _Rejected(
                422,
                f"{_DESERIALIZE} {what} at line 1 column {raw_len}",
            )
        params = body.get("parameters")
        if params is None:
            # lib.rs default_parameters(): sampling on, no details.
            params = {"do_sample": True, "details": False}
        if not isinstance(params, dict):
            raise self._deserialize_error(
                "parameters", f"invalid type: {_kind(params)}, expected struct GenerateParameters", raw_len
            )
        self._check_types(params, "parameters.", raw_len)
        return inputs, params, raw_len

    async def generate(self, request: web.Request) -> web.StreamResponse:
        begun = time.monotonic()
        if not self._authorized(request):
            return web.Response(status=401)  # axum's auth layer: the handler never runs
        self.metrics.inc("tgi_request_count")
        try:
            inputs, params, _ = await self._parse_generate(request)
            seq = self._start(inputs, params, stream=False)
        except _Rejected as exc:
            return web.Response(status=exc.status, text=exc.text)
        except TgiError as exc:
            return _json_response(exc.body(), status=exc.status)
        try:
            while True:
                kind, value = await self._next(seq, None)
                if kind == "token":
                    continue
                if kind == "error":
                    self.metrics.inc("tgi_request_failure", err="generation")
                    return _json_response(value.body(), status=value.status)
                if kind == "incomplete":
                    self.metrics.inc("tgi_request_failure", err="incomplete")
                    err = TgiError("Incomplete generation", "incomplete_generation", 500)
                    return _json_response(err.body(), status=500)
                break
        finally:
            seq.cancelled = True  # no-op once finished; drops it if the client went away
            self.in_flight -= 1
        _, finish = value
        self._succeeded(seq, begun)
        out: dict[str, Any] = {"generated_text": self._generated_text(seq)}
        if params.get("details") or params.get("decoder_input_details"):
            prefill: list[dict[str, Any]] = []
            if params.get("decoder_input_details"):
                prefill = [
                    {"id": 100 + i, "text": word, "logprob": None if i == 0 else LOGPROB}
                    for i, word in enumerate(inputs.split()[: seq.input_length])
                ]
            out["details"] = {
                "finish_reason": finish,
                "generated_tokens": len(seq.tokens),
                "seed": seq.seed,
                "prefill": prefill,
                "tokens": seq.tokens,
            }
        total = time.monotonic() - begun
        started = seq.started or begun
        headers = {
            "x-compute-type": "gpu+optimized",
            "x-compute-time": repr(total),
            "x-compute-characters": str(len(inputs)),
            "x-total-time": str(int(total * 1000)),
            "x-validation-time": str(int(max(0.0, seq.queued - begun) * 1000)),
            "x-queue-time": str(int(max(0.0, started - seq.queued) * 1000)),
            "x-inference-time": str(int((time.monotonic() - started) * 1000)),
            "x-time-per-token": str(int((time.monotonic() - started) * 1000 / max(1, len(seq.tokens)))),
            "x-prompt-tokens": str(seq.input_length),
            "x-generated-tokens": str(len(seq.tokens)),
        }
        return web.Response(text=_json(out), content_type="application/json", headers=headers)

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        begun = time.monotonic()
        if not self._authorized(request):
            return web.Response(status=401)  # axum's auth layer: the handler never runs
        self.metrics.inc("tgi_request_count")
        try:
            inputs, params, _ = await self._parse_generate(request)
        except _Rejected as exc:
            return web.Response(status=exc.status, text=exc.text)
        # server.rs: the SSE response starts before validation; every InferError after this
        # point is an event, not a status.
        resp = self._sse(inputs)
        await resp.prepare(request)
        details = bool(params.get("details"))
        try:
            seq = self._start(inputs, params, stream=True)
        except TgiError as exc:
            await self._event(resp, exc.body())
            await resp.write_eof()
            return resp
        index = 0
        try:
            while True:
                kind, value = await self._next(seq, resp)
                index += 1
                if kind == "token":
                    if self.fault == "drop" and index > self.fault_after:
                        self._cut(request)
                        return resp
                    await self._event(
                        resp, {"index": index, "token": value, "generated_text": None, "details": None}
                    )
                    continue
                if kind == "error":
                    self.metrics.inc("tgi_request_failure", err="generation")
                    await self._event(resp, value.body())
                elif kind == "incomplete":
                    self.metrics.inc("tgi_request_failure", err="incomplete")
                    err = TgiError("Incomplete generation stream", "incomplete_generation_stream", 500)
                    await self._event(resp, err.body())
                else:
                    token, finish = value
                    self._succeeded(seq, begun)
                    await self._event(
                        resp,
                        {
                            "index": index,
                            "token": token,
                            "generated_text": self._generated_text(seq),
                            "details": self._stream_details(seq, finish) if details else None,
                        },
                    )
                break
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away: the engine drops the request at its next step
        finally:
            seq.cancelled = True
            self.in_flight -= 1
        return resp

    # -- the Messages API -------------------------------------------------------------------

    def _template(self, messages: list[Any], raw_len: int) -> str:
        """A chat template (Zephyr's shape): the fake's stand-in for the model's own."""
        parts = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise self._deserialize_error(f"messages[{i}]", "missing field `role`", raw_len)
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(
                    p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
                )
            parts.append(f"<|{message['role']}|>\n{content or ''}</s>\n")
        return "".join(parts) + "<|assistant|>\n"

    def _chat_request(self, body: dict[str, Any], raw_len: int) -> tuple[str, dict[str, Any], str]:
        """lib.rs ``ChatRequest::try_into_generate``: the templated input, the generate
        parameters, and the model name the answer carries."""
        if "messages" not in body:
            raise self._deserialize_error("", "missing field `messages`", raw_len)
        if "max_tokens" in body and "max_completion_tokens" in body:
            raise self._deserialize_error("", "duplicate field `max_tokens`", raw_len)
        self._check_types(body, "", raw_len)
        bias = body.get("logit_bias")
        if bias is not None and not isinstance(bias, list):
            raise self._deserialize_error(
                "logit_bias", f"invalid type: {_kind(bias)}, expected a sequence", raw_len
            )
        messages = body["messages"]
        if not isinstance(messages, list):
            raise self._deserialize_error(
                "messages", f"invalid type: {_kind(messages)}, expected a sequence", raw_len
            )
        inputs = self._template(messages, raw_len)
        temperature = body.get("temperature")
        do_sample, temperature = (False, None) if temperature == 0 else (True, temperature)
        presence = body.get("presence_penalty")
        params: dict[str, Any] = {
            "do_sample": do_sample,
            "temperature": temperature,
            "top_p": body.get("top_p"),
            "max_new_tokens": body.get("max_tokens", body.get("max_completion_tokens")),
            "stop": body.get("stop") or [],
            "seed": body.get("seed"),
            "frequency_penalty": body.get("frequency_penalty"),
            "repetition_penalty": presence + 2.0 if presence is not None else None,
            "details": True,
        }
        model = body.get("model")
        return inputs, params, self.model_id if model in (None, "tgi") else model

    def _finish_reason(self, finish: str) -> str:
        if self.legacy:
            return finish  # TGI 1.x: FinishReason's Display
        return "length" if finish == "length" else "stop"  # FinishReason::format(true)

    def _chunk(self, model: str, choices: list[Any], usage: Any = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "object": "text_completion" if self.legacy else "chat.completion.chunk",
            "id": "",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": f"{self.version}-native",
            "choices": choices,
        }
        if not self.legacy:
            out["usage"] = usage
        return out

    async def chat(self, request: web.Request) -> web.StreamResponse:
        begun = time.monotonic()
        if not self._authorized(request):
            return web.Response(status=401)  # axum's auth layer: the handler never runs
        self.metrics.inc("tgi_request_count")
        try:
            body = await self._body(request)
            self._record(request, body)
            inputs, params, model = self._chat_request(body, request.content_length or 0)
        except _Rejected as exc:
            return web.Response(status=exc.status, text=exc.text)
        stream = bool(body.get("stream"))
        if not stream:
            return await self._chat_whole(inputs, params, model, begun)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and not self.legacy
        resp = self._sse(inputs)
        await resp.prepare(request)
        try:
            seq = self._start(inputs, params, stream=True)
        except TgiError as exc:
            await self._event(resp, {"error": {"message": exc.message, "http_status_code": 422}})
            await self._event(resp, "[DONE]")
            await resp.write_eof()
            return resp
        sent = 0
        try:
            while True:
                kind, value = await self._next(seq, resp)
                if kind in ("error", "incomplete"):
                    err = (
                        value
                        if kind == "error"
                        else TgiError("Incomplete generation stream", "incomplete_generation_stream", 500)
                    )
                    self.metrics.inc(
                        "tgi_request_failure", err="generation" if kind == "error" else "incomplete"
                    )
                    await self._event(resp, {"error": {"message": err.message, "http_status_code": 422}})
                    break
                token, finish = (value, None) if kind == "token" else value
                if self.fault == "drop" and sent >= self.fault_after:
                    self._cut(request)
                    return resp
                content = None if token["special"] else token["text"]
                choice = {
                    "index": 0,
                    "delta": {"role": "assistant", "content": content or ""},
                    "logprobs": None,
                    "finish_reason": self._finish_reason(finish) if finish is not None else None,
                }
                await self._event(resp, self._chunk(model, [choice]))
                sent += 1
                if finish is not None:
                    self._succeeded(seq, begun)
                    if include_usage:
                        n = len(seq.tokens)
                        usage = {
                            "prompt_tokens": seq.input_length,
                            "completion_tokens": n,
                            "total_tokens": seq.input_length + n,
                        }
                        await self._event(resp, self._chunk(model, [], usage))
                    break
            await self._event(resp, "[DONE]")
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            seq.cancelled = True
            self.in_flight -= 1
        return resp

    async def _chat_whole(
        self, inputs: str, params: dict[str, Any], model: str, begun: float
    ) -> web.Response:
        try:
            seq = self._start(inputs, params, stream=False)
        except TgiError as exc:
            return _json_response(exc.body(), status=exc.status)
        try:
            while True:
                kind, value = await self._next(seq, None)
                if kind == "token":
                    continue
                if kind == "error":
                    self.metrics.inc("tgi_request_failure", err="generation")
                    return _json_response(value.body(), status=value.status)
                if kind == "incomplete":
                    self.metrics.inc("tgi_request_failure", err="incomplete")
                    return _json_response(
                        {"error": "Incomplete generation", "error_type": "incomplete_generation"}, status=500
                    )
                break
        finally:
            seq.cancelled = True
            self.in_flight -= 1
        _, finish = value
        self._succeeded(seq, begun)
        n = len(seq.tokens)
        out = {
            "object": "chat.completion",
            "id": "",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": f"{self.version}-native",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self._generated_text(seq)},
                    "logprobs": None,
                    "finish_reason": self._finish_reason(finish),
                }
            ],
            "usage": {
                "prompt_tokens": seq.input_length,
                "completion_tokens": n,
                "total_tokens": seq.input_length + n,
            },
        }
        return web.Response(text=_json(out), content_type="application/json")

    # -- tokenizing (server.rs ``tokenize`` and ``chat_tokenize``) -----------------------------

    def _simple_tokens(self, text: str) -> list[dict[str, Any]]:
        """``TokenizeResponse``: one ``SimpleToken`` per whitespace-separated word (the fake's
        tokenizer, the one its ``input_length`` counts with)."""
        out = []
        pos = 0
        for word in text.split():
            start = text.index(word, pos)
            pos = start + len(word)
            out.append({"id": len(out), "text": word, "start": start, "stop": pos})
        return out

    async def tokenize(self, request: web.Request) -> web.Response:
        self.tokenize_calls += 1
        try:
            body = await self._body(request)
            inputs = body.get("inputs")
            if not isinstance(inputs, str):
                raise self._deserialize_error("", "missing field `inputs`", request.content_length or 0)
        except _Rejected as exc:
            return web.Response(status=exc.status, text=exc.text)
        return _json_response(self._simple_tokens(inputs))

    async def chat_tokenize(self, request: web.Request) -> web.Response:
        self.tokenize_calls += 1
        try:
            body = await self._body(request)
            if not isinstance(body.get("messages"), list):
                raise self._deserialize_error("", "missing field `messages`", request.content_length or 0)
            text = self._template(body["messages"], request.content_length or 0)
        except _Rejected as exc:
            return web.Response(status=exc.status, text=exc.text)
        return _json_response({"tokenize_response": self._simple_tokens(text), "templated_text": text})

    # -- info routes (no --api-key check in TGI) ---------------------------------------------

    async def info(self, request: web.Request) -> web.Response:
        self._record(request, None)
        if self.legacy:
            data: dict[str, Any] = {
                "model_id": self.model_id,
                "model_sha": None,
                "model_dtype": "torch.float16",
                "model_device_type": "cuda",
                "model_pipeline_tag": "text-generation",
                "max_concurrent_requests": self.max_concurrent_requests,
                "max_best_of": self.max_best_of,
                "max_stop_sequences": self.max_stop_sequences,
                "max_input_length": self.max_input_tokens,
                "max_total_tokens": self.max_total_tokens,
                "waiting_served_ratio": 1.2,
                "max_batch_total_tokens": self.max_batch_total_tokens,
                "max_waiting_tokens": 20,
                "max_batch_size": self.max_batch_size,
                "validation_workers": 2,
                "version": self.version,
                "sha": None,
                "docker_label": None,
            }
        else:
            data = {
                "model_id": self.model_id,
                "model_sha": None,
                "model_pipeline_tag": "text-generation",
                "max_concurrent_requests": self.max_concurrent_requests,
                "max_best_of": self.max_best_of,
                "max_stop_sequences": self.max_stop_sequences,
                "max_input_tokens": self.max_input_tokens,
                "max_total_tokens": self.max_total_tokens,
                "validation_workers": 2,
                "max_client_batch_size": 4,
                "router": "text-generation-router",
                "version": self.version,
                "sha": None,
                "docker_label": None,
            }
        return web.Response(text=_json(data), content_type="application/json")

    async def health(self, request: web.Request) -> web.Response:
        self._record(request, None)
        if self.fault == "unhealthy":
            return _json_response({"error": "unhealthy", "error_type": "healthcheck"}, status=503)
        return web.Response(status=200)

    async def metrics_page(self, request: web.Request) -> web.Response:
        self._record(request, None)
        return web.Response(text=self.metrics.render(), content_type="text/plain")


def _json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(text=_json(obj), status=status, content_type="application/json")


def _kind(value: Any) -> str:
    """serde's name for a JSON value's type, as in its "invalid type" messages."""
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return "null"


def main(argv: list[str] | None = None) -> int:
    """``text-generation-launcher``'s flags (those the fake uses), plus fake-only ones."""
    parser = argparse.ArgumentParser(prog="python -m tests.fake_tgi", description=__doc__.splitlines()[0])
    parser.add_argument("--model-id", default="fake/tiny-llama")
    parser.add_argument("--hostname", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3000)
    parser.add_argument("--max-input-tokens", "--max-input-length", type=int, default=1024)
    parser.add_argument("--max-total-tokens", type=int, default=2048)
    parser.add_argument("--max-batch-total-tokens", type=int, default=16384)
    parser.add_argument("--max-batch-size", type=int, default=None)
    parser.add_argument("--max-concurrent-requests", type=int, default=128)
    parser.add_argument("--max-stop-sequences", type=int, default=4)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="fake only: time per decode step")
    args = parser.parse_args(argv)
    fake = FakeTGI(
        model_id=args.model_id,
        host=args.hostname,
        port=args.port,
        max_input_tokens=args.max_input_tokens,
        max_total_tokens=args.max_total_tokens,
        max_batch_total_tokens=args.max_batch_total_tokens,
        max_batch_size=args.max_batch_size,
        max_concurrent_requests=args.max_concurrent_requests,
        max_stop_sequences=args.max_stop_sequences,
        api_key=args.api_key,
        token_delay_s=args.token_delay_ms / 1000,
    )

    async def run() -> None:
        loop = asyncio.get_running_loop()

        def started() -> None:
            assert fake._stop is not None
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, fake._stop.set)
            # The banner tests.conftest.start_process waits for.
            print(f"serving fake TGI ({args.model_id}) on http://{fake.host}:{fake.port}", flush=True)

        await fake.serve(started)

    try:
        asyncio.run(run())
    except OSError as exc:
        print(f"fake TGI: cannot listen on {args.hostname}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
