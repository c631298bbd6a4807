"""The ``tgi`` backend against ``tests/fake_tgi.py``, a protocol-faithful fake of Hugging Face
Text Generation Inference (TGI cannot run here: it needs a GPU).

Published documents this module (and the fake) follow:

- TGI v3.3.7 (github.com/huggingface/text-generation-inference, tag v3.3.7): the OpenAPI
  document ``docs/openapi.json`` (routes, ``GenerateParameters``, ``StreamResponse``,
  ``StreamDetails``, ``Info``, ``ChatRequest``/``ChatCompletionChunk``, ``ErrorResponse``
  and its 422/424/429/500 examples), the router source it is generated from
  (``router/src/server.rs``, ``lib.rs``, ``validation.rs``, ``infer/mod.rs``, ``chat.rs``),
  ``backends/v3/src/`` for the batch and queue gauges, and
  ``docs/source/reference/metrics.md`` for the metric names and types;
- TGI v1.4.5's router for the older shapes (``/info`` with ``max_input_length`` and
  ``max_batch_total_tokens``, stream details without ``input_length``, no usage chunk);
- axum 0.7's SSE encoding and metrics-exporter-prometheus 0.15's text format (how TGI's
  events and ``/metrics`` page look on the wire);
- the ``text-generation`` 0.7.0 client, read to decide not to use it (its AsyncClient opens
  a session per request; see docs/backends/tgi.md).

Covered: the OpenAI → TGI parameter mapping (asserted on what the fake received), streaming
and whole completions and chat, token counts from ``details``, finish reasons, errors
(validation, overload, generation, incomplete, a cut connection, connection refused,
timeouts, a wrong API key), health, ``/info``, the ``/metrics`` parser on recorded pages
(``tests/data/tgi_metrics_*.txt``, rendered by the fake) and live, pooled connections, a
real ``shuniu serve`` gateway in front of the fake driven by the ``openai`` SDK, and a
gateway launching the fake the way it launches ``text-generation-launcher``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import httpx
import msgspec
import openai
import pytest
import yaml
from pydantic import ValidationError

from shuniu.backends.http import ProbeError
from shuniu.backends.http.sse import SseData
from shuniu.backends.tgi import protocol
from shuniu.backends.tgi.backend import TgiBackend
from shuniu.backends.tgi.metrics import MetricsError, parse_tgi_metrics
from shuniu.backends.tgi.options import TgiOptions
from shuniu.core.api.openai import parse_request
from shuniu.core.contracts import EndpointSpec
from shuniu.core.errors import GatewayError
from shuniu.core.types import Chunk, EndpointLoad, Health, InferenceRequest
from tests.conftest import wait_until
from tests.fake_tgi import FakeTGI, rust_float
from tests.ports import quiet_ports

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"
DOC = ROOT / "docs" / "backends" / "tgi.md"
FIXTURES = sorted(DATA.glob("tgi_metrics_*.txt"))


# -- helpers --------------------------------------------------------------------------------


def _req(api: str, body: dict[str, Any]) -> InferenceRequest:
    """A request as the gateway parses it."""
    body = {"model": "chat", **body}
    return parse_request(msgspec.json.encode(body), api, "r1", 0.0)  # type: ignore[arg-type]


def _completion(prompt: Any = "one two three", **fields: Any) -> InferenceRequest:
    return _req("completions", {"prompt": prompt, **fields})


def _chat(content: str = "hello there", **fields: Any) -> InferenceRequest:
    return _req("chat", {"messages": [{"role": "user", "content": content}], **fields})


def _backend(url: str, **options: Any) -> TgiBackend:
    return TgiBackend(EndpointSpec(name="tgi-0", model="chat", options=TgiOptions(base_url=url, **options)))


@contextlib.asynccontextmanager
async def _running(url: str, **options: Any) -> AsyncIterator[TgiBackend]:
    b = _backend(url, **options)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


async def _collect(gen: AsyncIterator[Chunk]) -> list[Chunk]:
    return [c async for c in gen]


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


@pytest.fixture
def fakes() -> Iterator[Callable[..., FakeTGI]]:
    """Start fakes with the given settings; all are stopped after the test."""
    started: list[FakeTGI] = []

    def start(**settings: Any) -> FakeTGI:
        fake = FakeTGI(**settings).start()
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.stop()


@pytest.fixture
def fake(fakes: Callable[..., FakeTGI]) -> FakeTGI:
    return fakes()


def _sent(fake: FakeTGI, path: str) -> list[dict[str, Any]]:
    return [r.body for r in fake.requests if r.path == path and r.body is not None]


# -- the protocol mapping (no server) ----------------------------------------------------------


def test_generate_parameters_map_openai_fields() -> None:
    params = protocol.generate_parameters(
        _completion(max_tokens=7, stop="\n", temperature=0.7, top_p=0.9, seed=11, frequency_penalty=0.5)
    )
    assert params == {
        "details": True,
        "max_new_tokens": 7,
        "stop": ["\n"],
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 11,
        "frequency_penalty": 0.5,
    }
    # temperature 0 is greedy (TGI refuses 0); top_p 1 is no filtering (TGI refuses 1).
    greedy = protocol.generate_parameters(_completion(temperature=0, top_p=1, max_completion_tokens=3))
    assert greedy == {"details": True, "max_new_tokens": 3, "do_sample": False}
    # Nothing given: OpenAI samples at temperature 1; max_new_tokens stays TGI's default.
    assert protocol.generate_parameters(_completion()) == {"details": True, "do_sample": True}
    # vLLM-style extras under TGI's names; top_k <= 0 means "off" there.
    extras = protocol.generate_parameters(_completion(top_k=40, repetition_penalty=1.1), adapter_id="lora-a")
    assert (extras["top_k"], extras["repetition_penalty"], extras["adapter_id"]) == (40, 1.1, "lora-a")
    assert "top_k" not in protocol.generate_parameters(_completion(top_k=-1))


def test_chat_body_is_what_tgis_messages_api_takes() -> None:
    req = _chat(stop="END", top_p=1.0, max_completion_tokens=9, logit_bias={"50256": -100}, tools=[{"x": 1}])
    body = protocol.chat_body(req)
    assert body["stop"] == ["END"] and body["max_tokens"] == 9
    assert "top_p" not in body and "logit_bias" not in body and "max_completion_tokens" not in body
    assert body["tools"] == [{"x": 1}]  # the rest is forwarded as sent
    assert req.body["stop"] == "END" and req.body["top_p"] == 1.0  # the request is not touched
    assert "stop" not in protocol.chat_body(_chat(stop=[]))
    assert protocol.chat_body(_chat(top_p=0.5))["top_p"] == 0.5


def test_finish_reasons() -> None:
    assert [protocol.finish_reason(r) for r in ("length", "eos_token", "stop_sequence", "stop", None)] == [
        "length",
        "stop",
        "stop",
        "stop",
        None,
    ]


def test_unsupported_completion_requests_are_refused_before_sending() -> None:
    for prompt in ([1, 2, 3], [[1, 2, 3]]):
        with pytest.raises(GatewayError) as err:
            protocol.check_completion(_completion(prompt))
        assert (err.value.status, err.value.code, err.value.param) == (400, "unsupported_value", "prompt")
        assert "text" in err.value.message
    protocol.check_completion(_completion(["one prompt as a list"]))
    for field, value in (("echo", True), ("suffix", "tail"), ("logprobs", 2), ("best_of", 3)):
        with pytest.raises(GatewayError) as err:
            protocol.check_completion(_completion(**{field: value}))
        assert err.value.status == 400 and err.value.param == field
    protocol.check_completion(_completion(echo=False, logprobs=0, best_of=1, suffix=""))


def test_error_mapping() -> None:
    e = protocol.tgi_error(
        "e0", "Input validation error: `top_k` must be strictly positive", "validation", 422
    )
    assert (e.status, e.code, e.type) == (400, "validation", "invalid_request_error")
    assert e.message == "Input validation error: `top_k` must be strictly positive"  # TGI's own words
    too_long = (
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 2048. "
        "Given: 2000 `inputs` tokens and 100 `max_new_tokens`"
    )
    e = protocol.tgi_error("e0", too_long, "validation", 422)
    assert (e.status, e.code, e.param) == (400, "context_length_exceeded", "max_tokens")
    e = protocol.tgi_error("e0", "Model is overloaded", "overloaded", 429)
    assert (e.status, e.code, e.headers) == (503, "upstream_overloaded", {"retry-after": "1"})
    assert "e0" in e.message
    for message, kind, status in (
        ("Request failed during generation: Server error: OOM", "generation", 424),
        ("Incomplete generation", "incomplete_generation", 500),
    ):
        e = protocol.tgi_error("e0", message, kind, status)
        assert (e.status, e.code) == (502, "upstream_error") and message in e.message
    # Messages API events say only the message (and a 422 whatever the error was).
    assert protocol.tgi_error("e0", "Model is overloaded", None).status == 503
    assert protocol.tgi_error("e0", "Input validation error: `inputs` cannot be empty", None).status == 400
    assert protocol.tgi_error("e0", "Template error: syntax error", None).code == "template_error"
    assert protocol.tgi_error("e0", "Incomplete generation stream", None).status == 502
    # axum's plain-text JSON rejections (422) are the forwarded body's fault; 401 is ours.
    plain = protocol.tgi_error(
        "e0", "Failed to deserialize the JSON body into the target type: ...", None, 422
    )
    assert plain.status == 400
    assert protocol.tgi_error("e0", "HTTP 401", None, 401).status == 502


def test_options() -> None:
    for given in ("http://h:8080", "http://h:8080/", "http://h:8080/v1", "http://h:8080/v1/"):
        assert TgiOptions(base_url=given).base_url == "http://h:8080"
    opts = TgiOptions(base_url="http://h")
    assert (opts.health_path, opts.metrics_path, opts.adapter_id) == ("/health", "/metrics", None)
    assert TgiOptions.launch_base_url == "http://{host}:{port}"
    with pytest.raises(ValidationError, match="http"):
        TgiOptions(base_url="h:8080")
    with pytest.raises(ValidationError, match="must start with /"):
        TgiOptions(base_url="http://h", metrics_path="metrics")
    with pytest.raises(ValidationError, match="not be empty"):
        TgiOptions(base_url="http://h", adapter_id=" ")
    with pytest.raises(ValidationError, match="timeout_s"):
        TgiOptions(base_url="http://h", timeout_s=0)
    with pytest.raises(ValidationError, match="Extra inputs"):
        TgiOptions(base_url="http://h", model="x")  # type: ignore[call-arg]


def test_every_option_is_documented() -> None:
    doc = DOC.read_text()
    for name, field in TgiOptions.model_fields.items():
        assert field.description, name
        assert f"`{name}`" in doc, name


def test_doc_yaml_examples_validate() -> None:
    from shuniu.core.config.loader import load_deployment
    from shuniu.core.plugin_manager import load_plugins

    plugins = load_plugins()
    blocks = re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), re.DOTALL | re.MULTILINE)
    deployments = [b for b in blocks if re.search(r"^models:", b, re.MULTILINE)]
    assert len(deployments) >= 2
    for text in deployments:
        load_deployment(None, plugins, text=text, env={"TGI_API_KEY": "k"})
    assert "--hostname" in DOC.read_text() and "text-generation-launcher" in DOC.read_text()


# -- the metrics parser -------------------------------------------------------------------------


def _reference(text: str, budget: int | None = None) -> EndpointLoad:
    """The same view through prometheus_client's full parser (slow, but independent)."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    dropped = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            # prometheus_client names counter samples *_total; TGI's exporter does not.
            if s.name in ("tgi_request_failure", "tgi_request_failure_total"):
                if s.labels.get("err") == "dropped":
                    dropped = (dropped or 0) + int(s.value)
                continue
            values[s.name] = values.get(s.name, 0.0) + s.value
    total = values.get("tgi_batch_max_total_tokens") or budget
    reserved = values.get("tgi_batch_current_max_tokens", 0.0)
    generated = values.get("tgi_request_generated_tokens_sum")
    return EndpointLoad(
        running=int(values.get("tgi_batch_current_size", 0)),
        waiting=int(values.get("tgi_queue_size", 0)),
        kv_usage=reserved / total if total else None,
        generated_tokens=int(generated) if generated is not None else None,
        aborted=dropped,
    )


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_parser_agrees_with_prometheus_client_on_recorded_pages(path: Path) -> None:
    pytest.importorskip("prometheus_client")
    raw = path.read_bytes()
    assert parse_tgi_metrics(raw, 16384) == _reference(raw.decode(), 16384)
    assert parse_tgi_metrics(raw) == _reference(raw.decode())
    assert parse_tgi_metrics(raw.decode()) == parse_tgi_metrics(raw)


def test_parser_on_the_busy_pages() -> None:
    # Rendered by the fake with --max-batch-size 2: two requests in the batch (10-word prompts,
    # max_new_tokens 200: 2 x 210 tokens reserved), two queued, 3 finished (5 + 7 + 4 tokens),
    # one dropped by its client.
    new = parse_tgi_metrics((DATA / "tgi_metrics_busy_v3.3.7.txt").read_bytes())
    assert new == EndpointLoad(running=2, waiting=2, kv_usage=420 / 16384, generated_tokens=16, aborted=1)
    # TGI 1.x has no budget on the page: it comes from /info.
    old = (DATA / "tgi_metrics_busy_v1.4.5.txt").read_bytes()
    assert b"\n# HELP tgi" not in old and b"\ntgi_batch_max_total_tokens" not in old
    assert parse_tgi_metrics(old).kv_usage is None
    assert parse_tgi_metrics(old, 16384) == new


def test_parser_edge_cases() -> None:
    page = (
        "# TYPE tgi_queue_size gauge\n"
        "tgi_queue_size 3\n"
        "tgi_queue_size_other 100\n"
        'tgi_batch_current_size{shard="a } \\" b"} 2\n'
        'tgi_batch_current_size{shard="c"} 1 1700000000000\n'
        "tgi_batch_current_max_tokens 1.5e3\n"
        "tgi_batch_max_total_tokens 1000\n"
        'tgi_request_failure{err="dropped"} 2\n'
        'tgi_request_failure{err="validation"} 40\n'
        "tgi_request_generated_tokens_count 9\n"
        "tgi_request_generated_tokens_sum NaN\n"
    )
    assert parse_tgi_metrics(page) == EndpointLoad(
        running=3,  # summed over label sets, a timestamp allowed, tricky label values skipped right
        waiting=3,  # not tgi_queue_size_other
        kv_usage=1.0,  # reserved above the budget is clamped
        generated_tokens=None,  # a NaN sample is skipped
        aborted=2,  # only err="dropped"
    )
    # An engine that has served nothing yet shows only the budget: idle, not an error.
    assert parse_tgi_metrics(
        "# TYPE tgi_batch_max_total_tokens gauge\ntgi_batch_max_total_tokens 16000\n"
    ) == (EndpointLoad(running=0, waiting=0, kv_usage=0.0))
    for bad in ("", "# HELP x\n", "<html></html>", "vllm:num_requests_running 1\n"):
        with pytest.raises(MetricsError):
            parse_tgi_metrics(bad)


def test_the_fakes_number_format_is_rusts() -> None:
    assert [rust_float(v) for v in (0.0, 3.0, 0.5, 6.5e-05, 1e21, 0.00015000000000000001)] == [
        "0",
        "3",
        "0.5",
        "0.000065",
        "1000000000000000000000",
        "0.00015000000000000001",
    ]


# -- the SSE reader -------------------------------------------------------------------------------


async def test_data_lines_split_any_way_and_skip_comments() -> None:
    loop = asyncio.get_running_loop()
    big = b'{"text":"' + b"x" * 300_000 + b'"}'
    body = b"data:{}\n\n:\n\ndata: [DONE]\r\n\ndata:" + big + b"\n\nevent: x\ndata:tail-without-newline"
    reader = aiohttp.StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=loop)
    for i in range(0, len(body), 7777):  # blocks cut mid-line, mid-"data:", mid-"\r\n"
        reader.feed_data(body[i : i + 7777])
    reader.feed_eof()
    assert [x async for x in SseData(reader)] == [b"{}", b"[DONE]", big, b"tail-without-newline"]


# -- the backend against the fake ---------------------------------------------------------------


async def test_streamed_completion(fake: FakeTGI) -> None:
    async with _running(fake.url, api_key="sk-tgi") as b:
        assert b.max_model_len == 2048 and b.max_input_tokens == 1024
        chunks = await _collect(
            b.stream(_completion("one two three four", max_tokens=5, stream=True, seed=3))
        )
        assert "".join(c.text for c in chunks) == " w0 w1 w2 w3 w4"
        assert [c.tokens for c in chunks] == [1] * 5
        last = chunks[-1]
        assert last.finish_reason == "length"
        assert last.usage is not None and (last.usage.prompt_tokens, last.usage.completion_tokens) == (4, 5)
        assert all(c.finish_reason is None and c.usage is None for c in chunks[:-1])
    (sent,) = _sent(fake, "/generate_stream")
    assert sent == {
        "inputs": "one two three four",
        "parameters": {"details": True, "max_new_tokens": 5, "do_sample": True, "seed": 3},
    }
    (received,) = [r for r in fake.requests if r.path == "/generate_stream"]
    assert received.headers["Authorization"] == "Bearer sk-tgi"


async def test_whole_completion_uses_generate(fakes: Callable[..., FakeTGI]) -> None:
    fake = fakes(eos_after=2)
    async with _running(fake.url) as b:
        done = await b.complete(_completion("a b c", max_tokens=10, temperature=0, stop=["zz"]))
    # EOS after two tokens: TGI counts the EOS token and leaves its text out.
    assert (done.text, done.finish_reason) == (" w0 w1", "stop")
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (3, 3, 6)
    (sent,) = _sent(fake, "/generate")
    assert sent["parameters"] == {"details": True, "max_new_tokens": 10, "stop": ["zz"], "do_sample": False}


async def test_stop_sequences_and_eos_in_streams(fakes: Callable[..., FakeTGI]) -> None:
    fake = fakes()
    async with _running(fake.url) as b:
        chunks = await _collect(b.stream(_completion(max_tokens=50, stop=[" w2"], stream=True)))
        # TGI keeps the stop sequence in the text (OpenAI would not).
        assert "".join(c.text for c in chunks) == " w0 w1 w2" and chunks[-1].finish_reason == "stop"
        fake.eos_after = 1
        chunks = await _collect(b.stream(_completion(max_tokens=50, stream=True)))
        # The EOS token is special: no text, no token counted by chunks, but in the usage.
        assert [(c.text, c.tokens) for c in chunks] == [(" w0", 1), ("", 0)]
        assert chunks[-1].finish_reason == "stop" and chunks[-1].usage.completion_tokens == 2  # type: ignore[union-attr]


async def test_chat_streamed_and_whole(fake: FakeTGI) -> None:
    async with _running(fake.url) as b:
        req = _chat("hello there", max_tokens=3, stream=True, stop="never", top_p=1.0, temperature=0)
        chunks = await _collect(b.stream(req))
        assert "".join(c.text for c in chunks) == " w0 w1 w2"
        assert chunks[-2].finish_reason == "length"
        # The usage chunk: TGI's counts. The templated prompt
        # ("<|user|>\nhello there</s>\n<|assistant|>\n") is 4 words to the fake.
        usage = chunks[-1].usage
        assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (4, 3)
        done = await b.complete(_chat("hi", max_completion_tokens=2))
        assert (done.text, done.finish_reason, done.usage.completion_tokens) == (" w0 w1", "length", 2)
    streamed, whole = _sent(fake, "/v1/chat/completions")
    assert streamed["model"] == whole["model"] == "tgi"  # never the pool's name: TGI reads it as an adapter
    assert streamed["stream_options"] == {"include_usage": True} and streamed["stop"] == ["never"]
    assert "top_p" not in streamed and streamed["temperature"] == 0
    assert whole["max_tokens"] == 2 and "max_completion_tokens" not in whole and "stream_options" not in whole


async def test_adapter_id(fake: FakeTGI) -> None:
    async with _running(fake.url, adapter_id="customer-lora") as b:
        await b.complete(_chat())
        await b.complete(_completion(max_tokens=1))
    assert _sent(fake, "/v1/chat/completions")[0]["model"] == "customer-lora"
    assert _sent(fake, "/generate")[0]["parameters"]["adapter_id"] == "customer-lora"


async def test_connections_are_pooled(fake: FakeTGI) -> None:
    async with _running(fake.url) as b:
        for _ in range(3):
            await _collect(b.stream(_completion(max_tokens=2, stream=True)))
            await b.complete(_completion(max_tokens=2))
            await _collect(b.stream(_chat(max_tokens=2, stream=True)))
    peers = {r.peer for r in fake.requests if r.path != "/info"}
    assert len(peers) == 1, peers  # nine requests, one keep-alive connection


async def test_validation_errors(fakes: Callable[..., FakeTGI]) -> None:
    fake = fakes(max_input_tokens=60, max_total_tokens=100)
    # The backend is told no window, so requests reach TGI (the gateway would refuse them).
    async with _running(fake.url) as b:
        b.max_model_len = None
        # TGI refuses 2 + 500 > 100. On /generate_stream the refusal is the first event (HTTP
        # 200); the backend raises before yielding anything, so the gateway still answers
        # with an HTTP error.
        for req in (
            _completion("a b", max_tokens=500, stream=True),
            _completion("a b", max_tokens=500),
            _chat("a b", max_tokens=500, stream=True),
            _chat("a b", max_tokens=500),
        ):
            call = _collect(b.stream(req)) if req.stream else b.complete(req)
            with pytest.raises(GatewayError) as err:
                await call
            assert (err.value.status, err.value.code) == (400, "context_length_exceeded"), req
            assert "`inputs` tokens + `max_new_tokens` must be <= 100" in err.value.message
        # More stop sequences than --max-stop-sequences (4): TGI's validation message.
        with pytest.raises(GatewayError) as err:
            await b.complete(_completion(stop=["a", "b", "c", "d", "e"]))
        assert (err.value.status, err.value.code) == (400, "validation")
        assert err.value.message == "Input validation error: `stop` supports up to 4 stop sequences. Given: 5"
        # A field of the wrong type is refused by axum before TGI (plain text, 422).
        with pytest.raises(GatewayError) as err:
            await b.complete(_chat(seed=-1))
        assert err.value.status == 400 and "expected u64" in err.value.message
        # Token ids are refused before anything is sent.
        before = len(fake.requests)
        with pytest.raises(GatewayError) as err:
            await _collect(b.stream(_completion([1, 2, 3], stream=True)))
        assert err.value.code == "unsupported_value" and len(fake.requests) == before


async def test_overload(fake: FakeTGI) -> None:
    fake.fault = "overloaded"
    async with _running(fake.url) as b:
        for req in (
            _completion(stream=True),
            _completion(),
            _chat(stream=True),
            _chat(),
        ):
            call = _collect(b.stream(req)) if req.stream else b.complete(req)
            with pytest.raises(GatewayError) as err:
                await call
            assert (err.value.status, err.value.code) == (503, "upstream_overloaded")
            assert err.value.headers == {"retry-after": "1"} and "Model is overloaded" in err.value.message
    # TGI's own concurrency limit: the second request while one is in flight.
    busy = FakeTGI(max_concurrent_requests=1, token_delay_s=0.05).start()
    try:
        async with _running(busy.url) as b:
            gen = b.stream(_completion(max_tokens=100, stream=True))
            await anext(gen)
            with pytest.raises(GatewayError) as err:
                await b.complete(_completion(max_tokens=1))
            assert err.value.status == 503
            await gen.aclose()
    finally:
        busy.stop()


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_failures_mid_stream(fakes: Callable[..., FakeTGI], api: str) -> None:
    fake = fakes()
    make = _chat if api == "chat" else _completion
    async with _running(fake.url) as b:
        for fault, expect in (
            ("generation_error", "CUDA out of memory"),
            ("incomplete", "Incomplete generation stream"),
            ("drop", "broke off the stream"),
        ):
            fake.fault = fault
            got: list[Chunk] = []
            with pytest.raises(GatewayError) as err:
                async for chunk in b.stream(make(max_tokens=10, stream=True)):
                    got.append(chunk)
            assert err.value.status == 502 and expect in err.value.message, (fault, err.value.message)
            # Tokens came first: the gateway had started the stream and ends it with an error event.
            assert "".join(c.text for c in got) == " w0 w1", fault
        # Whole answers: TGI's 424 and 500.
        for fault, status_text in (("generation_error", "HTTP 424"), ("incomplete", "HTTP 500")):
            fake.fault = fault
            with pytest.raises(GatewayError) as err:
                await b.complete(make(max_tokens=10))
            assert err.value.status == 502 and status_text in err.value.message


async def test_unreachable_slow_and_unauthorised(fakes: Callable[..., FakeTGI]) -> None:
    async with _running(f"http://127.0.0.1:{quiet_ports()[0]}") as b:
        assert b.max_model_len is None and b.info_problem is not None and "/info" in b.info_problem
        for req in (_completion(stream=True), _chat()):
            with pytest.raises(GatewayError) as err:
                await (_collect(b.stream(req)) if req.stream else b.complete(req))
            assert err.value.status == 502 and "Cannot reach" in err.value.message
    slow = fakes(token_delay_s=5.0, keepalive_s=0.05)
    async with _running(slow.url, timeout_s=0.5) as b:
        t0 = time.monotonic()
        for req in (_completion(max_tokens=3, stream=True), _completion(max_tokens=3), _chat(stream=True)):
            with pytest.raises(GatewayError) as err:
                await (_collect(b.stream(req)) if req.stream else b.complete(req))
            assert err.value.status == 504, err.value.message
        assert time.monotonic() - t0 < 5
    locked = fakes(api_key="right")
    async with _running(locked.url, api_key="wrong") as b:
        assert b.max_model_len == 2048  # /info needs no key in TGI
        with pytest.raises(GatewayError) as err:
            await b.complete(_completion())
        assert err.value.status == 502 and "HTTP 401" in err.value.message


async def test_keep_alive_comments_between_slow_tokens(fakes: Callable[..., FakeTGI]) -> None:
    fake = fakes(token_delay_s=0.12, keepalive_s=0.03)
    async with _running(fake.url) as b:
        chunks = await _collect(b.stream(_chat(max_tokens=3, stream=True)))
        assert "".join(c.text for c in chunks) == " w0 w1 w2" and chunks[-1].usage is not None


async def test_health_and_info(fakes: Callable[..., FakeTGI]) -> None:
    fake = fakes()
    b = _backend(fake.url)
    assert await b.health() == Health(False, "not started")
    await b.start()
    try:
        assert await b.health() == Health(True, "HTTP 200")
        assert b.info is not None and b.info["model_id"] == "fake/tiny-llama"
        fake.fault = "unhealthy"
        health = await b.health()
        assert not health.ok and health.detail == 'HTTP 503: {"error":"unhealthy","error_type":"healthcheck"}'
    finally:
        await b.stop()
    # A configured window wins over /info's.
    b = TgiBackend(EndpointSpec("e", "chat", TgiOptions(base_url=fake.url), max_model_len=512))
    await b.start()
    try:
        assert b.max_model_len == 512 and b.info is not None
    finally:
        await b.stop()
    # TGI 1.x: max_input_length, and the token budget in /info.
    old = fakes(version="1.4.5", max_input_tokens=1000, max_total_tokens=1500, max_batch_total_tokens=9000)
    async with _running(old.url) as b:
        assert (b.max_model_len, b.max_input_tokens, b.max_batch_total_tokens) == (1500, 1000, 9000)


async def test_a_server_that_comes_up_later() -> None:
    port = quiet_ports()[0]
    async with _running(f"http://127.0.0.1:{port}") as b:
        assert not (await b.health()).ok
        with pytest.raises(aiohttp.ClientError):
            await b.load()
        fake = FakeTGI(port=port).start()
        try:
            assert await b.health() == Health(True, "HTTP 200")  # and /info is read now
            assert b.max_model_len == 2048 and b.info_problem is None
        finally:
            fake.stop()


async def test_load_follows_the_engine(fakes: Callable[..., FakeTGI]) -> None:
    fake = fakes(max_batch_size=1, token_delay_s=0.05)
    async with _running(fake.url) as b:
        idle = await b.load()
        assert (idle.running, idle.waiting, idle.kv_usage, idle.generated_tokens) == (0, 0, 0.0, None)
        gens = [b.stream(_completion("a b c d", max_tokens=60, stream=True)) for _ in range(3)]
        firsts = [asyncio.ensure_future(anext(g)) for g in gens]

        async def busy() -> EndpointLoad | None:
            snap = await b.load()
            return snap if (snap.running, snap.waiting) == (1, 2) else None

        snap = await _eventually(busy)
        assert snap.kv_usage == pytest.approx((4 + 60) / 16384)  # one request's reservation
        # The client of the running request goes away: TGI drops it, the next one runs.
        await asyncio.wait(firsts, return_when=asyncio.FIRST_COMPLETED)
        running = next(i for i, f in enumerate(firsts) if f.done())
        await gens[running].aclose()

        async def moved_on() -> EndpointLoad | None:
            snap = await b.load()
            return snap if snap.aborted == 1 and (snap.running, snap.waiting) == (1, 1) else None

        await _eventually(moved_on)
        for f in firsts:
            f.cancel()
        await asyncio.gather(*firsts, return_exceptions=True)
        for g in gens:
            await g.aclose()
        await _eventually(lambda: _idle(b))
        done = await b.complete(_completion(max_tokens=4))
        assert done.usage.completion_tokens == 4
        assert (await b.load()).generated_tokens == 4
    with pytest.raises(ProbeError, match="not started"):
        await b.load()


async def _idle(b: TgiBackend) -> bool:
    snap = await b.load()
    return (snap.running, snap.waiting) == (0, 0)


async def test_legacy_server_shapes(fakes: Callable[..., FakeTGI]) -> None:
    fake = fakes(version="1.4.5", eos_after=1)
    async with _running(fake.url) as b:
        # No input_length in the stream details: the gateway's estimate of the prompt.
        req = _completion("alpha beta", max_tokens=5, stream=True)
        chunks = await _collect(b.stream(req))
        assert chunks[-1].finish_reason == "stop"
        assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == req.prompt_tokens
        # Chat: TGI 1.x's own finish reason, and no usage chunk.
        chunks = await _collect(b.stream(_chat(max_tokens=5, stream=True)))
        assert chunks[-1].finish_reason == "stop" and all(c.usage is None for c in chunks)
        load = await b.load()
        assert load.kv_usage == 0.0  # the budget from /info (no tgi_batch_max_total_tokens on the page)


def test_tgi_is_registered_with_its_options() -> None:
    from shuniu.core.plugin_manager import load_plugins

    reg = load_plugins().registered("backends")["tgi"]
    assert reg.options is TgiOptions and reg.plugin == "tgi" and "/generate_stream" in reg.description
    backend = reg.factory(EndpointSpec("e", "m", TgiOptions(base_url="http://127.0.0.1:9")))
    assert isinstance(backend, TgiBackend) and backend.kind == "tgi"


# -- a real gateway in front of the fake --------------------------------------------------------


def test_a_gateway_in_front_of_the_fake(gateway_factory, fakes: Callable[..., FakeTGI]) -> None:  # type: ignore[no-untyped-def]
    fake = fakes(token_delay_s=0.002)
    gw = gateway_factory(
        f"""
        models:
          chat:
            health: {{interval_s: 0.1}}
            load: {{interval_s: 0.1}}
            endpoints:
              - kind: tgi
                name: tgi-a
                options: {{base_url: "{fake.url}/v1"}}
        """
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=60)
    try:
        assert [m.model_extra["max_model_len"] for m in client.models.list().data] == [2048]  # type: ignore[index]
        stream = client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == " w0 w1 w2 w3 w4 w5"
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["length"]
        usage = chunks[-1].usage
        assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (4, 6)  # TGI's counts
        assert all(c.model == "chat" for c in chunks)

        done = client.completions.create(model="chat", prompt="one two three", max_tokens=4, temperature=0)
        assert done.choices[0].text == " w0 w1 w2 w3" and done.choices[0].finish_reason == "length"
        assert done.usage is not None and (done.usage.prompt_tokens, done.usage.completion_tokens) == (3, 4)

        parts = list(
            client.completions.create(model="chat", prompt="x y", max_tokens=3, stop=[" w1"], stream=True)
        )
        assert "".join(p.choices[0].text for p in parts if p.choices) == " w0 w1"
        assert [p.choices[0].finish_reason for p in parts if p.choices][-1] == "stop"

        # TGI's own validation (422), as a 400 with TGI's message.
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], stop=["a", "b", "c", "d", "e"]
            )
        assert (
            bad.value.code == "validation" and "`stop` supports up to 4 stop sequences" in bad.value.message
        )
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(model="chat", prompt=[1, 2, 3], max_tokens=2)
        assert bad.value.code == "unsupported_value"

        fake.fault = "overloaded"
        with pytest.raises(openai.APIStatusError) as busy:
            client.completions.create(model="chat", prompt="x", max_tokens=2, stream=True)
        assert busy.value.status_code == 503 and busy.value.response.headers["retry-after"] == "1"
        fake.fault = None

        sent = _sent(fake, "/v1/chat/completions")[0]
        assert sent["model"] == "tgi" and sent["stream_options"] == {"include_usage": True}

        def ready() -> dict[str, Any] | None:
            body = httpx.get(f"{gw.url}/ready", timeout=10).json()
            (endpoint,) = body["models"]["chat"]["endpoints"]
            load = endpoint["load"]
            # 6 + 4 + 2 tokens generated above (TGI counts finished requests only).
            return endpoint if endpoint["healthy"] and load and load["generated_tokens"] == 12 else None

        endpoint = wait_until(ready)
        assert endpoint["kind"] == "tgi" and endpoint["detail"] == "HTTP 200"
        assert (endpoint["load"]["running"], endpoint["load"]["waiting"], endpoint["load"]["kv_usage"]) == (
            0,
            0,
            0.0,
        )
    finally:
        client.close()


def test_a_gateway_launching_the_fake_like_text_generation_launcher(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    # The doc's `launch:` example with the fake's CLI in place of text-generation-launcher
    # (same flags); base_url is derived from launch_base_url.
    command = yaml.safe_dump(
        [
            sys.executable,
            "-m",
            "tests.fake_tgi",
            "--model-id",
            "{model}",
            "--hostname",
            "{host}",
            "--port",
            "{port}",
        ],
        default_flow_style=True,
    ).strip()
    gw = gateway_factory(
        f"""
        models:
          tiny:
            health: {{interval_s: 0.1}}
            endpoints:
              - kind: tgi
                launch:
                  command: {command}
                  cwd: "{ROOT}"
                  ready_timeout_s: 30
                  log_dir: null
        """
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)
    try:

        def ready() -> bool:
            return httpx.get(f"{gw.url}/ready", timeout=10).status_code == 200

        wait_until(ready, timeout=30)
        done = client.completions.create(model="tiny", prompt="a b", max_tokens=2)
        assert done.choices[0].text == " w0 w1" and done.usage is not None and done.usage.prompt_tokens == 2
        assert [m.model_extra["max_model_len"] for m in client.models.list().data] == [2048]  # type: ignore[index]
    finally:
        client.close()
