"""Forwarding an engine's ordinary OpenAI stream events without decoding them.

Almost every event of a streamed answer is one content delta:
``{"id":…,"object":…,"created":…,"model":…,"choices":[{"index":0,"delta":{"content":"…"},
"logprobs":null,"finish_reason":null}]}``. The gateway needs nothing from it but "one more
token": its id and model are rewritten, everything else goes to the client as it came.
:class:`RawEvents` recognises such an event and hands over its bytes from ``"choices"`` on
(:attr:`shuniu.core.types.Chunk.raw`), with its finish reason when it has one, so the last
token's fields (its ``logprobs``) reach the client too. Any other event (the role
announcement, usage figures, an error, tool calls without text, JSON written with spaces)
returns ``None`` and is decoded as before.

Two ways to recognise one, the second learning the first:

* **by its keys**: byte searches for keys with their quotes (``"finish_reason":null``). A
  JSON string can never hold an unescaped quote, so generated text cannot imitate a key;
* **by the stream's template**: an engine writes its plain deltas alike, the same bytes
  before the text and after it. Once one has been recognised by its keys, an event that
  starts and ends with the same bytes and has no quote between them is the same delta with
  other text: two comparisons and one search of the text instead of several searches.
"""

from __future__ import annotations

from shuniu.core.types import Chunk

__all__ = ["RawEvents"]

_CHOICES = b'"choices":['
_HEAD_KEYS = (b'"id":', b'"object":', b'"created":', b'"model":')
"""What the gateway writes anew: an event is forwarded only when all of them come before
``"choices"`` (so none is left in the forwarded part to repeat them)."""
_OPEN = b'"finish_reason":null'
_FINISH = b'"finish_reason":"'
_USAGE = b'"usage"'
_USAGE_NULL = b',"usage":null'
_ERROR = b'"error"'
_QUOTE = 34
_BACKSLASH = 92


class RawEvents:
    """The forwardable events of one stream. The part before ``"choices"`` is the same in
    every event of a stream (one id, one created, one model), so it is checked once and
    then compared; so is a plain delta's template."""

    __slots__ = ("_drop", "_head", "_line_prefix", "_prefix", "_suffix", "_text")

    def __init__(self, chat: bool) -> None:
        self._head: bytes | None = None
        self._text = b'"content":"' if chat else b'"text":"'
        self._prefix: bytes | None = None
        """A plain delta's bytes up to its text (the head included)."""
        self._suffix = b""
        """A plain delta's bytes after its text."""
        self._drop = 1
        """Bytes cut from a plain delta's end: its closing brace and a ``,"usage":null``."""
        self._line_prefix: bytes | None = None
        """``data: `` and the template's prefix: a whole SSE line recognised as it is."""

    def take_line(self, line: bytes) -> Chunk | None:
        """A whole ``data: {...}`` line that matches the stream's template as a chunk
        carrying its bytes (no copy of the payload first); ``None`` otherwise, for
        :meth:`take` to look at the payload (an engine may write ``data:`` without the
        space)."""
        return self._templated(line, self._line_prefix, 6)

    def take(self, payload: bytes) -> Chunk | None:
        """``payload`` (one ``data:`` event's JSON) as a chunk carrying its own bytes, or
        ``None`` when it is not an ordinary content delta and must be decoded: by the
        template, else by its keys."""
        return self._templated(payload, self._prefix, 0) or self._by_keys(payload)

    def _templated(self, data: bytes, prefix: bytes | None, skip: int) -> Chunk | None:
        """``data`` as a plain delta when it starts with ``prefix`` (the template's, after
        ``skip`` bytes of its own), ends with the template's suffix, and has no quote in its
        text, nor a backslash escaping the closing one."""
        suffix = self._suffix
        if prefix is None or not data.startswith(prefix) or not data.endswith(suffix):
            return None
        end = len(data) - len(suffix)
        if end > len(prefix) and data.find(b'"', len(prefix), end) < 0 and data[end - 1] != _BACKSLASH:
            head = self._head
            assert head is not None
            return Chunk(tokens=1, raw=data[skip + len(head) : len(data) - self._drop])
        return None

    def _by_keys(self, payload: bytes) -> Chunk | None:
        head = self._head
        if head is not None and payload.startswith(head) and payload.startswith(_CHOICES, len(head)):
            at = len(head)
        else:
            at = payload.find(_CHOICES)
            if at < 0:
                return None
            head = payload[:at]
            for key in _HEAD_KEYS:
                if key not in head:
                    return None
            self._head = head
            self._prefix = self._line_prefix = None  # a new head: learn the template again
        if _ERROR in payload or payload[-1] != 0x7D:  # an object's end: "}"
            return None
        tail = payload[at:-1]
        finish: str | None = None
        if _OPEN not in tail:
            start = tail.find(_FINISH)
            if start < 0:
                return None
            start += len(_FINISH)
            end = tail.find(b'"', start)
            if end < 0:
                return None
            finish = tail[start:end].decode()
        usage_null = False
        if _USAGE in tail:
            if _USAGE_NULL not in tail:
                return None  # usage figures: decoded, the gateway keeps them
            tail = tail.replace(_USAGE_NULL, b"")
            if _USAGE in tail:
                return None
            usage_null = True
        text = self._text
        start = tail.find(text) + len(text)
        if start < len(text) or start >= len(tail) or tail[start] == _QUOTE:
            if finish is None:
                return None  # no text (a role, a tool call's start): decoded, as before
            return Chunk(finish_reason=finish, raw=tail)
        if finish is None and self._prefix is None:
            self._learn(payload, payload.find(text, at) + len(text), usage_null)
        return Chunk(tokens=1, finish_reason=finish, raw=tail)

    def _learn(self, payload: bytes, text_at: int, usage_null: bool) -> None:
        """Keep a plain delta's bytes before and after its text (which starts at
        ``text_at``) as the stream's template, when they can serve as one."""
        end = text_at
        while True:  # the text's closing quote: the first not escaped
            end = payload.find(b'"', end)
            if end < 0:
                return
            backslashes = 0
            while payload[end - 1 - backslashes] == _BACKSLASH:
                backslashes += 1
            if backslashes % 2 == 0:
                break
            end += 1
        suffix = payload[end:]
        if usage_null and not suffix.endswith(_USAGE_NULL + b"}"):
            return  # a usage member elsewhere: the keys' way only
        self._prefix = payload[:text_at]
        self._line_prefix = b"data: " + self._prefix
        self._suffix = suffix
        self._drop = 1 + (len(_USAGE_NULL) if usage_null else 0)
