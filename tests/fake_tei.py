"""A protocol-faithful FAKE of Hugging Face Text Embeddings Inference (TEI), for tests.

Why this file is long: it is one fake server, kept whole so that it can be read side by side
with TEI's router source it was built from (routes, the order of checks, error bodies, the
queue and batching that the metrics report); split, the correspondence would be lost.

TEI needs a model and cannot run where the suite runs, so the ``tei`` backend is tested
against this fake.

No model, no tokenizer: a token is a whitespace-separated word and token id ``i`` the word
``w{i}``; a vector is the mean of per-word Gaussian vectors seeded from each word plus a term
seeded from the whole sequence (same text, same vector; shared words, higher cosine); a rerank
logit is ``8 * (share of the query's words in the text) - 4`` plus a small seeded jitter,
through a sigmoid unless ``raw_scores``. The wire follows TEI's source, read (never copied) at
tag **v1.8.3** (github.com/huggingface/text-embeddings-inference, commit ``78502d8e6122``):
``router/src/http/server.rs`` (routes; ``--api-key`` guards all but ``/health``, ``GET /``,
``/ping``, ``/metrics``; the order of checks in ``embed``, ``rerank``, ``openai_embed``; the
concurrency permit: a single input tries for one and gets 429, each input of a batch waits;
rerank's sort, ascending then reversed; the OpenAI error body; ``ErrorType`` → status),
``router/src/http/types.rs`` (fields and defaults; the untagged ``Input``, where ``[]`` and
``[1, 2]`` are ONE input of ids; ``Left``/``Right``), ``router/src/lib.rs`` (``Info``,
``ErrorResponse`` with ``error_type`` the variant's name, the ``x-*`` headers in whole ms
averaged over a batch), ``core/src/infer.rs``, ``tokenization.rs``, ``lib.rs`` (messages,
the 250-characters-a-token limit, prompts, ``dimensions``: truncate then normalise, where each
metric moves), ``core/src/queue.rs`` (unpadded batches cut at ``max_batch_tokens`` and
``max_batch_requests``; ``te_queue_size`` +1 per queued input, set to what is left at each
take; ``te_batch_next_*`` observed at every take, the empty one ending a round too),
``router/src/prometheus.rs`` (buckets; nothing described, so no ``# HELP`` lines; a series
appears once first recorded; metrics-exporter-prometheus 0.15's text format).

Not modelled: ``/embed_all``, ``/embed_sparse``, ``/predict``, ``/similarity``,
``/tokenize``, ``/decode``, ``/vertex``, gRPC, SPLADE, classifiers, special tokens (none is
counted), ``--default-prompt``, the batching task's one-batch prefetch, client disconnects,
CORS; serde's rejections are imitated for the fields read, with the body's length as column;
f32s are the shortest round-tripping decimal in Python's notation (``1e-05``, serde ``1e-5``).

Faults (``FakeTEI.fault``): ``overloaded`` (429 on every inference route, batches included,
which real TEI would make wait), ``backend_error`` (every batch fails, 424), ``unhealthy``
(``/health`` 503). ``hold()`` stalls the forward pass until ``release()``: the first batch
waits, later inputs stay queued and ``te_queue_size`` counts them. ``batch_delay_s`` slows
every batch.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import random
import string
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import lru_cache
from typing import Any, Literal

from aiohttp import web

__all__ = ["FakeTEI", "FakeTEIConfig", "Received", "TeiError"]

VERSION = "1.8.3"
MAX_CHAR_MULTIPLIER = 250
"""tokenization.rs: an input may have at most ``max_input_length * 250`` characters."""
STATUS = {"Unhealthy": 503, "Backend": 424, "Overloaded": 429, "Tokenizer": 422,
          "Validation": 413, "Empty": 400}  # fmt: skip
_DESERIALIZE = "Failed to deserialize the JSON body into the target type:"
_LE_INF = 'le="+Inf"'
_EXPECTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "bool": (lambda v: isinstance(v, bool), "a boolean"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "usize": (lambda v: isinstance(v, int) and not isinstance(v, bool), "usize"),
    "strs": (lambda v: isinstance(v, list), "a sequence"),
}

Item = str | list[int] | tuple[str, str]
"""One input: a text, token ids, or a (query, text) pair."""
Meta = tuple[int, float, float, float]
"""One input's prompt tokens and its tokenization, queue and inference seconds."""


def rust_float(value: float) -> str:
    """``value`` as Rust's ``Display`` writes an f64 (the exporter's gauges, sums, bounds)."""
    return str(int(value)) if value.is_integer() else format(Decimal(repr(value)), "f")


def f32(value: float) -> float:
    """``value`` as an f32, as serde_json writes it: the shortest decimal that round-trips."""
    exact = struct.unpack("<f", struct.pack("<f", value))[0]
    for digits in range(1, 10):
        short = float(f"{exact:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", short))[0] == exact:
            return short
    return float(exact)


class TeiError(Exception):
    """A TEI ``ErrorResponse``: the message, the ``error_type`` and so the status."""

    def __init__(self, message: str, error_type: str) -> None:
        super().__init__(message)
        self.message, self.error_type = message, error_type

    @property
    def status(self) -> int:
        return STATUS[self.error_type]

    def body(self, openai: bool = False) -> dict[str, Any]:
        if openai:  # OpenAICompatErrorResponse
            return {"message": self.message, "code": self.status, "type": self.error_type}
        return {"error": self.message, "error_type": self.error_type}


def _validation(text: str) -> TeiError:
    return TeiError(f"Input validation error: {text}", "Validation")


def _overloaded() -> TeiError:
    return TeiError("Model is overloaded", "Overloaded")


class _Rejected(Exception):
    """axum refusing a request before TEI's handler runs (a plain-text body)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


@dataclass
class Received:
    """One request the fake received (``body``: None unless a JSON object was read)."""

    method: str
    path: str
    body: dict[str, Any] | None
    headers: dict[str, str]


@dataclass
class FakeTEIConfig:
    """What ``text-embeddings-router``'s flags (TEI's defaults) and the model would set."""

    model_id: str = ""
    """Empty: ``fake/bge-small-en-v1.5``, or ``fake/bge-reranker-base`` for a reranker."""
    kind: Literal["embedding", "reranker"] = "embedding"
    dim: int = 32
    pooling: Literal["cls", "mean", "last_token"] = "cls"
    max_client_batch_size: int = 32
    max_input_length: int = 512
    """The model's limit in tokens (TEI lowers it to ``max_batch_tokens`` under auto-truncate)."""
    max_batch_tokens: int = 16384
    max_batch_requests: int | None = None
    max_concurrent_requests: int = 512
    auto_truncate: bool = False
    api_key: str | None = None
    prompts: dict[str, str] | None = None
    """sentence-transformers ``prompts``: ``prompt_name`` picks one, prepended to the text."""
    model_dtype: str = "float16"
    tokenization_workers: int = 4
    payload_limit: int = 2_000_000
    batch_delay_s: float = 0.0
    """Fake only: how long each batch's forward pass takes."""

    def __post_init__(self) -> None:
        if self.kind not in ("embedding", "reranker") or self.pooling not in ("cls", "mean", "last_token"):
            raise ValueError("kind must be embedding or reranker; pooling cls, mean or last_token")


# -- metrics, as metrics-exporter-prometheus renders them ---------------------------------------


class _Metrics:
    def __init__(self, max_input_length: int) -> None:
        duration, value = [], 0.00001
        for _ in range(35):  # prometheus.rs: 35 geometric buckets from 0.00001 * 1.5
            value *= 1.5
            duration.append(value)
        self._duration = duration
        self._buckets = {
            "te_request_input_length": [2.0**x for x in range(20) if 2**x <= max_input_length],
            "te_batch_next_size": [2.0**x for x in range(13)],
            "te_batch_next_tokens": [2.0**x for x in range(21)],
        }
        self.counters: dict[str, dict[tuple[tuple[str, str], ...], int]] = {}
        self.gauges: dict[str, float] = {}
        self.histograms: dict[str, list[Any]] = {}

    def inc(self, name: str, **labels: str) -> None:
        series = self.counters.setdefault(name, {})
        key = tuple(labels.items())
        series[key] = series.get(key, 0) + 1

    def gauge(self, name: str, value: float, add: bool = False) -> None:
        self.gauges[name] = (self.gauges.get(name, 0.0) if add else 0.0) + value

    def observe(self, name: str, value: float) -> None:
        bounds = self._buckets.get(name, self._duration)
        entry = self.histograms.setdefault(name, [[0] * len(bounds), 0.0, 0, bounds])
        for i, bound in enumerate(bounds):
            entry[0][i] += value <= bound
        entry[1] += value
        entry[2] += 1

    def value(self, name: str, **labels: str) -> float | None:
        if name in self.gauges:
            return self.gauges[name]
        if name in self.histograms:
            return float(self.histograms[name][2])
        count = self.counters.get(name, {}).get(tuple(labels.items()))
        return None if count is None else float(count)

    def render(self) -> str:
        out: list[str] = []
        for name in sorted(self.counters):
            out.append(f"# TYPE {name} counter")
            for key, count in self.counters[name].items():
                labels = "{" + ",".join(f'{k}="{v}"' for k, v in key) + "}" if key else ""
                out.append(f"{name}{labels} {count}")
            out.append("")
        for name in sorted(self.gauges):
            out += [f"# TYPE {name} gauge", f"{name} {rust_float(self.gauges[name])}", ""]
        for name in sorted(self.histograms):
            counts, total, count, bounds = self.histograms[name]
            out.append(f"# TYPE {name} histogram")
            out += [f'{name}_bucket{{le="{rust_float(b)}"}} {n}' for b, n in zip(bounds, counts, strict=True)]
            out += [f"{name}_bucket{{{_LE_INF}}} {count}", f"{name}_sum {rust_float(total)}"]
            out += [f"{name}_count {count}", ""]
        return "\n".join(out) + ("\n" if out else "")


# -- the "model" ---------------------------------------------------------------------------------


@lru_cache(maxsize=65536)
def _word_vector(word: str, dim: int) -> tuple[float, ...]:
    rng = random.Random("tei:" + word)  # a str seed is the same in every run
    return tuple(rng.gauss(0.0, 1.0) for _ in range(dim))


def _raw_embedding(tokens: list[str], dim: int, pooling: str) -> list[float]:
    sequence = _word_vector(f"\x00{pooling}\x00" + " ".join(tokens), dim)
    if not tokens:  # whitespace only: as if there were special tokens alone
        return list(sequence)
    columns = zip(*(_word_vector(t, dim) for t in tokens), strict=True)
    return [sum(col) / len(tokens) + 0.3 * s for col, s in zip(columns, sequence, strict=True)]


def _raw_score(query: list[str], text: list[str]) -> float:
    def words(tokens: list[str]) -> set[str]:
        return {w.lower().strip(string.punctuation) for w in tokens} - {""}

    asked = words(query)
    overlap = len(asked & words(text)) / len(asked) if asked else 0.0
    jitter = random.Random("rank:" + " ".join(query) + "\x00" + " ".join(text)).uniform(-0.1, 0.1)
    return 8.0 * overlap - 4.0 + jitter


@dataclass(eq=False)
class _Entry:
    tokens: list[str]
    n_query: int | None
    """For a (query, text) pair: how many of ``tokens`` are the query's."""
    queued: float
    future: asyncio.Future[tuple[Any, float, float]] = field(repr=False)


@dataclass
class _Opts:
    truncate: bool
    direction: str
    prompt_name: str | None = None
    normalize: bool = True
    dimensions: int | None = None


# -- the server ----------------------------------------------------------------------------------


class FakeTEI:
    """The fake server; ``start()`` serves it from a thread with its own loop.
    ``FakeTEI(kind="reranker", dim=8)`` overrides fields of ``config`` (default: the defaults)."""

    def __init__(
        self, config: FakeTEIConfig | None = None, *, host: str = "127.0.0.1", port: int = 0, **fields: Any
    ) -> None:
        cfg = replace(config or FakeTEIConfig(), **fields)
        if not cfg.model_id:
            cfg = replace(
                cfg, model_id=f"fake/bge-{'reranker-base' if cfg.kind == 'reranker' else 'small-en-v1.5'}"
            )
        if cfg.max_input_length > cfg.max_batch_tokens:  # lib.rs: refuses to start, or lowers it
            if not cfg.auto_truncate:
                raise ValueError("`--max-batch-tokens` cannot be lower than the model `max_input_length`")
            cfg = replace(cfg, max_input_length=cfg.max_batch_tokens)
        self.config = cfg
        self.host, self.port = host, port
        self.fault: str | None = None
        """``overloaded``, ``backend_error``, ``unhealthy`` or None."""
        self.fault_message = "CUDA error: out of memory"
        self.received: list[Received] = []
        self.in_flight = 0
        """Inputs holding one of the ``max_concurrent_requests`` permits now."""
        self.batches: list[int] = []
        """The size of each batch the engine ran, in order."""
        self.metrics = _Metrics(cfg.max_input_length)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._held = False
        self._queue: deque[_Entry] = deque()
        self._wake: asyncio.Event | None = None
        self._gate: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._permits: asyncio.Semaphore | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- running -----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.payload_limit + 1)
        default = self.rerank if self.config.kind == "reranker" else self.embed
        posts = {"/embed": self.embed, "/rerank": self.rerank, "/embeddings": self.openai_embed}
        posts.update({"/v1/embeddings": self.openai_embed, "/": default, "/invocations": default})
        for path, handler in posts.items():
            app.router.add_post(path, handler)
        gets = {"/info": self.info, "/health": self.health, "/": self.health, "/ping": self.health}
        for path, handler in (*gets.items(), ("/metrics", self.metrics_page)):
            app.router.add_get(path, handler)
        return app

    async def serve(self, started: Callable[[], None] | None = None) -> None:
        """Serve until :meth:`stop`."""
        self.loop = asyncio.get_running_loop()
        self._stop, self._wake, self._gate = asyncio.Event(), asyncio.Event(), asyncio.Event()
        if not self._held:
            self._gate.set()
        self._permits = asyncio.Semaphore(self.config.max_concurrent_requests)
        engine = asyncio.create_task(self._engine())
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
            engine.cancel()
            await runner.cleanup()

    def start(self) -> FakeTEI:
        """Serve from a daemon thread; returns once listening."""

        def run() -> None:
            try:
                asyncio.run(self.serve(self._ready.set))
            except BaseException as exc:  # reported by start()
                self._error = exc
                self._ready.set()

        self._thread = threading.Thread(target=run, name="fake-tei", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise RuntimeError(f"the fake TEI did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FakeTEI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's loop (to read or change its state from a test)."""
        assert self.loop is not None

        async def wrapped() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(10)

    def hold(self) -> None:
        """Stall the forward pass: requests queue up and none finishes until :meth:`release`."""
        self._held = True
        if self._gate is not None:
            self.call(self._gate.clear)

    def release(self) -> None:
        self._held = False
        if self._gate is not None:
            self.call(self._gate.set)

    @contextmanager
    def holding(self) -> Iterator[None]:
        self.hold()
        try:
            yield
        finally:
            self.release()

    def queued(self) -> int:
        """Inputs waiting in the queue (not those of the batch being run)."""
        return int(self.call(lambda: len(self._queue)))

    def metrics_text(self) -> str:
        return str(self.call(self.metrics.render))

    def metric(self, name: str, **labels: str) -> float | None:
        """A counter's or gauge's value, or a histogram's count; None before it is recorded."""
        value: float | None = self.call(lambda: self.metrics.value(name, **labels))
        return value

    # -- the engine: queue.rs and infer.rs's batching and backend tasks ---------------------------

    def _next_batch(self) -> list[_Entry]:
        batch: list[_Entry] = []
        tokens = 0
        while self._queue:
            entry = self._queue[0]
            if entry.future.done():  # its request went away
                self._queue.popleft()
                self.metrics.inc("te_request_failure", err="dropped")
                continue
            if tokens + len(entry.tokens) > self.config.max_batch_tokens:
                break
            batch.append(self._queue.popleft())
            tokens += len(entry.tokens)
            if len(batch) == self.config.max_batch_requests:
                break
        self.metrics.observe("te_batch_next_size", float(len(batch)))
        self.metrics.observe("te_batch_next_tokens", float(tokens))
        self.metrics.gauge("te_queue_size", float(len(self._queue)))
        return batch

    async def _engine(self) -> None:
        assert self._wake is not None and self._gate is not None
        cfg = self.config
        while True:
            await self._wake.wait()
            self._wake.clear()
            while batch := self._next_batch():
                began = time.monotonic()
                await self._gate.wait()
                if cfg.batch_delay_s:
                    await asyncio.sleep(cfg.batch_delay_s)
                inference = time.monotonic() - began
                self.batches.append(len(batch))
                for e in (e for e in batch if not e.future.done()):
                    if self.fault == "backend_error":
                        e.future.set_exception(TeiError(f"Backend error: {self.fault_message}", "Backend"))
                        continue
                    if e.n_query is None:
                        value: Any = _raw_embedding(e.tokens, cfg.dim, cfg.pooling)
                    else:
                        value = _raw_score(e.tokens[: e.n_query], e.tokens[e.n_query :])
                    e.future.set_result((value, max(0.0, time.monotonic() - e.queued - inference), inference))

    async def _infer(self, tokens: list[str], n_query: int | None, began: float) -> tuple[Any, Meta]:
        assert self.loop is not None and self._wake is not None
        tokenization = time.monotonic() - began
        entry = _Entry(tokens, n_query, time.monotonic(), self.loop.create_future())
        self._queue.append(entry)
        self.metrics.gauge("te_queue_size", 1.0, add=True)
        self._wake.set()
        try:
            value, queue_s, inference = await entry.future
        except TeiError:
            self.metrics.inc("te_request_failure", err="inference")
            raise
        return value, (len(tokens), tokenization, queue_s, inference)

    # -- tokenization.rs: prompts, limits, truncation ---------------------------------------------

    def _tokens(self, item: Item, opts: _Opts) -> tuple[list[str], int | None]:
        try:
            return self._encode(item, opts)
        except TeiError:
            self.metrics.inc("te_request_failure", err="tokenization")
            raise

    def _encode(self, item: Item, opts: _Opts) -> tuple[list[str], int | None]:
        cfg = self.config
        if not (item[0] or item[1] if isinstance(item, tuple) else item):
            raise TeiError("Input validation error: `inputs` cannot be empty", "Empty")
        prompt, name = "", opts.prompt_name
        if name is not None:
            said = f"`default-prompt-name` is set to `{name}` but"
            if cfg.prompts is None:
                raise _validation(f"{said} no prompts were found in the Sentence Transformers configuration")
            if name not in cfg.prompts:
                keys = ", ".join(f'"{k}"' for k in cfg.prompts)  # Rust's Debug of the keys
                raise _validation(f"{said} it was not found in the Sentence Transformers prompts. "
                                  f"Available prompts: [{keys}]")  # fmt: skip
            prompt = cfg.prompts[name]
        chars = sum(len(s) for s in item) if isinstance(item, tuple) else len(item)
        limit = cfg.max_input_length * MAX_CHAR_MULTIPLIER
        if chars > limit:
            if not opts.truncate:
                raise _validation(f"`inputs` must have less than {limit} characters. Given: {chars}")
            if isinstance(item, str):
                item = item[:limit]
            elif isinstance(item, tuple):
                item = (item[0][: limit // 2], item[1][: limit // 2])
        query: list[str] | None = None
        if isinstance(item, tuple):
            if prompt:
                raise _validation("`prompt_name` cannot be set with dual inputs")
            query, text = item[0].split(), item[1].split()
        else:
            text = (prompt + (item if isinstance(item, str) else " ".join(f"w{i}" for i in item))).split()
        n = len(text) + len(query or [])
        while opts.truncate and n > cfg.max_input_length:  # LongestFirst, a token at a time
            longest = text if query is None or len(text) >= len(query) else query
            del longest[0 if opts.direction == "Left" else -1]
            n -= 1
        if n > cfg.max_input_length:
            raise _validation(f"`inputs` must have less than {cfg.max_input_length} tokens. Given: {n}")
        self.metrics.observe("te_request_input_length", float(n))
        return (text, None) if query is None else (query + text, len(query))

    # -- infer.rs: one input ---------------------------------------------------------------------

    async def _embed_one(self, item: Item, opts: _Opts) -> tuple[list[float], Meta]:
        began, m = time.monotonic(), self.metrics
        if opts.dimensions == 0:
            m.inc("te_request_failure", err="validation")
            raise _validation("`dimensions` should be positive")
        if self.config.kind != "embedding":
            m.inc("te_request_failure", err="model_type")
            raise TeiError("Backend error: Model is not an embedding model", "Backend")
        m.inc("te_embed_count")
        vector, meta = await self._infer(self._tokens(item, opts)[0], None, began)
        if opts.dimensions is not None:
            if opts.dimensions > len(vector):
                m.inc("te_request_failure", err="validation")
                raise _validation("`dimensions` should be smaller than the maximum embedding dimension.")
            vector = vector[: opts.dimensions]
        if opts.normalize:
            scale = 1.0 / math.sqrt(sum(v * v for v in vector))
            vector = [v * scale for v in vector]
        self._succeeded("te_embed", began, meta)
        return [f32(v) for v in vector], meta

    async def _rank_one(self, query: str, text: str, opts: _Opts, raw: bool) -> tuple[float, Meta]:
        began = time.monotonic()
        self.metrics.inc("te_predict_count")
        score, meta = await self._infer(*self._tokens((query, text), opts), began)
        if not raw:
            score = 1.0 / (1.0 + math.exp(-score))
        self._succeeded("te_predict", began, meta)
        return f32(score), meta

    def _succeeded(self, prefix: str, began: float, meta: Meta) -> None:
        self.metrics.inc(f"{prefix}_success")
        self.metrics.observe(f"{prefix}_duration", time.monotonic() - began)
        for part, seconds in zip(("tokenization", "queue", "inference"), meta[1:], strict=True):
            self.metrics.observe(f"{prefix}_{part}_duration", seconds)

    async def _permitted(self, work: Coroutine[Any, Any, Any]) -> Any:
        """One input of a batch: wait for a permit (infer.rs ``acquire_permit``)."""
        assert self._permits is not None
        async with self._permits:
            self.in_flight += 1
            try:
                return await work
            finally:
                self.in_flight -= 1

    async def _single(self, work: Coroutine[Any, Any, Any]) -> Any:
        """A single input: a permit now, or 429 (``try_acquire_permit``)."""
        assert self._permits is not None
        if self._permits.locked() or self.fault == "overloaded":
            work.close()
            self.metrics.inc("te_request_failure", err="overloaded")
            raise _overloaded()
        return await self._permitted(work)

    async def _batch(self, size: int, works: Callable[[], list[Coroutine[Any, Any, Any]]]) -> list[Any]:
        if size > self.config.max_client_batch_size:
            self.metrics.inc("te_request_failure", err="batch_size")
            limit = self.config.max_client_batch_size
            raise TeiError(f"batch size {size} > maximum allowed batch size {limit}", "Validation")
        if self.fault == "overloaded":
            self.metrics.inc("te_request_failure", err="overloaded")
            raise _overloaded()
        results = await asyncio.gather(*(self._permitted(w) for w in works()), return_exceptions=True)
        for result in results:  # the first error, in the inputs' order
            if isinstance(result, BaseException):
                raise result
        return results

    def _headers(self, metas: list[Meta], chars: int, began: float) -> dict[str, str]:
        """lib.rs ``ResponseMetadata`` (and its histograms)."""
        total = time.monotonic() - began
        tok, queue, inf = (sum(m[i] for m in metas) / len(metas) for i in (1, 2, 3))
        for name, seconds in (("", total), ("_tokenization", tok), ("_queue", queue), ("_inference", inf)):
            self.metrics.observe(f"te_request{name}_duration", seconds)
        ms = {"compute": total, "total": total, "tokenization": tok, "queue": queue, "inference": inf}
        headers = {"x-compute-type": "gpu+optimized", "x-compute-characters": str(chars)}
        headers["x-compute-tokens"] = str(sum(m[0] for m in metas))
        headers.update({f"x-{k}-time": str(int(v * 1000)) for k, v in ms.items()})
        return headers

    # -- axum's Json extractor and serde ------------------------------------------------------------

    def _record(self, request: web.Request) -> Received:
        received = Received(request.method, request.path, None, dict(request.headers))
        self.received.append(received)
        return received

    async def _body(self, request: web.Request, struct_name: str) -> tuple[dict[str, Any], int]:
        received = self._record(request)
        if (request.content_length or 0) > self.config.payload_limit:
            raise _Rejected(413, "Failed to buffer the request body: length limit exceeded")
        mime = request.content_type
        if not (mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))):
            raise _Rejected(415, "Expected request with `Content-Type: application/json`")
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise _Rejected(400, f"Failed to parse the request body as JSON: {exc}") from None
        if not isinstance(body, dict):  # (serde would also read a struct's fields from a list)
            raise _bad(len(raw), "", f"invalid type: {_kind(body)}, expected struct {struct_name}")
        received.body = body
        return body, len(raw)

    @staticmethod
    def _fields(body: dict[str, Any], raw_len: int, spec: dict[str, str]) -> dict[str, Any]:
        """serde's checks of the fields read, in the body's order, then of the missing ones
        (``!`` marks a required field, ``?`` one that may be null; others are ignored)."""
        out: dict[str, Any] = {}
        for key, value in body.items():
            kind = spec.get(key, "").strip("!")
            if kind and value is None and kind.endswith("?"):
                out[key] = None
                continue
            kind = kind.rstrip("?")
            if kind.startswith("enum:"):
                names = kind[5:].split(",")
                if not isinstance(value, str):
                    raise _bad(raw_len, key, "expected value")
                if value not in names:
                    raise _bad(raw_len, key, f"unknown variant `{value}`, expected `{'` or `'.join(names)}`")
            elif kind == "usize" and isinstance(value, int) and not isinstance(value, bool) and value < 0:
                raise _bad(raw_len, key, f"invalid value: integer `{value}`, expected usize")
            elif kind in _EXPECTED and not _EXPECTED[kind][0](value):
                raise _bad(raw_len, key, f"invalid type: {_kind(value)}, expected {_EXPECTED[kind][1]}")
            elif kind == "strs" and (bad := [i for i, v in enumerate(value) if not isinstance(v, str)]):
                raise _bad(
                    raw_len, f"{key}[{bad[0]}]", f"invalid type: {_kind(value[bad[0]])}, expected a string"
                )
            elif kind == "input":
                value = _input(raw_len, key, value)
            if kind:
                out[key] = value
        for key in (k for k, kind in spec.items() if kind.startswith("!") and k not in out):
            raise _bad(raw_len, "", f"missing field `{key}`")
        return out

    # -- routes ------------------------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        key = self.config.api_key
        return key is None or request.headers.get("authorization") == f"Bearer {key}"

    async def _serve(
        self, request: web.Request, route: Callable[..., Any], struct_name: str, openai: bool = False
    ) -> web.Response:
        if not self._authorized(request):
            self._record(request)
            return web.Response(status=401)  # the auth layer: the handler never runs
        try:
            body, raw_len = await self._body(request, struct_name)
            payload, headers = await route(body, raw_len)
        except _Rejected as exc:
            return web.Response(status=exc.status, text=exc.text)
        except TeiError as exc:
            return _json_response(exc.body(openai), exc.status)
        return _json_response(payload, 200, headers)

    async def embed(self, request: web.Request) -> web.Response:
        return await self._serve(request, self._embed, "EmbedRequest")

    async def openai_embed(self, request: web.Request) -> web.Response:
        return await self._serve(request, self._openai, "OpenAICompatRequest", openai=True)

    async def rerank(self, request: web.Request) -> web.Response:
        return await self._serve(request, self._rerank, "RerankRequest")

    def _opts(self, req: dict[str, Any], *more: Any) -> _Opts:
        truncate = req.get("truncate")  # null or absent: --auto-truncate
        truncate = self.config.auto_truncate if truncate is None else truncate
        return _Opts(truncate, req.get("truncation_direction", "Right"), *more)

    async def _embeddings(self, inputs: tuple[bool, list[Item]], opts: _Opts) -> tuple[Any, dict[str, str]]:
        """server.rs ``embed`` and ``openai_embed``: one input, or a batch of them."""
        began, m = time.monotonic(), self.metrics
        batched, items = inputs
        if not batched:
            m.inc("te_request_count", method="single")
            results = [await self._single(self._embed_one(items[0], opts))]
        else:
            m.inc("te_request_count", method="batch")
            if not items:  # unreachable through JSON: `[]` is one input of ids
                m.inc("te_request_failure", err="validation")
                raise TeiError("`inputs` cannot be empty", "Empty")
            results = await self._batch(len(items), lambda: [self._embed_one(i, opts) for i in items])
        m.inc("te_request_success", method="batch" if batched else "single")
        chars = sum(len(i) for i in items)
        return [r[0] for r in results], self._headers([r[1] for r in results], chars, began)

    async def _embed(self, body: dict[str, Any], raw_len: int) -> tuple[Any, dict[str, str]]:
        spec = {"inputs": "!input", "truncate": "bool?", "truncation_direction": "enum:Left,Right",
                "prompt_name": "str?", "normalize": "bool", "dimensions": "usize?"}  # fmt: skip
        req = self._fields(body, raw_len, spec)
        opts = self._opts(req, req.get("prompt_name"), req.get("normalize", True), req.get("dimensions"))
        return await self._embeddings(req["inputs"], opts)

    async def _openai(self, body: dict[str, Any], raw_len: int) -> tuple[Any, dict[str, str]]:
        spec = {"input": "!input", "model": "str?", "user": "str?",
                "encoding_format": "enum:float,base64", "dimensions": "usize?"}  # fmt: skip
        req = self._fields(body, raw_len, spec)
        opts = _Opts(self.config.auto_truncate, "Right", dimensions=req.get("dimensions"))
        vectors, headers = await self._embeddings(req["input"], opts)
        if req.get("encoding_format") == "base64":  # the f32s' bytes, little-endian
            vectors = [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in vectors]
        data = [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)]
        tokens = int(headers["x-compute-tokens"])
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return {"object": "list", "data": data, "model": self.config.model_id, "usage": usage}, headers

    async def _rerank(self, body: dict[str, Any], raw_len: int) -> tuple[Any, dict[str, str]]:
        spec = {"query": "!str", "texts": "!strs", "truncate": "bool?", "raw_scores": "bool",
                "truncation_direction": "enum:Left,Right", "return_text": "bool"}  # fmt: skip
        req = self._fields(body, raw_len, spec)
        began, m = time.monotonic(), self.metrics
        query, texts = req["query"], req["texts"]
        if not texts:
            m.inc("te_request_failure", err="validation")
            raise TeiError("`texts` cannot be empty", "Empty")
        if self.config.kind != "reranker":
            m.inc("te_request_failure", err="model_type")
            raise TeiError("Backend error: model is not a re-ranker model", "Backend")
        m.inc("te_request_count", method="batch")
        opts, raw = self._opts(req), req.get("raw_scores", False)
        results = await self._batch(len(texts), lambda: [self._rank_one(query, t, opts, raw) for t in texts])
        ranks = [
            {"index": i, **({"text": texts[i]} if req.get("return_text") else {}), "score": score}
            for i, (score, _) in enumerate(results)
        ]
        ranks.sort(key=lambda r: r["score"])
        ranks.reverse()  # as server.rs does: equal scores come out in reverse index order
        m.inc("te_request_success", method="batch")
        chars = len(query) * len(texts) + sum(len(t) for t in texts)
        return ranks, self._headers([r[1] for r in results], chars, began)

    async def info(self, request: web.Request) -> web.Response:
        self._record(request)
        if not self._authorized(request):
            return web.Response(status=401)
        cfg = self.config
        if cfg.kind == "reranker":
            model_type: Any = {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
        else:
            model_type = {"embedding": {"pooling": cfg.pooling}}
        info = {"model_id": cfg.model_id, "model_sha": None, "model_dtype": cfg.model_dtype}
        info["model_type"] = model_type
        for key in ("max_concurrent_requests", "max_input_length", "max_batch_tokens", "max_batch_requests",
                    "max_client_batch_size", "auto_truncate", "tokenization_workers"):  # fmt: skip
            info[key] = getattr(cfg, key)
        info.update({"version": VERSION, "sha": None, "docker_label": None})
        return _json_response(info)

    async def health(self, request: web.Request) -> web.Response:
        self._record(request)
        if self.fault == "unhealthy":
            return _json_response({"error": "unhealthy", "error_type": "Unhealthy"}, 503)
        return web.Response(status=200)

    async def metrics_page(self, request: web.Request) -> web.Response:
        self._record(request)
        return web.Response(text=self.metrics.render())


def _bad(raw_len: int, path: str, what: str) -> _Rejected:
    where = f"{path}: " if path else ""
    return _Rejected(422, f"{_DESERIALIZE} {where}{what} at line 1 column {raw_len}")


def _input(raw_len: int, key: str, value: Any) -> tuple[bool, list[Item]]:
    """The untagged ``Input``: one text or id list (``[]`` too), else a batch of them."""

    def ids(v: Any) -> bool:
        return isinstance(v, list) and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**32 for i in v
        )

    if isinstance(value, str) or ids(value):
        return False, [value]
    if isinstance(value, list) and all(isinstance(v, str) or ids(v) for v in value):
        return True, list(value)
    raise _bad(raw_len, key, "data did not match any variant of untagged enum Input")


def _json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)  # serde_json's compact form
    return web.Response(text=text, status=status, content_type="application/json", headers=headers)


def _kind(value: Any) -> str:
    """serde's name for a JSON value in its "invalid type" messages."""
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int | float):
        return f"{'integer' if isinstance(value, int) else 'floating point'} `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return "sequence" if isinstance(value, list) else "map" if isinstance(value, dict) else "null"
