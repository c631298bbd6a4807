"""The Batch API's input file: JSON Lines, one request per line, checked at upload so a
bad file is refused at once with the lines that are wrong.

A line is ``{"custom_id": "...", "method": "POST", "url": "/v1/chat/completions", "body":
{...}}``: ``custom_id`` a non-empty string, unique in the file (results are keyed by it);
``method`` ``POST``; ``url`` one of :data:`BATCH_URLS`; ``body`` an object naming a
``model``. The body is not parsed further here: each request meets the gateway's own parser
when it runs, and its error goes to the batch's error file under its ``custom_id``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shuniu.core.errors import GatewayError

__all__ = ["BATCH_URLS", "BatchLine", "check_batch_input"]

BATCH_URLS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
"""The endpoints a batch may call."""
_MAX_ID = 512
_SHOWN = 10
"""Problems listed in the error at most (then a count of the rest)."""


class BatchLine(msgspec.Struct):
    custom_id: Any = None
    method: Any = None
    url: Any = None
    body: Any = None


_decode = msgspec.json.Decoder(BatchLine).decode


def check_batch_input(content: bytes, max_lines: int) -> list[tuple[int, BatchLine]]:
    """The requests in ``content`` with their line numbers, parsed, or a 400
    ``invalid_file`` naming the lines that are wrong."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    parsed: list[tuple[int, BatchLine]] = []
    count = 0
    lines = content.split(b"\n")
    if lines and not lines[-1].strip():
        lines.pop()  # the file's final newline
    for number, raw in enumerate(lines, 1):
        if len(problems) > 1000:
            break
        if not raw.strip():
            problems.append(f"line {number}: empty")
            continue
        count += 1
        try:
            line = _decode(raw)
        except msgspec.DecodeError as exc:
            problems.append(f"line {number}: not a JSON object ({exc})")
            continue
        parsed.append((number, line))
        cid = line.custom_id
        if not isinstance(cid, str) or not cid or len(cid) > _MAX_ID:
            problems.append(
                f"line {number}: custom_id must be a non-empty string of at most {_MAX_ID} characters"
            )
        elif cid in seen:
            problems.append(f"line {number}: custom_id {cid!r} is used on line {seen[cid]} too")
        else:
            seen[cid] = number
        if line.method != "POST":
            problems.append(f'line {number}: method must be "POST"')
        if line.url not in BATCH_URLS:
            problems.append(f"line {number}: url must be one of {', '.join(sorted(BATCH_URLS))}")
        body = line.body
        if not isinstance(body, dict):
            problems.append(f"line {number}: body must be a JSON object")
        elif not isinstance(body.get("model"), str):
            problems.append(f"line {number}: body.model must be a string")
        elif body.get("stream"):
            problems.append(f"line {number}: body.stream is not allowed in a batch")
    if count == 0 and not problems:
        problems.append("the file has no requests")
    if count > max_lines:
        problems.append(f"the file has {count} requests; a batch takes at most {max_lines}")
    if problems:
        shown = "; ".join(problems[:_SHOWN])
        more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
        raise GatewayError(
            400, f"The batch input file is not valid: {shown}{more}.", param="file", code="invalid_file"
        )
    return parsed
