"""The Files API with the official OpenAI SDK: upload, list, retrieve, content, delete;
files kept per tenant; batch input files checked line by line at upload; size limits."""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import openai
import pytest

from shuniu.core.api.batch_input import check_batch_input
from shuniu.core.errors import GatewayError

KEY_A = "sk-shuniu-demo-team-a-not-secret"
KEY_B = "sk-shuniu-demo-team-b-not-secret"
ADMIN = "sk-shuniu-demo-admin-not-secret"
DEPLOYMENT = """
gateway:
  admin_keys: ["sha256:f1852789774b976c91b1136bef38298f395c5c14ea0a5b1ddf45099c306ff22d"]
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
files: {max_file_bytes: 65536, max_batch_lines: 100, options: {dir: stored-files}}
models:
  chat:
    endpoints: [{kind: sim, options: {ttft_ms: 0, tokens_per_s: 0}}]
"""


def _lines(n: int, url: str = "/v1/chat/completions") -> bytes:
    rows = [
        {"custom_id": f"req-{i}", "method": "POST", "url": url,
         "body": {"model": "chat", "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 5}}
        for i in range(n)
    ]  # fmt: skip
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_batch_input_files_are_checked_line_by_line() -> None:
    checked = check_batch_input(_lines(3), 100)
    assert [(n, line.custom_id, line.url) for n, line in checked] == [
        (i + 1, f"req-{i}", "/v1/chat/completions") for i in range(3)
    ]
    bad = b"\n".join(
        [
            b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}',
            b'{"custom_id": "x", "method": "GET", "url": "/v1/images", "body": {"model": "m"}}',
            b"not json",
            b"",
            b'{"custom_id": "y", "method": "POST", "url": "/v1/embeddings", "body": {"stream": true}}',
        ]
    )
    with pytest.raises(GatewayError) as refused:
        check_batch_input(bad, 100)
    message = refused.value.message
    for part in (
        "line 2: custom_id 'x' is used on line 1 too",
        'line 2: method must be "POST"',
        "line 2: url must be one of",
        "line 3: not a JSON object",
        "line 4: empty",
        "line 5: body.model must be a string",
    ):
        assert part in message, part
    assert refused.value.code == "invalid_file" and refused.value.status == 400
    with pytest.raises(GatewayError, match="at most 2"):
        check_batch_input(_lines(3), 2)


def test_files_with_the_openai_sdk(gateway_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(DEPLOYMENT)
    a = openai.OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    b = openai.OpenAI(base_url=gw.base_url, api_key=KEY_B, max_retries=0)
    content = _lines(4)
    made = a.files.create(file=("input.jsonl", io.BytesIO(content)), purpose="batch")
    assert made.id.startswith("file-") and made.bytes == len(content) and made.purpose == "batch"
    assert made.filename == "input.jsonl" and made.status == "processed"
    second = a.files.create(file=("notes.txt", io.BytesIO(b"free text")), purpose="user_data")
    assert [f.id for f in a.files.list()] == [second.id, made.id]  # newest first
    assert [f.id for f in a.files.list(purpose="batch")] == [made.id]
    assert a.files.retrieve(made.id).bytes == len(content)
    assert a.files.content(made.id).read() == content
    # Another tenant sees nothing of it; an admin key sees it.
    assert list(b.files.list()) == []
    with pytest.raises(openai.NotFoundError):
        b.files.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        b.files.content(made.id)
    with pytest.raises(openai.NotFoundError):
        b.files.delete(made.id)
    admin = httpx.get(f"{gw.base_url}/files", headers={"authorization": f"Bearer {ADMIN}"}).json()
    assert {f["id"] for f in admin["data"]} == {made.id, second.id}
    # Stored on disk, under the gateway's working directory, as the deployment says.
    assert (tmp_path / "stored-files" / f"{made.id}.data").read_bytes() == content
    deleted = a.files.delete(made.id)
    assert deleted.deleted and deleted.id == made.id
    with pytest.raises(openai.NotFoundError):
        a.files.retrieve(made.id)
    assert not (tmp_path / "stored-files" / f"{made.id}.data").exists()


def test_bad_uploads_are_refused_with_the_reason(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(DEPLOYMENT)
    a = openai.OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    bad = _lines(2) + b'{"custom_id": "req-0", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    with pytest.raises(openai.BadRequestError) as refused:
        a.files.create(file=("bad.jsonl", io.BytesIO(bad)), purpose="batch")
    body = refused.value.body
    assert isinstance(body, dict) and body["code"] == "invalid_file"
    assert "line 3: custom_id 'req-0' is used on line 1 too" in body["message"]
    assert "line 3: body.model must be a string" in body["message"]
    with pytest.raises(openai.BadRequestError) as refused:
        a.files.create(file=("x.jsonl", io.BytesIO(b"{}")), purpose="nonsense")  # type: ignore[arg-type]
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "purpose"
    with pytest.raises(openai.APIStatusError) as too_big:
        a.files.create(file=("big.txt", io.BytesIO(b"x" * 70_000)), purpose="user_data")
    assert too_big.value.status_code == 413
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.base_url, api_key="sk-wrong", max_retries=0).files.list()
    plain = httpx.post(
        f"{gw.base_url}/files", json={"purpose": "batch"}, headers={"authorization": f"Bearer {KEY_A}"}
    )
    assert plain.status_code == 400 and plain.json()["error"]["code"] == "invalid_request"
    assert list(a.files.list()) == []  # nothing was stored


async def test_the_redis_file_store_keeps_large_files_whole_and_per_id(redis_url: str) -> None:
    from shuniu.core.contracts import StoredFile
    from shuniu.plugins.files.redis_store import RedisFileStore, RedisFileStoreOptions

    store = RedisFileStore(RedisFileStoreOptions(url=redis_url, chunk_bytes=64 * 1024))
    other = RedisFileStore(RedisFileStoreOptions(url=redis_url, chunk_bytes=64 * 1024))
    try:
        big = bytes(range(256)) * 1000 + b"tail"  # four chunks and a bit
        record = StoredFile(
            id="file-big", tenant="t", filename="b", purpose="batch", bytes=len(big), created_at=1
        )
        await store.put(record, big)
        await store.put(
            StoredFile(id="file-empty", tenant="t", filename="e", purpose="batch", bytes=0, created_at=2), b""
        )
        assert await other.content("file-big") == big and await other.content("file-empty") == b""
        assert await other.get("file-big") == record
        assert sorted(f.id for f in await other.list()) == ["file-big", "file-empty"]
        assert await other.delete("file-big") and not await other.delete("file-big")
        assert await store.content("file-big") is None and await store.get("file-big") is None
        assert await store.content("file-nope") is None
    finally:
        await store.close()
        await other.close()
