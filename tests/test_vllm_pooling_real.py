"""Embeddings, rerank and score through the ``vllm`` backend against a REAL vLLM server: the
CPU build serving the tiny Llama of ``tests/tiny_model.py`` as a pooling model
(``--runner pooling --convert embed``: last-token pooling, normalised; vLLM scores pairs of
an embedding model by cosine similarity). Opt-in like ``tests/test_vllm_real.py``
(``SHUNIU_REAL_VLLM=1`` and the vLLM CPU virtualenv); about 20 s to start.

Vectors and scores are the engine's: the tests compare what the gateway answers with what
the same server answers directly, in order, across split requests and both encodings."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.test_vllm_real import Server, serve_vllm
from tests.test_vllm_real import pytestmark as _real_vllm_marks

pytestmark = _real_vllm_marks
SERVED = "tiny-embed"


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = ["--served-model-name", SERVED, "--runner", "pooling", "--convert", "embed"]
    args += ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]
    with serve_vllm(args, tmp_path_factory.mktemp("vllm-embed") / "server.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def gw(embed_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.conftest import start_gateway

    config = f"""
    models:
      embed:
        serves: [embeddings, rerank]
        pooling: {{split_inputs: 3}}
        load: {{interval_s: 0.2}}
        endpoints:
          - {{kind: vllm, replicas: 2, options: {{base_url: "{embed_server.url}/v1", model: {SERVED}}}}}
    """
    server = start_gateway(config, tmp_path_factory.mktemp("vllm-pooling-gw"))
    yield server
    server.stop()


def _direct(server: Server, route: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = httpx.post(f"{server.url}/v1/{route}", json={"model": SERVED, **body}, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def test_embeddings_are_the_engines_in_order(gw: Any, embed_server: Server) -> None:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=60)
    texts = [f"sentence number {i} about the river and the mountain" for i in range(8)]
    resp = client.embeddings.create(model="embed", input=texts, encoding_format="float")
    direct = _direct(embed_server, "embeddings", {"input": texts})
    assert [d.embedding for d in resp.data] == [d["embedding"] for d in direct["data"]]
    assert resp.usage.prompt_tokens == direct["usage"]["prompt_tokens"]  # vLLM's own count, summed
    assert resp.model == "embed"

    # The SDK's default, base64: asked of vLLM and passed on; the same floats.
    packed = client.embeddings.create(model="embed", input=texts[:2])
    for got, want in zip(packed.data, direct["data"][:2], strict=True):
        assert all(abs(a - b) < 1e-6 for a, b in zip(got.embedding, want["embedding"], strict=True))
    raw = httpx.post(
        f"{gw.url}/v1/embeddings", json={"model": "embed", "input": texts[0], "encoding_format": "base64"}
    ).json()
    data = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(data) // 4}f", data)) == pytest.approx(
        direct["data"][0]["embedding"], abs=1e-6
    )

    ids = client.embeddings.create(model="embed", input=[[11, 12, 13], [14, 15]], encoding_format="float")
    assert ids.usage.prompt_tokens == 5 and len(ids.data) == 2


def test_the_engines_refusals_reach_the_client(gw: Any) -> None:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as err:  # the tiny model is not a Matryoshka model
        client.embeddings.create(model="embed", input="hello", dimensions=8)
    assert "dimensions" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:  # longer than its 512-token window
        client.embeddings.create(model="embed", input="word " * 600)
    assert err.value.code == "context_length_exceeded"


def test_rerank_and_score_are_the_engines(gw: Any, embed_server: Server) -> None:
    docs = ["the river runs to the sea", "stock market report", "a mountain river", "bread recipe", "sea"]
    ours = httpx.post(
        f"{gw.url}/v1/rerank",
        json={"model": "embed", "query": "river", "documents": docs, "top_n": 3},
        timeout=60,
    ).json()
    theirs = _direct(embed_server, "rerank", {"query": "river", "documents": docs})
    want = sorted(theirs["results"], key=lambda r: -r["relevance_score"])[:3]
    assert [r["index"] for r in ours["results"]] == [r["index"] for r in want]
    assert [r["relevance_score"] for r in ours["results"]] == pytest.approx(
        [r["relevance_score"] for r in want]
    )
    assert all(r["document"]["text"] == docs[r["index"]] for r in ours["results"])

    pairs = {"text_1": ["river", "bread"], "text_2": ["a mountain river", "stock market report"]}
    got = httpx.post(f"{gw.url}/v1/score", json={"model": "embed", **pairs}, timeout=60).json()
    direct = _direct(embed_server, "score", pairs)
    assert [d["score"] for d in got["data"]] == pytest.approx([d["score"] for d in direct["data"]])


def test_the_load_view_of_a_pooling_server(gw: Any) -> None:
    ready = httpx.get(f"{gw.url}/ready").json()
    endpoints = ready["models"]["embed"]["endpoints"]
    assert len(endpoints) == 2 and all(e["healthy"] and e["load"] is not None for e in endpoints)
    assert ready["models"]["embed"]["healthy_endpoints"] == 2
