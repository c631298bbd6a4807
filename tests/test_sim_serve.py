"""``shuniu sim serve``: a simulated engine that looks like ``vllm serve`` from outside.

The server runs as a real subprocess and is driven with the official ``openai`` SDK; its
``/metrics`` is read with ``prometheus_client``'s own parser, and :func:`render_metrics` is
checked line for line against what ``prometheus_client`` itself writes for the same values.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from shuniu.backends.sim.engine import EngineConfig, EngineCore, Seq
from shuniu.backends.sim.metrics import (
    CONTENT_TYPE,
    E2E_BUCKETS,
    ITL_BUCKETS,
    TTFT_BUCKETS,
    render_metrics,
)
from tests.conftest import GatewayProcess, start_process, wait_until

prometheus_client = pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

MODEL = "sim-test"
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = (
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
)
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": TTFT_BUCKETS,
    "vllm:inter_token_latency_seconds": ITL_BUCKETS,
    "vllm:e2e_request_latency_seconds": E2E_BUCKETS,
}


# -- running the server -------------------------------------------------------------------


def sim_serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "shuniu.core", "sim", "serve", *args]


def start_sim_server(*args: str, timeout: float = 30) -> GatewayProcess:
    """``shuniu sim serve ARGS`` on a free port."""
    return start_process(sim_serve_command("--port", "0", *args), timeout=timeout)


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayProcess]:
    """One simulated engine at 20 tokens/s per request, two sequences at a time."""
    srv = start_sim_server(
        "--tokens-per-s",
        "20",
        "--ttft-ms",
        "0",
        "--max-num-seqs",
        "2",
        "--max-model-len",
        "4096",
        "--served-model-name",
        MODEL,
        "--served-model-name",
        "sim-alias",
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: GatewayProcess) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()


# -- reading /metrics ---------------------------------------------------------------------


@dataclass
class Scrape:
    families: dict[str, object]
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]

    def value(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted({"engine": "0", "model_name": MODEL, **labels}.items())))
        return self.samples[key]


def parse(text: str) -> Scrape:
    families = {}
    samples = {}
    for family in text_string_to_metric_families(text):
        families[family.name] = family
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return Scrape(families, samples)


def scrape(server: GatewayProcess) -> Scrape:
    r = httpx.get(f"{server.url}/metrics", timeout=10)
    assert r.status_code == 200
    return parse(r.text)


def _delta(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


def _unique(words: int = 8) -> str:
    return f"{uuid.uuid4().hex} " + " ".join(f"word{i}" for i in range(words))


# -- the server ---------------------------------------------------------------------------


def test_banner_health_and_models(server: GatewayProcess, client: openai.OpenAI) -> None:
    server.output_containing("engine simulator", "fixed-rate")
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {MODEL, "sim-alias"}
    assert models[MODEL].model_extra["max_model_len"] == 4096


def test_metrics_endpoint_speaks_prometheus(server: GatewayProcess) -> None:
    r = httpx.get(f"{server.url}/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"] == CONTENT_TYPE
    m = parse(r.text)
    for name in GAUGES:
        assert m.families[name].type == "gauge"
        assert m.value(name) >= 0
    for name in COUNTERS:
        assert m.families[name].type == "counter"
        assert m.families[f"{name}_created"].type == "gauge"
    for name in HISTOGRAMS:
        assert m.families[name].type == "histogram"
    for reason in ("stop", "length", "abort"):
        assert m.value("vllm:request_success_total", finished_reason=reason) >= 0


def test_counters_match_what_the_clients_got(server: GatewayProcess, client: openai.OpenAI) -> None:
    before = scrape(server)
    usages = []
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": _unique()}], max_tokens=6
    )
    assert r.choices[0].finish_reason == "length"
    usages.append(r.usage)

    stream = client.chat.completions.create(
        model="sim-alias",
        messages=[{"role": "user", "content": _unique()}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    usages.append(chunks[-1].usage)

    c = client.completions.create(model=MODEL, prompt=_unique(20), max_tokens=5)
    usages.append(c.usage)

    cstream = client.completions.create(
        model=MODEL,
        prompt=_unique(3),
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    cchunks = list(cstream)
    usages.append(cchunks[-1].usage)

    # The engine counts before the last token leaves, so the counters are final by now.
    after = scrape(server)
    n = len(usages)
    completion = sum(u.completion_tokens for u in usages)
    prompt = sum(u.prompt_tokens for u in usages)
    assert _delta(before, after, "vllm:generation_tokens_total") == completion
    assert _delta(before, after, "vllm:prompt_tokens_total") == prompt
    assert _delta(before, after, "vllm:time_to_first_token_seconds_count") == n
    assert _delta(before, after, "vllm:e2e_request_latency_seconds_count") == n
    assert _delta(before, after, "vllm:inter_token_latency_seconds_count") == completion - n
    assert _delta(before, after, "vllm:request_success_total", finished_reason="length") == n
    assert _delta(before, after, "vllm:request_success_total", finished_reason="stop") == 0
    assert _delta(before, after, "vllm:request_success_total", finished_reason="abort") == 0
    # At 20 tokens/s no inter-token gap is shorter than an iteration (50 ms).
    itl = "vllm:inter_token_latency_seconds_bucket"
    assert _delta(before, after, itl, le="0.025") == 0
    assert _delta(before, after, itl, le="+Inf") == completion - n
    assert after.value("vllm:num_requests_running") == 0
    assert after.value("vllm:num_requests_waiting") == 0


def test_prefix_cache_hits_grow_when_a_long_prompt_repeats(
    server: GatewayProcess, client: openai.OpenAI
) -> None:
    prompt = _unique(300)
    before = scrape(server)
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    middle = scrape(server)
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    after = scrape(server)
    tokens = first.usage.prompt_tokens
    assert second.usage.prompt_tokens == tokens > 300
    assert _delta(before, middle, "vllm:prefix_cache_hits_total") == 0  # a prompt never seen
    assert _delta(before, middle, "vllm:prefix_cache_queries_total") == tokens
    hits = _delta(middle, after, "vllm:prefix_cache_hits_total")
    # Every full block but the one holding the last prompt token is reused (block size 16).
    assert tokens - 2 * 16 < hits < tokens
    assert _delta(middle, after, "vllm:prefix_cache_queries_total") == tokens


def test_gauges_follow_the_load_and_a_disconnect_frees_the_engine(
    server: GatewayProcess, client: openai.OpenAI
) -> None:
    """Three slow streams on an engine that runs two: 2 running, 1 waiting; when the clients
    hang up, the engine drops their sequences at once (not after their 1500 tokens)."""
    before = scrape(server)
    release = threading.Event()
    first_tokens: list[int] = []

    def hold(i: int) -> int:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": _unique()}],
            max_tokens=1500,  # 75 s at 20 tokens/s
            stream=True,
        )
        try:
            received = 0
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    received += 1
                    first_tokens.append(i)
                    break
            release.wait(60)
            return received
        finally:
            stream.close()  # the client goes away mid-stream

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(hold, i) for i in range(3)]
        try:
            during = wait_until(
                lambda: (
                    (m := scrape(server)).value("vllm:num_requests_running") == 2
                    and m.value("vllm:num_requests_waiting") == 1
                    and m
                )
            )
            assert during.value("vllm:kv_cache_usage_perc") > 0
            wait_until(lambda: len(first_tokens) == 2)
        finally:
            release.set()
        # Running drops as each client hangs up; the third request then starts, and is
        # dropped as soon as its client has its first token and hangs up too.
        after = wait_until(
            lambda: (
                (m := scrape(server)).value("vllm:num_requests_running") == 0
                and m.value("vllm:num_requests_waiting") == 0
                and m
            ),
            timeout=20,
        )
        assert [f.result(timeout=30) for f in futures] == [1, 1, 1]
    assert _delta(before, after, "vllm:request_success_total", finished_reason="abort") == 3
    assert _delta(before, after, "vllm:request_success_total", finished_reason="length") == 0
    assert after.value("vllm:kv_cache_usage_perc") == 0
    # Their tokens were generated (and counted), but far fewer than the 3 x 1500 asked for.
    assert 3 <= _delta(before, after, "vllm:generation_tokens_total") < 1500


def test_flags_problems_are_reported_without_a_traceback() -> None:
    r = subprocess.run(
        sim_serve_command("--port", "0", "--hardware", "h200"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2
    assert "give both `hardware` and `model`" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    r = subprocess.run(
        sim_serve_command("--port", "0", "--block-size", "0"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "--block-size" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    r = subprocess.run(
        sim_serve_command("--port", "0", "--tokenizer", "/no/such/tokenizer"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--tokenizer: " in r.stderr and "/no/such/tokenizer" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_profiles_serve_under_the_model_name() -> None:
    pytest.importorskip("shuniu.backends.sim.profiles")
    srv = start_sim_server("--hardware", "h200", "--model", "qwen2.5-7b")
    try:
        srv.output_containing("h200")
        c = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in c.models.list().data] == ["qwen2.5-7b"]
        r = c.chat.completions.create(
            model="qwen2.5-7b", messages=[{"role": "user", "content": "Hello"}], max_tokens=4
        )
        assert r.usage.completion_tokens == 4
        m = parse(httpx.get(f"{srv.url}/metrics", timeout=10).text)
        key = ("vllm:generation_tokens_total", (("engine", "0"), ("model_name", "qwen2.5-7b")))
        assert m.samples[key] == 4
        c.close()
    finally:
        srv.stop()

    r = subprocess.run(
        sim_serve_command("--port", "0", "--hardware", "no-such-gpu", "--model", "qwen2.5-7b"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "no-such-gpu" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


# -- render_metrics on its own ------------------------------------------------------------


def _run_core() -> EngineCore:
    """A core driven by hand: two requests with the same 64-token prompt one after the other,
    a third aborted mid-way."""
    core = EngineCore(EngineConfig(num_blocks=64, block_size=16))
    now = 0.0

    def run_until_idle() -> None:
        nonlocal now
        while (batch := core.schedule()) is not None:
            now += 0.03
            core.apply(batch, now)

    prompt = list(range(1000, 1064))
    core.add(Seq("a", prompt, 5, arrival=now))
    run_until_idle()
    core.add(Seq("b", prompt, 3, arrival=now))
    run_until_idle()
    c = Seq("c", list(range(64)), 50, arrival=now)
    core.add(c)
    for _ in range(4):
        batch = core.schedule()
        assert batch is not None
        now += 0.03
        core.apply(batch, now)
    core.abort(c)
    return core


def test_render_metrics_parses_and_matches_the_core() -> None:
    core = _run_core()
    assert core.prefix_hits > 0 and core.aborted == 1 and core.completed == 2
    text = render_metrics(core, 'odd "name"\\', finish_reasons={"stop": 1, "length": 1}).decode()
    assert text.endswith("\n")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    label = {"engine": "0", "model_name": 'odd "name"\\'}

    def value(name: str, **extra: str) -> float:
        for family in families.values():
            for s in family.samples:
                if s.name == name and s.labels == {**label, **extra}:
                    return s.value
        raise KeyError(name)

    assert value("vllm:num_requests_running") == 0
    assert value("vllm:num_requests_waiting") == 0
    assert value("vllm:kv_cache_usage_perc") == core.pool.usage()
    assert value("vllm:prefix_cache_queries_total") == core.prefix_queries
    assert value("vllm:prefix_cache_hits_total") == core.prefix_hits
    assert value("vllm:num_preemptions_total") == core.preemptions
    assert value("vllm:prompt_tokens_total") == core.prompt_tokens
    assert value("vllm:generation_tokens_total") == core.generated_tokens
    assert value("vllm:request_success_total", finished_reason="stop") == 1
    assert value("vllm:request_success_total", finished_reason="length") == 1
    assert value("vllm:request_success_total", finished_reason="abort") == 1
    for name, bounds in HISTOGRAMS.items():
        hist = {
            "vllm:time_to_first_token_seconds": core.ttft,
            "vllm:inter_token_latency_seconds": core.itl,
        }.get(name, core.e2e)
        buckets = [(s.labels["le"], s.value) for s in families[name].samples if s.name == f"{name}_bucket"]
        assert [le for le, _ in buckets] == [repr(float(b)) for b in bounds] + ["+Inf"]
        counts = [v for _, v in buckets]
        assert counts == sorted(counts)  # cumulative
        assert counts[-1] == value(f"{name}_count") == hist.count > 0
        assert value(f"{name}_sum") == pytest.approx(hist.total)
    assert core.ttft.count == 3  # the aborted request had its first token
    assert core.e2e.count == 2
    # Each family is announced once, before its samples; no _created series unless asked.
    types = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert len(types) == len(set(types)) == 3 + 6 + 3
    assert "_created" not in text


def test_render_metrics_writes_what_prometheus_client_writes() -> None:
    """Byte for byte, the text prometheus_client (as used by vLLM) writes for the same
    metrics with the same values, ``_created`` series aside."""
    core = EngineCore(EngineConfig(num_blocks=100))
    core.prefix_queries, core.prefix_hits, core.preemptions = 1234, 512, 3
    core.prompt_tokens, core.generated_tokens = 4321, 98765
    core.completed, core.aborted = 7, 2
    ttft = [0.0123, 0.3, 3.3, 0.0007, 150.0, 9000.0]
    itl = [0.012, 0.033, 0.2222, 0.06, 0.06]
    e2e = [0.4, 1.7, 12.0, 100.0]
    for hist, values in ((core.ttft, ttft), (core.itl, itl), (core.e2e, e2e)):
        for v in values:
            hist.add(v)

    registry = prometheus_client.CollectorRegistry()
    labels = ["model_name", "engine"]

    def gauge(name: str, doc: str, v: float) -> None:
        prometheus_client.Gauge(name, doc, labels, registry=registry).labels("m", "0").set(v)

    def counter(name: str, doc: str, v: float) -> None:
        prometheus_client.Counter(name, doc, labels, registry=registry).labels("m", "0").inc(v)

    def histogram(name: str, doc: str, bounds: tuple[float, ...], values: list[float]) -> None:
        h = prometheus_client.Histogram(name, doc, labels, buckets=bounds, registry=registry)
        for v in values:
            h.labels("m", "0").observe(v)

    prometheus_client.disable_created_metrics()
    try:
        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", 0)
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", 0)
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", 0)
        counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", 1234
        )
        counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", 512)
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", 3)
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", 4321)
        counter("vllm:generation_tokens", "Number of generation tokens processed.", 98765)
        success = prometheus_client.Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=registry,
        )
        for reason, n in (("stop", 5), ("length", 2), ("abort", 2)):
            success.labels("m", "0", reason).inc(n)
        histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
            ttft,
        )
        histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
            itl,
        )
        histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            E2E_BUCKETS,
            e2e,
        )
        expected = prometheus_client.generate_latest(registry).decode()
    finally:
        prometheus_client.enable_created_metrics()
    ours = render_metrics(core, "m", finish_reasons={"stop": 5, "length": 2}).decode()
    assert ours == expected


def test_render_metrics_created_series() -> None:
    core = _run_core()
    text = render_metrics(core, "m", created=1_776_930_173.6864555).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in [*COUNTERS, *HISTOGRAMS]:
        created = families[f"{name}_created"]
        assert created.type == "gauge"
        assert {s.value for s in created.samples} == {1_776_930_173.6864555}
    assert 'vllm:num_preemptions_created{engine="0",model_name="m"} 1.7769301736864555e+09' in text
    assert len(families["vllm:request_success_created"].samples) == 3
    # Without a tally every request the engine completed counts as a natural stop.
    stop = [s for s in families["vllm:request_success"].samples if s.labels["finished_reason"] == "stop"]
    assert stop[0].value == core.completed
