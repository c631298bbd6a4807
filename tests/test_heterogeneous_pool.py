"""One model served by a mixed pool: a vLLM engine (``shuniu sim serve``, which speaks vLLM's
API and metric names, standing in for an NVIDIA replica) and a MindIE engine on Ascend
(``tests/fake_mindie.py``, built from MindIE's published API), behind one gateway process.
Traffic is shared by weight, each engine's load is read in its own dialect, and a failing
replica of one kind is covered by the other."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.conftest import GatewayProcess, start_process
from tests.fake_mindie import FakeMindie, FakeMindieConfig

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
