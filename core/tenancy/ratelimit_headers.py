"""OpenAI's ``x-ratelimit-*`` response headers, written for every limited request.

A regular install compiles this module with mypyc (``core/compiled.py``), with the rest of
the tenancy: with the memory store's booking it is most of what a limited request costs."""

from __future__ import annotations

from typing import Final

__all__ = ["format_reset", "reset_bytes", "taken_headers"]

# Final: compiled code uses them as constants instead of looking them up in the module.
LIMIT_REQUESTS: Final = b"x-ratelimit-limit-requests"
REMAINING_REQUESTS: Final = b"x-ratelimit-remaining-requests"
RESET_REQUESTS: Final = b"x-ratelimit-reset-requests"
LIMIT_TOKENS: Final = b"x-ratelimit-limit-tokens"
REMAINING_TOKENS: Final = b"x-ratelimit-remaining-tokens"
RESET_TOKENS: Final = b"x-ratelimit-reset-tokens"
_MILLIS: Final = tuple(b"%dms" % n for n in range(1000))
"""``b"<n>ms"`` by ``n``: the common (sub-second) reset, written without formatting."""


def taken_headers(
    request_limit_headers: list[tuple[bytes, bytes]],
    token_limit_headers: list[tuple[bytes, bytes]],
    taken: tuple[int, int, float, int, int, float],
) -> list[tuple[bytes, bytes]]:
    """The headers of the tightest request and token limits: ``taken`` is ``(index,
    remaining, reset_s)`` of each kind (index ``-1``: the plan has none), as a store
    binding's ``take`` answers; ``*_limit_headers`` hold each limit's
    ``x-ratelimit-limit-*`` header, by index."""
    req, req_left, req_reset, tok, tok_left, tok_reset = taken
    if req >= 0 and tok >= 0:  # the usual plan, both kinds: one list, made whole
        return [
            request_limit_headers[req],
            (REMAINING_REQUESTS, str(req_left).encode() if req_left > 0 else b"0"),
            (RESET_REQUESTS, reset_bytes(req_reset)),
            token_limit_headers[tok],
            (REMAINING_TOKENS, str(tok_left).encode() if tok_left > 0 else b"0"),
            (RESET_TOKENS, reset_bytes(tok_reset)),
        ]
    out: list[tuple[bytes, bytes]] = []
    if req >= 0:
        out.append(request_limit_headers[req])
        out.append((REMAINING_REQUESTS, str(req_left).encode() if req_left > 0 else b"0"))
        out.append((RESET_REQUESTS, reset_bytes(req_reset)))
    if tok >= 0:
        out.append(token_limit_headers[tok])
        out.append((REMAINING_TOKENS, str(tok_left).encode() if tok_left > 0 else b"0"))
        out.append((RESET_TOKENS, reset_bytes(tok_reset)))
    return out


def reset_bytes(seconds: float) -> bytes:
    """:func:`format_reset` as header bytes, with the common sub-second case short."""
    if 0 < seconds < 0.9995:
        return _MILLIS[int(seconds * 1000.0 + 0.5) or 1]
    return format_reset(seconds).encode()


def format_reset(seconds: float) -> str:
    """A duration as OpenAI's ``x-ratelimit-reset-*`` headers write it: ``1s``, ``6m0s``,
    ``20ms``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        # Half up (not round()'s half to even): reset_bytes's table lookup does the same.
        return f"{max(1, int(seconds * 1000.0 + 0.5))}ms"
    total = round(seconds, 3)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    secs_text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{int(hours)}h{int(minutes)}m{secs_text}"
    if minutes:
        return f"{int(minutes)}m{secs_text}"
    return secs_text
