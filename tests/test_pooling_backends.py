"""Pooling requests through the HTTP backends, and the deployment checks that keep them
where they can be served.

The ``openai`` backend is driven against an OpenAI-compatible pooling server written here,
which answers ``/v1/embeddings``, ``/v1/rerank`` and ``/v1/score`` in the shapes vLLM's
OpenAI server uses (its ``EmbeddingResponse``, ``RerankResponse`` and ``ScoreResponse``);
the real vLLM build is driven in ``tests/test_vllm_real.py``."""

from __future__ import annotations

import base64
import struct
import textwrap
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from shuniu.core.config.loader import load_deployment
from shuniu.core.errors import ConfigError
from shuniu.core.plugin_manager import load_plugins
from tests.conftest import GatewayProcess, start_gateway
from tests.threaded_app import ThreadedApp


def _vector(text: str) -> list[float]:
    """A vector that says which text it belongs to: its length, and its first letters."""
    return [float(len(text)), *(float(ord(c)) for c in text[:3].ljust(3))]


class PoolingUpstream(ThreadedApp):
    """Embeddings (vectors from :func:`_vector`, in reverse index order on the wire, as a
    server may send them), rerank (scores: the share of the query's words in the document,
    results sorted) and score. Keeps every body it received."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[tuple[str, dict[str, Any]]] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/v1/rerank", self.rerank)
        app.router.add_post("/v1/score", self.score)

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(("embeddings", body))
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if any(i == "fail" for i in inputs):
            return web.json_response(
                {"error": {"message": "bad input", "type": "BadRequestError", "code": 400}}, status=400
            )
        data = []
        for i, text in enumerate(inputs):
            vector = _vector(text)
            embedding: Any = vector
            if body.get("encoding_format") == "base64":
                embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"index": i, "object": "embedding", "embedding": embedding})
        usage = {"prompt_tokens": 10 * len(inputs), "total_tokens": 10 * len(inputs)}
        return web.json_response(
            {
                "id": "embd-1",
                "object": "list",
                "created": 1,
                "model": body["model"],
                "data": data[::-1],
                "usage": usage,
            }
        )

    @staticmethod
    def _relevance(query: str, doc: str) -> float:
        words = query.split()
        return sum(w in doc.split() for w in words) / len(words)

    async def rerank(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(("rerank", body))
        scored = [(i, self._relevance(body["query"], d)) for i, d in enumerate(body["documents"])]
        scored.sort(key=lambda p: -p[1])
        results = [
            {"index": i, "document": {"text": body["documents"][i]}, "relevance_score": s}
            for i, s in scored[: body.get("top_n") or len(scored)]
        ]
        return web.json_response(
            {"id": "rerank-1", "model": body["model"], "usage": {"total_tokens": 7}, "results": results}
        )

    async def score(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(("score", body))
        pairs = zip(body["text_1"], body["text_2"], strict=True)
        data = [
            {"index": i, "object": "score", "score": self._relevance(q, d)} for i, (q, d) in enumerate(pairs)
        ]
        usage = {"prompt_tokens": 5, "total_tokens": 5, "completion_tokens": 0}
        return web.json_response(
            {"id": "score-1", "object": "list", "model": body["model"], "data": data, "usage": usage}
        )


@pytest.fixture(scope="module")
def upstream() -> Iterator[PoolingUpstream]:
    server = PoolingUpstream().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gw(upstream: PoolingUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = f"""
    models:
      embedder:
        serves: [embeddings, rerank]
        pooling: {{split_inputs: 2}}
        endpoints:
          - kind: openai
            replicas: 2
            options: {{base_url: "{upstream.url}/v1", model: upstream-embedder}}
    """
    server = start_gateway(config, tmp_path_factory.mktemp("pooling-openai"))
    yield server
    server.stop()


def test_embeddings_pass_through_in_input_order(gw: GatewayProcess, upstream: PoolingUpstream) -> None:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    texts = ["alpha", "beta", "gamma", "delta", "epsilon"]
    upstream.bodies.clear()
    resp = client.embeddings.create(model="embedder", input=texts, encoding_format="float", dimensions=4)
    assert [d.embedding for d in resp.data] == [_vector(t) for t in texts]
    assert resp.usage.prompt_tokens == 50  # the engine's own count, summed over the parts
    sent = [body for route, body in upstream.bodies if route == "embeddings"]
    assert sorted(b["input"] for b in sent) == sorted([["alpha", "beta"], ["gamma", "delta"], ["epsilon"]])
    assert all(b["model"] == "upstream-embedder" and b["dimensions"] == 4 for b in sent)

    # base64 is asked of the engine and passed on as it sent it.
    packed = client.embeddings.create(model="embedder", input=texts[:2])
    assert [d.embedding for d in packed.data] == [_vector(t) for t in texts[:2]]
    assert upstream.bodies[-1][1]["encoding_format"] == "base64"


def test_an_engine_refusal_of_one_part_is_the_answer(gw: GatewayProcess) -> None:
    resp = httpx.post(f"{gw.url}/v1/embeddings", json={"model": "embedder", "input": ["a", "b", "fail", "c"]})
    assert resp.status_code == 400 and "bad input" in resp.json()["error"]["message"]


def test_rerank_and_score_through_the_engine(gw: GatewayProcess, upstream: PoolingUpstream) -> None:
    docs = ["red apple pie", "blue sky", "red sky", "apple tree"]
    upstream.bodies.clear()
    ranked = httpx.post(
        f"{gw.url}/v1/rerank", json={"model": "embedder", "query": "red apple", "documents": docs, "top_n": 3}
    ).json()
    assert [r["index"] for r in ranked["results"]] == [0, 2, 3]
    assert [r["relevance_score"] for r in ranked["results"]] == [1.0, 0.5, 0.5]
    sent = [body for route, body in upstream.bodies if route == "rerank"]
    # Split in two, each part asked for all of its documents' scores (top_n is applied after).
    assert sorted(len(b["documents"]) for b in sent) == [2, 2] and all(b["top_n"] == 2 for b in sent)
    assert ranked["usage"]["total_tokens"] == 14

    pairs = httpx.post(
        f"{gw.url}/v1/score",
        json={"model": "embedder", "text_1": ["red", "sky"], "text_2": ["red sky", "tree"]},
    ).json()
    assert [d["score"] for d in pairs["data"]] == [1.0, 0.0]
    assert upstream.bodies[-1][0] == "score"


# -- deployment checks ---------------------------------------------------------------------


def _load(text: str) -> None:
    load_deployment("d.yaml", load_plugins(), text=textwrap.dedent(text), env={})


BASE = """
models:
  chat:
    {chat}
    endpoints: [{{kind: sim}}]
  embed:
    serves: [embeddings]
    {embed}
    endpoints: [{{kind: sim}}]
"""


@pytest.mark.parametrize(
    ("chat", "embed", "message"),
    [
        (
            "routes: [{to: embed, min_prompt_tokens: 100}]",
            "",
            "sends 'chat''s chat and completions requests to 'embed'",
        ),
        ("retries: {fallback: embed}", "", "'embed' does not serve chat or completions"),
        ("", "retries: {fallback: chat}", "'chat' does not serve embeddings"),
        ("serves: [chat, search]", "", "serves"),
    ],
)
def test_validate_refuses_routes_to_models_that_cannot_serve_them(
    chat: str, embed: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _load(BASE.format(chat=chat, embed=embed))
    assert message in str(err.value)


def test_an_engine_kind_without_the_api_is_refused_at_start() -> None:
    from shuniu.core.gateway import Gateway

    text = """
    models:
      embed:
        serves: [embeddings]
        endpoints: [{kind: tgi, options: {base_url: "http://127.0.0.1:9"}}]
    """
    plugins = load_plugins()
    resolved = load_deployment("d.yaml", plugins, text=textwrap.dedent(text), env={})
    with pytest.raises(ConfigError) as err:
        Gateway(resolved, plugins)
    assert "models.embed.endpoints[0].kind" in str(err.value) and "'tgi' do not serve embeddings" in str(
        err.value
    )
