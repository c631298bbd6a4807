"""One model served by a mixed pool: a vLLM engine (``shuniu sim serve``, which speaks vLLM's
API and metric names, standing in for an NVIDIA replica), a MindIE engine on Ascend
(``tests/fake_mindie.py``, built from MindIE's published API) and a TGI engine
(``tests/fake_tgi.py``), behind one gateway process. Traffic is shared by weight or by load,
each engine's load is read in its own dialect, and a failing replica of one kind is covered
by the other. In virtual time (``shuniu simulate``), simulated H200 and Ascend 910B replicas
in one pool show load-based balancing giving the faster replicas their share of the work."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import ROOT, GatewayProcess, start_process
from tests.fake_mindie import FakeMindie, FakeMindieConfig
from tests.fake_tgi import FakeTGI

MODEL = "qwen2.5-7b"


@pytest.fixture(scope="module")
def vllm_engine() -> Iterator[GatewayProcess]:
    cmd = [sys.executable, "-m", "shuniu.core", "sim", "serve", "--port", "0", "--served-model-name", MODEL]
    proc = start_process([*cmd, "--ttft-ms", "0", "--max-model-len", "4096"], timeout=60)
    yield proc
    proc.stop()


@pytest.fixture
def mindie() -> Iterator[FakeMindie]:
    with FakeMindie(FakeMindieConfig(model_name=MODEL, max_seq_len=4096)) as fake:
        yield fake


def _deployment(vllm_url: str, mindie_url: str, *, nvidia_weight: int, ascend_weight: int) -> str:
    return f"""
models:
  chat:
    balancer: {{policy: weighted_round_robin}}
    health: {{interval_s: 0.1}}
    load: {{interval_s: 0.1}}
    endpoints:
      - kind: vllm
        name: h100
        weight: {nvidia_weight}
        labels: {{accelerator: nvidia}}
        options: {{base_url: "{vllm_url}"}}
      - kind: ascend
        name: 910b
        weight: {ascend_weight}
        labels: {{accelerator: ascend}}
        options: {{engine: mindie, base_url: "{mindie_url}"}}
"""


def _endpoints(gw: GatewayProcess) -> dict[str, dict]:  # type: ignore[type-arg]
    ready = httpx.get(f"{gw.url}/ready", timeout=10).json()
    return {e["name"]: e for e in ready["models"]["chat"]["endpoints"]}


def test_a_mixed_pool_shares_traffic_by_weight_and_reads_each_engines_load(
    gateway_factory, vllm_engine: GatewayProcess, mindie: FakeMindie
) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deployment(vllm_engine.url, mindie.url, nvidia_weight=3, ascend_weight=1))
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    for i in range(40):
        if i % 2:
            list(
                client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=3, stream=True
                )
            )
        else:
            client.completions.create(model="chat", prompt=f"p{i}", max_tokens=3)
    eps = _endpoints(gw)
    assert eps["h100"]["completed"] == 30 and eps["910b"]["completed"] == 10  # 3:1 by weight
    assert eps["h100"]["kind"] == "vllm" and eps["910b"]["kind"] == "ascend"
    # Each engine's load view comes through its own protocol (vLLM's and MindIE's metrics).
    assert eps["h100"]["load"] is not None and eps["910b"]["load"] is not None
    assert len(mindie.bodies) == 10


def test_when_one_kind_fails_the_other_serves(
    gateway_factory, vllm_engine: GatewayProcess, mindie: FakeMindie
) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deployment(vllm_engine.url, mindie.url, nvidia_weight=1, ascend_weight=1))
    mindie.error_status = 500  # the Ascend replica fails every request
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    for i in range(10):
        reply = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": f"x{i}"}], max_tokens=2
        )
        assert reply.choices[0].message.content is not None
    eps = _endpoints(gw)
    assert eps["h100"]["completed"] == 10 and eps["910b"]["errors"] >= 1


def test_three_engines_on_three_kinds_of_hardware_balance_by_load(
    gateway_factory, vllm_engine: GatewayProcess, mindie: FakeMindie
) -> None:  # type: ignore[no-untyped-def]
    """vLLM (instant), MindIE (instant) and a slow TGI replica, equal weights, balanced by
    ``least_load``: the slow one holds its requests longer, so it is given fewer of them."""
    tgi = FakeTGI(token_delay_s=0.1).start()
    try:
        config = f"""
models:
  chat:
    balancer: {{policy: least_load}}
    health: {{interval_s: 0.1}}
    load: {{interval_s: 0.1}}
    endpoints:
      - {{kind: vllm, name: h100, options: {{base_url: "{vllm_engine.url}"}}}}
      - {{kind: ascend, name: 910b, options: {{engine: mindie, base_url: "{mindie.url}"}}}}
      - {{kind: tgi, name: l40s, options: {{base_url: "{tgi.url}"}}}}
"""
        gw = gateway_factory(config)
        client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=60)

        def ask(i: int) -> int:
            reply = client.chat.completions.create(
                model="chat",
                messages=[{"role": "user", "content": f"question {i}"}],
                max_tokens=10,
                extra_body={"ignore_eos": True},
            )
            assert reply.usage is not None
            return reply.usage.completion_tokens

        with ThreadPoolExecutor(8) as pool:
            assert all(n > 0 for n in pool.map(ask, range(64)))
        eps = _endpoints(gw)
        done = {name: eps[name]["completed"] for name in ("h100", "910b", "l40s")}
        assert sum(done.values()) == 64 and all(n > 0 for n in done.values()), done
        # Ten tokens at 100 ms each on the TGI replica, 60 tokens a second on the simulated
        # vLLM one, at once on the MindIE fake: each is given work as it frees up, so the
        # slowest takes far less than an equal third.
        assert done["l40s"] <= done["h100"] < done["910b"] and done["l40s"] < 64 / 6, done
        assert all(eps[name]["load"] is not None for name in done)  # each read in its own dialect
    finally:
        tgi.stop()


# -- in virtual time: simulated H200 and Ascend 910B replicas in one pool -------------------

MIXED = """
models:
  qwen:
    balancer: {{policy: {policy}}}
    scheduler: {{policy: fifo, options: {{max_queue: 100000, max_wait_s: 600}}}}
    endpoints:
      - {{kind: sim, name: h200, replicas: 2, options: {{hardware: h200, model: qwen2.5-7b}}}}
      - {{kind: sim, name: 910b, replicas: 2, options: {{hardware: ascend-910b, model: qwen2.5-7b}}}}
"""

CHAT = """
name: mixed-hardware
duration_s: {duration}
streams:
  - arrival: {{process: poisson, rate: {rate}}}
    input_tokens: {{dist: lognormal, mean: 1000, sigma: 0.5, min: 32, max: 4000}}
    output_tokens: {{dist: lognormal, mean: 200, sigma: 0.5, min: 16, max: 1000}}
"""


def _simulate(policy: str, rate: float, duration: float, tmp_path: Path) -> dict[str, dict[str, float]]:
    from shuniu.core.config.loader import load_deployment
    from shuniu.core.plugin_manager import load_plugins
    from shuniu.core.traffic import load_workload
    from shuniu.plugins.tools.simulate import simulate

    plugins = load_plugins()
    resolved = load_deployment("mixed.yaml", plugins, text=MIXED.format(policy=policy), env={})
    path = tmp_path / f"{policy}-{rate}.yaml"
    path.write_text(CHAT.format(rate=rate, duration=duration))
    result = simulate(resolved, plugins, load_workload(path), seed=1)
    per = result.per_endpoint
    out: dict[str, dict[str, float]] = {}
    for kind in ("h200", "910b"):
        eps = [per[f"{kind}-{i}"] for i in range(2)]
        out[kind] = {
            "completed": sum(e["completed"] for e in eps) / 2,
            "e2e_p50": sum(e["e2e_p50"] for e in eps) / 2,
        }
    return out


def test_simulated_h200_and_910b_replicas_share_work_by_load(tmp_path: Path) -> None:
    """Equal weights, ``least_load``: the H200 replicas (about four times as fast on this
    model) take about three times the work, and each kind runs at a similar slowdown over
    its own unloaded latency; round robin gives both the same share, and the 910B's requests
    take several times longer than unloaded."""
    unloaded = _simulate("round_robin", 1, 60, tmp_path)
    speed = unloaded["910b"]["e2e_p50"] / unloaded["h200"]["e2e_p50"]
    assert speed > 2.5  # the profiles: an H200 serves this model much faster than a 910B
    by_load = _simulate("least_load", 30, 40, tmp_path)
    by_turns = _simulate("round_robin", 30, 40, tmp_path)

    # Each replica holds about as much work as the others (Little's law: the share of requests
    # is the inverse of the time each takes there), so the faster ones complete more.
    share = by_load["h200"]["completed"] / by_load["910b"]["completed"]
    held = by_load["910b"]["e2e_p50"] / by_load["h200"]["e2e_p50"]
    print(f"speed {speed:.2f}, share {share:.2f}, latency ratio under load {held:.2f}")
    assert share > 2 and 0.7 * held <= share <= 1.3 * held, (share, held, speed)
    assert abs(by_turns["h200"]["completed"] / by_turns["910b"]["completed"] - 1) < 0.1

    def slowdown(run: dict[str, dict[str, float]], kind: str) -> float:
        return run[kind]["e2e_p50"] / unloaded[kind]["e2e_p50"]

    # By load, neither kind is pushed far past its own unloaded latency, and they are close.
    print(
        {
            (run, kind): round(slowdown(r, kind), 2)
            for run, r in (("load", by_load), ("turns", by_turns))
            for kind in r
        }
    )
    assert max(slowdown(by_load, "h200"), slowdown(by_load, "910b")) < 2.5
    assert 0.5 < slowdown(by_load, "910b") / slowdown(by_load, "h200") < 2
    # By turns, the slow replicas fall behind: their requests wait and take far longer.
    assert slowdown(by_turns, "910b") > 1.4 * slowdown(by_load, "910b")


def test_the_heterogeneous_example_serves_on_three_kinds_of_engine(
    gateway_factory, vllm_engine: GatewayProcess, mindie: FakeMindie
) -> None:  # type: ignore[no-untyped-def]
    """``examples/heterogeneous.yaml`` as shipped, its addresses pointed at a vLLM-speaking
    engine (twice), the MindIE fake and the TGI fake."""
    tgi = FakeTGI().start()
    try:
        text = (ROOT / "examples" / "heterogeneous.yaml").read_text()
        text = text.replace("host: 0.0.0.0", "host: 127.0.0.1").replace("Qwen/Qwen2.5-7B-Instruct", MODEL)
        text = re.sub(r"http://vllm-h200-\d\.engines:8000", vllm_engine.url, text)
        text = re.sub(r"http://mindie-0\.engines:\d+", mindie.url, text)
        text = re.sub(r"http://tgi-l40s-0\.engines:8080", tgi.url, text)
        assert ".engines" not in text
        gw = gateway_factory(text)
        client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=60)
        for i in range(12):
            reply = client.chat.completions.create(
                model="qwen", messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=3
            )
            assert reply.model == "qwen" and reply.usage is not None
        ready = httpx.get(f"{gw.url}/ready", timeout=10).json()["models"]["qwen2.5-7b"]
        assert ready["healthy_endpoints"] == 4
        served = {e["name"]: e["completed"] for e in ready["endpoints"]}
        assert sum(served.values()) == 12 and served["ascend-910b-0"] >= 1
    finally:
        tgi.stop()
