"""The pooling APIs (``/v1/embeddings``, ``/v1/rerank``, ``/v1/score``) end to end: the
official ``openai`` SDK (and plain HTTP for the rerank shapes it has no method for) against
``shuniu serve`` processes with simulated pooling models: the built-in quickstart, and a
deployment with keys, a token limit, the response cache and a model split over replicas."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from shuniu.plugins.auth.api_keys import hash_key
from tests.conftest import GatewayProcess, start_gateway, wait_until


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """``shuniu serve`` with no file: it serves ``embed`` and ``rerank`` beside chat."""
    gw = start_gateway(None, tmp_path_factory.mktemp("quickstart"))
    yield gw
    gw.stop()


def _client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)


def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (_norm(a) * _norm(b))


def _error(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"}, body
    return body["error"]  # type: ignore[no-any-return]


# -- embeddings ----------------------------------------------------------------------------


def test_embeddings_of_strings_with_the_sdk(quickstart: GatewayProcess) -> None:
    client = _client(quickstart.url)
    texts = ["the quick brown fox", "a quick brown dog", "tax law of 1998"]
    resp = client.embeddings.create(model="embed", input=texts, encoding_format="float")
    assert resp.object == "list" and resp.model == "embed"
    assert [d.index for d in resp.data] == [0, 1, 2]
    vectors = [d.embedding for d in resp.data]
    assert all(len(v) == 384 and abs(_norm(v) - 1) < 1e-6 for v in vectors)
    # Texts sharing words are closer than unrelated ones.
    assert _cos(vectors[0], vectors[1]) > _cos(vectors[0], vectors[2])
    # The usage is the prompt's tokens, counted as every limit counts them.
    assert resp.usage.prompt_tokens == resp.usage.total_tokens > 0

    # Deterministic: the same input gives the same vector, alone or in a list, and a
    # different input a different one.
    again = client.embeddings.create(model="embed", input=texts[1], encoding_format="float")
    assert again.data[0].embedding == vectors[1]
    other = client.embeddings.create(model="embed", input="the quick brown fox.", encoding_format="float")
    assert other.data[0].embedding != vectors[0]


def test_base64_is_the_float_vector_packed(quickstart: GatewayProcess) -> None:
    raw = httpx.post(
        f"{quickstart.url}/v1/embeddings",
        json={"model": "embed", "input": "hello world", "encoding_format": "base64"},
    ).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    unpacked = struct.unpack(f"<{len(packed) // 4}f", packed)
    floats = httpx.post(
        f"{quickstart.url}/v1/embeddings", json={"model": "embed", "input": "hello world"}
    ).json()["data"][0]["embedding"]
    assert len(unpacked) == len(floats) == 384
    assert all(abs(a - b) < 1e-6 for a, b in zip(unpacked, floats, strict=True))
    # The SDK asks for base64 by default and decodes it into the same floats.
    sdk = _client(quickstart.url).embeddings.create(model="embed", input="hello world")
    assert all(abs(a - b) < 1e-6 for a, b in zip(sdk.data[0].embedding, floats, strict=True))


def test_token_id_inputs_and_dimensions(quickstart: GatewayProcess) -> None:
    client = _client(quickstart.url)
    ids = client.embeddings.create(model="embed", input=[[5, 6, 7], [8, 9]], encoding_format="float")
    assert [len(d.embedding) for d in ids.data] == [384, 384]
    assert ids.usage.prompt_tokens == 5  # token ids are counted exactly
    one = client.embeddings.create(model="embed", input=[5, 6, 7], encoding_format="float")
    assert one.data[0].embedding == ids.data[0].embedding and one.usage.prompt_tokens == 3
    short = client.embeddings.create(
        model="embed", input="hello world", dimensions=64, encoding_format="float"
    )
    assert len(short.data[0].embedding) == 64 and abs(_norm(short.data[0].embedding) - 1) < 1e-6
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="embed", input="hello", dimensions=4096)
    assert "384" in str(err.value)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "embed"}, "input", "missing_required_parameter"),
        ({"model": "embed", "input": ""}, "input", "invalid_value"),
        ({"model": "embed", "input": ["a", ""]}, "input[1]", "invalid_value"),
        ({"model": "embed", "input": []}, "input", "invalid_type"),
        ({"model": "embed", "input": [1, "a"]}, "input", "invalid_type"),
        ({"model": "embed", "input": [[1], []]}, "input", "invalid_type"),
        ({"model": "embed", "input": {"text": "a"}}, "input", "invalid_type"),
        ({"model": "embed", "input": "a", "encoding_format": "int8"}, "encoding_format", "invalid_value"),
        ({"model": "embed", "input": "a", "dimensions": 0}, "dimensions", "invalid_value"),
        ({"model": "embed", "input": "a", "stream": True}, "stream", "unsupported_value"),
        ({"model": "embed", "input": ["a"] * 2049}, "input", "too_many_inputs"),
        ({"input": "a"}, "model", "missing_required_parameter"),
        ({"model": "embed", "input": "a " * 9000}, "input[0]", "context_length_exceeded"),
    ],
)
def test_bad_embedding_requests_get_openai_errors(
    quickstart: GatewayProcess, body: dict[str, Any], param: str, code: str
) -> None:
    resp = httpx.post(f"{quickstart.url}/v1/embeddings", json=body)
    assert resp.status_code == 400
    err = _error(resp)
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["code"] == code


def test_apis_go_only_to_models_that_serve_them(quickstart: GatewayProcess) -> None:
    client = _client(quickstart.url)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="quickstart", input="hello")
    assert err.value.code == "model_not_supported"
    assert "does not serve embeddings" in err.value.message and "models that do: embed" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="embed", messages=[{"role": "user", "content": "hi"}])
    assert err.value.code == "model_not_supported" and "quickstart" in err.value.message
    resp = httpx.post(
        f"{quickstart.url}/v1/rerank", json={"model": "embed", "query": "q", "documents": ["d"]}
    )
    assert resp.status_code == 400 and "models that do: rerank" in _error(resp)["message"]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="hello")


# -- rerank and score ------------------------------------------------------------------------


DOCS = ["green pears and plums", "fresh red apples", "the blue sky", "red apples, red cherries"]


def test_rerank_orders_documents_by_relevance(quickstart: GatewayProcess) -> None:
    resp = httpx.post(
        f"{quickstart.url}/v1/rerank", json={"model": "rerank", "query": "red apples", "documents": DOCS}
    )
    assert resp.status_code == 200
    body = resp.json()
    assert (
        body["model"] == "rerank" and body["id"].startswith("rerank-") and body["usage"]["total_tokens"] > 0
    )
    results = body["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2, 3]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert {results[0]["index"], results[1]["index"]} == {1, 3}  # the documents about red apples
    assert all(r["document"]["text"] == DOCS[r["index"]] for r in results)

    # top_n, documents as objects (Cohere's and Jina's form), no documents back, /v2/rerank.
    short = httpx.post(
        f"{quickstart.url}/v2/rerank",
        json={
            "model": "rerank",
            "query": "red apples",
            "documents": [{"text": d} for d in DOCS],
            "top_n": 2,
            "return_documents": False,
        },
    ).json()
    assert short["results"] == [{k: v for k, v in r.items() if k != "document"} for r in results[:2]]


def test_score_one_to_many_and_pairwise(quickstart: GatewayProcess) -> None:
    ranked = httpx.post(
        f"{quickstart.url}/v1/rerank", json={"model": "rerank", "query": "red apples", "documents": DOCS}
    ).json()["results"]
    by_index = {r["index"]: r["relevance_score"] for r in ranked}
    one = httpx.post(
        f"{quickstart.url}/v1/score", json={"model": "rerank", "text_1": "red apples", "text_2": DOCS}
    ).json()
    assert one["object"] == "list" and [d["index"] for d in one["data"]] == [0, 1, 2, 3]
    assert [d["score"] for d in one["data"]] == [by_index[i] for i in range(4)]
    pairs = httpx.post(
        f"{quickstart.url}/v1/score",
        json={"model": "rerank", "text_1": ["blue sky", "red apples"], "text_2": ["the blue sky", "plums"]},
    ).json()
    high, low = (d["score"] for d in pairs["data"])
    assert high > low
    bad = httpx.post(
        f"{quickstart.url}/v1/score",
        json={"model": "rerank", "text_1": ["a", "b"], "text_2": ["x", "y", "z"]},
    )
    assert bad.status_code == 400 and _error(bad)["param"] == "text_1"
    missing = httpx.post(f"{quickstart.url}/v1/rerank", json={"model": "rerank", "query": "q"})
    assert missing.status_code == 400 and _error(missing)["param"] == "documents"


# -- splitting, limits, the cache, metrics -----------------------------------------------------


KEY = "sk-pooling-test-key"
LIMITED = "sk-pooling-limited-key"

SPLIT = f"""
auth:
  authenticators:
    - kind: api_keys
      options:
        keys:
          - {{id: k1, hash: "{hash_key(KEY)}", tenant: acme, tier: default}}
          - {{id: k2, hash: "{hash_key(LIMITED)}", tenant: initech, tier: default, limits: {{tpm: 300}}}}
cache:
  store: memory
  ttl_s: 600
models:
  chat:
    endpoints:
      - {{kind: sim, options: {{ttft_ms: 0, tokens_per_s: 0}}}}
  vectors:
    serves: [embeddings]
    pooling: {{split_inputs: 8}}
    balancer: {{policy: least_requests}}
    health: {{interval_s: 0.05}}
    endpoints:
      - kind: sim
        replicas: 3
        options: {{ttft_ms: 20, embedding_dim: 16}}
"""


@pytest.fixture(scope="module")
def split_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = start_gateway(SPLIT, tmp_path_factory.mktemp("split"))
    yield gw
    gw.stop()


def _completed(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("shuniu_endpoint_completed_total{") and 'model="vectors"' in line:
            endpoint = line.split('endpoint="')[1].split('"')[0]
            out[endpoint] = float(line.rsplit(" ", 1)[1])
    return out


def test_a_long_list_is_split_over_the_replicas_and_reassembled_in_order(
    split_gateway: GatewayProcess,
) -> None:
    client = _client(split_gateway.url, KEY)
    texts = [f"document number {i} about topic {i % 5}" for i in range(40)]
    before = _completed(split_gateway.url)
    resp = client.embeddings.create(
        model="vectors", input=texts, encoding_format="float", extra_headers={"cache-control": "no-store"}
    )
    assert [d.index for d in resp.data] == list(range(40))
    after = _completed(split_gateway.url)
    calls = {e: after.get(e, 0) - before.get(e, 0) for e in after}
    assert sum(calls.values()) == 5  # 40 inputs in engine calls of at most 8
    assert sum(1 for n in calls.values() if n > 0) == 3  # placed on every replica at once
    # Each vector is the one its text gets alone: nothing was reordered.
    for i in (0, 9, 17, 39):
        alone = client.embeddings.create(
            model="vectors",
            input=texts[i],
            encoding_format="float",
            extra_headers={"cache-control": "no-store"},
        )
        assert alone.data[0].embedding == resp.data[i].embedding


def test_keys_token_limits_and_the_cache_apply(split_gateway: GatewayProcess) -> None:
    url = split_gateway.url
    anonymous = httpx.post(f"{url}/v1/embeddings", json={"model": "vectors", "input": "hi"})
    assert anonymous.status_code == 401
    headers = {"authorization": f"Bearer {KEY}"}
    body = {"model": "vectors", "input": ["cache me please", "and me"]}
    first = httpx.post(f"{url}/v1/embeddings", json=body, headers=headers)
    second = httpx.post(f"{url}/v1/embeddings", json=body, headers=headers)
    assert first.status_code == second.status_code == 200
    assert first.headers["x-shuniu-cache"] == "miss" and second.headers["x-shuniu-cache"] == "hit"
    assert second.json() == first.json()
    # The token limit counts embedding tokens: 200 of the key's 300 per minute go on the
    # first request, so the same again is refused.
    big = {"model": "vectors", "input": ["word " * 25] * 8}
    limited = {"authorization": f"Bearer {LIMITED}", "cache-control": "no-store"}
    ok = httpx.post(f"{url}/v1/embeddings", json=big, headers=limited)
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == 200
    refused = httpx.post(f"{url}/v1/embeddings", json=big, headers=limited)
    assert refused.status_code == 429 and _error(refused)["code"] == "rate_limit_exceeded"
    metrics = httpx.get(f"{url}/metrics").text
    assert 'shuniu_requests_total{code="",endpoint=' in metrics and 'model="vectors"' in metrics
    wait_until(lambda: 'shuniu_prompt_tokens_total{model="vectors"' in httpx.get(f"{url}/metrics").text)
