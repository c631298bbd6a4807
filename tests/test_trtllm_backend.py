"""The ``trtllm`` backend: its load parsers on recorded pages, its options and request
mapping, and the backend itself, alone and behind a real ``shuniu serve`` gateway driven by
the ``openai`` SDK, against protocol-faithful FAKE servers (``tests/fake_trtllm.py``):
TensorRT-LLM and Triton cannot run on these machines.

Why this file is long: one backend with two server kinds (``trtllm-serve``, Triton) and three
load sources, tested in one place against the same fakes; its sections follow the backend's
modules (load parsers, options, serve, triton, the gateway in front).

Published documents the fakes and these tests follow (see ``tests/fake_trtllm.py`` for the
details taken from each):

- TensorRT-LLM 1.x: ``docs/source/commands/trtllm-serve/trtllm-serve.rst`` (endpoints, the
  ``/metrics`` iteration statistics), ``tensorrt_llm/serve/openai_server.py`` and
  ``openai_protocol.py`` (routes, request validation, error bodies, streaming),
  ``cpp/tensorrt_llm/executor/jsonSerialization.cpp`` (``IterationStats`` JSON names),
  ``tensorrt_llm/metrics/collector.py`` (``trtllm_*`` Prometheus names);
- Triton Inference Server: ``docs/protocol/extension_generate.md`` (the generate
  extension), ``src/http_server.cc`` (status codes, SSE framing, health and ready);
- TensorRT-LLM's Triton backend: tensorrtllm_backend ``README.md`` ("Triton Metrics"),
  ``triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc``
  and ``model_instance_state.cc`` (``nv_trt_llm_*`` metric families), and the model
  configurations ``all_models/inflight_batcher_llm/{ensemble,tensorrt_llm_bls}/config.pbtxt``
  and ``all_models/llmapi/tensorrt_llm/config.pbtxt`` (input and output names).

The recorded pages in ``tests/data/trtllm_*`` come from the fakes under load
(``trtllm_serve_stats_busy.json``, ``trtllm_serve_prometheus.txt``,
``trtllm_triton_metrics.txt``) or were written by hand in the published format
(``trtllm_serve_stats_adp.json``: two attention-data-parallel ranks).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest
from pydantic import ValidationError

from shuniu.backends.http import ProbeError
from shuniu.backends.trtllm.metrics import (
    MetricsError,
    StatsView,
    parse_iteration_stats,
    parse_triton_metrics,
    parse_trtllm_prometheus,
)
from shuniu.backends.trtllm.options import ChatTemplate, TrtllmOptions
from shuniu.backends.trtllm.serve import TrtllmServeBackend, engine_priority
from shuniu.backends.trtllm.triton import StopTrimmer, TritonBackend, render_chat
from shuniu.core.api.openai import parse_request
from shuniu.core.contracts import EndpointSpec
from shuniu.core.errors import GatewayError
from shuniu.core.types import Chunk, EndpointLoad, Health, InferenceRequest, Principal
from tests.conftest import wait_until
from tests.fake_trtllm import FakeTriton, FakeTrtllmServe
from tests.ports import quiet_ports

DATA = Path(__file__).parent / "data"
SERVED = "TinyLlama-1.1B-Chat-v1.0"
CHATML = {
    "message": "<|im_start|>{role}\n{content}<|im_end|>\n",
    "generation_prompt": "<|im_start|>assistant\n",
    "stop": ["<|im_end|>"],
}


# -- helpers -------------------------------------------------------------------------------


def _req(body: dict[str, Any], api: str = "completions", priority: int = 0) -> InferenceRequest:
    """A request as the gateway parses it."""
    req = parse_request(json.dumps(body).encode(), api, "r1", 0.0)  # type: ignore[arg-type]
    req.priority = priority
    req.principal = Principal(tenant="acme")
    return req


def _completion(prompt: str = "hello world", **fields: Any) -> InferenceRequest:
    return _req({"model": "chat", "prompt": prompt, **fields})


def _chat(content: str = "hello", **fields: Any) -> InferenceRequest:
    return _req({"model": "chat", "messages": [{"role": "user", "content": content}], **fields}, "chat")


def _serve(base_url: str, pool: str = "chat", **options: Any) -> TrtllmServeBackend:
    spec = EndpointSpec(name="trt-0", model=pool, options=TrtllmOptions(base_url=base_url, **options))
    return TrtllmServeBackend(spec)


def _triton(fake: FakeTriton | str, **options: Any) -> TritonBackend:
    if isinstance(fake, FakeTriton):
        options.setdefault("metrics_url", fake.metrics_url)
        base = fake.url
    else:
        base = fake
    opts = TrtllmOptions(base_url=base, api="triton", **options)
    return TritonBackend(EndpointSpec(name="triton-0", model="chat", options=opts))


async def _collect(gen: Any) -> list[Chunk]:
    return [c async for c in gen]


def _text(chunks: list[Chunk]) -> str:
    return "".join(c.text for c in chunks)


async def _eventually(check: Callable[[], Awaitable[Any]], within_s: float = 10.0) -> Any:
    """Poll ``check`` until it returns something truthy. It waits for a condition to become
    true; it never stands in for one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within_s} s (last value: {value!r})")
        await asyncio.sleep(0.02)


# -- parsers on recorded pages -----------------------------------------------------------------


def test_iteration_stats_recorded_under_load() -> None:
    # A burst of 5 requests on 3 slots, read while it ran: trtllm-serve answers once no new
    # iteration came for its wait, so the list is the whole burst and its newest entry the
    # last request finishing.
    entries = json.loads((DATA / "trtllm_serve_stats_busy.json").read_text())
    assert len(entries) == 61 and [e["iter"] for e in entries] == list(range(61))
    assert parse_iteration_stats(entries) == EndpointLoad(
        running=1, waiting=0, kv_usage=11 / 40, prefix_queries=55 * 8, prefix_hits=0
    )
    # Read part-way, the newest entry then is one with requests queued behind the slots.
    i = next(i for i, e in enumerate(entries) if e["numQueuedRequests"])
    newest = entries[i]
    assert (newest["numActiveRequests"], newest["numQueuedRequests"]) == (3, 2)
    load = parse_iteration_stats(entries[: i + 1])
    assert load is not None and (load.running, load.waiting) == (3, 2)
    kv = newest["kvCacheStats"]
    assert load.kv_usage == kv["usedNumBlocks"] / kv["maxNumBlocks"]
    # The order of entries does not matter: the highest "iter" is the newest.
    assert parse_iteration_stats(list(reversed(entries[: i + 1]))) == load


def test_iteration_stats_of_attention_dp_ranks_are_summed() -> None:
    entries = json.loads((DATA / "trtllm_serve_stats_adp.json").read_text())
    # Newest per rank (iter 41 of ranks 0 and 1), summed: blocks used over blocks there are.
    assert parse_iteration_stats(entries) == EndpointLoad(
        running=12 + 7,
        waiting=2 + 1,
        kv_usage=(640 + 260) / 8000,
        prefix_queries=(120 + 320 + 60 + 160) * 32,
        prefix_hits=(120 + 60) * 32,
    )


def test_iteration_stats_edge_cases() -> None:
    assert parse_iteration_stats([]) is None
    assert parse_iteration_stats(["not a dict", 3]) is None
    # The documented example's shape (a few fields only); free blocks stand in for used.
    doc_like = [
        {
            "gpuMemUsage": 76665782272,
            "iter": 154,
            "iterLatencyMS": 7.0,
            "kvCacheStats": {"freeNumBlocks": 101253, "maxNumBlocks": 101256, "tokensPerBlock": 32},
            "numActiveRequests": 1,
        }
    ]
    load = parse_iteration_stats(doc_like)
    assert load == EndpointLoad(running=1, waiting=0, kv_usage=3 / 101256)
    # Null kvCacheStats (an engine without paged KV) and the per-rank dicts' "rank" key.
    ranks = [
        {"iter": 3, "rank": 0, "numActiveRequests": 2, "numQueuedRequests": 1, "kvCacheStats": None},
        {"iter": 3, "rank": 1, "numActiveRequests": 4, "numQueuedRequests": 0},
    ]
    assert parse_iteration_stats(ranks) == EndpointLoad(running=6, waiting=1)


def test_stats_view_tells_idle_from_switched_off() -> None:
    view = StatsView()
    with pytest.raises(MetricsError, match="enable_iter_perf_stats"):
        view.update([])  # never seen: statistics are off (or drained by someone else)
    busy = json.loads((DATA / "trtllm_serve_stats_adp.json").read_text())
    first = view.update(busy)
    assert first.running == 19
    # After statistics were seen, an empty read means no iteration ran: idle, with the
    # cumulative prefix counters kept.
    idle = view.update([])
    assert idle == EndpointLoad(
        running=0,
        waiting=0,
        kv_usage=0.0,
        prefix_queries=first.prefix_queries,
        prefix_hits=first.prefix_hits,
    )


def _reference_sums(text: str, name_filter: Callable[[str], bool]) -> dict[tuple[str, str], float]:
    """(name, sorted labels) -> value through prometheus_client's full parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if name_filter(s.name):
                key = (s.name, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())))
                out[key] = s.value
    return out


def test_trtllm_prometheus_page() -> None:
    pytest.importorskip("prometheus_client")
    raw = (DATA / "trtllm_serve_prometheus.txt").read_bytes()
    ref = {
        name: v for (name, _), v in _reference_sums(raw.decode(), lambda n: n.startswith("trtllm_")).items()
    }
    load = parse_trtllm_prometheus(raw)
    assert load == EndpointLoad(
        running=int(ref["trtllm_num_requests_running"]),
        waiting=int(ref["trtllm_num_requests_waiting"]),
        kv_usage=ref["trtllm_kv_cache_utilization"],
        prefix_queries=int(
            (ref["trtllm_kv_cache_reused_blocks_total"] + ref["trtllm_kv_cache_missed_blocks_total"])
            * ref["trtllm_kv_cache_tokens_per_block"]
        ),
        prefix_hits=int(ref["trtllm_kv_cache_reused_blocks_total"] * ref["trtllm_kv_cache_tokens_per_block"]),
        generated_tokens=int(ref["trtllm_generation_tokens_total"]),
    )
    assert (load.running, load.waiting, load.kv_usage) == (3, 2, 0.6)
    assert parse_trtllm_prometheus(raw.decode()) == load  # str works too


def test_trtllm_prometheus_edge_cases() -> None:
    labels = 'engine_type="undefined",model_name="undefined"'
    page = (
        f'trtllm_num_requests_running{{{labels},pid="1"}} 2.0\n'
        f'trtllm_num_requests_running{{{labels},pid="2"}} 1.0\n'
        f"trtllm_num_requests_waiting{{{labels}}} 4.0\n"
        f"trtllm_num_requests_waiting_other{{{labels}}} 99.0\n"
        f"trtllm_kv_cache_used_blocks{{{labels}}} 30\n"
        f"trtllm_kv_cache_max_blocks{{{labels}}} 120\n"
        f'trtllm_request_success_total{{{labels},finished_reason="stop"}} 7\n'
        f'trtllm_request_success_total{{{labels},finished_reason="cancelled"}} 2\n'
        f"trtllm_generation_tokens_total{{{labels}}} NaN\n"
    )
    # Summed over pids, used/max without the utilisation gauge, cancelled as aborted, a
    # NaN skipped, a longer metric name not taken for a shorter one.
    assert parse_trtllm_prometheus(page) == EndpointLoad(running=3, waiting=4, kv_usage=0.25, aborted=2)
    for bad in ("", "# HELP x\n", '{"detail":"Not Found"}', "process_cpu_seconds_total 3\n"):
        with pytest.raises(MetricsError):
            parse_trtllm_prometheus(bad)


def test_triton_metrics_page() -> None:
    pytest.importorskip("prometheus_client")
    raw = (DATA / "trtllm_triton_metrics.txt").read_bytes()
    ref = _reference_sums(raw.decode(), lambda n: n.startswith("nv_"))

    def value(name: str, **labels: str) -> float:
        want = ",".join(f"{k}={v}" for k, v in sorted({**labels, "version": "1"}.items()))
        return ref[(name, want)]

    active = value("nv_trt_llm_request_metrics", model="tensorrt_llm", request_type="active")
    waiting = value("nv_trt_llm_request_metrics", model="tensorrt_llm", request_type="waiting")
    fraction = value(
        "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="fraction", model="tensorrt_llm"
    )
    load = parse_triton_metrics(raw)
    # 4 requests active, 2 of them waiting for KV blocks (active - scheduled).
    assert (active, waiting) == (4, 2)
    assert load == EndpointLoad(running=2, waiting=2, kv_usage=fraction, generated_tokens=0)
    assert parse_triton_metrics(raw, model="tensorrt_llm") == load
    with pytest.raises(MetricsError, match="'ensemble'"):
        parse_triton_metrics(raw, model="ensemble")  # the ensemble reports no nv_trt_llm_*


def test_triton_metrics_older_releases_and_pending() -> None:
    # Without the "waiting" request type (older releases): running is
    # "active"; Triton's own queue counts as waiting; used/max without "fraction".
    page = """\
nv_inference_pending_request_count{model="ensemble",version="1"} 3
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 5
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 5
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 10
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 40
nv_trt_llm_request_metrics_other{model="tensorrt_llm",request_type="active",version="1"} 100
"""
    assert parse_triton_metrics(page) == EndpointLoad(running=5, waiting=4, kv_usage=0.25)
    # Filtered on one model, the ensemble's queue is left out.
    assert parse_triton_metrics(page, model="tensorrt_llm") == EndpointLoad(
        running=5, waiting=1, kv_usage=0.25
    )
    # An LLM-API model publishes no nv_trt_llm_* series: an error, not an idle engine.
    with pytest.raises(MetricsError, match="nv_trt_llm_request_metrics"):
        parse_triton_metrics('nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 0\n')


# -- options and pure helpers -------------------------------------------------------------------


def test_options() -> None:
    for given in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"):
        assert TrtllmOptions(base_url=given).base_url == "http://h:8000"
    serve = TrtllmOptions(base_url="http://h:8000")
    assert (serve.api, serve.load_from, serve.health_url, serve.prometheus_url) == (
        "openai",
        "auto",
        "http://h:8000/health",
        "http://h:8000/prometheus/metrics",
    )
    triton = TrtllmOptions(base_url="http://h:8000", api="triton")
    assert (triton.health_url, triton.prometheus_url, triton.load_source) == (
        "http://h:8000/v2/health/ready",
        "http://h:8002/metrics",
        "prometheus",
    )
    assert (
        TrtllmOptions(base_url="http://[::1]:9000", api="triton").prometheus_url
        == "http://[::1]:9002/metrics"
    )
    assert (
        TrtllmOptions(base_url="https://t.example", api="triton", metrics_port_offset=-443).prometheus_url
        == "https://t.example:0/metrics"
    )
    custom = TrtllmOptions(base_url="http://h:1", api="triton", metrics_url="http://m:9/x", health_path="/v2")
    assert (custom.prometheus_url, custom.health_url) == ("http://m:9/x", "http://h:1/v2")
    with pytest.raises(ValidationError, match="Triton has prometheus"):
        TrtllmOptions(base_url="http://h", api="triton", load_from="stats")
    with pytest.raises(ValidationError, match="http"):
        TrtllmOptions(base_url="h:8000")
    with pytest.raises(ValidationError, match="must start with /"):
        TrtllmOptions(base_url="http://h", stats_path="metrics")
    with pytest.raises(ValidationError, match="contain \\{content\\}"):
        TrtllmOptions(base_url="http://h", api="triton", chat_template={"message": "{role}"})
    with pytest.raises(ValidationError, match="api"):
        TrtllmOptions(base_url="http://h", api="grpc")  # type: ignore[arg-type]


def test_every_option_is_documented() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "backends" / "trtllm.md").read_text()
    for model in (TrtllmOptions, ChatTemplate):
        for name, field in model.model_fields.items():
            assert field.description, name
            assert f"`{name}`" in doc, name


def test_engine_priority_mapping() -> None:
    # The gateway's priority (smaller first) onto trtllm-serve's 0..1 (higher first).
    values = [engine_priority(p) for p in (-1000, -10, -1, 0, 1, 10, 1000)]
    assert values == sorted(values, reverse=True)
    assert engine_priority(0) == 0.5 and all(0 < v < 1 for v in values)


def test_render_chat_and_stop_trimming() -> None:
    template = ChatTemplate(
        message="<|im_start|>{role}\n{content}<|im_end|>\n",
        roles={"system": "<<SYS>>{content}<</SYS>>\n"},
        prefix="<s>",
        generation_prompt="<|im_start|>assistant\n",
    )
    messages = [
        {"role": "system", "content": "Be {brief}."},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
    ]
    assert render_chat(template, messages) == (
        "<s><<SYS>>Be {brief}.<</SYS>>\n<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(GatewayError) as err:
        render_chat(template, [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    assert err.value.status == 400 and err.value.param == "messages[0].content[0]"

    trim = StopTrimmer(["<|im_end|>", "STOP"])
    out = [trim.feed(p) for p in ("Hello", " wor", "ld<|im", "_e", "nd|> more")]
    assert out == ["Hello", " wor", "ld", "", ""] and trim.stopped and trim.flush() == ""
    trim = StopTrimmer(["<|im_end|>"])
    assert [trim.feed(p) for p in ("a<|", "im", "x")] == ["a", "", "<|imx"]  # a false start is released
    assert trim.feed("<|i") == "" and trim.flush() == "<|i" and not trim.stopped
    assert StopTrimmer([]).feed("anything") == "anything"


# -- trtllm-serve (api: openai) against the fake ------------------------------------------------


@pytest.fixture(scope="module")
def serve() -> Iterator[FakeTrtllmServe]:
    """A fake trtllm-serve: 4 slots, 10 ms per iteration, EOS after 12 tokens."""
    with FakeTrtllmServe(max_active=4, iteration_s=0.01) as fake:
        yield fake


async def test_serve_streams_completions_and_chat(serve: FakeTrtllmServe) -> None:
    b = _serve(serve.url)
    await b.start()
    try:
        # The served name came from /v1/models (the pool is "chat"); health passes.
        assert (b.served_model, b.model_problem) == (SERVED, None)
        assert await b.health() == Health(True, "HTTP 200")
        chunks = await _collect(b.stream(_completion(max_tokens=5, stream=True, priority=7)))
        assert len(_text(chunks).split()) == 5
        assert chunks[-2].finish_reason == "length"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
        sent = serve.bodies[-1]
        assert sent["model"] == SERVED and sent["stream_options"] == {"include_usage": True}
        assert "priority" not in sent  # not forwarded (and a vLLM-style 7 would be a 400)

        chat = await _collect(b.stream(_chat("hi", max_tokens=100, stream=True)))
        finishes = [c.finish_reason for c in chat if c.finish_reason]
        assert finishes == ["stop"] and len(_text(chat).split()) == 12  # the fake's EOS
        assert serve.bodies[-1]["messages"] == [{"role": "user", "content": "hi"}]

        whole = await b.complete(_chat("hi", max_tokens=3))
        assert whole.finish_reason == "length" and len(whole.text.split()) == 3
        assert whole.usage.completion_tokens == 3 and whole.usage.prompt_tokens > 0
    finally:
        await b.stop()


async def test_serve_forwards_priority_and_extra_fields(serve: FakeTrtllmServe) -> None:
    b = _serve(serve.url, forward_priority=True, model=SERVED)
    await b.start()
    try:
        body = {
            "model": "chat",
            "prompt": "x",
            "max_tokens": 2,
            "top_k": 5,
            "ignore_eos": True,
            "priority": 3,
        }
        done = await b.complete(_req(body, priority=-2))
        assert done.finish_reason == "length"
        sent = serve.bodies[-1]
        assert sent["priority"] == engine_priority(-2) > 0.5  # the scheduler's, mapped
        assert (sent["top_k"], sent["ignore_eos"]) == (5, True)  # TensorRT-LLM's own fields pass
    finally:
        await b.stop()


async def test_serve_errors(serve: FakeTrtllmServe) -> None:
    b = _serve(serve.url)
    await b.start()
    try:
        # A field trtllm-serve does not know: its validation error, passed through as a 400.
        with pytest.raises(GatewayError) as err:
            await b.complete(_completion(max_tokens=2, cache_salt_typo="x"))
        assert err.value.status == 400 and "Extra inputs are not permitted" in err.value.message
        # A prompt over the engine's limit: trtllm-serve's ErrorResponse message.
        with pytest.raises(GatewayError) as err:
            await b.complete(_completion("word " * 9000, max_tokens=2))
        assert err.value.status == 400 and "should not exceed max_num_tokens (8192)" in err.value.message
    finally:
        await b.stop()


async def test_serve_faults_and_cancellation() -> None:
    with FakeTrtllmServe(iteration_s=0.01) as fake:
        b = _serve(fake.url)
        await b.start()
        try:
            fake.fault = "http500"
            with pytest.raises(GatewayError) as err:
                await b.complete(_completion(max_tokens=2))
            assert err.value.status == 502 and "HTTP 500: Internal Server Error" in err.value.message
            # A failure mid-stream: trtllm-serve's body breaks off (its generator raised).
            fake.fault, fake.drop_after = "drop", 2
            gen = b.stream(_completion(max_tokens=20, stream=True))
            got = [await anext(gen), await anext(gen)]
            assert all(c.text for c in got)
            with pytest.raises(GatewayError) as err:
                await anext(gen)
            assert err.value.status == 502 and "broke off the stream" in err.value.message
            fake.fault = None
            # A client that goes away: the connection is dropped and the engine aborts.
            aborted = fake.call(lambda: fake.engine.aborted)
            gen = b.stream(_completion(max_tokens=200, ignore_eos=True, stream=True))
            await anext(gen)
            await gen.aclose()
            await _eventually(lambda: asyncio.to_thread(fake.call, lambda: fake.engine.aborted > aborted))
            # Unhealthy: trtllm-serve answers 503 once its executor died.
            fake.healthy = False
            health = await b.health()
            assert not health.ok and health.detail.startswith("HTTP 503: LLM is unavailable")
        finally:
            await b.stop()


async def test_serve_down() -> None:
    b = _serve(f"http://127.0.0.1:{quiet_ports()[0]}")
    await b.start()  # a server that is not up is not an error at start
    try:
        assert b.served_model is None and b.model_problem is not None
        assert "/v1/models" in b.model_problem
        health = await b.health()
        assert not health.ok and "Connect" in health.detail
        with pytest.raises(GatewayError) as err:
            await b.complete(_completion(max_tokens=2))
        assert err.value.status == 502 and "Cannot reach" in err.value.message
        with pytest.raises(Exception):  # noqa: B017 - whatever aiohttp raises; the gateway catches all
            await b.load()
    finally:
        await b.stop()


async def test_serve_model_choice() -> None:
    with FakeTrtllmServe("/models/llama") as fake:
        b = _serve(fake.url, model="other")
        await b.start()
        try:
            health = await b.health()
            assert not health.ok and "'other'" in health.detail and "/models/llama" in health.detail
        finally:
            await b.stop()


async def test_serve_load_from_iteration_statistics() -> None:
    # load_from: auto finds no /prometheus/metrics (a server without return_perf_metrics)
    # and reads the JSON statistics with a background poller.
    with FakeTrtllmServe(max_active=2, iteration_s=0.02, stats_wait_s=0.2) as fake:
        b = _serve(fake.url)
        await b.start()
        try:
            with pytest.raises(ProbeError):
                await b.load()
            assert b.load_source == "stats"
            # Nothing ran yet: an empty list means "off" until statistics were seen once.
            await _eventually(lambda: asyncio.sleep(0, fake.stats_reads > 0))
            with pytest.raises(ProbeError):
                await b.load()
            # A burst on 2 slots: 3 requests, one queued behind them.
            await asyncio.gather(*(b.complete(_completion(f"{i} hi", max_tokens=10)) for i in range(3)))

            async def seen() -> EndpointLoad | None:
                try:
                    return await b.load()
                except ProbeError:
                    return None

            # The server answers after the burst; the snapshot is its last iteration, then
            # idle. Each load() is immediate: the slow reads run in the background.
            snap = await _eventually(seen)
            assert snap.kv_usage is not None and snap.prefix_queries
            started = time.perf_counter()
            idle = await _eventually(lambda: _idle(b))
            assert time.perf_counter() - started < 5
            assert idle.kv_usage == 0.0 and idle.prefix_queries == snap.prefix_queries
        finally:
            await b.stop()


async def _idle(b: TrtllmServeBackend) -> EndpointLoad | None:
    try:
        load = await b.load()
    except ProbeError:
        return None
    return load if load is not None and load.running == 0 and load.kv_usage == 0.0 else None


async def test_serve_statistics_blocked_by_a_busy_server_go_stale() -> None:
    # trtllm-serve holds /metrics open while iterations keep coming: a long stream keeps
    # the read from answering, the read times out and the snapshot is not reported.
    # A read the idle server answers in 0.2 s must not time out on a loaded machine (its
    # statistics would be lost): 1 s; the 400-token stream (8 s) outlasts several timeouts.
    with FakeTrtllmServe(iteration_s=0.02, stats_wait_s=0.2) as fake:
        b = _serve(fake.url, load_from="stats", stats_timeout_s=1.0, stats_max_age_s=1.5)
        await b.start()
        try:
            await b.complete(_completion(max_tokens=2))
            await _eventually(lambda: _idle(b))
            gen = b.stream(_completion(max_tokens=400, ignore_eos=True, stream=True))
            await anext(gen)

            async def stale() -> str | None:
                try:
                    await b.load()
                except ProbeError as exc:
                    return str(exc)
                return None

            assert "s old" in await _eventually(stale)
            problem = await _eventually(lambda: asyncio.sleep(0, b.stats_problem))
            assert problem == "GET /metrics: TimeoutError"
            assert "(GET /metrics: TimeoutError)" in await _eventually(stale)
            await gen.aclose()
        finally:
            await b.stop()


async def test_serve_statistics_switched_off() -> None:
    with FakeTrtllmServe(iteration_s=0.01, iter_perf_stats=False) as fake:
        b = _serve(fake.url, load_from="stats")
        await b.start()
        try:
            await b.complete(_completion(max_tokens=3))
            await _eventually(lambda: asyncio.sleep(0, fake.stats_reads >= 2))
            with pytest.raises(ProbeError, match="enable_iter_perf_stats"):
                await b.load()
            assert b.load_source == "stats"
        finally:
            await b.stop()


async def test_serve_load_from_prometheus() -> None:
    # A server run with return_perf_metrics: its own collector drains the statistics (the
    # JSON endpoint stays empty) and publishes gauges; load_from: auto settles on those.
    with FakeTrtllmServe(max_active=2, iteration_s=0.03, return_perf_metrics=True) as fake:
        b = _serve(fake.url)
        await b.start()
        try:
            req = _completion("x", max_tokens=300, ignore_eos=True, stream=True)
            gens = [b.stream(req) for _ in range(3)]
            tasks = [asyncio.create_task(anext(g)) for g in gens]

            async def busy() -> EndpointLoad | None:
                try:
                    load = await b.load()
                except (MetricsError, ProbeError):
                    return None  # no iteration published yet
                return load if load is not None and (load.running, load.waiting) == (2, 1) else None

            load = await _eventually(busy)
            assert b.load_source == "prometheus"
            assert load.kv_usage is not None and load.kv_usage > 0 and load.generated_tokens
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for g in gens:
                await g.aclose()
            async with httpx.AsyncClient() as client:
                # The collector drains what the last iterations published on its own period:
                # once the requests are gone, the JSON endpoint is left empty.
                async def drained() -> bool:
                    return (await client.get(f"{fake.url}/metrics")).json() == []

                await _eventually(drained)
        finally:
            await b.stop()


async def test_serve_load_none(serve: FakeTrtllmServe) -> None:
    b = _serve(serve.url, load_from="none")
    await b.start()
    try:
        assert await b.load() is None  # the gateway then counts its own requests
    finally:
        await b.stop()


# -- Triton (api: triton) against the fake ------------------------------------------------------


@pytest.fixture(scope="module")
def triton() -> Iterator[FakeTriton]:
    """A fake Triton with TensorRT-LLM's inflight-batcher repository."""
    with FakeTriton(iteration_s=0.01) as fake:
        yield fake


async def test_triton_streams_and_maps_parameters(triton: FakeTriton) -> None:
    b = _triton(triton)
    await b.start()
    try:
        # The model's metadata settled the input names, including the token-count inputs.
        assert b.schema == "ensemble" and b.inputs is not None and "return_num_output_tokens" in b.inputs
        assert await b.health() == Health(True, "model ensemble ready")
        chunks = await _collect(
            b.stream(
                _completion(
                    "tell me",
                    max_tokens=6,
                    temperature=0.5,
                    top_p=0.9,
                    seed=11,
                    frequency_penalty=0.1,
                    stream=True,
                    ignore_eos=True,
                )
            )
        )
        assert triton.paths[-1] == "/v2/models/ensemble/generate_stream"
        assert triton.bodies[-1] == {
            "text_input": "tell me",
            "max_tokens": 6,
            "stream": True,
            "exclude_input_in_output": True,
            "temperature": 0.5,
            "top_p": 0.9,
            "frequency_penalty": 0.1,
            "seed": 11,
            "min_tokens": 6,  # ignore_eos: TensorRT-LLM has none, a minimum length does it
            "return_num_input_tokens": True,
            "return_num_output_tokens": True,
        }
        assert len(_text(chunks).split()) == 6 and all(c.tokens == 1 for c in chunks if c.text)
        last = chunks[-1]
        assert last.finish_reason == "length"
        assert last.usage is not None and (last.usage.prompt_tokens, last.usage.completion_tokens) == (2, 6)

        # The model's own end: "stop"; no max_tokens from the client: the default is sent.
        chunks = await _collect(b.stream(_completion("x", stream=True)))
        assert chunks[-1].finish_reason == "stop" and len(_text(chunks).split()) == 12
        assert triton.bodies[-1]["max_tokens"] == 512

        whole = await b.complete(_completion("hello there", max_tokens=4))
        assert triton.paths[-1] == "/v2/models/ensemble/generate"
        assert not whole.text.startswith("hello") and len(whole.text.split()) == 4
        assert (whole.finish_reason, whole.usage.prompt_tokens, whole.usage.completion_tokens) == (
            "length",
            2,
            4,
        )
    finally:
        await b.stop()


async def test_triton_stop_words_are_cut(triton: FakeTriton) -> None:
    b = _triton(triton)
    await b.start()
    try:
        # The fake's words run alphabetically from where the seed puts them: seed 2 starts
        # at "charlie", so " echo" comes third. TensorRT-LLM keeps the stop word; OpenAI
        # clients must not see it.
        chunks = await _collect(
            b.stream(_completion("x", max_tokens=10, seed=2, stop=[" echo"], stream=True))
        )
        assert triton.bodies[-1]["stop_words"] == [" echo"]
        assert _text(chunks) == " charlie delta"
        assert chunks[-1].finish_reason == "stop"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3  # the engine's count
        whole = await b.complete(_completion("x", max_tokens=10, seed=2, stop=" echo"))
        assert (whole.text, whole.finish_reason) == (" charlie delta", "stop")
    finally:
        await b.stop()


async def test_triton_chat_needs_a_template(triton: FakeTriton) -> None:
    plain = _triton(triton)
    templated = _triton(triton, chat_template=CHATML)
    await plain.start()
    await templated.start()
    try:
        with pytest.raises(GatewayError) as err:
            await plain.complete(_chat("hi"))
        assert err.value.status == 400 and "chat_template" in err.value.message
        done = await templated.complete(_chat("hi", max_tokens=3, stop="END"))
        sent = triton.bodies[-1]
        assert sent["text_input"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        assert sent["stop_words"] == ["END", "<|im_end|>"]
        assert done.finish_reason == "length" and len(done.text.split()) == 3
        # What Triton's generate endpoint cannot take is refused, not dropped silently.
        plain_text = await templated.complete(_chat("hi", max_tokens=2, response_format={"type": "text"}))
        assert plain_text.finish_reason == "length"
        for bad in (
            _completion(max_tokens=2, logprobs=2),
            _chat("hi", response_format={"type": "json_object"}),
            _req({"model": "chat", "prompt": [1, 2, 3]}),
            _chat("hi", tools=[{"type": "function", "function": {"name": "f"}}]),
        ):
            with pytest.raises(GatewayError) as err:
                await templated.complete(bad)
            assert err.value.status == 400
    finally:
        await plain.stop()
        await templated.stop()


async def test_triton_older_repository_and_estimates() -> None:
    # A repository from before return_num_*_tokens (and with random_seed / min_length):
    # only declared inputs are sent and the token counts are the gateway's estimates.
    with FakeTriton(old_inputs=True, iteration_s=0.01) as fake:
        b = _triton(fake)
        await b.start()
        try:
            chunks = await _collect(
                b.stream(_completion("a b c", max_tokens=4, seed=1, ignore_eos=True, stream=True))
            )
            sent = fake.bodies[-1]
            assert (
                "return_num_output_tokens" not in sent
                and sent["random_seed"] == 1
                and sent["min_length"] == 4
            )
            assert chunks[-1].usage is not None
            assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (3, 4)
            assert chunks[-1].finish_reason == "length"  # estimated: 4 words of 4 allowed
        finally:
            await b.stop()


async def test_triton_llmapi_repository() -> None:
    with FakeTriton("llmapi", iteration_s=0.01) as fake:
        b = _triton(fake, triton_model="tensorrt_llm", load_from="none")
        await b.start()
        try:
            assert b.schema == "llmapi"
            chunks = await _collect(b.stream(_completion("hi", max_tokens=3, temperature=0.0, stream=True)))
            assert fake.bodies[-1] == {
                "text_input": "hi",
                "streaming": True,
                "sampling_param_max_tokens": 3,
                "sampling_param_exclude_input_from_output": True,
                "return_finish_reason": True,
                "sampling_param_temperature": 0.0,
            }
            assert len(_text(chunks).split()) == 3 and chunks[-1].finish_reason == "length"
            done = await b.complete(_completion("hi", max_tokens=30))
            assert done.finish_reason == "stop"  # the model's own finish_reason output
            with pytest.raises(GatewayError) as err:
                await b.complete(_completion("hi", ignore_eos=True))
            assert err.value.status == 400 and err.value.param == "ignore_eos"
            assert await b.load() is None
        finally:
            await b.stop()
        # Forced to the ensemble's names, the LLM-API model refuses them: Triton's 400
        # reaches the client with its message.
        forced = _triton(fake, triton_model="tensorrt_llm", triton_inputs="ensemble")
        await forced.start()
        try:
            with pytest.raises(GatewayError) as err:
                await forced.complete(_completion("hi", max_tokens=2))
            assert err.value.status == 400
            assert "unexpected inference input 'max_tokens' for model 'tensorrt_llm'" in err.value.message
        finally:
            await forced.stop()


async def test_triton_accumulated_stream() -> None:
    with FakeTriton(iteration_s=0.01) as fake:
        fake.accumulate_tokens = True
        b = _triton(fake, triton_model="tensorrt_llm_bls", accumulate_tokens=True)
        await b.start()
        try:
            chunks = await _collect(b.stream(_completion("x", max_tokens=4, seed=0, stream=True)))
            assert [c.text for c in chunks if c.text] == [" alpha", " bravo", " charlie", " delta"]
        finally:
            await b.stop()


async def test_triton_errors_and_faults() -> None:
    with FakeTriton(iteration_s=0.01) as fake:
        b = _triton(fake)
        await b.start()
        try:
            fake.fault = "http500"
            with pytest.raises(GatewayError) as err:
                await b.complete(_completion(max_tokens=2))
            assert err.value.status == 502 and "HTTP 500" in err.value.message
            assert "Executor failed process requestId" in err.value.message
            # An error object after the first tokens (the status was already 200).
            fake.fault, fake.fail_after = "midstream", 2
            gen = b.stream(_completion(max_tokens=20, ignore_eos=True, stream=True))
            got = [await anext(gen), await anext(gen)]
            assert all(c.text for c in got)
            with pytest.raises(GatewayError) as err:
                await anext(gen)
            assert err.value.status == 502 and "fake CUDA error" in err.value.message
            fake.fault = "drop"
            gen = b.stream(_completion(max_tokens=20, ignore_eos=True, stream=True))
            await anext(gen)
            with pytest.raises(GatewayError) as err:
                await _collect(gen)
            assert "broke off the stream" in err.value.message
            fake.fault = None
            # A client that goes away: the connection is dropped and Triton cancels.
            aborted = fake.call(lambda: fake.engine.aborted)
            gen = b.stream(_completion(max_tokens=300, ignore_eos=True, stream=True))
            await anext(gen)
            await gen.aclose()
            await _eventually(lambda: asyncio.to_thread(fake.call, lambda: fake.engine.aborted > aborted))
        finally:
            await b.stop()


async def test_triton_health() -> None:
    with FakeTriton(iteration_s=0.01) as fake:
        b = _triton(fake)
        missing = _triton(fake, triton_model="nope")
        await b.start()
        await missing.start()
        try:
            assert (await b.health()).ok
            # A member of the ensemble still loading: Triton itself is not ready.
            fake.models["tensorrt_llm"] = False
            assert await b.health() == Health(False, "server not ready: HTTP 400")
            fake.model_ready = True
            # The model's own probe (with the server probe pointed at /v2/health/live).
            fake.models["ensemble"] = False
            live = _triton(fake, health_path="/v2/health/live")
            await live.start()
            try:
                health = await live.health()
                assert health == Health(False, "model ensemble not ready: HTTP 400: Model version not ready")
            finally:
                await live.stop()
            fake.model_ready = True
            health = await missing.health()
            assert not health.ok and "404" in health.detail and "unknown model: 'nope'" in health.detail
            assert missing.metadata_problem is not None
            with pytest.raises(GatewayError) as err:
                await missing.complete(_completion(max_tokens=2))
            assert err.value.status == 502 and "unknown model" in err.value.message
        finally:
            await b.stop()
            await missing.stop()
    down = _triton(f"http://127.0.0.1:{quiet_ports()[0]}")
    await down.start()
    try:
        health = await down.health()
        assert not health.ok and "Connect" in health.detail
        with pytest.raises(GatewayError) as err:
            await down.complete(_completion(max_tokens=2))
        assert err.value.status == 502
        with pytest.raises(Exception):  # noqa: B017 - whatever aiohttp raises; the gateway catches all
            await down.load()
    finally:
        await down.stop()


async def test_triton_load_follows_the_requests_in_flight() -> None:
    # 4 slots, KV for only two of the requests at once (each reserves 18 blocks of 8 tokens
    # for its prompt and max_tokens): two run, two wait for blocks.
    with FakeTriton(max_active=4, max_blocks=40, tokens_per_block=8, iteration_s=0.02) as fake:
        b = _triton(fake)
        await b.start()
        try:
            idle = await b.load()
            assert idle == EndpointLoad(running=0, waiting=0, kv_usage=0.0, generated_tokens=0)
            long = " ".join(["word"] * 40)
            gens = [
                b.stream(_completion(long, max_tokens=100, ignore_eos=True, stream=True)) for _ in range(4)
            ]
            tasks = [asyncio.create_task(anext(g)) for g in gens]

            async def busy() -> EndpointLoad | None:
                load = await b.load()
                return load if (load.running, load.waiting) == (2, 2) else None

            load = await _eventually(busy)
            assert load.kv_usage is not None and 0 < load.kv_usage <= 0.9
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for g in gens:
                await g.aclose()
            back = await _eventually(lambda: _triton_idle(b))
            assert back.generated_tokens is not None
        finally:
            await b.stop()
        wrong = _triton(fake, metrics_url=f"http://127.0.0.1:{fake.port}/metrics")
        await wrong.start()
        try:
            with pytest.raises(ProbeError, match="HTTP 404"):
                await wrong.load()
        finally:
            await wrong.stop()


async def _triton_idle(b: TritonBackend) -> EndpointLoad | None:
    load = await b.load()
    return load if load is not None and load.running == 0 and load.waiting == 0 else None


# -- through a real gateway, with the openai SDK ------------------------------------------------


def _ready_endpoints(gw: Any) -> list[dict[str, Any]] | None:
    body = httpx.get(f"{gw.url}/ready", timeout=10).json()
    endpoints = body["models"]["chat"]["endpoints"]
    return endpoints if all(e["healthy"] for e in endpoints) else None


def test_gateway_in_front_of_trtllm_serve(gateway_factory, serve: FakeTrtllmServe) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(
        f"""
        models:
          chat:
            health: {{interval_s: 0.1}}
            load: {{interval_s: 0.1}}
            endpoints:
              - {{kind: trtllm, name: trt-a, options: {{base_url: "{serve.url}/v1"}}}}
        """
    )
    wait_until(lambda: _ready_endpoints(gw))
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 6
    assert chunks[0].model == "chat"
    done = client.completions.create(model="chat", prompt="count", max_tokens=3)
    assert done.choices[0].finish_reason == "length" and len(done.choices[0].text.split()) == 3
    # trtllm-serve's own validation error reaches the client as a 400 with its message.
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="chat", prompt="x", max_tokens=2, extra_body={"bogus": 1})
    assert "Extra inputs are not permitted" in str(err.value)

    def with_load() -> dict[str, Any] | None:
        endpoints = _ready_endpoints(gw) or []
        return endpoints[0] if endpoints and endpoints[0]["load"] else None

    endpoint = wait_until(with_load, timeout=20)
    assert endpoint["kind"] == "trtllm" and endpoint["detail"] == "HTTP 200"
    assert endpoint["load"]["kv_usage"] is not None
    client.close()


def test_gateway_in_front_of_triton(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    with FakeTriton(iteration_s=0.01) as fake:
        template = json.dumps(CHATML)
        gw = gateway_factory(
            f"""
            models:
              chat:
                health: {{interval_s: 0.1}}
                load: {{interval_s: 0.1}}
                endpoints:
                  - kind: trtllm
                    name: triton-a
                    options:
                      base_url: "{fake.url}"
                      api: triton
                      metrics_url: "{fake.metrics_url}"
                      chat_template: {template}
            """
        )
        wait_until(lambda: _ready_endpoints(gw))
        client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=60)
        chunks = list(
            client.completions.create(
                model="chat",
                prompt="once upon",
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
        )
        assert chunks[-1].usage is not None
        assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (2, 5)
        assert len("".join(c.choices[0].text for c in chunks if c.choices).split()) == 5
        reply = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert reply.choices[0].finish_reason == "length"
        assert fake.bodies[-1]["text_input"].endswith("<|im_start|>assistant\n")
        # An error event after the first tokens: the gateway ends the stream with an SSE
        # error event, which the SDK raises.
        fake.fault, fake.fail_after = "midstream", 2
        stream = client.completions.create(
            model="chat", prompt="x", max_tokens=20, stream=True, extra_body={"ignore_eos": True}
        )
        with pytest.raises(openai.APIError, match="fake CUDA error"):
            list(stream)
        fake.fault = None

        def with_load() -> dict[str, Any] | None:
            endpoints = _ready_endpoints(gw) or []
            return endpoints[0] if endpoints and endpoints[0]["load"] else None

        def idle() -> dict[str, Any] | None:
            # The failed stream may still count as running in the snapshot polled while it ran.
            endpoint = with_load()
            return endpoint if endpoint is not None and endpoint["load"]["running"] == 0 else None

        endpoint = wait_until(idle, timeout=20)
        assert endpoint["detail"] == "model ensemble ready"
        assert endpoint["load"]["running"] == 0 and endpoint["load"]["kv_usage"] is not None
        client.close()
        gw.stop()


def test_trtllm_is_listed_with_its_options() -> None:
    from shuniu.core.plugin_manager import load_plugins

    reg = load_plugins().registered("backends")["trtllm"]
    assert reg.options is TrtllmOptions and reg.plugin == "trtllm" and "Triton" in reg.description
    # The factory picks the class by api; nothing is contacted until start().
    serve = reg.factory(EndpointSpec("e", "m", TrtllmOptions(base_url="http://127.0.0.1:9")))
    triton = reg.factory(EndpointSpec("e", "m", TrtllmOptions(base_url="http://127.0.0.1:9", api="triton")))
    assert isinstance(serve, TrtllmServeBackend) and isinstance(triton, TritonBackend)
    assert serve.kind == triton.kind == "trtllm"
    payload = msgspec.json.decode(serve._payload(_completion(stream=True), True))
    assert payload["stream_options"] == {"include_usage": True} and payload["model"] == "m"
