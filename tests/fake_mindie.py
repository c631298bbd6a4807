"""A fake MindIE Service (``mindieservice_daemon``) for tests. It is NOT MindIE: it generates
placeholder words instead of running a model, on the CPU, in a few hundred lines of Python.
What it imitates is the HTTP surface the ``ascend`` backend talks to, as MindIE publishes it,
so the adapter can be tested for streaming, non-streaming, errors, health and load parsing on
a machine without NPUs.

Followed, in order of authority:

1. MindIE's published documentation (hiascend.com, MindIE LLM / MindIE Service developer
   guides for MindIE 1.0.0, 2.x and 3.x; the same pages are in the Ascend/MindIE-LLM
   repository under ``docs/zh/user_guide/user_manual/``):

   - "EndPoint RESTful接口使用说明" (``service_APIs_usage_guidance.md``): which API lives on
     which plane; ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions`` on the
     business plane; ``/health``, ``/v2/health/live``, ``/v2/health/ready``,
     ``/health/timed[-N]``, ``/v1/config`` on the management plane; ``/metrics`` on the
     metrics plane.
   - "ServerConfig参数说明" (``service_parameter_configuration.md``): ``port`` 1025,
     ``managementPort`` 1026, ``metricsPort`` 1027; one HTTP server for every plane when the
     addresses and ports are equal; ``MIES_CONFIG_JSON_PATH`` names the config file.
   - "健康探针接口" (``/health/timed-${TIMEOUT}``, TIMEOUT 1..600, default 10, answers
     ``{"status": "healthy"}``) and "健康检查" (``/health``: 200 with no body).
   - "服务管控指标查询接口(普罗格式)" (``/metrics``; needs ``MIES_SERVICE_MONITOR_MODE=1``): the
     metric names, types and ``model_name`` label; the page shape is the published example
     recorded in ``tests/data/mindie_metrics_docs_example.txt``.

2. What the documents leave out, from MindIE-LLM's source (github.com/Ascend/MindIE-LLM,
   ``src/server/endpoint/``, master as of 2026; Mulan PSL v2; read, not copied):

   - ``utils/http_rest_resource.{h,cpp}``: every error body is ``{"error": message,
     "error_type": kind}``, the kinds being "Bad Request" (400), "NotFoundError" (404),
     "Input Validation Error" (422), "Generation Error" (424), "Incomplete Generation" (500)
     and "Service Unavailable" (503); JSON answers carry ``Connection: close``.
   - ``single_req_infer_interface/single_req_infer_interface_base.cpp``: request validation
     answers 422 (a missing or unknown ``model`` is "Model not found"), a refused enqueue
     424; ``single_req_vllm_openai_infer_interface.cpp`` and
     ``..._completions_infer_interface.cpp``: the chunk and response bodies; a first chunk
     with an empty assistant delta; ``role`` in every delta; usage only in the last chunk,
     whatever ``stream_options`` says (MindIE does not read it); ``data: [DONE]``.
   - ``single_llm_req_handler/single_llm_pnd_req_handler.cpp``: a failure after the stream
     has started is written into the body *raw* ("Failed to get engine response", "Engine
     callback timeout: ...") and the stream then ends cleanly, without ``[DONE]``.
   - ``http_wrapper/http_handler.cpp``: ``/v2/health/live`` answers 200 while busy (with
     ``{"message": "Service is alive but busy"}``) where ``/v2/health/ready`` answers 503;
     503 with no body before the engine is up; 500 ``{"message": "Service is abnormal"}``;
     ``/metrics`` without monitor mode answers 500 "Environment variable
     MIES_SERVICE_MONITOR_MODE is not set."; ``/v1/models`` lists ``id``, ``object``,
     ``root``, ``owned_by`` ("MindIE Server") and ``parent``, and no ``max_model_len``;
     ``/v1/config`` answers ``modelName``, ``maxSeqLen``, ``maxOutputLen``, ...
   - ``http_wrapper/prometheus_metrics.cpp``: HELP texts, the histogram buckets, and that
     ``npu_cache_usage_perc`` is (total - free) / total NPU blocks.

Guessed, because neither says: the request ids, how the exact prompt token count and the
"input too long" message look (the fake counts words and answers a 424), and timings.

Run it in a test through :class:`FakeMindie` (a thread with its own event loop), or as a
process like the daemon: ``python tests/fake_mindie.py`` reads ``MIES_CONFIG_JSON_PATH`` (a
MindIE ``config.json``), honours ``MIES_SERVICE_MONITOR_MODE``, and prints
``serving fake MindIE on http://HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

__all__ = ["FakeMindie", "FakeMindieConfig", "main"]

ERROR_TYPES = {
    400: "Bad Request",
    404: "NotFoundError",
    422: "Input Validation Error",
    424: "Generation Error",
    500: "Incomplete Generation",
    503: "Service Unavailable",
}
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TBT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
TOKEN_BUCKETS = (10, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
MAX_INT32 = 2**31 - 1

Health = Literal["ok", "busy", "starting", "abnormal"]


@dataclass
class FakeMindieConfig:
    """What the fake serves; the ``config.json`` fields it stands for are named."""

    model_name: str = "qwen2.5-7b"
    """``ModelConfig[0].modelName``: the only name ``model`` may take."""
    model_weight_path: str = "/data/weights/qwen2.5-7b"
    lora_names: list[str] = field(default_factory=list)
    """LoRA adapters, listed in ``/v1/models`` with the base model as ``parent``."""
    max_seq_len: int = 2560
    """``ModelDeployConfig.maxSeqLen``, reported by ``/v1/config``."""
    max_iter_times: int = 512
    """``ScheduleConfig.maxIterTimes``: the output limit when a request sets no ``max_tokens``."""
    max_batch_size: int = 4
    """``ScheduleConfig.maxBatchSize``: requests generating at once; the rest wait."""
    cache_block_size: int = 128
    npu_blocks: int = 64
    """NPU KV-cache blocks, for ``npu_cache_usage_perc``."""
    output_tokens: int = 8
    """Tokens generated before a natural stop (``ignore_eos`` generates up to ``max_tokens``)."""
    host: str = "127.0.0.1"
    port: int = 0
    """Business plane port (0: a free one)."""
    management_port: int | None = None
    """``None``: the business plane's server also serves the management routes."""
    metrics_port: int | None = None
    """``None``: the management plane's server also serves ``/metrics``."""
    monitor_mode: bool = True
    """``MIES_SERVICE_MONITOR_MODE=1``: without it ``/metrics`` answers 500."""
    ttft_s: float = 0.0
    token_s: float = 0.0

    @classmethod
    def from_mindie_config(cls, data: dict[str, Any], **overrides: Any) -> FakeMindieConfig:
        """The fake's settings from a MindIE ``config.json`` (the fields it knows)."""
        server = data.get("ServerConfig", {})
        backend = data.get("BackendConfig", {})
        deploy = backend.get("ModelDeployConfig", {})
        models = deploy.get("ModelConfig") or [{}]
        schedule = backend.get("ScheduleConfig", {})
        port = int(server.get("port", 1025))
        management = int(server.get("managementPort", port))
        metrics = int(server.get("metricsPort", management))
        same_ip = server.get("managementIpAddress", server.get("ipAddress")) == server.get("ipAddress")
        values: dict[str, Any] = {
            "model_name": models[0].get("modelName", cls.model_name),
            "model_weight_path": models[0].get("modelWeightPath", cls.model_weight_path),
            "max_seq_len": int(deploy.get("maxSeqLen", cls.max_seq_len)),
            "max_iter_times": int(schedule.get("maxIterTimes", cls.max_iter_times)),
            "max_batch_size": int(schedule.get("maxBatchSize", cls.max_batch_size)),
            "cache_block_size": int(schedule.get("cacheBlockSize", cls.cache_block_size)),
            "host": server.get("ipAddress", cls.host),
            "port": port,
            "management_port": None if same_ip and management == port else management,
            "metrics_port": None if metrics == management else metrics,
        }
        values.update(overrides)
        return cls(**values)


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1


def _num(value: float) -> str:
    """A number as prometheus-cpp's text serializer prints it ("3188", "0.5")."""
    return f"{value:.17g}" if value != int(value) else str(int(value))


class FakeMindie:
    """The fake server. Fault switches are plain attributes, changed between requests."""

    def __init__(self, config: FakeMindieConfig | None = None) -> None:
        self.config = config or FakeMindieConfig()
        # -- fault switches ----------------------------------------------------------------
        self.health: Health = "ok"
        self.error_status: int | None = None
        """Answer every inference request with this status and MindIE's error body."""
        self.error_message = "Failed to enqueue inferRequest. Engine is not ready."
        self.stream_error_after: int | None = None
        """Streams write this many token chunks, then MindIE's raw failure text, then end."""
        self.stream_error_text = "Failed to get engine response"
        self.drop_stream_after: int | None = None
        """Streams write this many token chunks, then the connection is cut."""
        # -- state ----------------------------------------------------------------------------
        self.bodies: list[dict[str, Any]] = []
        self.running = 0
        self.waiting = 0
        self.aborted = 0
        self._used_blocks = 0
        self._ids = itertools.count(1)
        self._received = self._success = self._failed = 0
        self._prompt_tokens = self._generation_tokens = 0
        self._ttft = _Histogram(TTFT_BUCKETS)
        self._tbt = _Histogram(TBT_BUCKETS)
        self._e2e = _Histogram(E2E_BUCKETS)
        self._prompt_hist = _Histogram(tuple(float(b) for b in TOKEN_BUCKETS))
        self._generation_hist = _Histogram(tuple(float(b) for b in TOKEN_BUCKETS))
        self._slots: asyncio.Semaphore | None = None
        self._runners: list[web.AppRunner] = []
        self.ports: dict[str, int] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None

    # -- addresses -------------------------------------------------------------------------------

    def _plane_url(self, plane: str) -> str:
        return f"http://{self.config.host}:{self.ports[plane]}"

    @property
    def url(self) -> str:
        """The business plane (``base_url``)."""
        return self._plane_url("business")

    @property
    def management_url(self) -> str:
        return self._plane_url("management")

    @property
    def metrics_url(self) -> str:
        return self._plane_url("metrics")

    # -- serving ---------------------------------------------------------------------------------

    async def serve(self) -> None:
        """Start the plane servers on the running loop (one per distinct port)."""
        cfg = self.config
        self._slots = asyncio.Semaphore(cfg.max_batch_size)
        groups: list[tuple[int, list[str]]] = [(cfg.port, ["business"])]
        if cfg.management_port is None:
            groups[0][1].append("management")
        else:
            groups.append((cfg.management_port, ["management"]))
        if cfg.metrics_port is None:
            groups[-1][1].append("metrics")
        else:
            groups.append((cfg.metrics_port, ["metrics"]))
        for port, planes in groups:
            app = web.Application()
            if "business" in planes:
                app.router.add_post("/v1/chat/completions", self._chat)
                app.router.add_post("/v1/completions", self._completions)
                app.router.add_get("/v1/models", self._models)
                app.router.add_get("/v1/models/{model}", self._model)
            if "management" in planes:
                app.router.add_get("/health", self._health)
                app.router.add_get("/v2/health/live", self._live)
                app.router.add_get("/v2/health/ready", self._ready)
                app.router.add_get(r"/health/timed{timeout:(-[0-9]+)?}", self._timed)
                app.router.add_get("/v1/config", self._v1_config)
            if "metrics" in planes:
                app.router.add_get("/metrics", self._metrics)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, cfg.host, port)
            await site.start()
            bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._runners.append(runner)
            for plane in planes:
                self.ports[plane] = bound

    async def close(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    def start(self) -> FakeMindie:
        """Serve from a background thread (for tests, sync or async)."""

        def run() -> None:
            loop = asyncio.new_event_loop()
            self.loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.serve())
            except BaseException as exc:
                self._start_error = exc
                self._started.set()
                return
            self._started.set()
            loop.run_forever()
            loop.run_until_complete(self.close())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-mindie", daemon=True)
        self._thread.start()
        self._started.wait(10)
        if self._start_error is not None:
            raise RuntimeError("the fake MindIE did not start") from self._start_error
        return self

    def stop(self) -> None:
        if self.loop is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    def __enter__(self) -> FakeMindie:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- MindIE's answers ------------------------------------------------------------------------

    @staticmethod
    def _json(body: Any, status: int = 200, *, indent: int | None = None) -> web.Response:
        text = json.dumps(body, ensure_ascii=False, indent=indent, separators=None if indent else (",", ":"))
        # MindIE's ResponseWithBody sets Connection: close on every JSON answer.
        return web.Response(
            status=status, text=text, content_type="application/json", headers={"Connection": "close"}
        )

    def _error(self, status: int, message: str) -> web.Response:
        return self._json({"error": message, "error_type": ERROR_TYPES[status]}, status)

    # -- management plane ----------------------------------------------------------------------

    def _not_up(self) -> web.Response | None:
        if self.health == "starting":
            return web.Response(status=503, headers={"Connection": "close"})
        return None

    async def _health(self, request: web.Request) -> web.Response:
        if (answer := self._not_up()) is not None:
            return answer
        if self.health == "abnormal":
            return self._error(500, "Failed to get health status.")
        return web.Response(status=200, headers={"Connection": "close"})

    async def _live(self, request: web.Request) -> web.Response:
        if (answer := self._not_up()) is not None:
            return answer
        if self.health == "abnormal":
            return self._json({"message": "Service is abnormal"}, 500)
        if self.health == "busy":
            return self._json({"message": "Service is alive but busy"})
        return web.Response(status=200, headers={"Connection": "close"})

    async def _ready(self, request: web.Request) -> web.Response:
        if (answer := self._not_up()) is not None:
            return answer
        if self.health == "abnormal":
            return self._json({"message": "Service is abnormal"}, 500)
        if self.health == "busy":
            return self._json(
                {"message": "Service is alive but busy. Consider reducing request frequency"}, 503
            )
        return web.Response(status=200, headers={"Connection": "close"})

    async def _timed(self, request: web.Request) -> web.Response:
        if self.health == "starting":
            return web.Response(status=503, headers={"Connection": "close"})
        raw = request.match_info["timeout"]
        timeout = int(raw[1:]) if raw else 10
        if not 1 <= timeout <= 600:
            return self._error(400, f"The wait time must be in [1, 600], got {timeout}.")
        if self.health == "abnormal":
            return self._error(500, "The simulated inference did not finish in time.")
        return self._json({"status": "healthy"})

    async def _v1_config(self, request: web.Request) -> web.Response:
        cfg = self.config
        return self._json(
            {
                "modelName": cfg.model_name,
                "maxSeqLen": cfg.max_seq_len,
                "npuMemSize": -1,
                "cpuMemSize": 0,
                "worldSize": 1,
                "maxOutputLen": cfg.max_iter_times,
                "cacheBlockSize": cfg.cache_block_size,
            }
        )

    # -- business plane: models ------------------------------------------------------------------

    def _served(self) -> list[str]:
        return [self.config.model_name, *self.config.lora_names]

    async def _models(self, request: web.Request) -> web.Response:
        cfg = self.config
        data = [
            {
                "id": cfg.model_name,
                "object": "model",
                "root": cfg.model_weight_path.rstrip("/").rsplit("/", 1)[-1],
                "owned_by": "MindIE Server",
                "parent": "null",
            }
        ]
        data += [
            {
                "id": name,
                "object": "model",
                "root": name,
                "owned_by": "MindIE Server",
                "parent": cfg.model_name,
            }
            for name in cfg.lora_names
        ]
        # MindIE pretty-prints this one answer (jsonData2.dump(4)).
        return self._json({"object": "list", "data": data}, indent=4)

    async def _model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name not in self._served():
            return self._error(404, f"Model {name} not found.")
        return self._json(
            {"id": name, "object": "model", "created": int(time.time()), "owned_by": "MindIE Server"}
        )

    # -- metrics plane ---------------------------------------------------------------------------

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.config.monitor_mode:
            return self._error(500, "Environment variable MIES_SERVICE_MONITOR_MODE is not set.")
        return web.Response(
            body=self.metrics_text().encode(),
            headers={"Content-Type": "text/plain; charset=utf-8", "Connection": "close"},
        )

    def metrics_text(self) -> str:
        """The page prometheus-cpp's serializer writes for MindIE's registry."""
        label = f'model_name="{self.config.model_name}"'
        total = self._received
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, value: float) -> None:
            lines.extend(
                [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{{{label}}} {_num(value)}"]
            )

        def histogram(name: str, help_text: str, h: _Histogram) -> None:
            lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} histogram"])
            lines.append(f"{name}_count{{{label}}} {h.count}")
            lines.append(f"{name}_sum{{{label}}} {_num(h.sum)}")
            for bound, count in zip(h.buckets, h.counts, strict=True):
                lines.append(f'{name}_bucket{{{label},le="{_num(bound)}"}} {count}')
            lines.append(f'{name}_bucket{{{label},le="+Inf"}} {h.count}')

        metric("request_received_total", "counter", "Count of received requests.", total)
        metric("request_success_total", "counter", "Count of successfully processed requests.", self._success)
        metric("request_failed_total", "counter", "Count of failed requests.", self._failed)
        metric("prompt_tokens_total", "counter", "Number of prefill tokens processed.", self._prompt_tokens)
        metric(
            "generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            self._generation_tokens,
        )
        metric("num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", 0)
        metric("num_requests_running", "gauge", "Number of requests currently running on GPU.", self.running)
        metric("num_requests_waiting", "gauge", "Number of requests waiting to be processed.", self.waiting)
        metric("num_requests_swapped", "gauge", "Number of requests swapped to CPU.", 0)
        metric("avg_prompt_throughput_toks_per_s", "gauge", "Average prefill throughput in tokens/s.", 0)
        metric(
            "avg_generation_throughput_toks_per_s", "gauge", "Average generation throughput in tokens/s.", 0
        )
        failed = self._failed / total if total else 0.0
        metric("failed_request_perc", "gauge", "Requests failure rate. 1 means 100 percent usage.", failed)
        usage = min(1.0, self._used_blocks / self.config.npu_blocks)
        metric("npu_cache_usage_perc", "gauge", "NPU KV-cache usage. 1 means 100 percent usage.", usage)
        metric("cpu_cache_usage_perc", "gauge", "CPU KV-cache usage. 1 means 100 percent usage.", 0)
        metric("npu_prefix_cache_hit_rate", "gauge", "NPU prefix cache block hit rate..", 0)
        histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", self._ttft)
        histogram(
            "time_per_output_token_seconds", "Histogram of time per output token in seconds.", self._tbt
        )
        histogram(
            "e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", self._e2e
        )
        histogram("request_prompt_tokens", "Number of prefill tokens processed.", self._prompt_hist)
        histogram(
            "request_generation_tokens", "Number of generation tokens processed.", self._generation_hist
        )
        return "\n".join(lines) + "\n"

    # -- business plane: inference ---------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._infer(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._infer(request, chat=False)

    def _validate(self, body: Any, chat: bool) -> tuple[int, str] | None:
        """MindIE's checks, in its order, with its messages (422 unless said)."""
        if not isinstance(body, dict):
            return 422, "Failed to parse request context to json"
        model = body.get("model")
        if model is None:
            return 422, "Request contains not model or model null"
        if not isinstance(model, str):
            return 422, "Request param model must be string"
        if not model:
            return 422, "Request param model must be not empty"
        if model not in self._served():
            return 422, "Model not found"
        if chat and not isinstance(body.get("messages"), list):
            return 422, ""  # ParseTextInput fails without a message
        if not chat and not isinstance(body.get("prompt"), str | list):
            return 422, ""
        if "max_tokens" in body and body["max_tokens"] is not None:
            value = body["max_tokens"]
            if not isinstance(value, int) or isinstance(value, bool):
                return 422, "Parameter max_tokens not number_integer"
            if value <= 0 or value > MAX_INT32:
                return 422, f"Parameter max_tokens must be (0,{MAX_INT32}], got {value}"
        penalty = body.get("repetition_penalty")
        if penalty is not None and not (isinstance(penalty, int | float) and 0.0 < penalty <= 2.0):
            # ostream prints the C++ double 2.0 as "2" and the JSON value as dumped.
            return 422, f"Parameter 'repetition_penalty' must be in (0.0, 2], got {json.dumps(penalty)}."
        if "stream" in body and not isinstance(body["stream"], bool):
            return 422, "Parameter stream not boolean"
        return None

    @staticmethod
    def _count_prompt(body: dict[str, Any], chat: bool) -> int:
        if chat:
            parts = []
            for message in body["messages"]:
                content = message.get("content") if isinstance(message, dict) else None
                if isinstance(content, list):
                    content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
                parts.append(content if isinstance(content, str) else "")
            text = " ".join(parts)
        else:
            prompt = body["prompt"]
            text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        return max(1, len(text.split()))

    async def _infer(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        self._received += 1
        started = time.monotonic()
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        if isinstance(body, dict):
            self.bodies.append(body)
        problem = self._validate(body, chat)
        if problem is not None:
            self._failed += 1
            return self._error(*problem)
        assert isinstance(body, dict)
        if self.error_status is not None:
            self._failed += 1
            return self._error(self.error_status, self.error_message)
        prompt_tokens = self._count_prompt(body, chat)
        if prompt_tokens >= self.config.max_seq_len:
            self._failed += 1
            return self._error(
                424,
                f"Failed to enqueue inferRequest. The input length {prompt_tokens} exceeds maxSeqLen "
                f"{self.config.max_seq_len}.",
            )
        limit = body.get("max_tokens") or self.config.max_iter_times
        produce = limit if body.get("ignore_eos") else min(limit, self.config.output_tokens)
        finish = "length" if produce == limit else "stop"
        self._prompt_tokens += prompt_tokens
        self._prompt_hist.observe(prompt_tokens)
        rid = str(next(self._ids))
        model = body["model"]
        if body.get("stream"):
            return await self._stream(request, chat, rid, model, prompt_tokens, produce, finish, started)
        words: list[str] = []
        async with contextlib.aclosing(self._generate(prompt_tokens, produce, started)) as tokens:
            async for word in tokens:
                words.append(word)
        self._finished(len(words), started)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": produce,
            "total_tokens": prompt_tokens + produce,
        }
        text = "".join(words)
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "stop_reason": None,
                "finish_reason": finish,
            }
            obj = "text_completion"
        return self._json(
            {
                "id": rid,
                "object": obj,
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": usage,
            }
        )

    async def _generate(self, prompt_tokens: int, produce: int, started: float) -> Any:
        """Words, one per token, at the configured pace, holding one of ``maxBatchSize``
        slots (requests beyond it wait, as ``num_requests_waiting`` reports)."""
        assert self._slots is not None
        blocks = 0
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            if self.config.ttft_s:
                await asyncio.sleep(self.config.ttft_s)
            self._ttft.observe(time.monotonic() - started)
            for i in range(produce):
                if i and self.config.token_s:
                    await asyncio.sleep(self.config.token_s)
                if i:
                    self._tbt.observe(self.config.token_s)
                needed = -(-(prompt_tokens + i + 1) // self.config.cache_block_size)
                self._used_blocks += needed - blocks
                blocks = needed
                self._generation_tokens += 1
                yield f"w{i} "
        finally:
            self._used_blocks -= blocks
            self.running -= 1
            self._slots.release()

    def _finished(self, tokens: int, started: float) -> None:
        self._success += 1
        self._generation_hist.observe(tokens)
        self._e2e.observe(time.monotonic() - started)

    async def _stream(
        self,
        request: web.Request,
        chat: bool,
        rid: str,
        model: str,
        prompt_tokens: int,
        produce: int,
        finish: str,
        started: float,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"

        def event(choice: dict[str, Any], usage: dict[str, int] | None = None) -> bytes:
            chunk: dict[str, Any] = {"id": rid, "object": obj, "created": int(time.time()), "model": model}
            chunk["choices"] = [choice]
            if usage is not None:
                chunk["usage"] = usage
            return b"data: " + json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"

        sent = 0
        try:
            if chat:
                # MindIE opens a chat stream with an empty assistant delta (as vLLM does).
                first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                await resp.write(event({**first, "finish_reason": None}))
            tokens = self._generate(prompt_tokens, produce, started)
            # aclosing: leaving the loop early must free the batch slot at once.
            async with contextlib.aclosing(tokens):
                async for word in tokens:
                    if self.drop_stream_after is not None and sent >= self.drop_stream_after:
                        self._failed += 1
                        assert request.transport is not None
                        request.transport.abort()  # the connection is cut mid-body
                        return resp
                    if self.stream_error_after is not None and sent >= self.stream_error_after:
                        self._failed += 1
                        # Written raw, then the stream ends cleanly: MindIE's own framing.
                        await resp.write(self.stream_error_text.encode())
                        await resp.write_eof()
                        return resp
                    sent += 1
                    last = sent == produce
                    if chat:
                        choice = {
                            "index": 0,
                            "delta": {"role": "assistant", "content": word},
                            "logprobs": None,
                        }
                    else:
                        choice = {"index": 0, "text": word, "logprobs": None, "stop_reason": None}
                    choice["finish_reason"] = finish if last else None
                    usage = None
                    if last:
                        total = prompt_tokens + produce
                        usage = {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": produce,
                            "total_tokens": total,
                        }
                    await resp.write(event(choice, usage))
            self._finished(sent, started)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            # The client went away: MindIE stops the request (ControlRequest STOP).
            self.aborted += 1
            raise
        return resp


# -- the daemon-like entry point --------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A fake MindIE Service for tests (not MindIE).")
    parser.add_argument("--config", help="a MindIE config.json (default: $MIES_CONFIG_JSON_PATH)")
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--token-ms", type=float, default=0.0)
    parser.add_argument("--output-tokens", type=int, default=8)
    args = parser.parse_args(argv)
    path = args.config or os.environ.get("MIES_CONFIG_JSON_PATH")
    data: dict[str, Any] = {}
    if path:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("ServerConfig", {}).get("httpsEnabled", False):
            raise SystemExit("the fake MindIE speaks plain HTTP only: set ServerConfig.httpsEnabled to false")
    config = FakeMindieConfig.from_mindie_config(
        data,
        monitor_mode=os.environ.get("MIES_SERVICE_MONITOR_MODE") == "1",
        ttft_s=args.ttft_ms / 1000,
        token_s=args.token_ms / 1000,
        output_tokens=args.output_tokens,
    )
    if not data:
        config.port = 0
    fake = FakeMindie(config)

    async def run() -> None:
        await fake.serve()
        planes = f"management {fake.management_url}, metrics {fake.metrics_url}"
        print(f"serving fake MindIE on {fake.url} ({planes})")
        sys.stdout.flush()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await fake.close()

    asyncio.run(run())


if __name__ == "__main__":
    main()
