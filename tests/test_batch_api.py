"""The Batch API with the official OpenAI SDK, on real gateway processes: a batch runs to
its output and error files (each ``custom_id`` once), per tenant; a wrong endpoint fails
validation naming the lines; cancelling; and a gateway killed mid-batch and started again
finishes the batch with every ``custom_id`` exactly once."""

from __future__ import annotations

import io
import json
import signal
import socket

import httpx
import openai
import pytest

from tests.conftest import wait_until

KEY_A = "sk-shuniu-demo-team-a-not-secret"
KEY_B = "sk-shuniu-demo-team-b-not-secret"


def _deployment(tokens_per_s: int = 0, batches: str = "{poll_interval_s: 0.05}") -> str:
    return f"""
auth:
  authenticators:
    - kind: api_keys
      options:
        keys:
          - id: a
            tenant: team-a
            hash: "sha256:147a7f176cd43c982bcb8872b196e18766eb47442f8b2a6361aa3d44f74540f5"
          - id: b
            tenant: team-b
            hash: "sha256:78eaaf08943b3698e1dd3e63ee4ed76af2324aa0769ba1debf6b678f557ac4b6"
batches: {batches}
models:
  chat:
    endpoints:
      - kind: sim
        max_concurrency: 4
        options: {{ttft_ms: 0, tokens_per_s: {tokens_per_s}, output_tokens_min: 5, output_tokens_max: 9}}
  embed:
    serves: [embeddings]
    endpoints: [{{kind: sim, options: {{ttft_ms: 0, embedding_dim: 8}}}}]
"""


def _line(i: int, model: str = "chat", url: str = "/v1/chat/completions", max_tokens: int = 5) -> dict:  # type: ignore[type-arg]
    if url == "/v1/embeddings":
        body = {"model": model, "input": f"text {i}"}
    else:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"hello {i}"}],
            "max_tokens": max_tokens,
        }
    return {"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}


def _file(lines: list[dict]) -> io.BytesIO:  # type: ignore[type-arg]
    return io.BytesIO("".join(json.dumps(x) + "\n" for x in lines).encode())


def _jsonl(data: bytes) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def _ran_here(gw) -> float:  # type: ignore[no-untyped-def]
    """Batch requests this gateway ran to an answer (its own metric)."""
    prefix = 'shuniu_batch_requests_finished_total{outcome="done"}'
    metrics = httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics if line.startswith(prefix))


def _done(client: openai.OpenAI, batch_id: str, timeout: float = 30):  # type: ignore[no-untyped-def]
    return wait_until(
        lambda: (
            (b := client.batches.retrieve(batch_id)).status in ("completed", "failed", "expired", "cancelled")
            and b
        ),
        timeout=timeout,
    )


def test_a_batch_runs_to_its_output_and_error_files(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deployment())
    a = openai.OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    b = openai.OpenAI(base_url=gw.base_url, api_key=KEY_B, max_retries=0)
    lines = [_line(i) for i in range(6)] + [_line(6, model="no-such-model")]
    upload = a.files.create(file=("in.jsonl", _file(lines)), purpose="batch")
    batch = a.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "1"},
    )
    assert batch.status == "validating" and batch.metadata == {"run": "1"}
    done = _done(a, batch.id)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (7, 6, 1)
    assert done.completed_at is not None and done.in_progress_at is not None
    assert done.output_file_id and done.error_file_id
    output = _jsonl(a.files.content(done.output_file_id).read())
    assert [o["custom_id"] for o in output] == [f"req-{i}" for i in range(6)]
    for o in output:
        assert o["response"]["status_code"] == 200 and o["error"] is None
        body = o["response"]["body"]
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] <= 5
        assert o["response"]["request_id"].startswith("batch_req_")
    errors = _jsonl(a.files.content(done.error_file_id).read())
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("req-6", 404)]
    assert errors[0]["response"]["body"]["error"]["code"] == "model_not_found"
    # The output files are the tenant's; the other tenant sees no batch and no file.
    assert a.files.retrieve(done.output_file_id).purpose == "batch_output"
    assert [x.id for x in a.batches.list()] == [batch.id]
    assert list(b.batches.list()) == []
    with pytest.raises(openai.NotFoundError):
        b.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        b.files.content(done.output_file_id)
    with pytest.raises(openai.NotFoundError):
        b.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    # The requests ran in the batch tier, counted like any request.
    metrics = httpx.get(f"{gw.url}/metrics", timeout=10).text
    assert 'shuniu_batch_requests_finished_total{outcome="done"} 6.0' in metrics
    assert 'shuniu_batch_requests_finished_total{outcome="failed"} 1.0' in metrics


def test_an_embeddings_batch_and_a_wrong_endpoint(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deployment())
    a = openai.OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    embeds = a.files.create(
        file=("e.jsonl", _file([_line(i, "embed", "/v1/embeddings") for i in range(3)])), purpose="batch"
    )
    done = _done(
        a, a.batches.create(input_file_id=embeds.id, endpoint="/v1/embeddings", completion_window="1h").id
    )
    assert (
        done.status == "completed" and done.request_counts is not None and done.request_counts.completed == 3
    )
    vectors = _jsonl(a.files.content(done.output_file_id).read())
    assert all(len(v["response"]["body"]["data"][0]["embedding"]) == 8 for v in vectors)
    chats = a.files.create(file=("c.jsonl", _file([_line(0), _line(1)])), purpose="batch")
    failed = _done(
        a, a.batches.create(input_file_id=chats.id, endpoint="/v1/embeddings", completion_window="24h").id
    )
    assert failed.status == "failed" and failed.errors is not None and failed.errors.data
    assert [(e.code, e.line) for e in failed.errors.data] == [
        ("mismatched_endpoint", 1),
        ("mismatched_endpoint", 2),
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        a.batches.create(input_file_id=chats.id, endpoint="/v1/chat/completions", completion_window="2d")  # type: ignore[arg-type]
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "completion_window"
    notes = a.files.create(file=("n.txt", io.BytesIO(b"x")), purpose="user_data")
    with pytest.raises(openai.BadRequestError):
        a.batches.create(input_file_id=notes.id, endpoint="/v1/chat/completions", completion_window="24h")


def test_cancelling_a_batch_keeps_what_ran(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deployment(tokens_per_s=50, batches="{poll_interval_s: 0.05, concurrency: 1}"))
    a = openai.OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    upload = a.files.create(
        file=("in.jsonl", _file([_line(i, max_tokens=20) for i in range(30)])), purpose="batch"
    )
    batch = a.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_until(
        lambda: (c := a.batches.retrieve(batch.id).request_counts) is not None and c.completed >= 1,
        timeout=30,
    )
    # The status page's data shows the queue's counts while it is unfinished.
    status = httpx.get(
        f"{gw.url}/status.json", headers={"authorization": f"Bearer {KEY_A}"}, timeout=10
    ).json()
    assert status["batches"]["batches"].get("in_progress") == 1
    assert status["batches"]["requests"]["pending"] >= 1
    cancelling = a.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = _done(a, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert done.request_counts is not None and done.request_counts.total == 30
    answered = _jsonl(a.files.content(done.output_file_id).read()) if done.output_file_id else []
    cancelled = _jsonl(a.files.content(done.error_file_id).read())
    assert len(answered) >= 1 and len(answered) + len(cancelled) == 30
    assert {c["error"]["code"] for c in cancelled} == {"batch_cancelled"}
    assert sorted(x["custom_id"] for x in answered + cancelled) == sorted(f"req-{i}" for i in range(30))
    with pytest.raises(openai.ConflictError):
        a.batches.cancel(batch.id)


def _on_redis(config: str, redis_url: str) -> str:
    """``config`` with its queue in Redis Streams and its files in Redis (a fleet's setup)."""
    return config.replace(
        "batches: {",
        f'files: {{store: redis, options: {{url: "{redis_url}"}}}}\nbatches: {{database: "{redis_url}", ',
    )


@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_a_gateway_killed_mid_batch_finishes_it_after_a_restart(gateway_factory, queue: str, request) -> None:  # type: ignore[no-untyped-def]
    config = _deployment(tokens_per_s=100, batches="{poll_interval_s: 0.05, concurrency: 2, lease_s: 1}")
    if queue == "redis":
        config = _on_redis(config, request.getfixturevalue("redis_url"))
    gw = gateway_factory(config)
    a = openai.OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    upload = a.files.create(
        file=("in.jsonl", _file([_line(i, max_tokens=10) for i in range(24)])), purpose="batch"
    )
    batch = a.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_until(
        lambda: (c := a.batches.retrieve(batch.id).request_counts) is not None and c.completed >= 4,
        timeout=30,
    )
    gw.stop(signal.SIGKILL)  # no graceful anything: two requests die with it, leased
    again = gateway_factory(config)
    client = openai.OpenAI(base_url=again.base_url, api_key=KEY_A, max_retries=0)
    done = _done(client, batch.id, timeout=60)
    assert done.status == "completed"
    assert done.request_counts is not None and done.request_counts.completed == 24
    output = _jsonl(client.files.content(done.output_file_id).read())
    assert [o["custom_id"] for o in output] == [f"req-{i}" for i in range(24)]  # each exactly once
    assert done.error_file_id is None


def test_two_gateways_share_one_queue_in_postgres(gateway_factory, postgres_url: str) -> None:  # type: ignore[no-untyped-def]
    config = _deployment(
        tokens_per_s=200, batches=f'{{poll_interval_s: 0.05, concurrency: 2, database: "{postgres_url}"}}'
    ).replace("batches:", "files: {options: {dir: shared-files}}\nbatches:")
    one, two = gateway_factory(config), gateway_factory(config)  # one working directory: one file folder
    a = openai.OpenAI(base_url=one.base_url, api_key=KEY_A, max_retries=0)
    upload = a.files.create(
        file=("in.jsonl", _file([_line(i, max_tokens=8) for i in range(16)])), purpose="batch"
    )
    batch = a.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    seen_on_two = openai.OpenAI(base_url=two.base_url, api_key=KEY_A, max_retries=0)
    done = _done(seen_on_two, batch.id)
    assert (
        done.status == "completed" and done.request_counts is not None and done.request_counts.completed == 16
    )
    ran = [_ran_here(gw) for gw in (one, two)]
    assert sum(ran) == 16 and all(n > 0 for n in ran)  # both gateways worked on it, none twice
    output = _jsonl(seen_on_two.files.content(done.output_file_id).read())
    assert sorted(o["custom_id"] for o in output) == sorted(f"req-{i}" for i in range(16))


def test_two_gateways_share_one_queue_and_the_files_in_redis(gateway_factory, redis_url: str) -> None:  # type: ignore[no-untyped-def]
    config = _on_redis(
        _deployment(tokens_per_s=200, batches="{poll_interval_s: 0.05, concurrency: 2}"), redis_url
    )
    one, two = gateway_factory(config), gateway_factory(config)
    a_one = openai.OpenAI(base_url=one.base_url, api_key=KEY_A, max_retries=0)
    a_two = openai.OpenAI(base_url=two.base_url, api_key=KEY_A, max_retries=0)
    b_two = openai.OpenAI(base_url=two.base_url, api_key=KEY_B, max_retries=0)
    upload = a_one.files.create(
        file=("in.jsonl", _file([_line(i, max_tokens=8) for i in range(20)])), purpose="batch"
    )
    assert a_two.files.retrieve(upload.id).bytes == upload.bytes  # uploaded to one, seen on two
    with pytest.raises(openai.NotFoundError):
        b_two.files.retrieve(upload.id)
    batch = a_two.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert [b.id for b in a_one.batches.list()] == [batch.id] and list(b_two.batches.list()) == []
    done = _done(a_one, batch.id)
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (20, 20)
    ran = [_ran_here(gw) for gw in (one, two)]
    assert sum(ran) == 20 and all(n > 0 for n in ran)  # both gateways worked on it, none twice
    output = _jsonl(a_two.files.content(done.output_file_id).read())
    assert [o["custom_id"] for o in output] == [f"req-{i}" for i in range(20)]
    assert {o["response"]["status_code"] for o in output} == {200}
    # A second batch, cancelled on the other gateway.
    slow = a_one.files.create(
        file=("slow.jsonl", _file([_line(i, max_tokens=60) for i in range(40)])), purpose="batch"
    )
    second = a_one.batches.create(
        input_file_id=slow.id, endpoint="/v1/chat/completions", completion_window="1h"
    )
    wait_until(lambda: a_two.batches.retrieve(second.id).status == "in_progress", timeout=30)
    a_two.batches.cancel(second.id)
    cancelled = _done(a_one, second.id)
    assert cancelled.status == "cancelled" and cancelled.request_counts is not None
    assert cancelled.request_counts.total == 40
    lines = _jsonl(a_one.files.content(cancelled.error_file_id).read())
    if cancelled.output_file_id:
        lines += _jsonl(a_one.files.content(cancelled.output_file_id).read())
    assert sorted(x["custom_id"] for x in lines) == sorted(f"req-{i}" for i in range(40))
    a_two.files.delete(upload.id)
    with pytest.raises(openai.NotFoundError):
        a_one.files.content(upload.id)


def test_a_batch_reaches_only_the_models_its_callers_tier_allows(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    config = (
        _deployment()
        .replace("tenant: team-b\n", "tenant: team-b\n            tier: small\n")
        .replace("batches:", "tiers:\n  small: {models: [chat]}\nbatches:")
    )
    gw = gateway_factory(config)
    b = openai.OpenAI(base_url=gw.base_url, api_key=KEY_B, max_retries=0)
    with pytest.raises(openai.NotFoundError):  # interactively: not for this tier
        b.embeddings.create(model="embed", input="x")
    lines = [_line(0), _line(1, "embed", "/v1/embeddings")]
    chats = b.files.create(file=("c.jsonl", _file(lines[:1])), purpose="batch")
    embeds = b.files.create(file=("e.jsonl", _file(lines[1:])), purpose="batch")
    ok = _done(
        b,
        b.batches.create(input_file_id=chats.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )
    assert ok.request_counts is not None and ok.request_counts.completed == 1
    refused = _done(
        b, b.batches.create(input_file_id=embeds.id, endpoint="/v1/embeddings", completion_window="24h").id
    )
    assert refused.request_counts is not None and refused.request_counts.failed == 1
    errors = _jsonl(b.files.content(refused.error_file_id).read())
    assert errors[0]["response"]["status_code"] == 404


def test_an_unreachable_queue_or_file_store_answers_503_not_500(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    gw = gateway_factory(_on_redis(_deployment(), dead))
    a = openai.OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    with pytest.raises(openai.APIStatusError) as upload:
        a.files.create(file=("in.jsonl", _file([_line(0)])), purpose="batch")
    with pytest.raises(openai.APIStatusError) as listing:
        a.batches.list()
    for err, code in ((upload, "file_store_unavailable"), (listing, "batch_queue_unavailable")):
        assert err.value.status_code == 503 and err.value.response.headers["retry-after"] == "5"
        assert err.value.response.json()["error"]["code"] == code
    assert a.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}]).choices
