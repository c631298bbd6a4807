"""``precise_prefix`` against REAL vLLM engines publishing their KV-cache events (vLLM's CPU
build serving the tiny random Llama of ``tests/tiny_model.py``), opt-in as the other real-vLLM
suites: ``SHUNIU_REAL_VLLM=1`` and the vLLM virtualenv (docs/testing.md).

One gateway for the module launches two vLLM servers (``launch:``, ``replicas: 2``) with
``kv_events:`` (the launcher hands each replica its ``--kv-events-config``: its own PUB port and
replay port) and routes model ``chat`` with ``precise_prefix``, tokenizing with the model's own
tokenizer and chat template (``tokenizer:``). The memory of recent dispatches is cut to 1 ms,
so every prediction comes from the engines' events.

What is proved, against the engines' own numbers:

- after each request, the index holds exactly the blocks the engine stored (the full 32-token
  blocks of the prompt as vLLM's ``/tokenize`` renders it), per engine;
- for every request, the prompt tokens the balancer expected the chosen engine to hold
  (``shuniu_prefix_expected_hits_total``) equal what that engine found in its prefix cache
  (``vllm:prefix_cache_hits_total``), token for token, misses included;
- an engine that is killed loses its entries at once, the other keeps its own, and the
  restarted engine's events (numbered from 0 again) are followed.

Generated text is random: only protocol, counts and metrics are asserted. About 2.4 GB of RAM
per server and two to four minutes in all.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import GatewayProcess, start_gateway, wait_until
from tests.kv_exactness import Cluster, exactness_scenario, system_prompt, table
from tests.ports import quiet_ports
from tests.test_launcher_real import _tails, vllm_launch
from tests.test_vllm_real import MODEL_DIR, _ensure_model, real_vllm_marks

pytestmark = real_vllm_marks("launches two real vLLM servers with KV events (~2 min, ~5 GB RAM)", 1200)

BLOCK = 32
"""The engines' ``--block-size`` (vLLM's CPU backend wants multiples of 32)."""
ENDPOINTS = ("chat-0", "chat-1")


def _deployment(http: int, kv: int, replay: int, logs: Path) -> str:
    return f"""
gateway: {{graceful_shutdown_s: 30}}
models:
  chat:
    tokenizer: {json.dumps(str(MODEL_DIR))}
    health: {{interval_s: 0.5, timeout_s: 10, unhealthy_after: 3}}
    load: {{interval_s: 0.25, timeout_s: 10}}
    balancer: {{policy: precise_prefix, options: {{recent_s: 0.001}}}}
    endpoints:
      - kind: vllm
        replicas: 2
        max_concurrency: 4
        options: {{probe_timeout_s: 10}}
        kv_events:
          endpoint: tcp://127.0.0.1:{kv}
          replay_endpoint: tcp://127.0.0.1:{replay}
          topic: kv-events
{vllm_launch(http, logs, "--block-size", str(BLOCK))}
"""


@dataclass
class Engines:
    gw: GatewayProcess
    logs: Path
    cluster: Cluster


def _engine_ids(port: int) -> Callable[[list[dict[str, str]]], list[int]]:
    """A chat's prompt token ids as the engine itself renders and tokenizes it (``/tokenize``)."""

    def ids(messages: list[dict[str, str]]) -> list[int]:
        r = httpx.post(
            f"http://127.0.0.1:{port}/tokenize",
            json={"model": "tiny", "messages": messages, "add_generation_prompt": True},
            timeout=30,
        )
        r.raise_for_status()
        return list(r.json()["tokens"])

    return ids


def _ready(gw: GatewayProcess) -> dict[str, dict[str, Any]] | None:
    body = httpx.get(f"{gw.url}/ready", timeout=30).json()
    eps = {e["name"]: e for e in body["models"]["chat"]["endpoints"]}
    ok = all(e["healthy"] and e["launch"]["state"] == "ready" for e in eps.values())
    return eps if ok else None


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    _ensure_model()
    tmp = tmp_path_factory.mktemp("kv-events-real")
    logs = tmp / "logs"
    http, kv, replay = quiet_ports(3, 2)
    gw = start_gateway(_deployment(http, kv, replay, logs), tmp)
    try:
        try:
            wait_until(lambda: _ready(gw), timeout=600, interval=1.0)
        except AssertionError:
            pytest.fail("the launched vLLM servers did not become ready:\n" + _tails(logs))
        ports = {name: http + k for k, name in enumerate(ENDPOINTS)}
        yield Engines(gw, logs, Cluster(gw.url, ports, _engine_ids(http), BLOCK))
    finally:
        assert gw.stop(signal.SIGTERM, timeout=120) == 0


# ------------------------------------------------------------------------------ the tests


def test_the_index_predicts_every_engines_prefix_cache_hits_exactly(engines: Engines) -> None:
    client = openai.OpenAI(base_url=engines.gw.base_url, api_key="unused", max_retries=0, timeout=120)
    sent = exactness_scenario(engines.cluster, client)
    client.close()
    shown = table(sent)
    print(f"\nper request (tokens):\n{shown}")
    assert [s.expected for s in sent] == [s.hits for s in sent], shown
    assert {s.endpoint for s in sent} == set(ENDPOINTS), shown  # both engines served, both indexed
    assert sum(s.hits for s in sent) > 0 and any(s.hits == 0 for s in sent), shown  # hits and misses
    # A group stays where its prefix is: every repeat found most of its prompt cached.
    assert all(s.hits >= s.prompt_tokens // 2 for s in sent[9:]), shown


def test_a_killed_engine_loses_its_entries_and_its_restart_is_followed(engines: Engines) -> None:
    gw, cluster = engines.gw, engines.cluster
    if not any(cluster.stored.values()):
        pytest.skip("runs after the exactness test, which fills the engines")
    eps = wait_until(lambda: _ready(gw), timeout=60)
    victim, other = ("chat-0", "chat-1") if cluster.stored["chat-0"] else ("chat-1", "chat-0")
    kept = len(cluster.stored[other])
    resets_before = cluster.gateway_metrics().get(("shuniu_kv_event_resets_total", victim), 0)
    os.kill(eps[victim]["launch"]["pid"], signal.SIGKILL)
    # At once (the launcher saw the exit), not at the restarted engine's first events.
    wait_until(lambda: cluster.gateway_metrics().get(("shuniu_kv_index_blocks", victim)) == 0, timeout=60)
    assert cluster.gateway_metrics().get(("shuniu_kv_index_blocks", other)) == kept
    cluster.stored[victim] = set()
    try:
        wait_until(lambda: _ready(gw), timeout=600, interval=1.0)
    except AssertionError:
        pytest.fail("the killed vLLM server did not come back:\n" + _tails(engines.logs))
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)
    sent = []
    # Two new assistants one after the other (equal costs: the balancer's rotation puts them
    # on different engines), then each again (where its prefix now is).
    for q, group in enumerate((50, 51, 50, 51)):
        messages = [
            {"role": "system", "content": system_prompt(group, 150)},
            {"role": "user", "content": f"after the restart, question {q}"},
        ]
        sent.append(cluster.send(client, messages))
    client.close()
    shown = table(sent)
    print(f"\nafter the restart (tokens):\n{shown}")
    assert [s.expected for s in sent] == [s.hits for s in sent], shown
    assert victim in {s.endpoint for s in sent}, shown
    assert sent[2].hits > 0 and sent[3].hits > 0, shown
    # The restarted engine numbers its batches from 0 again: its feed noticed and followed.
    assert cluster.gateway_metrics().get(("shuniu_kv_event_resets_total", victim), 0) > resets_before


def test_a_prompt_scheduled_twice_at_once_is_computed_once(engines: Engines) -> None:
    """vLLM V1 caches a block when its tokens are scheduled, not when computed: of two equal
    new prompts sent together, the one scheduled second finds the first one's blocks, whether
    it joined the same step or a later one (the simulator's engine does the same:
    ``tests/test_sim_core.py::test_a_prompt_admitted_twice_in_one_step_is_computed_once``)."""
    cluster = engines.cluster
    endpoint = ENDPOINTS[0]
    ids = [random.Random(11).randrange(100, 8000) for _ in range(6 * BLOCK + 5)]
    queries0, hits0 = cluster.engine_counters(endpoint)
    r = httpx.post(
        f"http://127.0.0.1:{cluster.engines[endpoint]}/v1/completions",
        json={"model": "tiny", "prompt": [ids, ids], "max_tokens": 1, "temperature": 0},
        timeout=120,
    )
    r.raise_for_status()
    assert len(r.json()["choices"]) == 2
    _, hits = wait_until(
        lambda: c if (c := cluster.engine_counters(endpoint))[0] - queries0 == 2 * len(ids) else None,
        timeout=60,
        interval=0.05,
    )
    assert hits - hits0 == 6 * BLOCK  # the second prompt's full blocks, none of the first's
