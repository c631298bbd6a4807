"""Batches as OpenAI's API writes them, and the lines of their output and error files."""

from __future__ import annotations

import json
import secrets
from typing import Any

from shuniu.core.batch.queue import BatchRecord

__all__ = ["batch_object", "output_line", "parse_window"]

_STAMPS = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)
_FAILED = frozenset({"failed", "expired", "cancelled"})


def parse_window(text: str) -> int | None:
    """``24h`` → seconds; ``None`` when it is not a whole number of hours from 1 to 168."""
    if not text.endswith("h") or not text[:-1].isdigit():
        return None
    hours = int(text[:-1])
    return hours * 3600 if 1 <= hours <= 168 else None


def batch_object(batch: BatchRecord, counts: dict[str, int]) -> dict[str, Any]:
    """The batch object (``request_counts`` from the requests' states)."""
    total = sum(counts.values())
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": batch.created_at,
        "expires_at": batch.expires_at,
        **{stamp: batch.times.get(stamp) for stamp in _STAMPS},
        "request_counts": {
            "total": total,
            "completed": counts.get("done", 0),
            "failed": sum(n for state, n in counts.items() if state in _FAILED),
        },
        "metadata": batch.metadata,
    }


def output_line(
    custom_id: str, state: str, status_code: int | None, response: str | None, request_id: str | None
) -> bytes:
    """One line of the output file (an answered request) or of the error file."""
    body = json.loads(response) if response else None
    error = None
    if state == "expired":
        error = {"code": "batch_expired", "message": "The batch expired before this request ran."}
    elif state == "cancelled":
        error = {"code": "batch_cancelled", "message": "The batch was cancelled before this request ran."}
    line = {
        "id": "batch_req_" + secrets.token_hex(12),
        "custom_id": custom_id,
        "response": (
            {"status_code": status_code, "request_id": request_id, "body": body}
            if status_code is not None
            else None
        ),
        "error": error,
    }
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"
