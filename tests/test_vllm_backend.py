"""The ``vllm`` backend: the ``/metrics`` parser on recorded pages, its options, the body it
forwards (served model, ``priority``, ``cache_salt``), and the backend against real
``shuniu sim serve`` subprocesses (a vLLM-compatible server with vLLM's metric names), alone
and behind a real gateway driven by the ``openai`` SDK.

The run against a real vLLM server is ``tests/test_vllm_real.py`` (opt-in).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest
from pydantic import ValidationError

from shuniu.backends.http import ProbeError
from shuniu.backends.vllm.backend import VllmBackend, choose_model, tenant_salt
from shuniu.backends.vllm.metrics import MetricsError, parse_vllm_metrics
from shuniu.backends.vllm.options import VllmOptions
from shuniu.core.contracts import EndpointSpec
from shuniu.core.errors import GatewayError
from shuniu.core.types import EndpointLoad, Health, InferenceRequest, Principal
from tests.conftest import GatewayProcess, start_process, wait_until
from tests.ports import quiet_ports
from tests.test_openai_backend import ScriptedUpstream

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.glob("vllm_metrics_*.txt"))
SERVED = "sim-test"
SECRET = "0123456789abcdef-test-secret"
# Words the simulator tokenizes one token each, roughly: 400 of them fill many 16-token blocks.
LONG_PROMPT = " ".join(["hello world model server request response token stream"] * 50)


# -- the metrics parser -------------------------------------------------------------------


def _reference(text: str) -> EndpointLoad:
    """The same view through prometheus_client's full parser (slow, but independent)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    aborted = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vllm:request_success_total":
                if s.labels.get("finished_reason") == "abort":
                    aborted = (aborted or 0) + int(s.value)
                continue
            sums[s.name] = sums.get(s.name, 0.0) + s.value
            counts[s.name] = counts.get(s.name, 0) + 1

    def count(name: str) -> int | None:
        return int(sums[name]) if name in sums else None

    kv = "vllm:kv_cache_usage_perc"
    return EndpointLoad(
        running=int(sums["vllm:num_requests_running"]),
        waiting=int(sums["vllm:num_requests_waiting"]),
        kv_usage=sums[kv] / counts[kv] if kv in sums else None,
        prefix_queries=count("vllm:prefix_cache_queries_total"),
        prefix_hits=count("vllm:prefix_cache_hits_total"),
        generated_tokens=count("vllm:generation_tokens_total"),
        aborted=aborted,
    )


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_parser_agrees_with_prometheus_client_on_recorded_pages(path: Path) -> None:
    pytest.importorskip("prometheus_client")
    raw = path.read_bytes()
    load = parse_vllm_metrics(raw)
    assert load == _reference(raw.decode())
    assert load == parse_vllm_metrics(raw.decode())  # str works too
    # Every field is there on a current vLLM (or the simulator's imitation of one).
    assert None not in (load.kv_usage, load.prefix_queries, load.prefix_hits, load.generated_tokens)
    assert load.aborted is not None


def test_parser_on_the_simulators_page() -> None:
    # Recorded from `shuniu sim serve` with one request streaming, one aborted, and a
    # repeated 400-token prompt (tests/data/vllm_metrics_sim.txt).
    load = parse_vllm_metrics((DATA / "vllm_metrics_sim.txt").read_bytes())
    assert load == EndpointLoad(
        running=1,
        waiting=0,
        kv_usage=0.000732421875,
        prefix_queries=806,
        prefix_hits=384,
        generated_tokens=322,
        aborted=1,
    )


def test_parser_on_a_real_vllm_page() -> None:
    # Recorded from vLLM 0.32 (CPU build, tests/test_vllm_real.py) with one request running
    # and one waiting behind it (--max-num-seqs 1).
    load = parse_vllm_metrics((DATA / "vllm_metrics_vllm_0.32.0.txt").read_bytes())
    assert load == EndpointLoad(
        running=1,
        waiting=1,  # not vllm:num_requests_waiting_by_reason, which is on the page too
        kv_usage=0.0001220852154804053,
        prefix_queries=3,
        prefix_hits=0,
        generated_tokens=38,
        aborted=0,
    )


PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 3.0
vllm:num_requests_running{engine="1",model_name="a"} 2.0
vllm:num_requests_running{engine="0",model_name="b } \\" tricky"} 1.0
vllm:num_requests_waiting{engine="0",model_name="a"} 4.0 1700000000000
vllm:num_requests_waiting{engine="1",model_name="a"} 1.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="a",reason="capacity"} 99.0
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="a"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="a"} 1.5e+03
vllm:prefix_cache_queries_created{engine="0",model_name="a"} 1.7e+09
vllm:prefix_cache_hits_total{engine="0",model_name="a"} 100.0
vllm:prefix_cache_hits_total{engine="1",model_name="a"} 200.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="a"} 7777.0
vllm:generation_tokens_total{engine="0",model_name="a"} 10.0
vllm:generation_tokens_total{engine="1",model_name="a"} 20.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="a"} 50.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="a"} 2.0
vllm:request_success_total{engine="1",finished_reason="abort",model_name="a"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="a"} 5.0
vllm:num_requests_running_other{engine="0"} 1000.0
"""


def test_parser_sums_over_label_sets_and_skips_everything_else() -> None:
    load = parse_vllm_metrics(PAGE)
    assert load == EndpointLoad(
        running=6,  # 3 + 2 + 1, the last with "}" and an escaped quote inside a label value
        waiting=5,  # a timestamp after the value is allowed; *_by_reason is another metric
        kv_usage=0.375,  # the mean of the engines' fractions, not their sum
        prefix_queries=2500,
        prefix_hits=300,  # external_prefix_cache_hits_total is not the engine's own cache
        generated_tokens=30,
        aborted=5,  # only finished_reason="abort"
    )


def test_missing_metrics_are_none_and_a_page_without_load_series_is_an_error() -> None:
    minimal = 'vllm:num_requests_running{engine="0"} 2.0\nvllm:num_requests_waiting 1\n'
    assert parse_vllm_metrics(minimal) == EndpointLoad(running=2, waiting=1)
    assert parse_vllm_metrics("vllm:num_requests_waiting 4\n").running == 0
    for page in ("", "# HELP x\n", "<html>not metrics</html>", "process_cpu_seconds_total 3.0\n"):
        with pytest.raises(MetricsError):
            parse_vllm_metrics(page)
    # A sample whose value is not a finite number is skipped, not fatal.
    odd = "vllm:num_requests_running 2\nvllm:num_requests_waiting NaN\nvllm:generation_tokens_total +Inf\n"
    assert parse_vllm_metrics(odd) == EndpointLoad(running=2, waiting=0)


def test_old_metric_names() -> None:
    # vLLM before 0.10: gpu_cache_usage_perc and gpu_prefix_cache_* (no abort label yet).
    old = """\
vllm:num_requests_running{model_name="m"} 1.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.75
vllm:gpu_prefix_cache_queries_total{model_name="m"} 640.0
vllm:gpu_prefix_cache_hits_total{model_name="m"} 320.0
vllm:generation_tokens_total{model_name="m"} 64.0
"""
    assert parse_vllm_metrics(old) == EndpointLoad(1, 0, 0.75, 640, 320, 64, None)
    # With both, the current names win.
    both = old + 'vllm:kv_cache_usage_perc{model_name="m"} 0.5\nvllm:prefix_cache_hits_total 1.0\n'
    load = parse_vllm_metrics(both)
    assert (load.kv_usage, load.prefix_hits, load.prefix_queries) == (0.5, 1, 640)


# -- options and model choice -------------------------------------------------------------


def test_options_normalise_the_server_url() -> None:
    for given in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"):
        assert VllmOptions(base_url=given).base_url == "http://h:8000"
    assert VllmOptions(base_url="https://h/prefix/v1").base_url == "https://h/prefix"
    opts = VllmOptions(base_url="http://h:8000")
    assert (opts.health_path, opts.metrics_path, opts.cache_salt, opts.forward_priority) == (
        "/health",
        "/metrics",
        "tenant",
        False,
    )
    with pytest.raises(ValidationError, match="http"):
        VllmOptions(base_url="h:8000")
    with pytest.raises(ValidationError, match="at least 16"):
        VllmOptions(base_url="http://h", cache_salt_secret="short")
    with pytest.raises(ValidationError, match="must start with /"):
        VllmOptions(base_url="http://h", metrics_path="metrics")
    with pytest.raises(ValidationError, match="cache_salt"):
        VllmOptions(base_url="http://h", cache_salt="global")  # type: ignore[arg-type]
    # The secret never shows in a repr (nor, through it, in logs).
    assert SECRET not in repr(VllmOptions(base_url="http://h", cache_salt_secret=SECRET))


def test_every_option_is_documented() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "backends" / "vllm.md").read_text()
    for name, field in VllmOptions.model_fields.items():
        assert field.description, name
        assert f"`{name}`" in doc, name


def test_choose_model() -> None:
    one = [{"id": "tiny", "root": "/models/tiny", "max_model_len": 1024}]
    aliases = [{"id": "a", "root": "/m"}, {"id": "b", "root": "/m"}]
    two = [{"id": "a", "root": "/m1"}, {"id": "b", "root": "/m2"}]
    assert choose_model(one, None, "chat") == (one[0], None)
    assert choose_model(aliases, None, "chat") == (aliases[0], None)
    assert choose_model(two, None, "b") == (two[1], None)  # the pool's own name
    assert choose_model(two, "a", "b") == (two[0], None)  # the configured one wins
    entry, problem = choose_model(two, None, "chat")
    assert entry is None and problem is not None and "set options.model" in problem
    entry, problem = choose_model(one, "other", "chat")
    assert entry is None and problem is not None and "'other'" in problem and "tiny" in problem
    assert choose_model([], None, "chat")[1] == "the server lists no models in /v1/models"


# -- the forwarded body -------------------------------------------------------------------


def _backend(base_url: str = "http://127.0.0.1:9", pool: str = "chat", **options: Any) -> VllmBackend:
    """A backend of the pool (public model name) ``pool``; ``options`` are VllmOptions."""
    return VllmBackend(EndpointSpec(name="e0", model=pool, options=VllmOptions(base_url=base_url, **options)))


def _req(
    body: dict[str, Any] | None = None, tenant: str = "acme", priority: int = 0, *, stream: bool = False
) -> InferenceRequest:
    body = body or {"model": "chat-alias", "messages": [{"role": "user", "content": "hi"}]}
    return InferenceRequest(
        id="r1",
        api="chat",
        model="chat-alias",
        body=body,
        prompt="hi",
        prompt_tokens=2,
        stream=stream,
        priority=priority,
        principal=Principal(tenant=tenant),
    )


def test_cache_salt_is_per_tenant_keyed_and_overwrites_the_clients() -> None:
    b = _backend(cache_salt_secret=SECRET)
    client_body = {"model": "x", "prompt": "p", "cache_salt": "guess-of-another-tenant"}
    acme = b.prepare_body(_req(client_body, tenant="acme"))
    other = b.prepare_body(_req(client_body, tenant="other"))
    assert acme["cache_salt"] != other["cache_salt"]
    assert "guess" not in acme["cache_salt"] and client_body["cache_salt"] == "guess-of-another-tenant"
    # Stable for one secret (several gateways agree), different under another secret, and
    # what vLLM accepts (<= 128 characters, none of @ / \).
    assert (
        acme["cache_salt"]
        == _backend(cache_salt_secret=SECRET).prepare_body(_req(tenant="acme"))["cache_salt"]
    )
    assert acme["cache_salt"] != _backend(cache_salt_secret=SECRET + "x").salt("acme")
    assert acme["cache_salt"] == tenant_salt(SECRET.encode(), "acme")
    assert len(acme["cache_salt"]) == 64 and acme["cache_salt"].isalnum()
    assert "acme" not in acme["cache_salt"]
    # Without a secret: a random key per process, shared by the endpoints of this gateway.
    assert _backend().salt("acme") == _backend().salt("acme") != acme["cache_salt"]
    # A secret longer than BLAKE2b's 64-byte key limit works.
    assert len(_backend(cache_salt_secret="k" * 100).salt("acme")) == 64
    # off: the client's salt passes through, none is added.
    off = _backend(cache_salt="off")
    assert off.prepare_body(_req(client_body))["cache_salt"] == "guess-of-another-tenant"
    assert "cache_salt" not in off.prepare_body(_req())


def test_priority_forwarding_on_and_off() -> None:
    body = {"model": "x", "prompt": "p", "priority": -100}
    on = _backend(forward_priority=True)
    assert on.prepare_body(_req(body, priority=2))["priority"] == 2  # the scheduler's, not the client's
    assert on.prepare_body(_req(priority=0))["priority"] == 0
    off = _backend()
    assert "priority" not in off.prepare_body(_req(body, priority=2))  # the client's is removed
    assert body["priority"] == -100  # the request's own body is not touched


def test_model_name_sent_upstream() -> None:
    # Until /v1/models settles it: options.model, else the pool's name (never the alias the
    # client used).
    assert _backend().prepare_body(_req())["model"] == "chat"
    assert _backend(model="served").prepare_body(_req())["model"] == "served"


async def test_what_reaches_the_wire() -> None:
    """Against a scripted OpenAI server that records bodies: the served model discovered
    from /v1/models, the tier's priority, the tenant's salt, and usage always requested."""
    up = ScriptedUpstream().start()
    try:
        b = _backend(
            f"http://127.0.0.1:{up.port}/v1",
            forward_priority=True,
            cache_salt_secret=SECRET,
            api_key="sk-vllm",
        )
        await b.start()
        try:
            assert (b.served_model, b.max_model_len, b.model_problem) == ("up-model", 4096, None)
            body = {"model": "chat", "messages": [{"role": "user", "content": "hello"}], "cache_salt": "mine"}
            chunks = [c async for c in b.stream(_req({**body, "stream": True}, "acme", 3, stream=True))]
            assert "".join(c.text for c in chunks) == "w0 w1 w2 " and chunks[-1].usage is not None
            done = await b.complete(_req(body, "other", 1))
            assert done.text == "fine"
            # This server has no /health or /metrics: the detail says what answered.
            health = await b.health()
            assert not health.ok and health.detail.startswith("HTTP 404")
            with pytest.raises(ProbeError, match="GET /metrics: HTTP 404"):
                await b.load()
        finally:
            await b.stop()
    finally:
        up.stop()
    streamed, whole = up.bodies
    assert streamed["model"] == whole["model"] == "up-model"
    assert streamed["stream_options"] == {"include_usage": True}
    assert (streamed["priority"], whole["priority"]) == (3, 1)
    assert streamed["cache_salt"] == tenant_salt(SECRET.encode(), "acme")
    assert whole["cache_salt"] == tenant_salt(SECRET.encode(), "other")
    assert all(h["Authorization"] == "Bearer sk-vllm" for h in up.headers)


# -- against `shuniu sim serve` -----------------------------------------------------------


def _sim(*args: str) -> GatewayProcess:
    cmd = [sys.executable, "-m", "shuniu.core", "sim", "serve", "--port", "0", "--served-model-name", SERVED]
    return start_process([*cmd, "--ttft-ms", "0", "--max-model-len", "4096", *args], timeout=60)


@pytest.fixture(scope="module")
def sims() -> Iterator[list[GatewayProcess]]:
    """Two simulated vLLM servers at 20 tokens/s per request (slow enough to watch)."""
    servers = [_sim("--tokens-per-s", "20", "--max-num-seqs", "4") for _ in range(2)]
    yield servers
    for s in servers:
        s.stop()


async def _eventually(check: Callable[[], Awaitable[Any]], within_s: float = 10.0) -> Any:
    """The async twin of conftest.wait_until: poll ``check`` until it returns something truthy.
    It waits for a condition to become true; it never stands in for one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within_s} s (last value: {value!r})")
        await asyncio.sleep(0.02)


def _completion(
    prompt: str, max_tokens: int, *, stream: bool = False, tenant: str = "acme"
) -> InferenceRequest:
    body = {"model": "chat", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    return InferenceRequest(
        id="c1",
        api="completions",
        model="chat",
        body=body,
        prompt=prompt,
        prompt_tokens=len(prompt.split()),
        stream=stream,
        max_tokens=max_tokens,
        principal=Principal(tenant=tenant),
    )


async def test_start_health_and_load_against_sim_serve(sims: list[GatewayProcess]) -> None:
    b = _backend(sims[0].url)
    await b.start()
    try:
        # The served model and max_model_len come from /v1/models (the pool is named "chat").
        assert (b.served_model, b.max_model_len) == (SERVED, 4096)
        assert await b.health() == Health(True, "HTTP 200")
        idle = await b.load()
        assert idle.running == 0 and idle.kv_usage is not None and idle.prefix_queries is not None

        # A slow stream (200 tokens at 20/s) shows as running while it lasts ...
        gen = b.stream(_completion("count slowly", 200, stream=True))
        first = await anext(gen)
        assert first.text or first.tokens == 0

        async def running() -> EndpointLoad | None:
            snap = await b.load()
            return snap if snap.running == 1 and snap.kv_usage else None

        busy = await _eventually(running)
        assert busy.kv_usage > 0
        # ... and closing it early aborts it in the engine (the connection is dropped).
        await gen.aclose()

        async def aborted() -> bool:
            snap = await b.load()
            return snap.running == 0 and (snap.aborted or 0) > (idle.aborted or 0)

        await _eventually(aborted)
    finally:
        await b.stop()


async def test_prefix_counters_grow_on_a_repeated_long_prompt(sims: list[GatewayProcess]) -> None:
    b = _backend(sims[1].url, cache_salt="off")
    await b.start()
    try:
        before = await b.load()
        prompt = f"{id(b)} {LONG_PROMPT}"  # unique to this run
        await b.complete(_completion(prompt, 1))
        first = await b.load()
        await b.complete(_completion(prompt, 1))
        second = await b.load()
        assert first.prefix_queries > before.prefix_queries  # type: ignore[operator]
        assert first.prefix_hits == before.prefix_hits  # a new prompt: nothing cached yet
        assert second.prefix_hits - first.prefix_hits >= 300  # type: ignore[operator]
        assert second.generated_tokens == first.generated_tokens + 1  # type: ignore[operator]
    finally:
        await b.stop()


async def test_a_server_that_is_down_or_stops() -> None:
    # Not up at start: start() succeeds, health says why, load() raises, requests get 502.
    b = _backend(f"http://127.0.0.1:{quiet_ports()[0]}")
    await b.start()
    try:
        assert b.served_model is None and b.model_problem is not None and "/v1/models" in b.model_problem
        health = await b.health()
        assert not health.ok and "Connect" in health.detail
        with pytest.raises(Exception):  # noqa: B017 - whatever aiohttp raises; the gateway catches all
            await b.load()
        with pytest.raises(GatewayError) as err:
            await b.complete(_completion("x", 1))
        assert err.value.status == 502
    finally:
        await b.stop()

    # Up, then stopped: healthy, then not.
    srv = _sim("--tokens-per-s", "0")
    b = _backend(srv.url)
    await b.start()
    try:
        assert (await b.health()).ok and b.served_model == SERVED
        srv.stop()
        health = await b.health()
        assert not health.ok and health.detail
        with pytest.raises(Exception):  # noqa: B017
            await b.load()
    finally:
        srv.stop()
        await b.stop()


async def test_health_waits_for_an_unambiguous_model(sims: list[GatewayProcess]) -> None:
    b = _backend(sims[0].url, model="not-served")
    await b.start()
    try:
        health = await b.health()
        assert not health.ok and "'not-served'" in health.detail and SERVED in health.detail
    finally:
        await b.stop()


def test_a_gateway_in_front_of_two_sim_servers(gateway_factory, sims: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(
        f"""
        models:
          chat:
            health: {{interval_s: 0.1}}
            load: {{interval_s: 0.1}}
            balancer: {{policy: least_load}}
            endpoints:
              - {{kind: vllm, name: vllm-a, options: {{base_url: "{sims[0].base_url}"}}}}
              - kind: vllm
                name: vllm-b
                options: {{base_url: "{sims[1].url}", cache_salt_secret: "{SECRET}", forward_priority: false}}
        """
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=60)
    # max_model_len came from the engines' /v1/models.
    assert [m.model_extra["max_model_len"] for m in client.models.list().data] == [4096]  # type: ignore[index]
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

    def ready() -> dict[str, Any] | None:
        body = httpx.get(f"{gw.url}/ready", timeout=10).json()
        endpoints = body["models"]["chat"]["endpoints"]
        return body if all(e["load"] is not None and e["healthy"] for e in endpoints) else None

    body = wait_until(ready)
    endpoints = {e["name"]: e for e in body["models"]["chat"]["endpoints"]}
    assert set(endpoints) == {"vllm-a", "vllm-b"}
    for e in endpoints.values():
        assert e["kind"] == "vllm" and e["detail"] == "HTTP 200"
        load = e["load"]
        assert set(load) >= {"running", "waiting", "kv_usage", "prefix_queries", "prefix_hits"}
        assert load["kv_usage"] is not None and load["generated_tokens"] is not None
    client.close()


def test_vllm_is_listed_with_its_options() -> None:
    from shuniu.core.plugin_manager import load_plugins

    reg = load_plugins().registered("backends")["vllm"]
    assert reg.options is VllmOptions and reg.plugin == "vllm" and "/metrics" in reg.description
    # The factory builds the backend; nothing is contacted until start().
    backend = reg.factory(EndpointSpec("e", "m", VllmOptions(base_url="http://127.0.0.1:9")))
    assert isinstance(backend, VllmBackend) and backend.kind == "vllm"
    assert msgspec.json.decode(backend._payload(_req(stream=True), True))["stream_options"] == {
        "include_usage": True
    }
