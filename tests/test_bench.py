"""``shuniu bench``: arrivals, lengths, prompts, SSE timing, percentiles, error kinds, the
client against small fake servers, and the command against real ``shuniu serve`` gateways."""

from __future__ import annotations

import asyncio
import json
import math
import random
import socket
import statistics
import subprocess
import sys
from array import array
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from shuniu.core.cli import build_cli
from shuniu.core.stats import percentile
from shuniu.core.tokens import count_tokens
from shuniu.plugins.tools.bench.client import (
    SseTracker,
    http_error_kind,
    parse_endpoint,
    parse_response,
)
from shuniu.plugins.tools.bench.prompts import VOCABULARY, PromptMaker, ids_to_text, words
from shuniu.plugins.tools.bench.report import latency_stats, summarize
from shuniu.plugins.tools.bench.runner import RunResult, RunSpec, run
from shuniu.plugins.tools.bench.traffic import (
    BodyBuilder,
    Planned,
    arrival_times,
    length_sampler,
    make_arrival,
    parse_length,
    parse_ramp,
    synthetic_plan,
)
from tests.conftest import ROOT, GatewayProcess, start_gateway

# --------------------------------------------------------------------------- arrivals


def _take(it: Iterator[float], n: int) -> list[float]:
    return [next(it) for _ in range(n)]


def test_poisson_arrivals_have_the_asked_mean_rate() -> None:
    times = _take(arrival_times(make_arrival("poisson", rate=50.0), seed=7), 20000)
    assert times == sorted(times)
    rate = len(times) / times[-1]
    assert rate == pytest.approx(50.0, rel=0.03)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    # Exponential gaps: the standard deviation equals the mean.
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)
    # The same seed gives the same arrivals; another seed other ones.
    assert _take(arrival_times(make_arrival("poisson", rate=50.0), seed=7), 5) == times[:5]
    assert _take(arrival_times(make_arrival("poisson", rate=50.0), seed=8), 5) != times[:5]


def test_constant_arrivals_are_evenly_spaced() -> None:
    times = _take(arrival_times(make_arrival("constant", rate=4.0), seed=0), 40)
    for i, t in enumerate(times, 1):
        assert t == pytest.approx(i * 0.25)


def test_gamma_arrivals_are_burstier_than_poisson() -> None:
    times = _take(arrival_times(make_arrival("gamma", rate=20.0, cv=3.0), seed=1), 20000)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert len(times) / times[-1] == pytest.approx(20.0, rel=0.1)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(3.0, rel=0.15)


def test_a_ramp_rises_linearly_over_the_duration_after_the_warmup() -> None:
    arrival = make_arrival("constant", ramp=(10.0, 30.0), warmup_s=2.0, duration_s=10.0)
    times = list(_until(arrival_times(arrival, 0), 14.0))
    in_window = [t for t in times if 2.0 <= t < 12.0]
    # Warm-up at the starting rate; then the integral of a rate rising 10 -> 30 over 10 s is 200,
    # 75 in the first half and 125 in the second; then 30/s.
    assert sum(1 for t in times if t < 2.0) == pytest.approx(20, abs=1)
    assert len(in_window) == pytest.approx(200, abs=1)
    assert sum(1 for t in in_window if t < 7.0) == pytest.approx(75, abs=1)
    assert sum(1 for t in times if 12.0 <= t < 14.0) == pytest.approx(60, abs=1)
    # Poisson on the same ramp: the same counts on average.
    poisson = list(_until(arrival_times(make_arrival("poisson", ramp=(10, 30), duration_s=100), 3), 100))
    assert len(poisson) == pytest.approx(2000, rel=0.06)
    assert sum(1 for t in poisson if t < 50) == pytest.approx(750, rel=0.1)


def _until(it: Iterator[float], end: float) -> Iterator[float]:
    for t in it:
        if t >= end:
            return
        yield t


def test_ramp_and_arrival_arguments_are_checked() -> None:
    assert parse_ramp("1:20") == (1.0, 20.0)
    assert parse_ramp("20:0") == (20.0, 0.0)
    for bad in ("5", "a:b", "-1:3", "0:0"):
        with pytest.raises(ValueError, match="FROM:TO"):
            parse_ramp(bad)
    with pytest.raises(ValueError, match="needs --duration"):
        make_arrival("poisson", ramp=(1, 2))
    with pytest.raises(ValueError, match="positive"):
        make_arrival("poisson", rate=0)


# --------------------------------------------------------------------------- lengths


@pytest.mark.parametrize(
    ("spec", "mean", "lo", "hi"),
    [
        ("256", 256, 256, 256),
        ("fixed:7", 7, 7, 7),
        ("uniform:100:400", 250, 100, 400),
        ("uniform:min=1,max=3", 2, 1, 3),
        ("lognormal:mean=500,sigma=0.5", 500, 1, math.inf),
        ("exponential:mean=200", 200, 1, math.inf),
        ("lognormal:mean=500,sigma=1,min=100,max=600", None, 100, 600),
    ],
)
def test_length_distributions(spec: str, mean: float | None, lo: float, hi: float) -> None:
    draw = length_sampler(parse_length(spec))
    rng = random.Random(0)
    xs = [draw(rng) for _ in range(20000)]
    assert all(isinstance(x, int) and lo <= x <= hi for x in xs)
    if mean is not None:
        assert statistics.fmean(xs) == pytest.approx(mean, rel=0.03)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0", "whole number >= 1"),
        ("1.5", "whole number >= 1"),
        ("uniform:5:1", "below min"),
        ("uniform:1", "two numbers"),
        ("lognormal:mean=5", "sigma"),
        ("lognormal:mean=5,sigma=x", "expected a token count"),
        ("zipf:1", "unknown distribution"),
    ],
)
def test_bad_length_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_length(spec)


# --------------------------------------------------------------------------- prompts


def test_prompts_have_the_asked_length_and_are_deterministic() -> None:
    assert len(VOCABULARY) == len(set(VOCABULARY)) == 256
    text = words(1, "x", 1000)
    assert len(text.split()) == 1000 == count_tokens(text)
    assert words(1, "x", 1000) == text
    assert words(1, "x", 10) == " ".join(text.split()[:10])  # a longer text extends a shorter one
    assert words(2, "x", 1000) != text
    assert words(1, "x", 1) == text.split()[0]
    assert words(1, "x", 0) == ""
    assert ids_to_text([0, 256, 257, 32767]) == " ".join(
        [VOCABULARY[0], VOCABULARY[0], VOCABULARY[1], VOCABULARY[255]]
    )


def test_shared_prefixes_are_identical_within_a_group_and_differ_between_groups() -> None:
    maker = PromptMaker(seed=3, prefix_tokens=50, groups=2)
    prompts = [maker.make(i, 20) for i in range(6)]
    prefixes = [p for p, _ in prompts]
    assert prefixes[0] == prefixes[2] == prefixes[4] != prefixes[1] == prefixes[3] == prefixes[5]
    assert all(len(p.split()) == 50 for p in prefixes)
    uniques = [u for _, u in prompts]
    assert len(set(uniques)) == 6 and all(len(u.split()) == 20 for u in uniques)
    assert prefixes[0].split()[0] != prefixes[1].split()[0] or prefixes[0] != prefixes[1]
    assert PromptMaker(seed=3, prefix_tokens=50, groups=2).make(4, 20) == prompts[4]
    assert PromptMaker(seed=3).make(0, 5)[0] == ""


def test_the_plan_puts_a_shared_prefix_in_a_system_message() -> None:
    builder = BodyBuilder("m", stream=True, ignore_eos=True, extra={"temperature": 0})
    plan = synthetic_plan(
        api="chat",
        builder=builder,
        prompt_tokens=parse_length("10"),
        output_tokens=parse_length("uniform:5:9"),
        prompts=PromptMaker(seed=0, prefix_tokens=30, groups=1),
        seed=0,
        times=iter([0.5, 1.0, 1.5]),
    )
    items = list(plan)
    assert [p.at for p in items] == [0.5, 1.0, 1.5]
    bodies = [json.loads(p.body) for p in items]
    for p, body in zip(items, bodies, strict=True):
        assert body["messages"][0]["role"] == "system"
        assert len(body["messages"][0]["content"].split()) == 30
        assert len(body["messages"][1]["content"].split()) == 10
        assert body["max_tokens"] == p.output_tokens and 5 <= p.output_tokens <= 9
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["ignore_eos"] is True and body["temperature"] == 0
        assert p.prompt_tokens == 40
    assert bodies[0]["messages"][0] == bodies[1]["messages"][0] == bodies[2]["messages"][0]
    completion = json.loads(BodyBuilder("m", stream=False).build("completions", "a b", "c d", None))
    assert completion == {"model": "m", "prompt": "a b c d"}


# --------------------------------------------------------------------------- SSE


def _chat_event(
    text: str | None = None, *, role: bool = False, usage: tuple[int, int] | None = None
) -> bytes:
    if usage is not None:
        obj: dict[str, object] = {
            "choices": [],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
        }
    elif role:
        obj = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    elif text is None:
        obj = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    else:
        obj = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def test_sse_timing_from_a_fake_clock() -> None:
    t = SseTracker()
    # (bytes, arrival time): the role chunk is no content; then tokens at 0.30, 0.35, 0.45.
    t.feed(b": keep-alive\n\n" + _chat_event(role=True), 0.10)
    assert t.first < 0
    t.feed(_chat_event("Hel"), 0.30)
    event = _chat_event("lo")
    t.feed(event[:17], 0.33)  # an event split across reads counts when it is complete
    assert t.chunks == 1
    t.feed(event[17:], 0.35)
    t.feed(_chat_event(" world") + _chat_event(None) + _chat_event(usage=(12, 7)), 0.45)
    assert not t.done
    t.feed(b"data: [DONE]\n\n", 0.46)
    assert t.done and t.error is None
    assert t.first == 0.30 and t.last == 0.45 and t.chunks == 3
    assert t.gaps == pytest.approx([0.05, 0.10])
    assert (t.prompt_tokens, t.completion_tokens) == (12, 7)


def test_sse_events_in_one_read_share_its_time_and_crlf_and_fields_are_handled() -> None:
    t = SseTracker()
    stream = (
        b"event: message\r\nid: 1\r\ndata: "
        + msgspec.json.encode({"choices": [{"text": "a"}]})
        + b"\r\n\r\n"
        + b"data:"
        + msgspec.json.encode({"choices": [{"text": "b"}]})
        + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    )
    t.feed(stream[:40], 1.0)
    t.feed(stream[40:], 2.0)
    assert (t.chunks, t.first, t.gaps, t.done) == (2, 2.0, [0.0], True)


def test_sse_errors_inside_a_stream() -> None:
    t = SseTracker()
    t.feed(_chat_event("x"), 1.0)
    t.feed(
        b'data: {"error": {"message": "engine died", "type": "server_error", "code": "engine_error"}}\n\n',
        2.0,
    )
    t.feed(b"data: [DONE]\n\n", 2.0)
    assert t.error == "stream_error engine_error" and t.chunks == 1
    old_vllm = SseTracker()
    old_vllm.feed(
        b'data: {"object": "error", "message": "bad", "type": "BadRequestError", "code": 400}\n\n', 1
    )
    assert old_vllm.error == "stream_error BadRequestError"
    junk = SseTracker()
    junk.feed(b"data: not json\n\n", 1.0)
    assert junk.bad_events == 1 and junk.chunks == 0


def test_reasoning_and_content_parts_count_as_content() -> None:
    t = SseTracker()
    t.feed(b'data: {"choices": [{"delta": {"reasoning_content": "hmm"}}]}\n\n', 1.0)
    t.feed(b'data: {"choices": [{"delta": {"content": [{"type": "text", "text": "x"}]}}]}\n\n', 2.0)
    assert t.chunks == 2 and t.first == 1.0


def test_non_streamed_bodies() -> None:
    body = b'{"choices": [{"message": {"content": "hi there"}}], '
    body += b'"usage": {"prompt_tokens": 3, "completion_tokens": 2}}'
    r = parse_response(body)
    assert r is not None and (r.text, r.prompt_tokens, r.completion_tokens) == ("hi there", 3, 2)
    assert parse_response(b'{"choices": [{"text": "ok"}]}').text == "ok"  # type: ignore[union-attr]
    assert parse_response(b"<html>") is None
    assert parse_response(b'{"error": {"message": "no"}}') is None


def test_the_prompt_tokens_a_servers_cache_served_are_read_from_usage() -> None:
    t = SseTracker()
    t.feed(_chat_event("x"), 1.0)
    usage = {"prompt_tokens": 300, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 256}}
    t.feed(b"data: " + msgspec.json.encode({"choices": [], "usage": usage}) + b"\n\n", 1.1)
    assert (t.prompt_tokens, t.cached_tokens) == (300, 256)
    plain = SseTracker()
    plain.feed(_chat_event(usage=(12, 7)), 1.0)
    assert plain.cached_tokens is None  # the server did not say
    anthropic = SseTracker()
    cached = {"input_tokens": 40, "cache_read_input_tokens": 32}
    start = {"type": "message_start", "message": {"usage": cached}}
    anthropic.feed(b"event: message_start\ndata: " + msgspec.json.encode(start) + b"\n\n", 1.0)
    assert (anthropic.prompt_tokens, anthropic.cached_tokens) == (40, 32)
    body = b'{"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 3, '
    body += b'"completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 2}}}'
    r = parse_response(body)
    assert r is not None and r.cached_tokens == 2


# --------------------------------------------------------------------------- report


def test_percentiles_against_reference_values() -> None:
    # Linear interpolation between ranks (numpy's default), worked by hand.
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([10, 20, 30, 40, 50], 95) == pytest.approx(48.0)
    assert percentile([10, 20, 30, 40, 50], 99) == pytest.approx(49.6)
    assert percentile([10, 20, 30, 40, 50], 0) == 10 and percentile([10, 20, 30, 40, 50], 100) == 50
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None
    xs = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    s = latency_stats(list(reversed(xs)))
    assert s["n"] == 100 and s["min"] == 1.0 and s["max"] == 100.0
    assert s["mean"] == pytest.approx(50.5) and s["p50"] == pytest.approx(50.5)
    assert s["p90"] == pytest.approx(90.1) and s["p99"] == pytest.approx(99.01)
    assert latency_stats([])["p99"] is None


def _result(**kw: object) -> RunResult:
    r = RunResult(mode="open", window_s=2.0, issue_s=2.0, wall_s=2.0, client_cpu_s=0.1)
    r.issued = r.succeeded = 4
    r.output_tokens = [10, 10, 10, 10]
    r.e2e = [0.1] * 4
    r.lag.extend([0.0001] * 4)
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_the_summary_says_when_the_client_was_the_bottleneck() -> None:
    config = {"max_in_flight": 8}
    clean = summarize(_result(), config)
    assert clean["client"]["bottleneck"] is False and clean["client"]["verdict"] == []
    assert clean["qps"] == 2.0 and clean["output_tokens_per_s"] == 20.0
    saturated = summarize(_result(saturated=3), config)
    assert saturated["client"]["bottleneck"] and "client saturated" in saturated["client"]["verdict"][0]
    r = _result()
    r.lag.extend([0.05] * 4)
    late = summarize(r, config)
    assert late["client"]["bottleneck"] and "fell behind its schedule" in late["client"]["verdict"][0]
    # Held up now and then (lag spikes), not falling behind: a warning when small next to TTFT.
    jitter = _result(ttft=[0.5] * 4, lag=array("d", [0.012, 0.0001] * 4))
    s = summarize(jitter, config)
    assert not s["client"]["bottleneck"] and "schedule lag p99" in s["client"]["warnings"][0]
    busy = summarize(_result(client_cpu_s=1.95), config)
    assert not busy["client"]["bottleneck"] and "CPU core" in busy["client"]["warnings"][0]
    good = summarize(_result(good=3), config, {"ttft_ms": 100.0})
    assert good["goodput"] == {"slo_ms": {"ttft_ms": 100.0}, "requests": 3, "share": 0.75, "per_s": 1.5}


# --------------------------------------------------------------------------- errors


def test_error_kinds() -> None:
    body = b'{"error": {"message": "full", "type": "rate_limit_error", "param": null, "code": "queue_full"}}'
    assert http_error_kind(429, body) == "429 queue_full"
    assert http_error_kind(429, b'{"error": {"message": "slow down", "type": "rate_limit_exceeded"}}') == (
        "429 rate_limit_exceeded"
    )
    vllm = b'{"object": "error", "message": "x", "type": "BadRequestError", "param": null, "code": 400}'
    assert http_error_kind(400, vllm) == "400 BadRequestError"
    assert http_error_kind(502, b"<html>Bad Gateway</html>") == "502"
    assert http_error_kind(500, b"") == "500"


def test_endpoints_from_urls() -> None:
    e = parse_endpoint("http://127.0.0.1:8000/v1")
    assert (e.scheme, e.host, e.port, e.root, e.api) == ("http", "127.0.0.1", 8000, "/v1", None)
    assert e.path("chat") == "/v1/chat/completions" and e.path("completions") == "/v1/completions"
    assert parse_endpoint("http://[::1]:9/v1/chat/completions").api == "chat"
    assert parse_endpoint("http://[::1]:9/v1/chat/completions").host_header == "[::1]:9"
    assert parse_endpoint("https://example.com/v1/completions/").api == "completions"
    assert parse_endpoint("https://example.com").port == 443
    for bad in ("ftp://x/v1", "http:///v1", "http://user:pw@127.0.0.1:1/v1"):
        with pytest.raises(ValueError):
            parse_endpoint(bad)


# --------------------------------------------------------------------------- the client, against fake servers


_SCRIPT = list[tuple[float, bytes]]


async def _fake_server(scripts: dict[str, _SCRIPT]) -> AsyncIterator[int]:
    """A raw HTTP server: the request's model name picks a script of (delay, bytes) writes;
    ``close`` as bytes closes the connection."""

    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                body = json.loads(await reader.readexactly(length))
                for delay, data in scripts[body["model"]]:
                    await asyncio.sleep(delay)
                    if data == b"close":
                        writer.close()
                        return
                    writer.write(data)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]
        for task in handlers:
            task.cancel()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


_SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


@pytest.fixture
async def fake_server() -> AsyncIterator[int]:
    scripts: dict[str, _SCRIPT] = {
        "timed": [
            (0.0, _SSE_HEAD + _chunk(_chat_event(role=True))),
            (0.20, _chunk(_chat_event("a"))),
            (0.10, _chunk(_chat_event("b") + _chat_event("c"))),
            (
                0.10,
                _chunk(_chat_event(None) + _chat_event(usage=(5, 4)) + b"data: [DONE]\n\n") + b"0\r\n\r\n",
            ),
        ],
        "cut": [(0.0, _SSE_HEAD + _chunk(_chat_event("a"))), (0.05, b"close")],
        "nodone": [(0.0, _SSE_HEAD + _chunk(_chat_event("a")) + b"0\r\n\r\n")],
        "busy": [
            (
                0.0,
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                + b"content-length: 60\r\n\r\n"
                + b'{"error": {"message": "busy", "code": "queue_timeout"}}'.ljust(60),
            )
        ],
        "slow": [(2.0, b"")],
    }
    async for port in _fake_server(scripts):
        yield port


async def test_the_client_times_a_stream_and_classifies_failures(fake_server: int) -> None:
    # A 1 s deadline: "timed" (0.4 s of pauses) ends well within it on a loaded machine,
    # "slow" (2 s) never does.
    spec = RunSpec(endpoint=parse_endpoint(f"http://127.0.0.1:{fake_server}/v1"), requests=5, timeout_s=1.0)
    plan = [
        Planned(at, "chat", BodyBuilder(model, stream=True).build("chat", "", "hi", 4), 1, 4)
        for at, model in ((0.0, "timed"), (0.01, "cut"), (0.02, "nodone"), (0.03, "busy"), (0.04, "slow"))
    ]
    r = await run(spec, iter(plan))
    assert (r.issued, r.succeeded, r.failed) == (5, 1, 4)
    assert dict(r.errors) == {
        "stream_interrupted": 1,
        "stream_incomplete": 1,
        "503 queue_timeout": 1,
        "timeout": 1,
    }
    (ttft,) = r.ttft
    assert 0.19 <= ttft < 1.0
    assert sorted(r.itl) == pytest.approx([0.0, 0.1], abs=0.05)  # b and c arrived together
    assert r.output_tokens == [4] and r.usage_reported == 1 and r.input_tokens == 5
    assert r.tpot == pytest.approx([(0.2) / 3], abs=0.03)
    assert len(r.lag) == 5 and max(r.lag) < 0.1


async def test_connection_refused_is_an_error_kind() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        spec = RunSpec(endpoint=parse_endpoint(f"http://127.0.0.1:{port}/v1"), requests=2, timeout_s=2)
        body = BodyBuilder("m", stream=True).build("chat", "", "hi", 1)
        r = await run(spec, iter([Planned(0.0, "chat", body, 1, 1)] * 2))
    assert dict(r.errors) == {"connection_refused": 2}


async def test_closed_loop_keeps_n_requests_in_flight(fake_server: int) -> None:
    spec = RunSpec(endpoint=parse_endpoint(f"http://127.0.0.1:{fake_server}/v1"), concurrency=3, requests=6)
    body = BodyBuilder("timed", stream=True).build("chat", "", "hi", 4)
    r = await run(spec, iter([Planned(0.0, "chat", body, 1, 4)] * 100))
    assert (r.mode, r.issued, r.succeeded) == ("closed", 6, 6)
    assert r.connections == 3
    assert max(r.series_inflight_max) == 3
    # Two rounds of ~0.4 s requests, three at a time.
    assert 0.75 < r.window_s < 2.5


async def test_open_loop_counts_requests_beyond_max_in_flight_as_client_saturated(fake_server: int) -> None:
    spec = RunSpec(endpoint=parse_endpoint(f"http://127.0.0.1:{fake_server}/v1"), requests=6, max_in_flight=2)
    body = BodyBuilder("timed", stream=True).build("chat", "", "hi", 4)
    r = await run(spec, iter([Planned(i * 0.01, "chat", body, 1, 4) for i in range(6)]))
    assert (r.issued, r.saturated, r.succeeded) == (2, 4, 2)
    s = summarize(r, {"max_in_flight": 2})
    assert s["client"]["bottleneck"] and s["requests"]["client_saturated"] == 4


# --------------------------------------------------------------------------- the command, against gateways

_SIM = """
models:
  tiny:
    max_model_len: 16384
    health: {interval_s: 0.05}
    endpoints:
      - kind: sim
        replicas: 2
        options: {ttft_ms: 40, tokens_per_s: 200, output_tokens_min: 8, output_tokens_max: 40}
"""

_TINY_QUEUE = """
models:
  tiny:
    health: {interval_s: 0.05}
    endpoints:
      - kind: sim
        max_concurrency: 1
        options: {ttft_ms: 0, tokens_per_s: 20, output_tokens_min: 8, output_tokens_max: 8}
    scheduler: {policy: fifo, options: {max_queue: 2, max_wait_s: 0.3}}
"""


@pytest.fixture(scope="module")
def sim_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = start_gateway(_SIM, tmp_path_factory.mktemp("bench-gateway"))
    yield gw
    gw.stop()


def _bench(*args: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    result = CliRunner().invoke(
        build_cli(), ["bench", *args, "--json", "-", "--quiet"], catch_exceptions=False
    )
    out = result.output
    return result.exit_code, json.loads(out) if out.strip().startswith("{") else {}, out


def test_bench_against_a_gateway(sim_gateway: GatewayProcess, tmp_path: Path) -> None:
    code, s, out = _bench(
        sim_gateway.base_url,
        *("--rate", "10", "--arrival", "constant", "--duration", "2", "--output-tokens", "8"),
        *(
            "--ignore-eos",
            "--prompt-tokens",
            "uniform:20:40",
            "--shared-prefix",
            "64",
            "--slo-ttft-ms",
            "5000",
        ),
        *("--plot", str(tmp_path / "plots")),
        *("--requests-out", str(tmp_path / "requests.jsonl")),
    )
    assert code == 0, out
    req = s["requests"]
    assert req["issued"] in (19, 20) and req["succeeded"] == req["issued"] and req["failed"] == 0
    assert s["errors"] == {} and s["error_rate"] == 0
    assert s["config"]["model"] == "tiny"  # from /v1/models
    # The engine's fixed 40 ms before the first token, plus prefill and the first decode step.
    assert 40 < s["ttft_ms"]["p50"] < 1000
    assert (
        s["output_tokens"]["total"] == 8 * req["succeeded"]
        and s["output_tokens"]["from_usage"] == req["succeeded"]
    )
    assert s["output_tokens_per_s"] == pytest.approx(s["output_tokens"]["total"] / s["duration_s"], rel=1e-3)
    assert s["qps"] == pytest.approx(req["succeeded"] / s["duration_s"], rel=1e-3)
    assert 1.9 < s["duration_s"] < 4.0
    # 200 tokens/s per request: 5 ms between tokens.
    assert 2 < s["tpot_ms"]["p50"] < 50 and s["itl_ms"]["n"] == 7 * req["succeeded"]
    assert s["goodput"]["requests"] == req["succeeded"]
    # On time (p50: the p99 depends on what else this machine is running).
    assert s["schedule_lag_ms"]["n"] == req["issued"] and s["schedule_lag_ms"]["p50"] < 20
    assert sum(p["sent"] for p in s["timeseries"]) == req["issued"]
    assert sum(p["output_tokens"] for p in s["timeseries"]) == pytest.approx(s["output_tokens"]["total"])
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"latency_cdf.png", "throughput.png"}
    # Every measured request, one JSON line each, in the order they were due.
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [r["index"] for r in records] == sorted(r["index"] for r in records)
    assert len(records) == req["succeeded"] and all(r["error"] is None for r in records)
    assert all(r["output_tokens"] == 8 and 0 < r["ttft_s"] <= r["e2e_s"] for r in records)
    assert sorted(r["ttft_s"] for r in records)[len(records) // 2] * 1000 == pytest.approx(
        s["ttft_ms"]["p50"], rel=0.25
    )
    # Sent in the plan's order, within the run.
    sent = [r["sent_s"] for r in records]
    assert sent == sorted(sent) and 0 <= sent[0] and sent[-1] <= s["duration_s"]
    # The engine's prefix cache served the 64-token shared prefix to the later ones (whole
    # blocks of it), and never more than the prompt.
    assert all(0 <= r["cached_tokens"] <= r["prompt_tokens"] for r in records)
    assert max(r["cached_tokens"] for r in records) >= 48


def test_bench_replays_a_workload_file(sim_gateway: GatewayProcess) -> None:
    code, s, out = _bench(
        sim_gateway.base_url,
        *("--workload", str(ROOT / "examples/workloads/trace-replay.yaml"), "--rate-scale", "0.25"),
        *("--duration", "1.5", "--ignore-eos", "--no-stream"),
    )
    assert code == 0, out
    # trace.jsonl at 2x, scaled by 0.25: about 7 requests/s, i.e. the first ~10 lines.
    assert 5 <= s["requests"]["succeeded"] <= 16 and s["requests"]["failed"] == 0
    assert s["config"]["load"] == "workload trace-replay x0.25"
    # Exact answer lengths from the trace (ignore_eos), the first line's 124 among them.
    assert s["output_tokens"]["mean"] > 100
    assert s["goodput"]["slo_ms"] == {"ttft_ms": 1500.0, "tpot_ms": 50.0}
    assert s["ttft_ms"]["n"] == 0 and s["e2e_ms"]["n"] == s["requests"]["succeeded"]


def test_bench_classifies_queue_rejections(tmp_path: Path) -> None:
    gw = start_gateway(_TINY_QUEUE, tmp_path)
    try:
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "shuniu.core", "bench", gw.base_url, "--model", "tiny"),
                *("--rate", "20", "--arrival", "constant", "--duration", "1", "--output-tokens", "8"),
                *("--json", "-", "--quiet"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        gw.stop()
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    # One request runs (0.4 s), two wait, the rest are refused; waiters past 0.3 s time out.
    assert s["requests"]["succeeded"] >= 1
    assert s["errors"].get("429 queue_full", 0) >= 5
    assert set(s["errors"]) <= {"429 queue_full", "503 queue_timeout"}
    assert s["requests"]["failed"] == sum(s["errors"].values())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "5", "--concurrency", "2"], "not both"),
        ([], "say how to load"),
        (["--rate", "5", "--ramp", "1:2"], "not both"),
        (["--concurrency", "2", "--arrival", "constant"], "closed loop"),
        (["--rate", "5", "--prompt-tokens", "zipf:3"], "unknown distribution"),
        (["--workload", "x.yaml", "--prompt-tokens", "5"], "does not go with --workload"),
        (["--rate", "5", "--rate-scale", "2"], "goes with --workload"),
        (["--rate", "5", "--body", "[1]"], "JSON object"),
        (["--rate", "5", "--header", "Host: x"], "set by shuniu bench"),
        (["--rate", "5", "--cv", "2"], "--arrival gamma"),
        (["--rate", "5", "--api", "embeddings", "--stream"], "does not go with --api embeddings"),
        (["--rate", "5", "--api", "rerank", "--output-tokens", "5"], "does not go with --api rerank"),
        (["--rate", "5", "--inputs", "4"], "--inputs goes with"),
    ],
)
def test_bad_command_lines(args: list[str], message: str) -> None:
    result = CliRunner().invoke(build_cli(), ["bench", "http://127.0.0.1:9/v1", "--model", "m", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_bad_workload_file_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text("streams:\n  - arrival: {rate: -1}\n    input_tokens: 5\n    output_tokens: 5\n")
    result = CliRunner().invoke(
        build_cli(), ["bench", "http://127.0.0.1:9/v1", "--model", "m", "-w", str(bad)]
    )
    assert result.exit_code == 2 and "streams[0].arrival.rate" in result.output


def test_nothing_succeeding_exits_1_and_the_key_is_never_shown(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
        out = tmp_path / "r.json"
        result = CliRunner().invoke(
            build_cli(),
            ["bench", url, "--model", "m", "--requests", "2", "--rate", "50", "--json", str(out)],
            env={"OPENAI_API_KEY": "sk-secret-123", "COLUMNS": "200"},
        )
    assert result.exit_code == 1, result.output
    assert "connection_refused" in result.output and "no request succeeded" in result.output
    text = out.read_text()
    assert "sk-secret" not in text and "sk-secret" not in result.output
    assert json.loads(text)["config"]["headers"] == ["Authorization"]


# --------------------------------------------------------------------------- other APIs


def test_pooling_and_messages_bodies_and_answers() -> None:
    builder = BodyBuilder("m", stream=False, inputs=3)
    plan = synthetic_plan(
        api="embeddings",
        builder=builder,
        prompt_tokens=parse_length("10"),
        output_tokens=None,
        prompts=PromptMaker(1, 0, 1),
        seed=1,
    )
    first = next(plan)
    body = msgspec.json.decode(first.body)
    assert len(body["input"]) == 3 and all(len(t.split()) == 10 for t in body["input"])
    assert first.prompt_tokens == 30 and first.output_tokens is None and "stream" not in body
    ranked = msgspec.json.decode(BodyBuilder("m", stream=False).build("rerank", "", "a b c", None, ["d e"]))
    assert ranked["documents"] == ["a b c", "d e"] and ranked["query"] == "a b c"
    anthropic = msgspec.json.decode(BodyBuilder("m", stream=True).build("messages", "be brief", "hi", None))
    assert (
        anthropic["system"] == "be brief" and anthropic["max_tokens"] == 256 and anthropic["stream"] is True
    )
    assert "stream_options" not in anthropic

    vectors = parse_response(
        b'{"object":"list","data":[{"embedding":[1]},{"embedding":[2]}],"usage":{"prompt_tokens":9}}'
    )
    assert vectors is not None and (vectors.items, vectors.prompt_tokens, vectors.completion_tokens) == (
        2,
        9,
        0,
    )
    ranking = parse_response(
        b'{"id":"r","results":[{"index":0,"relevance_score":0.5}],"usage":{"total_tokens":4}}'
    )
    assert ranking is not None and (ranking.items, ranking.prompt_tokens) == (1, 4)
    message = parse_response(
        b'{"type":"message","content":[{"type":"text","text":"hello"}],"usage":{"input_tokens":5,"output_tokens":1}}'
    )
    assert message is not None and (message.text, message.prompt_tokens, message.completion_tokens) == (
        "hello",
        5,
        1,
    )


def test_anthropic_stream_timing() -> None:
    t = SseTracker()
    events = [
        (
            b"message_start",
            b'{"type":"message_start","message":{"usage":{"input_tokens":7,"output_tokens":1}}}',
        ),
        (
            b"content_block_start",
            b'{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
        ),
        (
            b"content_block_delta",
            b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}',
        ),
        (
            b"content_block_delta",
            b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"b"}}',
        ),
        (b"content_block_stop", b'{"type":"content_block_stop","index":0}'),
        (
            b"message_delta",
            b'{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}',
        ),
        (b"message_stop", b'{"type":"message_stop"}'),
    ]
    for i, (name, data) in enumerate(events):
        t.feed(b"event: " + name + b"\ndata: " + data + b"\n\n", float(i))
    assert (t.first, t.chunks, t.gaps, t.done) == (2.0, 2, [1.0], True)
    assert (t.prompt_tokens, t.completion_tokens, t.error) == (7, 2, None)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = start_gateway(None, tmp_path_factory.mktemp("bench-quickstart"))
    yield gw
    gw.stop()


def test_bench_drives_embeddings_rerank_and_messages(quickstart: GatewayProcess) -> None:
    url = quickstart.base_url
    code, s, out = _bench(
        url,
        "--api",
        "embeddings",
        "-m",
        "embed",
        "--inputs",
        "20",
        "--prompt-tokens",
        "16",
        "-c",
        "2",
        "-n",
        "6",
    )
    assert code == 0, out
    assert s["requests"]["succeeded"] == 6 and s["inputs"] == 120 and s["config"]["inputs_per_request"] == 20
    # The gateway's usage: 16 words each, counted as every limit counts them.
    assert s["input_tokens"]["total"] == 6 * 20 * 16
    assert s["inputs_per_s"] == pytest.approx(120 / s["duration_s"], rel=1e-3)
    code, s, out = _bench(url, "--api", "rerank", "-m", "rerank", "--inputs", "5", "-c", "1", "-n", "3")
    assert code == 0, out
    assert s["requests"]["succeeded"] == 3 and s["inputs"] == 15
    code, s, out = _bench(
        url,
        "--api",
        "messages",
        "-m",
        "quickstart",
        "--output-tokens",
        "4",
        "--ignore-eos",
        "-c",
        "2",
        "-n",
        "4",
    )
    assert code == 0, out
    assert s["requests"]["succeeded"] == 4 and s["output_tokens"]["total"] == 16 and s["ttft_ms"]["n"] == 4
    assert s["output_tokens"]["from_usage"] == 4
