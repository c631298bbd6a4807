"""Reading an engine's Server-Sent Events body line by line, whatever the line length.

aiohttp's own line iteration (``async for line in resp.content``) stops at 128 KiB with
"Line is too long", which turned a legitimate large event (a long tool-call argument, TGI's
final event repeating the whole answer, a base64 image) into a failure counted against a
healthy endpoint. :class:`SseLines` reads the body in the blocks it arrives in and splits
them itself: lines of any length up to :data:`MAX_LINE_BYTES`, one ``await`` per network
read rather than per line, and no async generator left behind when a stream is closed
half-way (it is a plain class).

Engines write one ``data:`` line per event (OpenAI, vLLM, SGLang, TGI, Triton, MindIE), so
events are read as lines; :func:`data_payload` takes the payload out of a ``data:`` line
(with or without the space after the colon).
"""

from __future__ import annotations

from collections import deque

import aiohttp

__all__ = ["MAX_LINE_BYTES", "LineSplitter", "OversizedEvent", "SseData", "SseLines", "data_payload"]

MAX_LINE_BYTES = 64 * 1024 * 1024
"""Longest line accepted (64 MiB). It bounds what a misbehaving engine (a body with no
newline at all) can make the gateway buffer; a longer line fails the stream."""

_DATA = b"data:"


class OversizedEvent(aiohttp.ClientPayloadError):
    """An engine sent a line longer than the reader takes. A payload error, so a backend's
    stream handling catches it with the other stream breaks; reported as a protocol error,
    never as the endpoint failing."""


class LineSplitter:
    """The complete lines of an SSE body fed to it block by block, without their line
    endings (``\\n`` or ``\\r\\n``); a line still open at the end of a block waits for the
    next. Synchronous, so a reader can split every line that one network read brought before
    it waits again (:class:`SseLines`, and the OpenAI engine's stream, which turns a whole
    read into chunks at once)."""

    __slots__ = ("_limit", "_tail")

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self._tail = b""
        self._limit = limit

    def feed(self, block: bytes) -> list[bytes]:
        """The lines ``block`` completes. Raises :class:`OversizedEvent` when the line left
        open grows past the limit."""
        if self._tail:
            block = self._tail + block
        lines = block.split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > self._limit:
            raise OversizedEvent(f"an event line longer than {self._limit} bytes")
        return [line[:-1] if line.endswith(b"\r") else line for line in lines]

    def end(self) -> bytes | None:
        """The body ended: its last line when it did not end with a newline."""
        tail, self._tail = self._tail, b""
        return tail.rstrip(b"\r") if tail else None


class SseLines:
    """The lines of an SSE body, in order, without their line endings (``\\n`` or
    ``\\r\\n``). The last line is returned even when the body does not end with a newline."""

    __slots__ = ("_blocks", "_eof", "_pending", "_split")

    def __init__(self, content: aiohttp.StreamReader, limit: int = MAX_LINE_BYTES) -> None:
        self._blocks = content.iter_any().__aiter__()
        self._pending: deque[bytes] = deque()
        self._split = LineSplitter(limit)
        self._eof = False

    def __aiter__(self) -> SseLines:
        return self

    async def __anext__(self) -> bytes:
        pending = self._pending
        while not pending:
            if self._eof:
                raise StopAsyncIteration
            try:
                block = await self._blocks.__anext__()
            except StopAsyncIteration:
                self._eof = True
                last = self._split.end()
                if last is not None:
                    pending.append(last)
                continue
            pending.extend(self._split.feed(block))
        return pending.popleft()


def data_payload(line: bytes) -> bytes | None:
    """The payload of a ``data:`` line, stripped; ``None`` for any other line (comments,
    ``event:``/``id:`` fields, blank lines between events)."""
    if line.startswith(_DATA):
        return line[5:].strip()
    return None


class SseData:
    """The ``data:`` payloads of an SSE body, in order, stripped; every other line (comments,
    other fields, blank lines) skipped."""

    __slots__ = ("_lines",)

    def __init__(self, content: aiohttp.StreamReader, limit: int = MAX_LINE_BYTES) -> None:
        self._lines = SseLines(content, limit)

    def __aiter__(self) -> SseData:
        return self

    async def __anext__(self) -> bytes:
        while True:
            line = await self._lines.__anext__()
            if line.startswith(_DATA):
                return line[5:].strip()
