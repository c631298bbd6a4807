"""One JSON line per finished request (``gateway.access_log``), for ELK, Loki and friends.

The line is built by a ``request_finished`` observer and handed to a queue; a background
thread writes it, so the request path never waits on a file or a pipe. Prompt text is
never written unless ``include_prompt`` is set; credentials never are (the line names the
key's id).
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
from typing import Any

import msgspec

from shuniu.core.config import AccessLogConfig
from shuniu.core.types import RequestRecord

__all__ = ["AccessLog"]

_encode = msgspec.json.Encoder().encode


class _Line(msgspec.Struct, omit_defaults=True):
    ts: float
    request_id: str
    tenant: str
    tier: str
    model: str
    api: str
    stream: bool
    status: int
    outcome: str
    prompt_tokens: int
    completion_tokens: int
    duration_ms: float
    key_id: str | None = None
    pool: str | None = None
    endpoint: str | None = None
    error_code: str | None = None
    queue_ms: float | None = None
    ttft_ms: float | None = None
    cached: bool = False
    retries: int = 0
    prompt: str | None = None


class AccessLog:
    """The observer and its writer thread."""

    def __init__(self, config: AccessLogConfig) -> None:
        self.config = config
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        if config.path is None:
            self._out: Any = sys.stderr.buffer
            self._close = False
        else:
            self._out = open(config.path, "ab")
            self._close = True
        self._listener = _Writer(self._queue, self._out)
        self._listener.start()
        # Event-loop time in records; wall time in the log line.
        self._offset: float | None = None

    def observe(self, record: RequestRecord) -> None:
        if self._offset is None:
            try:
                self._offset = time.time() - asyncio.get_running_loop().time()
            except RuntimeError:
                self._offset = 0.0
        p = record.principal
        arrival = record.arrival
        line = _Line(
            ts=round(record.finished + self._offset, 6),
            request_id=record.id,
            tenant=p.tenant,
            tier=p.tier,
            model=record.model,
            api=record.api,
            stream=record.stream,
            status=record.status,
            outcome=record.outcome.value,
            prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens,
            duration_ms=round((record.finished - arrival) * 1000, 3),
            key_id=p.key_id,
            pool=record.pool,
            endpoint=record.endpoint,
            error_code=record.error_code,
            queue_ms=round((record.admitted - arrival) * 1000, 3) if record.admitted is not None else None,
            ttft_ms=round((record.first_token - arrival) * 1000, 3)
            if record.first_token is not None
            else None,
            cached=record.cached,
            retries=record.retries,
            prompt=record.prompt if self.config.include_prompt else None,
        )
        self._queue.put(_encode(line) + b"\n")

    def stop(self) -> None:
        self._queue.put(None)
        self._listener.join(timeout=5)
        if self._close:
            self._out.close()


class _Writer:
    """A thread draining the queue into the file, several lines per write."""

    def __init__(self, q: queue.SimpleQueue[bytes | None], out: Any) -> None:
        self._q = q
        self._out = out
        self._thread = threading.Thread(target=self._run, name="shuniu-access-log", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        done = False
        while not done:
            item = self._q.get()
            batch: list[bytes] = []
            while item is not None:
                batch.append(item)
                if len(batch) >= 256:
                    break
                try:
                    item = self._q.get_nowait()
                except queue.Empty:
                    break
            else:
                done = True
            if batch:
                self._out.write(b"".join(batch))
                self._out.flush()
