"""Whether a gateway's ``precise_prefix`` index agrees with its engines, measured from outside:
the gateway's ``/metrics`` against each engine's own (vLLM's names: ``shuniu sim serve`` and a
real vLLM both export them). Shared by tests/test_kv_events.py (simulated engines) and
tests/test_kv_events_real.py (real vLLM).

Requests go one at a time, each stopping after one token (so an engine stores exactly the
full blocks of the prompt), and after each the gateway's index must hold exactly the blocks
each engine stored before the next is sent: every prediction is then made from the events.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import openai

from shuniu.backends.vllm.metrics import parse_vllm_metrics
from tests.conftest import wait_until

__all__ = ["Cluster", "Sent", "exactness_scenario", "system_prompt", "table"]

Messages = list[dict[str, str]]

WORDS = (
    "gateway engine token prefix cache block route balance queue stream tenant model server "
    "request answer latency 网关 引擎 缓存 前缀 路由 调度 队列 模型"
).split()


def system_prompt(group: int, words: int) -> str:
    """A system prompt of about ``words`` words, the same for the same ``group``, and another
    group's from its first words on (so groups share no block)."""
    rng = random.Random(group)
    return " ".join(rng.choice(WORDS) for _ in range(words)) + f" (assistant {group})"


@dataclass
class Sent:
    endpoint: str
    prompt_tokens: int
    expected: int
    """Tokens the balancer expected the engine to hold (``shuniu_prefix_expected_hits_total``)."""
    hits: int
    """Tokens the engine found in its prefix cache (``vllm:prefix_cache_hits_total``)."""


def table(sent: list[Sent]) -> str:
    rows = (f"  {s.endpoint}: prompt {s.prompt_tokens}, expected {s.expected}, engine {s.hits}" for s in sent)
    return "\n".join(rows)


@dataclass
class Cluster:
    """A gateway routing ``model`` with ``precise_prefix`` over engines that publish events."""

    gateway_url: str
    engines: dict[str, int]
    """Endpoint name → the engine's HTTP port on 127.0.0.1."""
    ids: Callable[[Messages], list[int]]
    """A chat's prompt token ids as the engines compute them."""
    block: int
    model: str = "chat"
    stored: dict[str, set[tuple[int, ...]]] = field(default_factory=dict)
    """The blocks each engine stored, as the token ids up to each block's end."""

    def __post_init__(self) -> None:
        for name in self.engines:
            self.stored.setdefault(name, set())

    def gateway_metrics(self) -> dict[tuple[str, str], float]:
        """(sample name, endpoint) → value, for ``model``'s per-endpoint samples."""
        text = httpx.get(f"{self.gateway_url}/metrics", timeout=30).text
        out: dict[tuple[str, str], float] = {}
        for line in text.splitlines():
            if line.startswith("#") or f'model="{self.model}"' not in line:
                continue
            name, _, rest = line.partition("{")
            labels, _, value = rest.rpartition("} ")
            for part in labels.split(","):
                key, _, val = part.partition("=")
                if key == "endpoint":
                    out[(name, val.strip('"'))] = float(value)
        return out

    def engine_counters(self, endpoint: str) -> tuple[int, int]:
        """(prefix-cache queries, hits) in tokens, from the engine's own /metrics."""
        page = httpx.get(
            f"http://127.0.0.1:{self.engines[endpoint]}/metrics",
            headers={"accept-encoding": "identity"},
            timeout=30,
        ).content
        m = parse_vllm_metrics(page)
        return int(m.prefix_queries or 0), int(m.prefix_hits or 0)

    def indexed(self) -> bool:
        """Whether the index holds as many blocks of each engine as the engine stored."""
        seen = self.gateway_metrics()
        return all(seen.get(("shuniu_kv_index_blocks", e)) == len(s) for e, s in self.stored.items())

    def send(self, client: openai.OpenAI, messages: Messages) -> Sent:
        """One chat request, then wait until its engine counted it and the gateway's index
        holds exactly what the engines stored."""
        ids = self.ids(messages)
        before = {e: self.engine_counters(e) for e in self.engines}
        expected_before = self.gateway_metrics()
        reply = client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=1, temperature=0, extra_body={"ignore_eos": True}
        )  # type: ignore[call-overload]
        assert reply.usage is not None and reply.usage.prompt_tokens == len(ids)

        def counted() -> tuple[str, int] | None:
            for e in self.engines:
                queries, hits = self.engine_counters(e)
                if queries - before[e][0] == len(ids):
                    return e, hits - before[e][1]
            return None

        endpoint, hits = wait_until(counted, timeout=60, interval=0.05)
        self.stored[endpoint] |= {tuple(ids[: (k + 1) * self.block]) for k in range(len(ids) // self.block)}
        key = ("shuniu_prefix_expected_hits_total", endpoint)
        expected = int(self.gateway_metrics().get(key, 0) - expected_before.get(key, 0))
        wait_until(self.indexed, timeout=30, interval=0.05)  # this prefill's events arrived
        return Sent(endpoint, len(ids), expected, hits)


def exactness_scenario(cluster: Cluster, client: openai.OpenAI) -> list[Sent]:
    """Three assistants of different lengths, three questions each (the groups' first requests
    land on different engines: equal costs rotate), then each group once more, shuffled."""
    groups = {g: system_prompt(g, words) for g, words in enumerate((180, 260, 120))}
    order = [(g, q) for g in groups for q in range(3)]
    tail = [(g, 3) for g in groups]
    random.Random(7).shuffle(tail)
    sent = []
    for g, q in order + tail:
        messages = [
            {"role": "system", "content": groups[g]},
            {"role": "user", "content": f"question {q}: " + system_prompt(100 + q, 6)},
        ]
        sent.append(cluster.send(client, messages))
    return sent
