"""Forwarding an engine's ordinary OpenAI stream events without decoding them.

Almost every event of a streamed answer is one content delta:
``{"id":…,"object":…,"created":…,"model":…,"choices":[{"index":0,"delta":{"content":"…"},
"logprobs":null,"finish_reason":null}]}``. The gateway needs nothing from it but "one more
token": its id and model are rewritten, everything else goes to the client as it came.
:class:`RawEvents` recognises such an event with a few byte searches and hands over its
bytes from ``"choices"`` on (:attr:`shuniu.core.types.Chunk.raw`), with its finish reason
when it has one, so the last token's fields (its ``logprobs``) reach the client too. Any
other event (the role announcement, usage figures, an error, tool calls without text, JSON
written with spaces) returns ``None`` and is decoded as before.

The searches look for keys with their quotes (``"finish_reason":null``). A JSON string can
never hold an unescaped quote, so generated text cannot imitate a key.
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


class RawEvents:
    """The forwardable events of one stream. The part before ``"choices"`` is the same in
    every event of a stream (one id, one created, one model), so it is checked once and
    then compared."""

    __slots__ = ("_head", "_text")

    def __init__(self, chat: bool) -> None:
        self._head: bytes | None = None
        self._text = b'"content":"' if chat else b'"text":"'

    def take(self, payload: bytes) -> Chunk | None:
        """``payload`` (one ``data:`` event's JSON) as a chunk carrying its own bytes, or
        ``None`` when it is not an ordinary content delta and must be decoded."""
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
        if _USAGE in tail:
            if _USAGE_NULL not in tail:
                return None  # usage figures: decoded, the gateway keeps them
            tail = tail.replace(_USAGE_NULL, b"")
            if _USAGE in tail:
                return None
        text = self._text
        start = tail.find(text) + len(text)
        if start < len(text) or start >= len(tail) or tail[start] == _QUOTE:
            if finish is None:
                return None  # no text (a role, a tool call's start): decoded, as before
            return Chunk(finish_reason=finish, raw=tail)
        return Chunk(tokens=1, finish_reason=finish, raw=tail)
