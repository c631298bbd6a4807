"""URLs in messages: a store's URL (Redis, PostgreSQL) may carry a password, which must
never reach a log line or an error."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["redact_url"]


def redact_url(url: str) -> str:
    """``url`` without its user, password and query (which may hold a password too)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{netloc}{parts.path}"
