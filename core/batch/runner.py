"""The batch runner: one task per gateway that moves batches through their statuses and
runs their requests on idle capacity.

Every ``poll_interval_s`` it

1. **validates** new batches (``validating`` → ``in_progress``, or ``failed`` with the
   lines that are wrong): the input file's requests become rows of the queue;
2. **expires** batches past their completion window and **cancels** those asked to;
3. **claims** requests while their pool has room: nothing queued, and slots left after
   ``headroom`` of them, after the most interactive requests the pool ran at once in the
   last ``burst_window_s`` and after the batch requests already running there; at most
   ``concurrency`` at once on this gateway. Each runs through
   the gateway's own request path as its batch's owner, in the batch tier (the lowest
   priority), so the scheduler, rate limits, budgets, the ledger and the metrics see it as
   any request; a refusal for load (429 ``queue_full`` or ``rate_limit_exceeded``, 502,
   503, 504) is retried later, up to ``max_attempts`` tries;
4. **finalizes** batches whose requests are all done: writes the output file (answered
   requests) and the error file (the others), in input order, and sets the final status.

The leases of running requests are renewed; a request whose gateway died is taken again
once its lease runs out (at least once), and only the claim holding a row records its
result (never twice in the output).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from shuniu.core.api.batch_input import check_batch_input
from shuniu.core.batch.objects import output_line
from shuniu.core.batch.queue import BatchQueue, BatchRecord, Item
from shuniu.core.config import BatchesConfig
from shuniu.core.contracts import FileStore, StoredFile
from shuniu.core.errors import GatewayError
from shuniu.core.ids import new_id
from shuniu.core.pools.pool import Pool
from shuniu.core.tasks import cancel_and_wait

__all__ = ["BatchRunner"]

log = logging.getLogger("shuniu.batch")

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]
_RETRY = frozenset({502, 503, 504})
_STOP_GRACE_S = 10.0
_RETRY_429 = frozenset({"queue_full", "rate_limit_exceeded"})
_decode = msgspec.json.decode


class _Model(msgspec.Struct):
    model: Any = None


class BatchRunner:
    """Runs the batches of one gateway's queue."""

    def __init__(
        self,
        cfg: BatchesConfig,
        store: BatchQueue,
        files: FileStore,
        app: App,
        pools: Callable[[], dict[str, Pool]],
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.files = files
        self.app = app
        self.routes = pools
        """Every model name and alias → its pool (read each time: a reload swaps them)."""
        self.running: dict[tuple[str, int], Item] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.states: dict[str, int] = {}
        """Requests of unfinished batches by state (``pending``, ``running``, ...), as of
        the last poll."""
        self.finished: dict[str, int] = {"done": 0, "failed": 0}
        """Requests this gateway ran to an end, by outcome."""
        self.batches: dict[str, int] = {}
        """Batches by status, as of the last poll."""
        self.in_pool: dict[str, int] = {}
        """Pool → batch requests this gateway runs there now (admitted or waiting)."""
        self.peaks: dict[str, deque[tuple[float, int]]] = {}
        """Pool → (when, interactive requests in flight) samples of the last burst window."""
        self._task: asyncio.Task[None] | None = None
        self._renewed = 0.0
        self.failing = False

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="shuniu-batches")

    async def stop(self) -> None:
        """Stop taking requests, let those running finish (for ``_STOP_GRACE_S``), give the
        rest back to the queue (another gateway, or this one after a restart, takes them at
        once, without waiting for their lease)."""
        await cancel_and_wait(self._task)
        self._task = None
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=_STOP_GRACE_S)
        left = list(self.running.values())
        for task in list(self.tasks):
            await cancel_and_wait(task)
        if self.store.opened:
            for item in left:
                try:
                    await self.store.retry_later(item, 0.0, attempt=False)
                except Exception:  # the lease runs out instead
                    break
            await self.store.close()

    async def _loop(self) -> None:
        while True:
            try:
                if self.store.exists():
                    await self.store.open()
                    await self.poll()
                if self.failing:
                    log.warning("the batch queue answers again")
                self.failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self.failing:
                    log.error(
                        "the batch queue cannot be worked on (%s: %s); retrying", type(exc).__name__, exc
                    )
                self.failing = True
            await asyncio.sleep(self.cfg.poll_interval_s)

    # -- one round ----------------------------------------------------------------------

    async def poll(self) -> None:
        store = self.store
        for batch in await store.with_status("validating"):
            await self._validate(batch)
        now = time.time()
        open_batches = await store.with_status("in_progress", "cancelling", "finalizing")
        counts = await store.counts([b.id for b in open_batches])
        self.batches = {}
        for b in open_batches:
            self.batches[b.status] = self.batches.get(b.status, 0) + 1
        states: dict[str, int] = {}
        for by_state in counts.values():
            for state, n in by_state.items():
                states[state] = states.get(state, 0) + n
        self.states = states
        active = []
        for batch in open_batches:
            mine = counts.get(batch.id, {})
            if batch.status == "in_progress" and now >= batch.expires_at:
                await store.end_open(batch.id, "expired", running_too=True)
                await self._finalize(batch, "expired")
            elif batch.status == "cancelling":
                await store.end_open(batch.id, "cancelled", running_too=False)
                if not mine.get("running"):
                    await self._finalize(batch, "cancelled")
            elif batch.status == "finalizing":
                # A gateway that died while finalizing: finish its work.
                if now - batch.times.get("finalizing_at", 0) > self.cfg.lease_s:
                    await self._write_files(batch, _final(mine))
            elif not mine.get("pending") and not mine.get("running"):
                await self._finalize(batch, _final(mine))
            else:
                active.append(batch)
        if now - self._renewed > self.cfg.lease_s / 3:
            self._renewed = now
            await store.renew(list(self.running.values()), self.cfg.lease_s)
        room = self.cfg.concurrency - len(self.running)
        pools = {id(p): p for p in self.routes().values()}
        spare = sum(self._spare(pool, now) for pool in pools.values())
        n = min(room, spare)
        if active and n > 0:
            for item in await store.claim([b.id for b in active], n, self.cfg.lease_s):
                mine = self.running.get((item.batch_id, item.idx))
                if mine is not None:  # ours, still running, its lease lapsed: hold on to it
                    mine.claim = item.claim
                    continue
                owner = next(b for b in active if b.id == item.batch_id)
                self._spawn(owner, item)

    def _spare(self, pool: Pool, now: float) -> int:
        """Batch requests ``pool`` can take now besides those it runs: none while anything
        is queued; else its slots less ``headroom`` of them, less the most interactive
        requests it ran at once over the last ``burst_window_s`` (a burst to come finds its
        slots free: a batch request is never preempted), less the batch requests running."""
        if pool.scheduler.queued:
            return 0
        total = busy = 0
        for e in pool.endpoints:
            if e.limit == 0:
                return self.cfg.concurrency  # no limit to keep free
            total += e.limit
            busy += e.in_flight + e.remote_in_flight
        ours = self.in_pool.get(pool.name, 0)
        interactive = max(0, busy - ours)
        samples = self.peaks.setdefault(pool.name, deque())
        samples.append((now, interactive))
        window = self.cfg.burst_window_s
        while samples and samples[0][0] < now - window:
            samples.popleft()
        peak = max(v for _t, v in samples)
        keep = math.ceil(self.cfg.headroom * total) + peak
        return max(0, total - keep - ours)

    # -- validation ---------------------------------------------------------------------

    async def _validate(self, batch: BatchRecord) -> None:
        content = await self.files.content(batch.input_file_id)
        errors: list[dict[str, Any]] = []
        lines: list[tuple[str, bytes]] = []
        if content is None:
            errors.append(
                {"code": "file_not_found", "message": "The input file is gone.", "param": None, "line": None}
            )
        else:
            try:
                for number, line in check_batch_input(content, 10**9):
                    if line.url != batch.endpoint:
                        errors.append(
                            {
                                "code": "mismatched_endpoint",
                                "message": f"The request's url {line.url} is not the batch's endpoint "
                                f"{batch.endpoint}.",
                                "param": "url",
                                "line": number,
                            }
                        )
                    lines.append((line.custom_id, msgspec.json.encode(line.body)))
            except GatewayError as exc:  # checked at upload: only a file changed since fails here
                errors.append({"code": "invalid_file", "message": exc.message, "param": None, "line": None})
        if errors:
            await self.store.move(batch, ("validating",), "failed", errors=errors[:100])
            return
        await self.store.add_items(batch.id, lines)
        await self.store.move(batch, ("validating",), "in_progress")

    # -- running one request ------------------------------------------------------------

    def _spawn(self, batch: BatchRecord, item: Item) -> None:
        self.running[(item.batch_id, item.idx)] = item
        task = asyncio.create_task(self._run(batch, item), name=f"shuniu-batch-{item.batch_id}-{item.idx}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, batch: BatchRecord, item: Item) -> None:
        cancelled = False
        try:
            model = _decode(item.body, type=_Model).model
            pool = self.routes().get(model) if isinstance(model, str) else None
            if pool is not None and self._spare(pool, time.time()) <= 0:
                await self.store.retry_later(item, self.cfg.poll_interval_s, attempt=False)
                return
            request_id = "batch_req_" + secrets.token_hex(12)
            name = pool.name if pool is not None else ""
            self.in_pool[name] = self.in_pool.get(name, 0) + 1
            try:
                status, body = await self._call(batch, item, request_id)
            finally:
                self.in_pool[name] -= 1
            code = _error_code(body) if status >= 400 else None
            retry = status in _RETRY or (status == 429 and code in _RETRY_429)
            if retry and item.attempts + 1 < self.cfg.max_attempts:
                delay = min(60.0, self.cfg.poll_interval_s * 2 ** (item.attempts + 1))
                await self.store.retry_later(item, delay, attempt=True)
                return
            state = "done" if status < 400 else "failed"
            if await self.store.finish(item, state, status, body, request_id):
                self.finished[state] += 1
        except asyncio.CancelledError:
            cancelled = True  # stopping: stop() gives the request back to the queue
            raise
        except Exception as exc:
            log.warning(
                "batch %s request %d could not be run (%s); it will be taken again",
                item.batch_id,
                item.idx,
                exc,
            )
        finally:
            if not cancelled:
                self.running.pop((item.batch_id, item.idx), None)

    async def _call(self, batch: BatchRecord, item: Item, request_id: str) -> tuple[int, bytes]:
        """The request through the gateway's own path, as the batch's owner in the batch tier."""
        principal = msgspec.structs.replace(batch.principal, tier=self.cfg.tier)
        body = item.body
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": batch.endpoint,
            "raw_path": batch.endpoint.encode(),
            "query_string": b"",
            "root_path": "",
            "client": ("batch", 0),
            "server": None,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-request-id", request_id.encode()),
            ],
            "shuniu.principal": principal,
        }
        sent = False
        never = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never.wait()  # the "client" never leaves
            return {"type": "http.disconnect"}

        status = 500
        chunks: list[bytes] = []

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        return status, b"".join(chunks)

    # -- the end ------------------------------------------------------------------------

    async def _finalize(self, batch: BatchRecord, final: str) -> None:
        if not await self.store.move(batch, ("in_progress", "cancelling"), "finalizing"):
            return  # another gateway does it
        await self._write_files(batch, final)

    async def _write_files(self, batch: BatchRecord, final: str) -> None:
        output, errors = [], []
        for _idx, custom_id, state, status, response, request_id in await self.store.results(batch.id):
            line = output_line(custom_id, state, status, response, request_id)
            (output if state == "done" else errors).append(line)
        ids: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
        for field, lines, suffix in (
            ("output_file_id", output, "output"),
            ("error_file_id", errors, "error"),
        ):
            if not lines:
                continue
            content = b"".join(lines)
            record = StoredFile(
                id=new_id("file-"),
                tenant=batch.tenant,
                filename=f"{batch.id}_{suffix}.jsonl",
                purpose="batch_output",
                bytes=len(content),
                created_at=int(time.time()),
            )
            await self.files.put(record, content)
            ids[field] = record.id
        await self.store.move(batch, ("finalizing",), final, **ids)


def _final(states: dict[str, int]) -> str:
    """A finished batch's status from its requests' states."""
    if states.get("cancelled"):
        return "cancelled"
    return "expired" if states.get("expired") else "completed"


def _error_code(body: bytes) -> str | None:
    try:
        code = _decode(body)["error"]["code"]
    except (msgspec.DecodeError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None
