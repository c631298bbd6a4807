"""The ``tei`` backend against ``tests/fake_tei.py``, a fake of Hugging Face
text-embeddings-inference built from its published API (TEI cannot run here): ``/info``,
``/embed`` and ``/rerank`` with their limits and errors, health, the load view from
``/metrics``, and a gateway serving embeddings and rerank from TEI endpoints to the
``openai`` SDK."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest

from shuniu.backends.tei.backend import TeiBackend
from shuniu.backends.tei.metrics import MetricsError, parse_tei_metrics
from shuniu.backends.tei.options import TeiOptions
from shuniu.core.api.pooling import parse_embeddings, parse_rerank, parse_score
from shuniu.core.contracts import EndpointSpec
from shuniu.core.errors import GatewayError
from shuniu.core.types import InferenceRequest
from tests.conftest import GatewayProcess, start_gateway
from tests.fake_tei import FakeTEI


@pytest.fixture
def embedder() -> Iterator[FakeTEI]:
    with FakeTEI(max_client_batch_size=4, max_input_length=64, dim=16) as fake:
        yield fake


@pytest.fixture
def reranker() -> Iterator[FakeTEI]:
    with FakeTEI(kind="reranker", max_client_batch_size=3) as fake:
        yield fake


@pytest.fixture
async def backend(embedder: FakeTEI) -> AsyncIterator[TeiBackend]:
    b = TeiBackend(EndpointSpec("tei-0", "embed", TeiOptions(base_url=embedder.url)))
    await b.start()
    yield b
    await b.stop()


def _embed(body: dict[str, Any]) -> InferenceRequest:
    import msgspec

    return parse_embeddings(msgspec.json.encode({"model": "embed", **body}), "r1", 0.0)


def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


async def test_info_sets_the_limits(backend: TeiBackend) -> None:
    assert backend.max_model_len == 64 and backend.batch_size == 4 and backend.model_kind == "embedding"
    assert (await backend.health()).ok


async def test_embed_splits_to_the_servers_batch_size_and_keeps_order(
    backend: TeiBackend, embedder: FakeTEI
) -> None:
    from shuniu.core.api.pooling import floats_of

    texts = [f"text number {i}" for i in range(10)]
    result = await backend.embed(_embed({"input": texts}))
    embeds = [r for r in embedder.received if r.path == "/embed"]
    assert [len(r.body["inputs"]) for r in embeds] == [4, 4, 2]
    assert all(r.body["normalize"] is True for r in embeds)
    vectors = [floats_of(v) for v in result.vectors]
    assert len(vectors) == 10 and all(len(v) == 16 and abs(_norm(v) - 1) < 1e-5 for v in vectors)
    # Each vector is its text's, alone.
    alone = await backend.embed(_embed({"input": texts[7]}))
    assert floats_of(alone.vectors[0]) == vectors[7]
    # The tokens TEI says it computed (x-compute-tokens): three words each in the fake.
    assert result.prompt_tokens == 30

    ids = await backend.embed(_embed({"input": [[1, 2, 3], [4]]}))
    assert len(ids.vectors) == 2 and embedder.received[-1].body["inputs"] == [[1, 2, 3], [4]]
    short = await backend.embed(_embed({"input": "hello there", "dimensions": 8}))
    assert len(floats_of(short.vectors[0])) == 8 and embedder.received[-1].body["dimensions"] == 8


async def test_teis_refusals_are_the_clients_and_its_failures_are_retried(
    backend: TeiBackend, embedder: FakeTEI
) -> None:
    with pytest.raises(GatewayError) as err:
        await backend.embed(_embed({"input": "word " * 100}))
    assert err.value.status == 413 and "must have less than" in err.value.message
    embedder.fault = "overloaded"
    with pytest.raises(GatewayError) as err:
        await backend.embed(_embed({"input": "hi"}))
    assert err.value.status == 502 and "429" in err.value.message  # another replica may take it
    embedder.fault = "backend_error"
    with pytest.raises(GatewayError) as err:
        await backend.embed(_embed({"input": "hi"}))
    assert err.value.status == 502 and "424" in err.value.message
    embedder.fault = "unhealthy"
    assert not (await backend.health()).ok
    embedder.fault = None
    assert (await backend.health()).ok


async def test_rerank_and_pairwise_scores(reranker: FakeTEI) -> None:
    import msgspec

    b = TeiBackend(EndpointSpec("tei-r", "rerank", TeiOptions(base_url=reranker.url)))
    await b.start()
    try:
        assert b.model_kind == "reranker"
        docs = ["red apples", "blue sky", "red apples and pears", "sky", "apples"]
        req = parse_rerank(
            msgspec.json.encode({"model": "m", "query": "red apples", "documents": docs}), "r", 0
        )
        scores = (await b.score(req)).scores
        assert [len(r.body["texts"]) for r in reranker.received if r.path == "/rerank"] == [3, 2]
        assert scores[0] > scores[1] and scores[2] > scores[3] and len(scores) == 5
        pairs = parse_score(
            msgspec.json.encode({"model": "m", "text_1": ["sky", "red"], "text_2": ["blue sky", "red car"]}),
            "s",
            0,
        )
        paired = (await b.score(pairs)).scores
        queries = [r.body["query"] for r in reranker.received if r.path == "/rerank"][-2:]
        assert sorted(queries) == ["red", "sky"] and len(paired) == 2
        # An embedding request to a reranker is TEI's 424: the engine cannot serve it.
        with pytest.raises(GatewayError):
            await b.embed(_embed({"input": "x"}))
    finally:
        await b.stop()


async def test_the_load_view_reads_the_queue(embedder: FakeTEI, backend: TeiBackend) -> None:
    idle = await backend.load()
    assert (idle.running, idle.waiting) == (0, 0)

    async def until(want: Any) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not want(snap := await backend.load()):
            assert loop.time() < deadline, snap
            await asyncio.sleep(0.01)
        return snap

    with embedder.holding():
        # The first request's batch is taken and held; what comes after it waits in TEI's queue.
        calls = [asyncio.create_task(backend.embed(_embed({"input": ["a", "b"]})))]
        await until(lambda s: s.running >= 1)
        calls += [asyncio.create_task(backend.embed(_embed({"input": [f"c{i}", f"d{i}"]}))) for i in range(2)]
        busy = await until(lambda s: s.waiting > 0)
        assert busy.waiting == 4 and busy.running == 3
    await asyncio.gather(*calls)
    done = await backend.load()
    assert done.waiting == 0 and done.running == 0


def test_metrics_parsing_rejects_a_page_that_is_not_teis() -> None:
    assert parse_tei_metrics(b"").waiting == 0  # a fresh server records nothing yet
    with pytest.raises(MetricsError):
        parse_tei_metrics(b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n")


# -- a gateway in front of TEI ------------------------------------------------------------


@pytest.fixture(scope="module")
def tei_gateway(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[GatewayProcess, FakeTEI, FakeTEI]]:
    key = "tei-secret"
    with (
        FakeTEI(api_key=key, dim=24) as one,
        FakeTEI(api_key=key, dim=24) as two,
        FakeTEI(kind="reranker", api_key=key) as ranker,
    ):
        config = f"""
        models:
          bge:
            serves: [embeddings]
            pooling: {{split_inputs: 16}}
            endpoints:
              - {{kind: tei, options: {{base_url: "{one.url}", api_key: "{key}"}}}}
              - {{kind: tei, options: {{base_url: "{two.url}/v1", api_key: "{key}"}}}}
          reranker:
            serves: [rerank]
            endpoints:
              - {{kind: tei, options: {{base_url: "{ranker.url}", api_key: "{key}"}}}}
        """
        gw = start_gateway(config, tmp_path_factory.mktemp("tei"))
        try:
            yield gw, one, two
        finally:
            gw.stop()


def test_embeddings_and_rerank_through_the_gateway(
    tei_gateway: tuple[GatewayProcess, FakeTEI, FakeTEI],
) -> None:
    gw, one, two = tei_gateway
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    texts = [f"sentence {i} on subject {i % 3}" for i in range(40)]
    resp = client.embeddings.create(model="bge", input=texts)  # base64, converted by the gateway
    assert [d.index for d in resp.data] == list(range(40))
    assert all(len(d.embedding) == 24 and abs(_norm(d.embedding) - 1) < 1e-5 for d in resp.data)
    assert resp.usage.prompt_tokens == sum(len(t.split()) for t in texts)  # TEI's own count
    # The 40 inputs went to both replicas (parts of 16, and TEI batches of 32 within them).
    assert any(r.path == "/embed" for r in one.received) and any(r.path == "/embed" for r in two.received)
    ready = httpx.get(f"{gw.url}/ready").json()
    assert ready["models"]["bge"]["healthy_endpoints"] == 2

    ranked = httpx.post(
        f"{gw.url}/v1/rerank",
        json={"model": "reranker", "query": "subject 1", "documents": texts[:6], "top_n": 2},
    ).json()
    assert [r["index"] for r in ranked["results"]] == [1, 4]
