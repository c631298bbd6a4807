"""The batch queue's contract, on both queues — a real SQLite file and a real Redis
(Streams, a consumer group): two gateways never hold one request at once; a dead gateway's
requests are taken again once their lease runs out; a request that ran twice has one
result; a gateway whose request was taken over neither renews nor gives it back; retries
wait and count; a cancel ends what did not run and lets go of a dead gateway's requests;
adding a batch's requests again adds none twice; a status move happens once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from shuniu.core.batch import BatchQueue, BatchRecord, Item, RedisBatchQueue, SqlBatchQueue
from shuniu.core.governance import open_database
from shuniu.core.types import ANONYMOUS

Factory = Callable[[float], Awaitable[BatchQueue]]
SHORT = 0.05
"""A lease short enough to run out while a test waits for it."""


@pytest.fixture(params=["sqlite", "redis"])
async def queues(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Factory]:
    """``factory(lease_s)``: one more gateway's view of one queue."""
    made: list[BatchQueue] = []
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None

    async def factory(lease_s: float) -> BatchQueue:
        queue: BatchQueue
        if url is not None:
            queue = RedisBatchQueue(url, lease_s=lease_s)
        else:
            queue = SqlBatchQueue(open_database("sqlite:///q.db", base=tmp_path, timeout_s=5.0))
        await queue.open()
        made.append(queue)
        return queue

    yield factory
    for queue in made:
        await queue.close()


def _batch(batch_id: str = "batch_1", status: str = "in_progress") -> BatchRecord:
    now = int(time.time())
    return BatchRecord(
        id=batch_id,
        tenant="acme",
        principal=ANONYMOUS,
        endpoint="/v1/chat/completions",
        input_file_id="file-1",
        completion_window="24h",
        status=status,
        created_at=now,
        expires_at=now + 3600,
        times={},
    )


async def _started(queue: BatchQueue, n: int, batch_id: str = "batch_1") -> BatchRecord:
    batch = _batch(batch_id, "validating")
    await queue.create(batch)
    await queue.add_items(batch_id, [(f"req-{i}", b'{"model":"chat","i":%d}' % i) for i in range(n)])
    assert await queue.move(batch, ("validating",), "in_progress")
    return batch


async def _claim_until(queue: BatchQueue, n: int, lease_s: float, within: float = 10.0) -> list[Item]:
    """Claim until something comes (a lease has to run out first), for ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        got = await queue.claim(["batch_1"], n, lease_s)
        if got or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.02)


async def test_two_gateways_never_hold_one_request_at_once(queues: Factory) -> None:
    one, two = await queues(60), await queues(60)
    await _started(one, 20)
    first = await one.claim(["batch_1"], 8, 60)
    second = await two.claim(["batch_1"], 50, 60)
    assert len(first) == 8 and len(second) == 12
    assert {i.idx for i in first} | {i.idx for i in second} == set(range(20))
    assert not {i.idx for i in first} & {i.idx for i in second}
    assert await one.claim(["batch_1"], 5, 60) == []
    assert (await one.counts(["batch_1"]))["batch_1"] == {"running": 20}
    assert [(i.custom_id, i.body) for i in sorted(first, key=lambda i: i.idx)][:1] == [
        ("req-0", b'{"model":"chat","i":0}')
    ]


async def test_a_dead_gateways_requests_are_taken_again_and_have_one_result(queues: Factory) -> None:
    dead, alive = await queues(SHORT), await queues(SHORT)
    await _started(dead, 3)
    held = await dead.claim(["batch_1"], 3, SHORT)
    assert len(held) == 3
    again = await _claim_until(alive, 3, SHORT)  # the dead gateway never renews
    assert sorted(i.idx for i in again) == [0, 1, 2]
    # The "dead" one was only slow: both finish the same requests; one result each.
    recorded = [
        await q.finish(item, "done", 200, b'{"by":"%s"}' % who, f"r-{who.decode()}-{item.idx}")
        for q, items, who in ((dead, held, b"dead"), (alive, again, b"alive"))
        for item in items
    ]
    assert sum(recorded) == 3
    results = await alive.results("batch_1")
    assert [(r[0], r[1], r[2], r[3]) for r in results] == [(i, f"req-{i}", "done", 200) for i in range(3)]
    assert (await alive.counts(["batch_1"]))["batch_1"] == {"done": 3}


async def test_a_request_taken_over_is_neither_renewed_nor_given_back(queues: Factory) -> None:
    slow, taker, third = await queues(SHORT), await queues(SHORT), await queues(SHORT)
    await _started(slow, 1)
    (held,) = await slow.claim(["batch_1"], 1, SHORT)
    (taken,) = await _claim_until(taker, 1, SHORT)
    await taker.renew([taken], 30)
    await slow.renew([held], 30)  # too late: not its own any more
    await slow.retry_later(held, 0.0, attempt=False)  # neither is this
    assert await third.claim(["batch_1"], 1, 30) == []
    assert (await third.counts(["batch_1"]))["batch_1"] == {"running": 1}
    assert await taker.finish(taken, "failed", 400, b"{}", "r")
    assert (await third.counts(["batch_1"]))["batch_1"] == {"failed": 1}


async def test_a_retry_waits_for_its_delay_and_counts_as_an_attempt(queues: Factory) -> None:
    one, two = await queues(60), await queues(60)
    await _started(one, 2)
    a, b = sorted(await one.claim(["batch_1"], 2, 60), key=lambda i: i.idx)
    await one.retry_later(a, 0.0, attempt=True)
    await one.retry_later(b, 3600.0, attempt=False)
    assert (await two.counts(["batch_1"]))["batch_1"] == {"pending": 2}
    (again,) = await two.claim(["batch_1"], 5, 60)  # the one due now; not the other
    assert (again.idx, again.custom_id, again.attempts) == (0, "req-0", 1)
    assert await two.claim(["batch_1"], 5, 60) == []


async def test_a_cancel_ends_what_did_not_run_and_lets_go_of_a_dead_gateways_requests(
    queues: Factory,
) -> None:
    dead, runner = await queues(SHORT), await queues(SHORT)
    batch = await _started(dead, 4)
    # A 1 s lease: it must still hold when the runner claims next (a lapsed one would be
    # claimed again, lowest index first), however slow the machine; it lapses in the loop below.
    (held,) = await dead.claim(["batch_1"], 1, 1.0)
    assert held.idx == 0
    (mine,) = await runner.claim(["batch_1"], 1, 60)
    assert mine.idx == 1
    assert await runner.move(batch, ("in_progress",), "cancelling")
    await runner.end_open("batch_1", "cancelled", running_too=False)
    counts = (await runner.counts(["batch_1"]))["batch_1"]
    assert counts.get("cancelled", 0) >= 2 and counts.get("cancelled", 0) + counts["running"] == 4
    assert await runner.finish(mine, "done", 200, b"{}", "r")  # a running one may still finish
    # The dead gateway's request is let go once its lease ran out (the runner ends open
    # requests at each poll while a batch is cancelling).
    deadline = time.monotonic() + 10
    while (await runner.counts(["batch_1"]))["batch_1"].get("running"):
        assert time.monotonic() < deadline, "the dead gateway's request was never let go"
        await runner.end_open("batch_1", "cancelled", running_too=False)
        await asyncio.sleep(0.02)
    states = [r[2] for r in await runner.results("batch_1")]
    assert states == ["cancelled", "done", "cancelled", "cancelled"]


async def test_an_expiry_ends_running_requests_too_and_their_late_results_are_dropped(
    queues: Factory,
) -> None:
    one = await queues(60)
    batch = await _started(one, 3)
    (running,) = await one.claim(["batch_1"], 1, 60)
    await one.end_open("batch_1", "expired", running_too=True)
    assert await one.move(batch, ("in_progress",), "finalizing")
    assert not await one.finish(running, "done", 200, b"{}", "late")
    assert [r[2] for r in await one.results("batch_1")] == ["expired"] * 3
    assert (await one.counts(["batch_1"]))["batch_1"] == {"expired": 3}


async def test_adding_requests_again_adds_none_twice(queues: Factory) -> None:
    one = await queues(60)
    batch = _batch(status="validating")
    await one.create(batch)
    lines = [(f"req-{i}", b"{}") for i in range(2500)]
    await one.add_items("batch_1", lines[:1200])  # a validation that died half way
    await one.add_items("batch_1", lines)
    assert await one.move(batch, ("validating",), "in_progress")
    claimed = await one.claim(["batch_1"], 10_000, 60)
    assert sorted(i.idx for i in claimed) == list(range(2500))


async def test_a_status_moves_once_and_the_batch_reads_back(queues: Factory) -> None:
    one, two = await queues(60), await queues(60)
    batch = _batch("batch_x", "validating")
    batch.metadata = {"run": "nightly"}
    await one.create(batch)
    seen = await two.get("batch_x")
    assert seen is not None and seen.status == "validating" and seen.metadata == {"run": "nightly"}
    assert await one.move(batch, ("validating",), "in_progress")
    stale = await two.get("batch_x")
    assert stale is not None
    assert not await two.move(stale, ("validating",), "in_progress")  # done already
    assert await two.move(stale, ("in_progress",), "failed", errors=[{"code": "x", "line": 2}])
    back = await one.get("batch_x")
    assert back is not None and back.status == "failed" and back.errors == [{"code": "x", "line": 2}]
    assert set(back.times) == {"in_progress_at", "failed_at"}
    assert [b.id for b in await two.list("acme")] == ["batch_x"] and await two.list("other") == []


async def test_redis_keeps_only_a_finished_batchs_record_and_counts(redis_url: str) -> None:
    import redis.asyncio as aioredis

    queue = RedisBatchQueue(redis_url, lease_s=60)
    await queue.open()
    try:
        batch = await _started(queue, 3)
        for item in await queue.claim(["batch_1"], 3, 60):
            assert await queue.finish(item, "done", 200, b"{}", "r")
        assert await queue.move(batch, ("in_progress",), "finalizing")
        assert await queue.move(batch, ("finalizing",), "completed", output_file_id="file-out")
        client = aioredis.Redis.from_url(redis_url)
        try:
            keys = sorted(k.decode() for k in await client.keys("*"))
        finally:
            await client.aclose()
        assert keys == ["shuniu:batches:all", "shuniu:batches:tenant:acme", "{shuniu:batch:batch_1}:meta"]
        assert (await queue.counts(["batch_1"]))["batch_1"] == {"done": 3}
        done = await queue.get("batch_1")
        assert done is not None and done.output_file_id == "file-out" and done.status == "completed"
        assert await queue.with_status("in_progress", "completed") == []  # not open any more
    finally:
        await queue.close()
