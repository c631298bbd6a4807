"""Pages of a listing as OpenAI's API writes them (``/v1/files``, ``/v1/batches``):
``limit`` and the cursor ``after``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from shuniu.core.errors import GatewayError

__all__ = ["list_page", "page_limit"]

T = TypeVar("T")


def page_limit(params: Mapping[str, str], default: int, most: int) -> int:
    """The ``limit`` parameter, or a 400 naming it."""
    try:
        limit = int(params.get("limit", str(default)))
        if not 1 <= limit <= most:
            raise ValueError
    except ValueError:
        raise GatewayError(
            400, f"limit: a whole number from 1 to {most}.", param="limit", code="invalid_value"
        ) from None
    return limit


def list_page(
    items: Sequence[T], after: str | None, limit: int, id_of: Callable[[T], str], encode: Callable[[T], Any]
) -> dict[str, Any]:
    """``{"object": "list", "data", "first_id", "last_id", "has_more"}`` of ``items`` (in
    their order) after the item with id ``after``."""
    if after is not None:
        ids = [id_of(x) for x in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return {
        "object": "list",
        "data": [encode(x) for x in page],
        "first_id": id_of(page[0]) if page else None,
        "last_id": id_of(page[-1]) if page else None,
        "has_more": len(items) > limit,
    }
