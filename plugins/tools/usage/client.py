"""A small HTTP client of a running gateway (standard library only: a command makes a
handful of calls)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["GatewayClient", "GatewayClientError"]


class GatewayClientError(Exception):
    """The gateway could not be reached, or answered with an error (its message)."""


class GatewayClient:
    def __init__(self, url: str, key: str | None, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        """The decoded JSON answer, or :class:`GatewayClientError` with the gateway's
        message."""
        target = self.url + path
        if query:
            target += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(target, data=data, method=method)
        request.add_header("accept", "application/json")
        if data is not None:
            request.add_header("content-type", "application/json")
        if self.key:
            request.add_header("authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise GatewayClientError(f"HTTP {exc.code}: {_message(exc.read())}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise GatewayClientError(f"cannot reach {self.url}: {reason}") from None


def _message(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", "replace")[:300] or "(no body)"
