"""The Batch API with the official OpenAI SDK, on real gateway processes: a batch runs to
its output and error files (each ``custom_id`` once), per tenant; a wrong endpoint fails
validation naming the lines; cancelling; and a gateway killed mid-batch and started again
finishes the batch with every ``custom_id`` exactly once."""

from __future__ import annotations

import io
import json
import signal

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


def test_a_gateway_killed_mid_batch_finishes_it_after_a_restart(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    config = _deployment(tokens_per_s=100, batches="{poll_interval_s: 0.05, concurrency: 2, lease_s: 1}")
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
    ran = [
        float(line.rsplit(" ", 1)[1])
        for gw in (one, two)
        for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines()
        if line.startswith('shuniu_batch_requests_finished_total{outcome="done"}')
    ]
    assert sum(ran) == 16 and all(n > 0 for n in ran)  # both gateways worked on it, none twice
    output = _jsonl(seen_on_two.files.content(done.output_file_id).read())
    assert sorted(o["custom_id"] for o in output) == sorted(f"req-{i}" for i in range(16))


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
