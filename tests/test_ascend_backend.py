"""The ``ascend`` backend, on a machine without NPUs, MindIE or torch_npu.

What stands in for what, and which published document each follows:

- **MindIE Service** is ``tests/fake_mindie.py``, a fake built from MindIE's published API
  reference (hiascend.com MindIE LLM / Service developer guides: "EndPoint RESTful接口使用说明",
  "ServerConfig参数说明", "健康探针接口", "健康检查", "服务管控指标查询接口(普罗格式)"; MindIE 1.0.0,
  2.x and 3.x) and, where the documents are silent (error bodies, stream framing, mid-stream
  failures, ``/v1/models`` and ``/v1/config`` fields), from MindIE-LLM's open source
  (github.com/Ascend/MindIE-LLM, ``src/server/endpoint``). Its module docstring names each
  file it follows.
- **MindIE's metrics page**: ``tests/data/mindie_metrics_docs_example.txt`` is the response
  example of MindIE Motor's published "管控指标查询接口" page, transcribed verbatim (the page
  says the series are MindIE Server's, summed by the coordinator; MindIE Server's own
  "服务管控指标查询接口(普罗格式)" page shows the same series for ``llama3-70b``): an idle
  engine, 0 running, 0 waiting, a full KV cache;
  ``tests/data/mindie_metrics_source_busy.txt`` is a busy page written by hand in the shape
  MindIE-LLM's ``prometheus_metrics.cpp`` registers (its HELP texts, family order,
  histogram buckets, and ``model_name`` joining two models with " & "). Neither was
  scraped from a running MindIE.
- **vllm-ascend** speaks vLLM's API and metrics (it is a vLLM platform plugin, see
  docs.vllm.ai/projects/ascend), so its mode is tested against ``shuniu sim serve`` (vLLM's
  API and metric names) and ``tests.test_openai_backend.ScriptedUpstream`` (records the
  bodies), as the ``vllm`` backend is.
- **npu-smi** is a script on ``PATH`` printing the ``npu-smi info`` outputs recorded in
  ``tests/data/npu_smi_info_*.txt`` (see ``tests/test_hardware.py`` for their sources);
  ``ASCEND_RT_VISIBLE_DEVICES`` follows CANN's environment-variable reference.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from pydantic import ValidationError

from shuniu.backends.ascend import npu
from shuniu.backends.ascend.backend import AscendVllmBackend, MindieBackend, mindie_error_message
from shuniu.backends.ascend.metrics import MetricsError, parse_mindie_metrics
from shuniu.backends.ascend.mindie_launch import render_config
from shuniu.backends.ascend.options import AscendOptions
from shuniu.backends.http import ProbeError
from shuniu.backends.vllm.backend import VllmBackend, tenant_salt
from shuniu.core.config.loader import load_deployment
from shuniu.core.contracts import EndpointSpec
from shuniu.core.errors import GatewayError
from shuniu.core.gateway import Gateway
from shuniu.core.plugin_manager import PluginManager, load_plugins
from shuniu.core.pools.launcher import base_url_template, engine_url
from shuniu.core.types import EndpointLoad, Health, InferenceRequest, Principal
from shuniu.hardware.types import MIB
from tests.conftest import GatewayProcess, start_process, wait_until
from tests.fake_mindie import FakeMindie, FakeMindieConfig
from tests.test_openai_backend import ScriptedUpstream

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"
MINDIE_PAGES = sorted(DATA.glob("mindie_metrics_*.txt"))
SECRET = "0123456789abcdef-test-secret"
MODEL = "qwen2.5-7b"


# -- options ----------------------------------------------------------------------------------


def test_options_defaults_and_engine_rules() -> None:
    vllm = AscendOptions(base_url="http://10.0.0.7:8000/v1")
    assert (vllm.engine, vllm.base_url, vllm.engine_health_path()) == (
        "vllm-ascend",
        "http://10.0.0.7:8000",
        "/health",
    )
    mindie = AscendOptions(engine="mindie", base_url="http://10.0.0.7:1025")
    assert mindie.engine_health_path() == "/v2/health/live"
    assert mindie.management_root() == mindie.metrics_root() == "http://10.0.0.7:1025"
    split = AscendOptions(
        engine="mindie",
        base_url="http://10.0.0.7:1025",
        management_url="http://10.0.0.8:1026/",
        health_path="/health/timed-5",
    )
    assert (split.management_root(), split.metrics_root()) == ("http://10.0.0.8:1026", "http://10.0.0.8:1026")
    assert split.engine_health_path() == "/health/timed-5"
    with pytest.raises(ValidationError, match="management_url is for engine: mindie"):
        AscendOptions(base_url="http://h", management_url="http://h:1026")
    with pytest.raises(ValidationError, match="forward_priority is not supported"):
        AscendOptions(engine="mindie", base_url="http://h", forward_priority=True)
    with pytest.raises(ValidationError, match="listed twice"):
        AscendOptions(base_url="http://h", devices=[0, 0])
    with pytest.raises(ValidationError, match="0 or more"):
        AscendOptions(base_url="http://h", devices=[-1])
    with pytest.raises(ValidationError, match="must start with /"):
        AscendOptions(base_url="http://h", health_path="health")
    with pytest.raises(ValidationError, match="http"):
        AscendOptions(engine="mindie", base_url="http://h", metrics_url="h:1027")
    with pytest.raises(ValidationError, match="engine"):
        AscendOptions(base_url="http://h", engine="triton")  # type: ignore[arg-type]


def test_every_option_is_documented() -> None:
    doc = (ROOT / "docs" / "backends" / "ascend.md").read_text()
    for name, field in AscendOptions.model_fields.items():
        assert field.description, name
        assert f"`{name}`" in doc, name


def test_ascend_is_registered_and_builds_the_engines_backend() -> None:
    reg = load_plugins().registered("backends")["ascend"]
    assert reg.options is AscendOptions and reg.plugin == "ascend"
    vllm = reg.factory(EndpointSpec("e", "m", AscendOptions(base_url="http://127.0.0.1:9")))
    mindie = reg.factory(
        EndpointSpec("e", "m", AscendOptions(engine="mindie", base_url="http://127.0.0.1:9"))
    )
    assert isinstance(vllm, AscendVllmBackend) and isinstance(vllm, VllmBackend)
    assert isinstance(mindie, MindieBackend) and vllm.kind == mindie.kind == "ascend"


# -- MindIE's metrics page ------------------------------------------------------------------


def _reference(text: str) -> EndpointLoad:
    """The same view through prometheus_client's full parser (independent, slow)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            sums[s.name] = sums.get(s.name, 0.0) + s.value
    return EndpointLoad(
        running=int(sums["num_requests_running"]),
        waiting=int(sums["num_requests_waiting"]),
        kv_usage=sums["npu_cache_usage_perc"],
        generated_tokens=int(sums["generation_tokens_total"]),
    )


@pytest.mark.parametrize("path", MINDIE_PAGES, ids=[p.stem for p in MINDIE_PAGES])
def test_parser_agrees_with_prometheus_client_on_the_pages(path: Path) -> None:
    pytest.importorskip("prometheus_client")
    assert parse_mindie_metrics(path.read_bytes()) == _reference(path.read_text())


def test_parser_on_the_published_example_and_a_busy_page() -> None:
    doc = parse_mindie_metrics((DATA / "mindie_metrics_docs_example.txt").read_bytes())
    assert doc == EndpointLoad(running=0, waiting=0, kv_usage=1.0, generated_tokens=84425)
    busy = parse_mindie_metrics((DATA / "mindie_metrics_source_busy.txt").read_text())
    assert (busy.running, busy.waiting, busy.kv_usage, busy.generated_tokens) == (24, 7, 0.8671875, 1843210)
    # What MindIE does not publish stays unknown rather than zero.
    assert busy.prefix_queries is busy.prefix_hits is busy.aborted is None


def test_parser_edge_cases() -> None:
    # Two label sets (two instances behind one page) are summed; the KV fraction averaged.
    page = (
        'num_requests_running{model_name="a"} 3\nnum_requests_running{model_name="b"} 2\n'
        'num_requests_waiting{model_name="a"} 1\n'
        'npu_cache_usage_perc{model_name="a"} 0.5\nnpu_cache_usage_perc{model_name="b"} 0.25\n'
        "num_requests_running_by_reason 99\n"  # a longer name is not ours
        'vllm:num_requests_waiting{model_name="a"} 50\n'  # nor a vLLM series
        'exposer_request_latencies{quantile="0.5"} Nan\n'  # prometheus-cpp's empty summary
        'npu_cache_usage_perc{model_name="c"} Nan\n'
    )
    load = parse_mindie_metrics(page)
    assert (load.running, load.waiting, load.kv_usage, load.generated_tokens) == (5, 1, 0.375, None)
    # A broken exporter cannot push the KV term out of 0..1.
    assert parse_mindie_metrics("num_requests_running 1\nnpu_cache_usage_perc 30\n").kv_usage == 1.0
    # A vLLM page, or MindIE's JSON metrics, is not mistaken for an idle MindIE.
    with pytest.raises(MetricsError, match="num_requests_running"):
        parse_mindie_metrics((DATA / "vllm_metrics_vllm_0.32.0.txt").read_bytes())
    with pytest.raises(MetricsError):
        parse_mindie_metrics(b'{"resultType": "vector", "result": []}')


def test_error_bodies() -> None:
    assert mindie_error_message(b'{"error":"Model not found","error_type":"Input Validation Error"}') == (
        "Model not found",
        "Input Validation Error",
    )
    assert mindie_error_message(b'{"message":"Service is abnormal"}') == ("Service is abnormal", None)
    assert mindie_error_message(b'{"error":{"message":"m","type":"t"}}') == ("m", "t")
    assert mindie_error_message(b"Engine callback timeout: e2e") == ("Engine callback timeout: e2e", None)
    assert mindie_error_message(b"") == ("", None)


# -- requests -------------------------------------------------------------------------------


def _req(
    body: dict[str, Any] | None = None,
    *,
    api: str = "chat",
    stream: bool = False,
    tenant: str = "acme",
    priority: int = 0,
) -> InferenceRequest:
    if body is None:
        body = (
            {"model": "chat", "messages": [{"role": "user", "content": "hello there"}]}
            if api == "chat"
            else {"model": "chat", "prompt": "hello there"}
        )
    if stream:
        body = {**body, "stream": True}
    return InferenceRequest(
        id="r1",
        api=api,  # type: ignore[arg-type]
        model="chat",
        body=body,
        prompt="hello there",
        prompt_tokens=2,
        stream=stream,
        priority=priority,
        principal=Principal(tenant=tenant),
    )


def _spec(options: AscendOptions, *, pool: str = "chat", **kwargs: Any) -> EndpointSpec:
    return EndpointSpec(name="npu-0", model=pool, options=options, **kwargs)


# -- engine: vllm-ascend ----------------------------------------------------------------------


async def test_vllm_ascend_is_the_vllm_adapter_on_the_wire() -> None:
    """The same body as the ``vllm`` backend sends: served model from /v1/models, the
    tier's priority, the tenant's salt, usage requested."""
    up = ScriptedUpstream().start()
    try:
        opts = AscendOptions(
            base_url=f"http://127.0.0.1:{up.port}/v1", forward_priority=True, cache_salt_secret=SECRET
        )
        b = AscendVllmBackend(_spec(opts))
        await b.start()
        try:
            assert (b.served_model, b.max_model_len) == ("up-model", 4096)
            body = {"model": "chat", "messages": [{"role": "user", "content": "hello"}], "cache_salt": "mine"}
            chunks = [c async for c in b.stream(_req(body, stream=True, tenant="acme", priority=3))]
            assert "".join(c.text for c in chunks) == "w0 w1 w2 " and chunks[-1].usage is not None
            assert (await b.complete(_req(body, tenant="other", priority=1))).text == "fine"
        finally:
            await b.stop()
    finally:
        up.stop()
    streamed, whole = up.bodies
    assert streamed["model"] == whole["model"] == "up-model"
    assert (streamed["priority"], whole["priority"]) == (3, 1)
    assert streamed["cache_salt"] == tenant_salt(SECRET.encode(), "acme")
    assert streamed["stream_options"] == {"include_usage": True}


@pytest.fixture(scope="module")
def sim() -> Iterator[GatewayProcess]:
    """``shuniu sim serve``: a server with vLLM's API and metric names, as vllm-ascend has."""
    cmd = [sys.executable, "-m", "shuniu.core", "sim", "serve", "--port", "0", "--served-model-name", MODEL]
    proc = start_process([*cmd, "--ttft-ms", "0", "--max-model-len", "4096"], timeout=60)
    yield proc
    proc.stop()


async def test_vllm_ascend_health_and_load_from_vllms_endpoints(sim: GatewayProcess) -> None:
    b = AscendVllmBackend(_spec(AscendOptions(base_url=sim.url)))
    await b.start()
    try:
        assert (b.served_model, b.max_model_len) == (MODEL, 4096)
        assert (await b.health()).ok
        await b.complete(_req({"model": "chat", "prompt": "hello world", "max_tokens": 3}, api="completions"))
        load = await b.load()  # vllm:* names, parsed by the vllm backend's parser
        assert load.kv_usage is not None and (load.generated_tokens or 0) >= 3
    finally:
        await b.stop()


# -- engine: mindie ---------------------------------------------------------------------------


@pytest.fixture
def mindie() -> Iterator[FakeMindie]:
    with FakeMindie(FakeMindieConfig(model_name=MODEL, max_seq_len=8192)) as fake:
        yield fake


@pytest.fixture
def split_mindie() -> Iterator[FakeMindie]:
    """MindIE's default layout: business, management and metrics planes on three ports."""
    config = FakeMindieConfig(model_name=MODEL, management_port=0, metrics_port=0, max_batch_size=2)
    with FakeMindie(config) as fake:
        yield fake


def _mindie_backend(fake: FakeMindie, **options: Any) -> MindieBackend:
    if fake.management_url != fake.url:
        options.setdefault("management_url", fake.management_url)
        options.setdefault("metrics_url", fake.metrics_url)
    return MindieBackend(_spec(AscendOptions(engine="mindie", base_url=fake.url, **options)))


async def test_mindie_start_reads_the_served_model_and_its_context_window(mindie: FakeMindie) -> None:
    b = _mindie_backend(mindie)
    await b.start()
    try:
        # The name from /v1/models; maxSeqLen from /v1/config (MindIE's /v1/models has no
        # max_model_len).
        assert (b.served_model, b.max_model_len, b.model_problem) == (MODEL, 8192, None)
        assert await b.health() == Health(True, "HTTP 200")
    finally:
        await b.stop()
    # A configured window wins, and /v1/config is not needed then.
    configured = MindieBackend(_spec(AscendOptions(engine="mindie", base_url=mindie.url), max_model_len=1024))
    await configured.start()
    try:
        assert configured.max_model_len == 1024
    finally:
        await configured.stop()


async def test_mindie_chat_and_completions_whole_and_streamed(mindie: FakeMindie) -> None:
    b = _mindie_backend(mindie, cache_salt_secret=SECRET)
    await b.start()
    try:
        whole = await b.complete(_req())
        assert whole.text == "w0 w1 w2 w3 w4 w5 w6 w7 " and whole.finish_reason == "stop"
        assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (2, 8)
        assert whole.extra is None  # MindIE's empty tool_calls list is not passed on
        body = {
            "model": "chat",
            "messages": [{"role": "user", "content": "a b c"}],
            "max_completion_tokens": 3,
        }
        chunks = [c async for c in b.stream(_req(body, stream=True, priority=2))]
        assert [c.text for c in chunks] == ["w0 ", "w1 ", "w2 "]  # the empty first delta is skipped
        # MindIE puts usage in the last content chunk, with the finish reason.
        assert chunks[-1].finish_reason == "length" and chunks[-1].usage is not None
        assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (3, 3)
        text = await b.complete(_req(api="completions"))
        assert text.text.startswith("w0 ") and text.usage.completion_tokens == 8
        streamed = [
            c
            async for c in b.stream(
                _req({"model": "chat", "prompt": "x", "max_tokens": 2}, api="completions", stream=True)
            )
        ]
        assert "".join(c.text for c in streamed) == "w0 w1 " and streamed[-1].finish_reason == "length"
    finally:
        await b.stop()
    sent = mindie.bodies[1]
    # The served name; max_tokens for max_completion_tokens; no priority, no cache_salt.
    assert sent["model"] == MODEL and sent["max_tokens"] == 3 and "max_completion_tokens" not in sent
    assert "priority" not in sent and "cache_salt" not in sent
    assert all(b["model"] == MODEL for b in mindie.bodies)


async def test_mindie_errors_are_mapped(mindie: FakeMindie) -> None:
    b = _mindie_backend(mindie)
    await b.start()
    try:
        # MindIE's own validation: 422 "Input Validation Error" reaches the client as a 400.
        with pytest.raises(GatewayError) as info:
            await b.complete(_req({"model": "chat", "messages": [], "max_tokens": 0}))
        assert info.value.status == 400 and "max_tokens must be" in info.value.message
        assert info.value.code == "input_validation_error"
        # A prompt MindIE refuses to enqueue: 424 "Generation Error", also the client's.
        with pytest.raises(GatewayError) as info:
            await b.complete(_req({"model": "chat", "prompt": "w " * 9000}, api="completions"))
        assert info.value.status == 400 and "exceeds maxSeqLen" in info.value.message
        # Engine failures are the endpoint's: 500 -> 502, 503 -> 503, with MindIE's words.
        mindie.error_status = 500
        with pytest.raises(GatewayError) as info:
            await b.complete(_req())
        assert info.value.status == 502 and "Failed to enqueue inferRequest" in info.value.message
        mindie.error_status = 503
        with pytest.raises(GatewayError) as info:
            async for _ in b.stream(_req(stream=True)):
                pass
        assert info.value.status == 503 and info.value.code == "upstream_error"
    finally:
        await b.stop()


async def test_mindie_failures_after_the_first_byte(mindie: FakeMindie) -> None:
    b = _mindie_backend(mindie)
    await b.start()
    try:
        # MindIE writes its failure raw into the stream and ends it cleanly, without [DONE].
        mindie.stream_error_after = 2
        got: list[str] = []
        with pytest.raises(GatewayError) as info:
            async for chunk in b.stream(_req(stream=True)):
                got.append(chunk.text)
        assert got == ["w0 ", "w1 "]
        assert info.value.status == 502
        assert "ended the stream without finishing: Failed to get engine response" in info.value.message
        mindie.stream_error_text = "Engine callback timeout: the token timed out"
        with pytest.raises(GatewayError, match="Engine callback timeout"):
            async for _ in b.stream(_req(stream=True)):
                pass
        # The connection cut mid-body.
        mindie.stream_error_after = None
        mindie.drop_stream_after = 1
        with pytest.raises(GatewayError, match="broke off the stream"):
            async for _ in b.stream(_req(stream=True)):
                pass
        mindie.drop_stream_after = None
        assert len([c async for c in b.stream(_req(stream=True))]) == 8  # and it recovers
    finally:
        await b.stop()


async def test_mindie_health(split_mindie: FakeMindie) -> None:
    fake = split_mindie
    b = _mindie_backend(fake)
    await b.start()
    try:
        assert (await b.health()).ok  # /v2/health/live on the management port
        fake.health = "busy"
        assert (await b.health()).ok  # busy is a load signal, not a failure
        fake.health = "starting"
        assert await b.health() == Health(False, "HTTP 503")
        fake.health = "abnormal"
        health = await b.health()
        assert not health.ok and health.detail == 'HTTP 500: {"message":"Service is abnormal"}'
        fake.health = "ok"
        # The readiness probe can be chosen instead; it fails while busy.
        ready = _mindie_backend(fake, health_path="/v2/health/ready")
        await ready.start()
        try:
            assert (await ready.health()).ok
            fake.health = "busy"
            assert not (await ready.health()).ok
        finally:
            await ready.stop()
        # The business port has no health routes: pointing there is a visible failure.
        wrong = MindieBackend(_spec(AscendOptions(engine="mindie", base_url=fake.url)))
        await wrong.start()
        try:
            assert (await wrong.health()).detail.startswith("HTTP 404")
        finally:
            await wrong.stop()
    finally:
        await b.stop()


async def test_mindie_load_follows_what_is_in_flight(split_mindie: FakeMindie) -> None:
    """maxBatchSize 2: of three slow requests two run and one waits, as /metrics (on its
    own port) says; the KV usage grows with them and everything drains."""
    fake = split_mindie
    fake.config.token_s = 0.05
    b = _mindie_backend(fake)
    await b.start()
    try:
        assert await b.load() == EndpointLoad(running=0, waiting=0, kv_usage=0.0, generated_tokens=0)

        async def one() -> None:
            async for _ in b.stream(
                _req(
                    {"model": "c", "prompt": "p", "max_tokens": 30, "ignore_eos": True},
                    api="completions",
                    stream=True,
                )
            ):
                pass

        tasks = [asyncio.create_task(one()) for _ in range(3)]
        deadline = asyncio.get_running_loop().time() + 10
        load = await b.load()
        while (load.running, load.waiting) != (2, 1):
            assert asyncio.get_running_loop().time() < deadline, load
            await asyncio.sleep(0.02)
            load = await b.load()
        assert load.kv_usage is not None and load.kv_usage > 0
        await asyncio.gather(*tasks)
        done = await b.load()
        assert (done.running, done.waiting, done.kv_usage, done.generated_tokens) == (0, 0, 0.0, 90)
        # Closing a stream early stops the request in the engine.
        fake.config.token_s = 0.02
        gen = b.stream(_req(stream=True))
        await gen.__anext__()
        await gen.aclose()  # type: ignore[attr-defined]
        deadline = asyncio.get_running_loop().time() + 10
        while fake.aborted != 1 or (await b.load()).running != 0:  # the engine's own view
            assert asyncio.get_running_loop().time() < deadline, fake.aborted
            await asyncio.sleep(0.01)
        # Without MIES_SERVICE_MONITOR_MODE=1 MindIE answers 500, and says why.
        fake.config.monitor_mode = False
        with pytest.raises(
            ProbeError, match="HTTP 500: Environment variable MIES_SERVICE_MONITOR_MODE is not set"
        ):
            await b.load()
    finally:
        await b.stop()


async def test_mindie_that_is_down_or_serves_another_model() -> None:
    b = MindieBackend(_spec(AscendOptions(engine="mindie", base_url="http://127.0.0.1:9")))
    await b.start()  # a server that is not up is not an error at start
    try:
        assert not (await b.health()).ok
        with pytest.raises(GatewayError) as info:
            await b.complete(_req())
        assert info.value.status == 502
    finally:
        await b.stop()
    with FakeMindie(FakeMindieConfig(model_name=MODEL, lora_names=["sql-lora"])) as fake:
        # Two models with different roots and neither is the pool's: options.model decides.
        unsure = _mindie_backend(fake)
        await unsure.start()
        try:
            health = await unsure.health()
            assert not health.ok and "set options.model" in health.detail
        finally:
            await unsure.stop()
        lora = _mindie_backend(fake, model="sql-lora")
        await lora.start()
        try:
            assert (await lora.health()).ok and (await lora.complete(_req())).text
        finally:
            await lora.stop()
        assert fake.bodies[-1]["model"] == "sql-lora"


# -- NPU readings -------------------------------------------------------------------------------


@pytest.fixture
def npu_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``npu-smi`` on PATH printing the recorded 910B table; every run appends to ``runs``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    runs = tmp_path / "runs"
    script = bindir / "npu-smi"
    table = DATA / "npu_smi_info_910b.txt"
    script.write_text(
        f'#!/bin/sh\n[ "$1" = info ] || exit 64\necho run >> \'{runs}\'\ncat "${{NPU_SMI_TABLE:-{table}}}"\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # never used by the backend anyway
    npu.clear_npu_cache()
    yield runs
    npu.clear_npu_cache()


def _runs(log: Path) -> int:
    """How many times the fake npu-smi ran."""
    return log.read_text().count("run") if log.exists() else 0


def _launched(env: dict[str, str] | None = None) -> dict[str, Any]:
    launch: dict[str, Any] = {"host": "127.0.0.1", "port": 8100}
    if env is not None:
        launch["env"] = env
    return {"launch": launch}


async def test_devices_are_the_endpoints_npus(npu_smi: Path) -> None:
    opts = AscendOptions(engine="mindie", base_url="http://127.0.0.1:9", devices=[6, 2])
    b = MindieBackend(_spec(opts))
    readings = await b.devices()
    # In the engine's order, numbered as the engine sees them (npu:0 is logical device 6).
    assert [(d.index, d.visible_index) for d in readings] == [(6, 0), (2, 1)]
    first = readings[0]
    assert first.kind == "ascend" and first.name == "910B1" and first.bus_id == "0000:82:00.0"
    assert first.memory_used_bytes == 3377 * MIB and first.memory_total_bytes == 65536 * MIB
    assert first.temperature_c == 30.0 and first.power_w == pytest.approx(91.5) and first.utilization == 0.0
    assert first.extra["health"] == "OK" and first.extra["memory_kind"] == "hbm"
    report = await b.device_report()
    assert report.available and report.source == "npu-smi" and report.info["endpoint"] == "npu-0"
    assert report.info["devices_from"] == "options.devices" and report.info["device_ids"] == [6, 2]


async def test_devices_from_the_launch_environment(npu_smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def backend(extra: dict[str, Any], **options: Any) -> AscendVllmBackend:
        return AscendVllmBackend(_spec(AscendOptions(base_url="http://127.0.0.1:9", **options), extra=extra))

    assert [
        (d.index, d.visible_index)
        for d in await backend(_launched({"ASCEND_RT_VISIBLE_DEVICES": "4,5"})).devices()
    ] == [
        (4, 0),
        (5, 1),
    ]
    # CANN's rules: a space ends the list ("1, 2,3" is device 1), an id past the last
    # device (8 on an 8-device machine) too, each with a warning.
    spaced = await backend(_launched({"ASCEND_RT_VISIBLE_DEVICES": "1, 2,3"})).device_report()
    assert [d.index for d in spaced.devices] == [1] and "only digits and commas" in spaced.warnings[0]
    past = await backend(_launched({"ASCEND_RT_VISIBLE_DEVICES": "3,8"})).device_report()
    assert [d.index for d in past.devices] == [3] and "'8' is invalid" in past.warnings[0]
    # Launched without the variable: the engine sees every NPU.
    assert len(await backend(_launched({"OTHER": "1"})).devices()) == 8
    # ... unless the gateway itself has one, which the engine then inherits; the gateway's
    # variable does not hide NPUs from the probe otherwise.
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "7")
    assert [d.index for d in await backend(_launched()).devices()] == [7]
    assert [d.index for d in await backend(_launched(), devices=[0, 1]).devices()] == [0, 1]
    # options.devices wins over the launch environment.
    chosen = backend(_launched({"ASCEND_RT_VISIBLE_DEVICES": "4,5"}), devices=[3])
    assert [d.index for d in await chosen.devices()] == [3]


async def test_devices_of_remote_endpoints_and_machines_without_npus(
    npu_smi: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    remote = AscendVllmBackend(_spec(AscendOptions(base_url="http://10.0.0.7:8000")))
    assert await remote.devices() == []
    report = await remote.device_report()
    assert not report.available and "remote engine" in (report.reason or "")
    assert _runs(npu_smi) == 0  # nothing was run for it
    # A device the machine does not have is reported, not invented.
    missing = await AscendVllmBackend(
        _spec(AscendOptions(base_url="http://127.0.0.1:9", devices=[7, 12]))
    ).device_report()
    assert [d.index for d in missing.devices] == [7] and "[12]" in missing.warnings[-1]
    # No npu-smi on PATH (no driver): no readings, and the probe's reason.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    npu.clear_npu_cache()
    b = AscendVllmBackend(_spec(AscendOptions(base_url="http://127.0.0.1:9", devices=[0])))
    assert await b.devices() == []
    assert "npu-smi is not on PATH" in ((await b.device_report()).reason or "")


async def test_one_npu_smi_run_serves_every_endpoint(npu_smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backends = [
        MindieBackend(_spec(AscendOptions(engine="mindie", base_url="http://127.0.0.1:9", devices=[i])))
        for i in range(4)
    ]
    readings = await asyncio.gather(*(b.devices() for b in backends))
    assert [r[0].index for r in readings] == [0, 1, 2, 3]
    await asyncio.gather(*(b.devices() for b in backends))
    assert _runs(npu_smi) == 1  # concurrent callers shared one run, then the cache
    fresh = AscendVllmBackend(
        _spec(AscendOptions(base_url="http://127.0.0.1:9", devices=[0], device_max_age_s=0))
    )
    await fresh.devices()
    assert _runs(npu_smi) == 2
    # An Atlas A3 card: two dies, each its own logical device.
    monkeypatch.setenv("NPU_SMI_TABLE", str(DATA / "npu_smi_info_a3.txt"))
    dies = await AscendVllmBackend(
        _spec(AscendOptions(base_url="http://127.0.0.1:9", devices=[1, 0], device_max_age_s=0))
    ).devices()
    assert [(d.index, d.extra["phy_id"], d.visible_index) for d in dies] == [(1, 1, 0), (0, 0, 1)]


# -- managed launch ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plugins() -> PluginManager:
    return load_plugins()


def test_launch_entries_validate_and_derive_the_base_url(plugins: PluginManager) -> None:
    text = """
models:
  qwen:
    endpoints:
      - kind: ascend
        name: va
        replicas: 2
        launch:
          command: [python, -m, vllm.entrypoints.openai.api_server, --model, /models/qwen2.5-7b,
                    --served-model-name, "{model}", --port, "{port}"]
          env: {ASCEND_RT_VISIBLE_DEVICES: "{replica}"}
          port: 8100
      - kind: ascend
        name: mi
        launch:
          command: [python, -m, shuniu.backends.ascend.mindie_launch, --config, /etc/mindie/config.json,
                    --host, "{host}", --port, "{port}", --http, "--", mindieservice_daemon]
          env: {ASCEND_RT_VISIBLE_DEVICES: "2,3", MIES_SERVICE_MONITOR_MODE: "1"}
          port: 1025
        options: {engine: mindie}
"""
    resolved = load_deployment("x.yaml", plugins, text=text, env={})
    assert engine_url(base_url_template(AscendOptions), "0.0.0.0", 8100) == "http://127.0.0.1:8100"
    gw = Gateway(resolved, plugins)
    eps = {e.name: e.backend for e in gw.pools["qwen"].endpoints}
    assert [eps[f"va-{i}"].vllm_options.base_url for i in (0, 1)] == [
        "http://127.0.0.1:8100",
        "http://127.0.0.1:8101",
    ]
    assert isinstance(eps["va-0"], AscendVllmBackend) and isinstance(eps["mi"], MindieBackend)
    assert gw.engines["va-1"].plan.env == {"ASCEND_RT_VISIBLE_DEVICES": "1"}
    assert gw.engines["va-1"].plan.argv[-2:] == ["--port", "8101"]
    mi = eps["mi"]
    assert mi.vllm_options.base_url == "http://127.0.0.1:1025"
    assert (mi._health_url, mi._metrics_url) == (
        "http://127.0.0.1:1025/v2/health/live",
        "http://127.0.0.1:1025/metrics",
    )
    # A launched engine's NPUs are read on this machine: from launch.env when the gateway
    # passes it on, else (the engine inheriting the gateway's environment) every NPU.
    assert mi.device_selection.local and mi.device_selection.visible_env in ("2,3", None)


def test_the_mindie_config_helper(tmp_path: Path) -> None:
    base = {
        "ServerConfig": {
            "ipAddress": "127.0.0.1",
            "managementIpAddress": "127.0.0.2",
            "port": 1025,
            "managementPort": 1026,
            "metricsPort": 1027,
            "httpsEnabled": True,
        },
        "BackendConfig": {
            "npuDeviceIds": [[0, 1]],
            "ModelDeployConfig": {"ModelConfig": [{"modelName": "x"}]},
        },
    }
    config = render_config(base, host="0.0.0.0", port=8123, http=True, model_name="qwen")
    server = config["ServerConfig"]
    assert (server["ipAddress"], server["managementIpAddress"]) == ("0.0.0.0", "0.0.0.0")
    assert server["port"] == server["managementPort"] == server["metricsPort"] == 8123
    assert server["allowAllZeroIpListening"] is True and server["httpsEnabled"] is False
    assert config["BackendConfig"]["ModelDeployConfig"]["ModelConfig"][0]["modelName"] == "qwen"
    assert config["BackendConfig"]["npuDeviceIds"] == [[0, 1]] and base["ServerConfig"]["port"] == 1025
    # The helper writes the file owner-only and execs the daemon with MIES_CONFIG_JSON_PATH.
    (tmp_path / "base.json").write_text(json.dumps(base))
    show = "import json,os,stat,sys; p=os.environ['MIES_CONFIG_JSON_PATH']; "
    show += "print(oct(stat.S_IMODE(os.stat(p).st_mode)), "
    show += "json.load(open(p))['ServerConfig']['port'], sys.argv[1:])"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "shuniu.backends.ascend.mindie_launch",
            "--config",
            str(tmp_path / "base.json"),
            "--port",
            "8124",
            "--out",
            str(tmp_path / "run" / "c.json"),
            "--",
            sys.executable,
            "-c",
            show,
            "a",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == ["0o640", "8124", "['a']"]


def test_a_gateway_launches_mindie_and_serves_the_openai_sdk(gateway_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """End to end: ``shuniu serve`` launches the fake MindIE the way it launches MindIE
    (the config helper setting the port in config.json, then the daemon), keeps it out of
    balancing until its health probe passes, and serves the official ``openai`` SDK."""
    base = {
        "ServerConfig": {
            "ipAddress": "127.0.0.1",
            "port": 1025,
            "managementPort": 1026,
            "metricsPort": 1027,
            "httpsEnabled": True,
        },
        "BackendConfig": {
            "ModelDeployConfig": {"maxSeqLen": 4096, "ModelConfig": [{"modelName": "placeholder"}]},
            "ScheduleConfig": {"maxBatchSize": 8, "maxIterTimes": 64},
        },
    }
    (tmp_path / "mindie.json").write_text(json.dumps(base))
    fake = ROOT / "tests" / "fake_mindie.py"
    gw = gateway_factory(
        f"""
        models:
          qwen:
            health: {{interval_s: 0.1}}
            load: {{interval_s: 0.1}}
            endpoints:
              - kind: ascend
                name: mindie
                labels: {{accelerator: ascend}}
                launch:
                  command: ["{sys.executable}", -m, shuniu.backends.ascend.mindie_launch,
                            --config, "{tmp_path / "mindie.json"}", --port, "{{port}}", --http,
                            --model-name, "{{model}}", "--", "{sys.executable}", "{fake}", --token-ms, "1"]
                  env: {{ASCEND_RT_VISIBLE_DEVICES: "0,1", MIES_SERVICE_MONITOR_MODE: "1"}}
                  ready_timeout_s: 60
                  log_dir: null
                options: {{engine: mindie}}
        """
    )

    def ready() -> dict[str, Any] | None:
        body = httpx.get(f"{gw.url}/ready", timeout=10).json()
        (ep,) = body["models"]["qwen"]["endpoints"]
        return ep if ep["healthy"] and ep["load"] is not None else None

    ep = wait_until(ready, timeout=60)
    assert ep["kind"] == "ascend" and ep["launch"]["state"] == "ready"
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=60)
    try:
        # The context window came from MindIE's /v1/config.
        assert [m.model_extra["max_model_len"] for m in client.models.list().data] == [4096]  # type: ignore[index]
        whole = client.chat.completions.create(
            model="qwen", messages=[{"role": "user", "content": "hello there"}], max_completion_tokens=5
        )
        assert whole.choices[0].message.content == "w0 w1 w2 w3 w4 " and whole.usage is not None
        assert whole.usage.completion_tokens == 5 and whole.choices[0].finish_reason == "length"
        stream = client.chat.completions.create(
            model="qwen",
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "w0 w1 w2 w3 "
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
        text = client.completions.create(model="qwen", prompt="once upon", max_tokens=3)
        assert text.choices[0].text == "w0 w1 w2 "
        # A check only MindIE makes (422 there), as an OpenAI-style 400.
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model="qwen",
                messages=[{"role": "user", "content": "x"}],
                extra_body={"repetition_penalty": 3.5},
            )
        assert "'repetition_penalty' must be in (0.0, 2], got 3.5" in info.value.message
    finally:
        client.close()
    # The load view is MindIE's /metrics, read on the one port the helper configured.
    load = wait_until(lambda: (e := ready()) and (e["load"]["generated_tokens"] or 0) >= 12 and e["load"])
    assert load["running"] == 0 and load["waiting"] == 0 and load["kv_usage"] == 0.0
