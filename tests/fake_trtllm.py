"""Protocol-faithful FAKE TensorRT-LLM servers, for testing the ``trtllm`` backend on machines
without NVIDIA GPUs (TensorRT-LLM and Triton cannot run here). They are fakes: a small
continuous-batching simulation stands in for the engine and generates placeholder words;
what is faithful is the HTTP surface: paths, request validation, response and error
bodies, streaming framing, metric names and labels, and how the load numbers move with the
requests in flight.

Why this file is long: two fake servers (``trtllm-serve`` and Triton's generate extension)
that share their fake executor, kept in one file so each can be read against the TensorRT-LLM
and Triton sources it follows.

Built from these published documents and sources (their main branches as read for this work,
mid-2026; TensorRT-LLM 1.x, Triton 2.x):

``FakeTrtllmServe`` (``trtllm-serve``, TensorRT-LLM 1.x):

- ``docs/source/commands/trtllm-serve/trtllm-serve.rst``: the endpoints (``/v1/models``,
  ``/v1/completions``, ``/v1/chat/completions``, ``/health``, ``/metrics``, ``/version``)
  and the ``/metrics`` example (a JSON list of iteration statistics, drained on read);
- ``tensorrt_llm/serve/openai_server.py``: ``/health`` (200 empty, 503 "LLM is
  unavailable..."), ``/metrics`` (``get_stats_async(2)``: drain the queue, then wait until
  no new iteration came for 2 s; an ``IterationResult`` marked done answers ``[]`` at once
  until the next request), ``/prometheus/metrics`` only with ``return_perf_metrics`` (and
  then a background collector drains the statistics, so ``/metrics`` stays empty), request
  errors as ``ErrorResponse`` (``{"object": "error", "message", "type":
  "BadRequestError", "param": null, "code": 400}``), validation errors as 400
  ``{"error": "..."}``, a failure mid-stream as a broken-off body (the generator raises);
- ``tensorrt_llm/serve/openai_protocol.py``: request models with ``extra="forbid"`` (an
  unknown field is a 400), ``priority`` a number in 0..1, ``stream_options.include_usage``,
  ``ModelCard`` (``id``, ``object``, ``created``, ``owned_by: tensorrt_llm``);
- ``cpp/tensorrt_llm/executor/jsonSerialization.cpp``: the ``IterationStats``,
  ``KvCacheStats`` and ``InflightBatchingStats`` JSON field names;
- ``tensorrt_llm/metrics/collector.py``: the ``trtllm_*`` Prometheus names, fed from each
  iteration's statistics (gauges keep the last iteration's values).

``FakeTriton`` (Triton Inference Server with TensorRT-LLM's model repositories):

- Triton ``docs/protocol/extension_generate.md``: ``POST /v2/models/{m}/generate`` and
  ``/generate_stream``, top-level inputs, ``{"error": "..."}`` bodies, SSE ``data:``
  events, an error object after a 200 status;
- Triton ``src/http_server.cc``: status codes (``/v2/health/ready`` 400 when not ready,
  model ready 400 ``{"error":"Model version not ready"}``, NOT_FOUND 404, INTERNAL 500),
  one-element output tensors as scalars, ``data: ...\\n\\n`` framing and no ``[DONE]``;
  KServe v2 model metadata (``GET /v2/models/{m}``);
- TensorRT-LLM ``triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt``,
  ``tensorrt_llm_bls/config.pbtxt`` and ``llmapi/tensorrt_llm/config.pbtxt``: input and
  output names (``text_input``, ``max_tokens``, ``stop_words``, ``min_tokens``, ``seed``,
  ``stream``, ``exclude_input_in_output``, ``return_num_output_tokens`` ...;
  ``sampling_param_*``, ``streaming``, ``return_finish_reason`` ...);
- tensorrtllm_backend ``README.md`` "Triton Metrics", and TensorRT-LLM
  ``triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc``
  and ``model_instance_state.cc``: ``nv_trt_llm_request_metrics{request_type=active|max|
  scheduled|context|waiting}`` (waiting = active - scheduled), ``nv_trt_llm_kv_cache_block_metrics
  {kv_cache_block_type=max|free|used|tokens_per|reused|fraction}``, the inflight-batcher and
  general families, ``nv_llm_output_token_len``; Triton's ``nv_inference_*`` counters and
  ``nv_inference_pending_request_count``; metrics on their own port.

The engine simulation: requests queue, up to ``max_active`` become active, an active
request is scheduled once its KV blocks (prompt plus ``max_tokens``, reserved up front as
TensorRT-LLM's default ``GUARANTEED_NO_EVICT`` policy does) fit; every ``iteration_s`` each
scheduled request gets one token. A request ends at ``max_tokens`` (``length``), at a stop
word (``stop``, the word kept in the output as TensorRT-LLM does), or at its "EOS" after
``eos_after`` tokens (``stop``) unless it ignores EOS.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["WORDS", "FakeEngine", "FakeTriton", "FakeTrtllmServe", "tokens"]

WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()
"""The placeholder vocabulary: one word is one token (for the gateway's estimate too)."""

_TOKEN = re.compile(r"\w+|[^\w\s]")


def tokens(text: str) -> int:
    """The fake tokenizer: a run of word characters or one punctuation character."""
    return len(_TOKEN.findall(text))


# -- the engine ---------------------------------------------------------------------------


@dataclass(eq=False)
class FakeRequest:
    prompt_tokens: int
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    first_word: int = 0
    prompt_blocks: list[int] = field(default_factory=list)
    """Hashes of the prompt's full KV blocks (for the reuse counters)."""
    generated: int = 0
    text: str = ""
    finish: str | None = None
    scheduled: bool = False
    reserved: int = 0
    events: asyncio.Queue[tuple[str, str | None]] = field(default_factory=asyncio.Queue)
    """(piece, finish_reason) per token; the last carries the finish reason."""


class FakeEngine:
    """A continuous-batching engine in virtual detail: queue, active set, KV blocks."""

    def __init__(
        self,
        *,
        max_active: int = 8,
        max_blocks: int = 256,
        tokens_per_block: int = 32,
        iteration_s: float = 0.01,
        eos_after: int = 12,
    ) -> None:
        self.max_active = max_active
        self.max_blocks = max_blocks
        self.tokens_per_block = tokens_per_block
        self.iteration_s = iteration_s
        self.eos_after = eos_after
        self.queue: collections.deque[FakeRequest] = collections.deque()
        self.active: list[FakeRequest] = []
        self.iter = 0
        self.completed_total = 0
        self.generated_total = 0
        self.aborted = 0
        self.alloc_total = self.alloc_new = self.reused = self.missed = 0
        self.cached: set[int] = set()
        self.stats: collections.deque[dict[str, Any]] = collections.deque(maxlen=1000)
        """Iteration statistics not yet read (TensorRT-LLM keeps at most 1000)."""
        self.stats_added = asyncio.Event()
        self.finished_by_reason: collections.Counter[str] = collections.Counter()
        self.output_lengths: list[int] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._words = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    # -- requests

    def submit(
        self,
        prompt: str,
        max_tokens: int,
        *,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        stop: list[str] | None = None,
        seed: int | None = None,
    ) -> FakeRequest:
        words = _TOKEN.findall(prompt)
        per = self.tokens_per_block
        blocks = [hash(tuple(words[: (i + 1) * per])) for i in range(len(words) // per)]
        if seed is None:
            self._words += 1
            seed = self._words
        req = FakeRequest(
            prompt_tokens=len(words),
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            ignore_eos=ignore_eos,
            stop=list(stop or ()),
            first_word=seed,
            prompt_blocks=blocks,
        )
        self.queue.append(req)
        self._wake.set()
        return req

    def cancel(self, req: FakeRequest) -> None:
        """The client went away: drop the request wherever it is."""
        if req.finish is not None:
            return
        req.finish = "cancelled"
        self.aborted += 1
        self.finished_by_reason["cancelled"] += 1
        if req in self.queue:
            self.queue.remove(req)
        if req in self.active:
            self.active.remove(req)

    # -- views

    def _blocks(self, req: FakeRequest, tokens_in_cache: int) -> int:
        return math.ceil(tokens_in_cache / self.tokens_per_block)

    @property
    def used_blocks(self) -> int:
        return sum(self._blocks(r, r.prompt_tokens + r.generated) for r in self.active if r.scheduled)

    @property
    def reserved_blocks(self) -> int:
        return sum(r.reserved for r in self.active if r.scheduled)

    @property
    def scheduled(self) -> int:
        return sum(1 for r in self.active if r.scheduled)

    # -- the loop

    async def _run(self) -> None:
        while True:
            if not self.active and not self.queue:
                self._wake.clear()
                await self._wake.wait()
            started = time.perf_counter()
            new = 0
            while self.queue and len(self.active) < self.max_active:
                self.active.append(self.queue.popleft())
                new += 1
            for req in self.active:
                if req.scheduled:
                    continue
                need = self._blocks(req, req.prompt_tokens + req.max_tokens)
                if self.reserved_blocks + need > self.max_blocks:
                    continue  # waits for KV blocks (active, not scheduled)
                req.scheduled, req.reserved = True, need
                hit = sum(1 for b in req.prompt_blocks if b in self.cached)
                self.reused += hit
                self.missed += need - hit
                self.alloc_total += need
                self.alloc_new += need - hit
                self.cached.update(req.prompt_blocks)
            entry = self._entry(new)
            context = sum(1 for r in self.active if r.scheduled and r.generated == 0)
            done = 0
            for req in [r for r in self.active if r.scheduled]:
                word = WORDS[(req.first_word + req.generated) % len(WORDS)]
                piece = " " + word
                req.generated += 1
                self.generated_total += 1
                req.text += piece
                finish = None
                if any(req.text.endswith(s) for s in req.stop):
                    finish = "stop"  # the stop word stays in the output, as in TensorRT-LLM
                elif req.generated >= req.max_tokens:
                    finish = "length"
                elif not req.ignore_eos and req.generated >= max(self.eos_after, req.min_tokens):
                    finish = "stop"  # the model's end token
                if finish is not None:
                    req.finish = finish
                    self.active.remove(req)
                    self.completed_total += 1
                    self.finished_by_reason[finish] += 1
                    self.output_lengths.append(req.generated)
                    done += 1
                req.events.put_nowait((piece, finish))
            entry["numCompletedRequests"] = done
            entry["inflightBatchingStats"]["numContextRequests"] = context
            entry["inflightBatchingStats"]["numGenRequests"] = (
                entry["inflightBatchingStats"]["numScheduledRequests"] - context
            )
            self.iter += 1
            entry["iterLatencyMS"] = round(
                (time.perf_counter() - started) * 1000 + self.iteration_s * 1000, 3
            )
            self.stats.append(entry)
            self.stats_added.set()
            await asyncio.sleep(self.iteration_s)

    def _entry(self, new: int) -> dict[str, Any]:
        """This iteration's statistics, as ``IterationStats`` serialises them (taken at the
        iteration's start: a request finishing in it still counts as active)."""
        now = time.time()
        stamp = time.strftime("%m-%d-%Y %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
        used = self.used_blocks
        queries = self.reused + self.missed
        return {
            "timestamp": stamp,
            "iter": self.iter,
            "iterLatencyMS": 0.0,
            "newActiveRequestsQueueLatencyMS": 0.0,
            "numNewActiveRequests": new,
            "numActiveRequests": len(self.active),
            "numQueuedRequests": len(self.queue),
            "numCompletedRequests": 0,
            "maxNumActiveRequests": self.max_active,
            "maxBatchSizeStatic": self.max_active,
            "maxBatchSizeTunerRecommended": 0,
            "maxBatchSizeRuntime": self.max_active,
            "maxNumTokensStatic": 8192,
            "maxNumTokensTunerRecommended": 0,
            "maxNumTokensRuntime": 8192,
            "gpuMemUsage": 76_665_782_272,
            "cpuMemUsage": 0,
            "pinnedMemUsage": 0,
            "kvCacheStats": {
                "maxNumBlocks": self.max_blocks,
                "freeNumBlocks": self.max_blocks - used,
                "usedNumBlocks": used,
                "tokensPerBlock": self.tokens_per_block,
                "allocTotalBlocks": self.alloc_total,
                "allocNewBlocks": self.alloc_new,
                "reusedBlocks": self.reused,
                "missedBlocks": self.missed,
                "cacheHitRate": round(self.reused / queries, 5) if queries else 0.0,
            },
            "staticBatchingStats": None,
            "inflightBatchingStats": {
                "numScheduledRequests": self.scheduled,
                "numContextRequests": 0,
                "numGenRequests": 0,
                "numPausedRequests": 0,
                "numCtxTokens": 0,
                "microBatchId": 0,
                "avgNumDecodedTokensPerIter": 1.0,
            },
            "specDecodingStats": None,
            "attentionDpRank": 0,
        }


# -- shared server plumbing -------------------------------------------------------------------


class _ThreadServer:
    """An aiohttp application on 127.0.0.1 (port 0), in its own thread and event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ports: list[int] = []
        self._started = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._start_error: BaseException | None = None

    def _apps(self) -> list[web.Application]:  # pragma: no cover - overridden
        raise NotImplementedError

    async def _on_start(self) -> None:
        return None

    async def _on_stop(self) -> None:
        return None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        runners: list[web.AppRunner] = []
        try:

            async def setup() -> None:
                await self._on_start()
                for app in self._apps():
                    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
                    await runner.setup()
                    site = web.TCPSite(runner, "127.0.0.1", 0)
                    await site.start()
                    runners.append(runner)
                    self.ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

            self.loop.run_until_complete(setup())
        except BaseException as exc:  # pragma: no cover - reported to the starting thread
            self._start_error = exc
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()

        async def teardown() -> None:
            await self._on_stop()
            for runner in runners:
                await runner.cleanup()

        self.loop.run_until_complete(teardown())
        # Whatever is still running (handlers of requests that never ended) is cancelled, so
        # the loop closes cleanly.
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
        self._stopped.set()

    def start(self) -> Any:
        self._thread.start()
        self._started.wait(10)
        if self._start_error is not None:
            raise self._start_error
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    def call(self, fn: Any) -> Any:
        """Run ``fn()`` on the server's loop and return its result (for tests that read state)."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _labels(**labels: str) -> str:
    """A Triton label set: sorted by name, with the model's version."""
    labels.setdefault("version", "1")
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def _sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


# -- trtllm-serve ---------------------------------------------------------------------------------

_SAMPLING = {
    "best_of", "use_beam_search", "top_k", "top_p_min", "min_p", "repetition_penalty", "length_penalty",
    "early_stopping", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
    "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
    "return_context_logits", "detokenize", "thinking_token_budget", "add_special_tokens",
    "response_format", "disaggregated_params", "priority", "conversation_params", "lora_request",
}  # fmt: skip
_COMPLETION_FIELDS = _SAMPLING | {
    "model", "prompt", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p",
    "user", "prompt_ignore_length",
}  # fmt: skip
_CHAT_FIELDS = _SAMPLING | {
    "model", "messages", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "max_tokens",
    "max_completion_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options",
    "temperature", "top_p", "tools", "tool_choice", "user", "echo", "add_generation_prompt",
    "documents", "chat_template", "chat_template_kwargs", "cache_salt", "reasoning_effort",
    "prompt_token_ids", "agent_hierarchy",
}  # fmt: skip


class FakeTrtllmServe(_ThreadServer):
    """FAKE ``trtllm-serve``: the OpenAI API, ``/health``, ``/version``, the JSON iteration
    statistics at ``/metrics`` and, with ``return_perf_metrics``, ``/prometheus/metrics``.

    Fault switches (set them from the test): ``healthy = False`` (``/health`` answers 503),
    ``fault = "http500"`` (the next requests fail with uvicorn's bare 500),
    ``fault = "drop"`` (streams break off after ``drop_after`` tokens, as when the
    generator raises mid-stream)."""

    def __init__(
        self,
        model: str = "TinyLlama-1.1B-Chat-v1.0",
        *,
        stats_wait_s: float = 0.3,
        iter_perf_stats: bool = True,
        return_perf_metrics: bool = False,
        max_num_tokens: int = 8192,
        **engine: Any,
    ) -> None:
        super().__init__()
        self.model = model
        self.stats_wait_s = stats_wait_s
        self.iter_perf_stats = iter_perf_stats
        self.return_perf_metrics = return_perf_metrics
        self.max_num_tokens = max_num_tokens
        self._engine_args = engine
        self.engine: FakeEngine
        self.healthy = True
        self.fault: str | None = None
        self.drop_after = 2
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.stats_reads = 0
        self._stats_done = False
        self._gauges: dict[str, float] = {}
        self._counters: collections.Counter[str] = collections.Counter()
        self._collector: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _on_start(self) -> None:
        self.engine = FakeEngine(**self._engine_args)
        self.engine.start()
        if self.return_perf_metrics:
            self._collector = asyncio.get_running_loop().create_task(self._collect())

    async def _on_stop(self) -> None:
        await self.engine.stop()
        if self._collector is not None:
            self._collector.cancel()

    def _apps(self) -> list[web.Application]:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        if self.return_perf_metrics:
            app.router.add_get("/prometheus/metrics", self._prometheus)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        return [app]

    # -- probes

    async def _health(self, request: web.Request) -> web.Response:
        if self.healthy:
            return web.Response(status=200)
        return web.Response(
            status=503, text="LLM is unavailable. Please check the server logs for more details."
        )

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "1.2.0"})

    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "created": int(time.time()), "owned_by": "tensorrt_llm"}
        return web.json_response({"object": "list", "data": [card]})

    async def _metrics(self, request: web.Request) -> web.Response:
        """``get_stats_async(2)``: nothing when marked done; else drain, then wait for more
        until ``stats_wait_s`` passes without a new iteration (and mark done)."""
        self.stats_reads += 1
        out: list[dict[str, Any]] = []
        engine = self.engine
        if not self.iter_perf_stats or self._stats_done:
            return web.json_response(out)
        while True:
            while engine.stats:
                out.append(engine.stats.popleft())
            engine.stats_added.clear()
            try:
                await asyncio.wait_for(engine.stats_added.wait(), self.stats_wait_s)
            except TimeoutError:
                self._stats_done = True
                return web.json_response(out)

    async def _collect(self) -> None:
        """With ``return_perf_metrics``: the server's own collector drains the statistics
        into Prometheus gauges (so ``/metrics`` finds nothing)."""
        engine = self.engine
        prev_reused = prev_missed = 0
        while True:
            await engine.stats_added.wait()
            engine.stats_added.clear()
            while engine.stats:
                s = engine.stats.popleft()
                kv = s["kvCacheStats"]
                self._gauges.update(
                    {
                        "trtllm_num_requests_running": s["numActiveRequests"],
                        "trtllm_num_requests_waiting": s["numQueuedRequests"],
                        "trtllm_max_num_active_requests": s["maxNumActiveRequests"],
                        "trtllm_kv_cache_hit_rate": kv["cacheHitRate"],
                        "trtllm_kv_cache_utilization": kv["usedNumBlocks"] / kv["maxNumBlocks"],
                        "trtllm_kv_cache_max_blocks": kv["maxNumBlocks"],
                        "trtllm_kv_cache_free_blocks": kv["freeNumBlocks"],
                        "trtllm_kv_cache_used_blocks": kv["usedNumBlocks"],
                        "trtllm_kv_cache_tokens_per_block": kv["tokensPerBlock"],
                        "trtllm_iteration_latency_seconds": s["iterLatencyMS"] / 1000,
                    }
                )
                self._counters["trtllm_kv_cache_reused_blocks_total"] += kv["reusedBlocks"] - prev_reused
                self._counters["trtllm_kv_cache_missed_blocks_total"] += kv["missedBlocks"] - prev_missed
                self._counters["trtllm_num_requests_completed_total"] += s["numCompletedRequests"]
                prev_reused, prev_missed = kv["reusedBlocks"], kv["missedBlocks"]

    async def _prometheus(self, request: web.Request) -> web.Response:
        labels = f'engine_type="undefined",model_name="undefined",pid="{os.getpid()}"'
        lines: list[str] = []
        for name, value in sorted(self._gauges.items()):
            lines += [f"# HELP {name} {name}", f"# TYPE {name} gauge", f"{name}{{{labels}}} {float(value)}"]
        counters = dict(self._counters)
        counters["trtllm_generation_tokens_total"] = self.engine.generated_total
        for name, value in sorted(counters.items()):
            base = name.removesuffix("_total")
            lines += [f"# HELP {base} {base}", f"# TYPE {base} counter", f"{name}{{{labels}}} {float(value)}"]
        lines += ["# HELP trtllm_request_success Count", "# TYPE trtllm_request_success counter"]
        for reason, n in sorted(self.engine.finished_by_reason.items()):
            lines.append(f'trtllm_request_success_total{{{labels},finished_reason="{reason}"}} {float(n)}')
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")

    # -- generation

    def _validation_error(self, kind: str, field_name: str, message: str, value: Any) -> web.Response:
        detail = {"type": kind, "loc": ("body", field_name), "msg": message, "input": value}
        return web.json_response({"error": f"1 validation error:\n  {detail}"}, status=400)

    def _error(self, message: str, status: int = 400, kind: str = "BadRequestError") -> web.Response:
        body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
        return web.json_response(body, status=status)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        if self.fault == "http500":
            return web.Response(status=500, text="Internal Server Error")
        allowed = _CHAT_FIELDS if chat else _COMPLETION_FIELDS
        for name, value in body.items():
            if name not in allowed:
                return self._validation_error(
                    "extra_forbidden", name, "Extra inputs are not permitted", value
                )
        priority = body.get("priority")
        if priority is not None and (not isinstance(priority, int | float) or not 0 <= priority <= 1):
            return self._validation_error(
                "less_than_equal", "priority", "Input should be less than or equal to 1", priority
            )
        if body.get("stream_options") and not body.get("stream"):
            return self._validation_error(
                "value_error",
                "stream_options",
                "Stream options can only be defined when stream is true.",
                None,
            )
        if chat:
            prompt = "".join(f"<|{m.get('role')}|>\n{m.get('content')}</s>\n" for m in body["messages"])
            prompt += "<|assistant|>\n"
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        else:
            prompt = body["prompt"] if isinstance(body["prompt"], str) else " ".join(map(str, body["prompt"]))
            max_tokens = body.get("max_tokens")
        n_prompt = tokens(prompt)
        if n_prompt > self.max_num_tokens:
            return self._error(
                f"The sum of prompt length ({n_prompt}), query length (0) should not exceed "
                f"max_num_tokens ({self.max_num_tokens})"
            )
        stop = body.get("stop") or []
        req = self.engine.submit(
            prompt,
            max_tokens or 16,
            min_tokens=int(body.get("min_tokens") or 0),
            ignore_eos=bool(body.get("ignore_eos")),
            stop=[stop] if isinstance(stop, str) else list(stop),
            seed=body.get("seed"),
        )
        self._stats_done = False  # a new request marks the statistics result undone
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        if not body.get("stream"):
            try:
                while True:
                    _piece, finish = await req.events.get()
                    if finish is not None:
                        break
            except asyncio.CancelledError:
                self.engine.cancel(req)
                raise
            return web.json_response(self._whole(ident, created, chat, req, n_prompt))
        resp = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        options = body.get("stream_options") or {}
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": ident, "object": obj, "created": created, "model": self.model}
        try:
            if chat:
                first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                await resp.write(_sse({**head, "choices": [first]}))
            sent = 0
            while True:
                piece, finish = await req.events.get()
                if self.fault == "drop" and sent >= self.drop_after:
                    self.engine.cancel(req)
                    request.transport.close()  # type: ignore[union-attr]
                    return resp
                text = {"delta": {"content": piece}} if chat else {"text": piece}
                stop_reason = None
                if finish == "stop" and any(req.text.endswith(s) for s in req.stop):
                    stop_reason = next(s for s in req.stop if req.text.endswith(s))
                choice = {"index": 0, **text, "finish_reason": finish, "stop_reason": stop_reason}
                await resp.write(_sse({**head, "choices": [choice]}))
                sent += 1
                if finish is not None:
                    break
            if options and options.get("include_usage", True):
                usage = self._usage(req, n_prompt)
                await resp.write(_sse({**head, "choices": [], "usage": usage}))
            await resp.write(b"data: [DONE]\n\n")
        except asyncio.CancelledError:
            self.engine.cancel(req)
            raise
        except ConnectionError:
            # The client went away: trtllm-serve's await_disconnected aborts the request.
            self.engine.cancel(req)
        return resp

    def _usage(self, req: FakeRequest, n_prompt: int) -> dict[str, Any]:
        return {
            "prompt_tokens": n_prompt,
            "total_tokens": n_prompt + req.generated,
            "completion_tokens": req.generated,
            "prompt_tokens_details": {"cached_tokens": 0},
        }

    def _whole(self, ident: str, created: int, chat: bool, req: FakeRequest, n_prompt: int) -> dict[str, Any]:
        if chat:
            message = {"role": "assistant", "content": req.text, "reasoning_content": None, "tool_calls": []}
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None}
        else:
            choice = {"index": 0, "text": req.text, "token_ids": None, "logprobs": None}
        choice.update({"finish_reason": req.finish, "stop_reason": None})
        return {
            "id": ident,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": self.model,
            "choices": [choice],
            "usage": self._usage(req, n_prompt),
        }


# -- Triton ---------------------------------------------------------------------------------------

_ENSEMBLE_INPUTS = {
    "text_input": "BYTES", "decoder_text_input": "BYTES", "max_tokens": "INT32",
    "num_return_sequences": "INT32", "bad_words": "BYTES", "stop_words": "BYTES",
    "exclude_input_in_output": "BOOL", "end_id": "INT32", "pad_id": "INT32", "top_k": "INT32",
    "top_p": "FP32", "temperature": "FP32", "length_penalty": "FP32", "repetition_penalty": "FP32",
    "min_tokens": "INT32", "presence_penalty": "FP32", "frequency_penalty": "FP32", "seed": "UINT64",
    "return_log_probs": "BOOL", "return_context_logits": "BOOL", "return_generation_logits": "BOOL",
    "return_perf_metrics": "BOOL", "return_num_input_tokens": "BOOL", "return_num_output_tokens": "BOOL",
    "beam_width": "INT32", "stream": "BOOL",
}  # fmt: skip
_LLMAPI_INPUTS = {
    "text_input": "BYTES", "streaming": "BOOL", "sampling_param_best_of": "INT32",
    "sampling_param_temperature": "FP32", "sampling_param_top_k": "INT32", "sampling_param_top_p": "FP32",
    "sampling_param_frequency_penalty": "FP32", "sampling_param_presence_penalty": "FP32",
    "sampling_param_max_tokens": "INT32", "sampling_param_stop": "BYTES", "sampling_param_seed": "UINT64",
    "sampling_param_exclude_input_from_output": "BOOL", "sampling_param_return_perf_metrics": "BOOL",
    "return_finish_reason": "BOOL", "return_stop_reason": "BOOL", "return_cumulative_logprob": "BOOL",
    "stop": "BOOL",
}  # fmt: skip
_REQUIRED = {"ensemble": ("text_input", "max_tokens"), "llmapi": ("text_input",)}


class FakeTriton(_ThreadServer):
    """FAKE Triton Inference Server serving a TensorRT-LLM repository: the generate
    extension, health and model-ready probes, model metadata, and Prometheus metrics on a
    second port.

    ``repository="ensemble"``: the inflight-batcher repository (``ensemble``,
    ``preprocessing``, ``tensorrt_llm``, ``postprocessing``, ``tensorrt_llm_bls``; metrics
    labelled ``model="tensorrt_llm"``). ``repository="llmapi"``: the LLM-API repository
    (one ``tensorrt_llm`` model with ``sampling_param_*`` inputs and a ``finish_reason``
    output). ``old_inputs=True`` drops the inputs older repositories lack (``return_num_*_tokens``)
    and renames ``seed``/``min_tokens`` to ``random_seed``/``min_length``.

    Fault switches: ``server_ready``/``model_ready = False``; ``fault = "http500"`` (the
    executor fails before the first response: 500 with an error object), ``"midstream"``
    (an error event after ``fail_after`` tokens, status already 200), ``"drop"`` (the
    connection closes mid-stream)."""

    def __init__(self, repository: str = "ensemble", *, old_inputs: bool = False, **engine: Any) -> None:
        super().__init__()
        self.repository = repository
        inputs = dict(_LLMAPI_INPUTS if repository == "llmapi" else _ENSEMBLE_INPUTS)
        if old_inputs and repository != "llmapi":
            for name in ("return_num_input_tokens", "return_num_output_tokens", "return_perf_metrics"):
                inputs.pop(name)
            inputs["random_seed"] = inputs.pop("seed")
            inputs["min_length"] = inputs.pop("min_tokens")
        self.inputs = inputs
        self.schema = "llmapi" if repository == "llmapi" else "ensemble"
        self.generative = ("tensorrt_llm",) if repository == "llmapi" else ("ensemble", "tensorrt_llm_bls")
        models = ("tensorrt_llm",) if repository == "llmapi" else (
            "ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls",
        )  # fmt: skip
        self.models = dict.fromkeys(models, True)
        """Model name -> ready."""
        self._engine_args = engine
        self.engine: FakeEngine
        self.server_ready = True
        self.accumulate_tokens = False
        """The BLS model's ``accumulate_tokens`` parameter: streamed ``text_output`` holds the
        whole text so far."""
        self.fault: str | None = None
        self.fail_after = 2
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.success: collections.Counter[str] = collections.Counter()
        self.failure: collections.Counter[str] = collections.Counter()

    @property
    def model_ready(self) -> bool:
        return all(self.models.values())

    @model_ready.setter
    def model_ready(self, value: bool) -> None:
        for name in self.models:
            self.models[name] = value

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def metrics_port(self) -> int:
        return self.ports[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    async def _on_start(self) -> None:
        self.engine = FakeEngine(**self._engine_args)
        self.engine.start()

    async def _on_stop(self) -> None:
        await self.engine.stop()

    def _apps(self) -> list[web.Application]:
        app = web.Application()
        app.router.add_get("/v2/health/live", self._live)
        app.router.add_get("/v2/health/ready", self._ready)
        app.router.add_get("/v2/models/{model}", self._metadata)
        app.router.add_get("/v2/models/{model}/ready", self._model_ready)
        app.router.add_post("/v2/models/{model}/generate", self._generate)
        app.router.add_post("/v2/models/{model}/generate_stream", self._generate)
        metrics = web.Application()
        metrics.router.add_get("/metrics", self._metrics)
        return [app, metrics]

    @staticmethod
    def _err(message: str, status: int = 400) -> web.Response:
        return web.json_response({"error": message}, status=status)

    async def _live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.server_ready and self.model_ready else 400)

    def _unknown(self, model: str) -> web.Response:
        return self._err(f"Request for unknown model: '{model}' is not found", 404)

    async def _model_ready(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        if model not in self.models:
            return self._unknown(model)
        if not self.models[model]:
            return self._err("Model version not ready")
        return web.Response(status=200)

    async def _metadata(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        if model not in self.models:
            return self._unknown(model)
        if model in self.generative:
            inputs = [{"name": n, "datatype": t, "shape": [-1, 1]} for n, t in self.inputs.items()]
            outputs = [{"name": "text_output", "datatype": "BYTES", "shape": [-1, -1]}]
        else:
            inputs = outputs = []
        platform = "ensemble" if model == "ensemble" else "python"
        return web.json_response(
            {"name": model, "versions": ["1"], "platform": platform, "inputs": inputs, "outputs": outputs}
        )

    # -- generate

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        model = request.match_info["model"]
        streaming_endpoint = request.path.endswith("/generate_stream")
        self.paths.append(request.path)
        if model not in self.models:
            return self._unknown(model)
        if model not in self.generative:
            return self._err(
                f"[request id: <id_unknown>] expected 1 inputs but got 0 inputs for model '{model}'"
            )
        if not self.models[model]:
            return self._err(f"Request for unknown model: '{model}' has no available versions", 400)
        try:
            body = await request.json()
        except ValueError:
            return self._err("failed to parse the request JSON buffer: The document is empty. at 0")
        self.bodies.append(body)
        given = [k for k in body if k not in ("id", "parameters")]
        for name in given:
            if name not in self.inputs:
                return self._err(
                    f"[request id: <id_unknown>] unexpected inference input '{name}' for model '{model}'"
                )
        missing = [n for n in _REQUIRED[self.schema] if n not in body]
        if missing:
            return self._err(
                f"[request id: <id_unknown>] expected {len(_REQUIRED[self.schema])} inputs but got "
                f"{len([n for n in _REQUIRED[self.schema] if n in body])} inputs for model '{model}'. "
                f"Got input(s) {given}, but missing required input(s) {missing}. "
                "Please provide all required input(s)."
            )
        ens = self.schema == "ensemble"
        max_key = "max_tokens" if ens else "sampling_param_max_tokens"
        max_tokens = body.get(max_key, 64)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            return self._err(
                f"[request id: <id_unknown>] Unable to parse '{max_key}': "
                "attempt to access JSON non-int as int"
            )
        if self.fault == "http500":
            self.failure[model] += 1
            return self._err(
                f"in ensemble '{model}', Executor failed process requestId 1 due to the following error: "
                "[TensorRT-LLM][ERROR] Assertion failed: fake executor failure",
                500,
            )
        prompt = body["text_input"]
        if isinstance(prompt, list):
            prompt = prompt[0]
        stop_key = "stop_words" if ens else "sampling_param_stop"
        stop = body.get(stop_key) or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        min_key = "min_tokens" if "min_tokens" in self.inputs else "min_length"
        seed_key = ("seed" if "seed" in self.inputs else "random_seed") if ens else "sampling_param_seed"
        req = self.engine.submit(
            prompt,
            max_tokens,
            min_tokens=int(body.get(min_key) or 0) if ens else 0,
            stop=[s for s in stop if s],
            seed=body.get(seed_key),
        )
        stream = bool(body.get("stream" if ens else "streaming")) and streaming_endpoint
        exclude = bool(
            body.get("exclude_input_in_output" if ens else "sampling_param_exclude_input_from_output")
        )
        head = {"model_name": model, "model_version": "1"}
        counts = ens and body.get("return_num_output_tokens")
        n_prompt = tokens(prompt)

        def event(text: str, n_out: int, finish: str | None) -> dict[str, Any]:
            out: dict[str, Any] = {**head}
            if ens:
                out.update(
                    {
                        "batch_index": 0,
                        "context_logits": 0.0,
                        "cum_log_probs": 0.0,
                        "generation_logits": 0.0,
                        "output_log_probs": [0.0] * max(n_out, 1) if n_out > 1 else 0.0,
                        "sequence_end": False,
                        "sequence_id": 0,
                        "sequence_index": 0,
                        "sequence_start": False,
                    }
                )
                if body.get("return_num_input_tokens"):
                    out["num_input_tokens"] = n_prompt
                if counts:
                    out["num_output_tokens"] = n_out
            elif body.get("return_finish_reason"):
                out["finish_reason"] = finish or ""
            out["text_output"] = text
            return out

        if not stream:
            try:
                while True:
                    _piece, finish = await req.events.get()
                    if finish is not None:
                        break
            except asyncio.CancelledError:
                self.engine.cancel(req)
                raise
            self.success[model] += 1
            text = req.text if exclude else prompt + req.text
            response = event(text, req.generated, req.finish)
            if not streaming_endpoint:
                return web.json_response(response)
            resp = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
            await resp.prepare(request)
            await resp.write(_sse(response))
            await resp.write_eof()
            return resp
        resp = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        sent = 0
        try:
            while True:
                piece, finish = await req.events.get()
                if self.fault == "midstream" and sent >= self.fail_after:
                    self.engine.cancel(req)
                    self.failure[model] += 1
                    await resp.write(
                        _sse(
                            {
                                "error": f"in ensemble '{model}', Executor failed process requestId 7 due "
                                "to the following error: Encountered an error in forwardAsync function: "
                                "fake CUDA error"
                            }
                        )
                    )
                    await resp.write_eof()
                    return resp
                if self.fault == "drop" and sent >= self.fail_after:
                    self.engine.cancel(req)
                    request.transport.close()  # type: ignore[union-attr]
                    return resp
                text = req.text if self.accumulate_tokens else piece
                await resp.write(_sse(event(text, 1, finish)))
                sent += 1
                if finish is not None:
                    break
            self.success[model] += 1
            await resp.write_eof()
        except asyncio.CancelledError:
            self.engine.cancel(req)
            raise
        except ConnectionError:
            # The client went away: Triton cancels the request in the backend.
            self.engine.cancel(req)
        return resp

    # -- metrics

    async def _metrics(self, request: web.Request) -> web.Response:
        e = self.engine
        llm = "tensorrt_llm"
        active = len(e.active)
        scheduled = e.scheduled
        used = e.used_blocks
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lines.append(f"{name}{{{labels}}} {value:g}")

        models = list(self.models)
        family(
            "nv_inference_request_success",
            "counter",
            "Number of successful inference requests, all batch sizes",
            [(_labels(model=m), self.success[m]) for m in models],
        )
        family(
            "nv_inference_request_failure",
            "counter",
            "Number of failed inference requests, all batch sizes",
            [(_labels(model=m), self.failure[m]) for m in models],
        )
        family(
            "nv_inference_pending_request_count",
            "gauge",
            "Instantaneous number of pending requests awaiting execution per-model.",
            # TensorRT-LLM's decoupled model hands requests to its executor at once.
            [(_labels(model=m), 0) for m in models],
        )
        if self.schema == "ensemble":
            family(
                "nv_trt_llm_request_metrics",
                "gauge",
                "TRT LLM request metrics",
                [
                    (_labels(model=llm, request_type="waiting"), active - scheduled),
                    (_labels(model=llm, request_type="context"), 0),
                    (_labels(model=llm, request_type="scheduled"), scheduled),
                    (_labels(model=llm, request_type="max"), e.max_active),
                    (_labels(model=llm, request_type="active"), active),
                ],
            )
            family(
                "nv_trt_llm_runtime_memory_metrics",
                "gauge",
                "TRT LLM runtime memory metrics",
                [
                    (_labels(model=llm, memory_type="pinned"), 0),
                    (_labels(model=llm, memory_type="gpu"), 1610236),
                    (_labels(model=llm, memory_type="cpu"), 0),
                ],
            )
            family(
                "nv_trt_llm_kv_cache_block_metrics",
                "gauge",
                "TRT LLM KV cache block metrics",
                [
                    (_labels(model=llm, kv_cache_block_type="fraction"), used / e.max_blocks),
                    (_labels(model=llm, kv_cache_block_type="tokens_per"), e.tokens_per_block),
                    (_labels(model=llm, kv_cache_block_type="used"), used),
                    (_labels(model=llm, kv_cache_block_type="free"), e.max_blocks - used),
                    (_labels(model=llm, kv_cache_block_type="max"), e.max_blocks),
                    (_labels(model=llm, kv_cache_block_type="reused"), e.reused),
                ],
            )
            family(
                "nv_trt_llm_inflight_batcher_metrics",
                "gauge",
                "TRT LLM inflight_batcher-specific metrics",
                [
                    (_labels(model=llm, inflight_batcher_specific_metric="paused_requests"), 0),
                    (_labels(model=llm, inflight_batcher_specific_metric="micro_batch_id"), 0),
                    (_labels(model=llm, inflight_batcher_specific_metric="generation_requests"), scheduled),
                    (_labels(model=llm, inflight_batcher_specific_metric="total_context_tokens"), 0),
                ],
            )
            family(
                "nv_trt_llm_general_metrics",
                "gauge",
                "General TRT LLM metrics",
                [
                    (_labels(model=llm, general_type="iteration_counter"), e.iter),
                    (_labels(model=llm, general_type="timestamp"), int(time.time() * 1e6)),
                ],
            )
            lengths = e.output_lengths
            buckets = [(10.0, "10"), (50.0, "50"), (100.0, "100"), (500.0, "500"), (1000.0, "1000")]
            lines.append("# HELP nv_llm_output_token_len TRT LLM response metrics")
            lines.append("# TYPE nv_llm_output_token_len histogram")
            lab = _labels(model=llm, response_metric_type="total_output_tokens")
            for bound, text in buckets:
                count = sum(1 for n in lengths if n <= bound)
                lines.append(f'nv_llm_output_token_len_bucket{{{lab},le="{text}"}} {count}')
            lines.append(f'nv_llm_output_token_len_bucket{{{lab},le="+Inf"}} {len(lengths)}')
            lines.append(f"nv_llm_output_token_len_sum{{{lab}}} {sum(lengths)}")
            lines.append(f"nv_llm_output_token_len_count{{{lab}}} {len(lengths)}")
        family(
            "nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", [('gpu_uuid="GPU-fake"', 0.42)]
        )
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")
