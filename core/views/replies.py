"""The JSON answers the views' Litestar handlers send: a payload, or a
:class:`~shuniu.core.errors.GatewayError` as its OpenAI-style error."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from litestar import Request, Response

from shuniu.core.errors import GatewayError

__all__ = ["bad_value", "error_reply", "json_reply", "unavailable_on_error"]

log = logging.getLogger("shuniu.views")

_encode = msgspec.json.Encoder().encode


def json_reply(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Response[bytes]:
    return Response(_encode(payload), status_code=status, media_type="application/json", headers=headers)


def error_reply(err: GatewayError) -> Response[bytes]:
    return Response(err.body(), status_code=err.status, media_type="application/json", headers=err.headers)


def bad_value(param: str, message: str) -> Response[bytes]:
    """A 400 ``invalid_value`` naming ``param``."""
    return error_reply(GatewayError(400, message, param=param, code="invalid_value"))


def unavailable_on_error(what: str, code: str) -> dict[type[Exception], Callable[..., Response[bytes]]]:
    """Route exception handlers: an error of the store behind a route (``what``: "the batch
    queue") is a 503 ``code`` with ``retry-after``, not a 500 (Litestar's own HTTP errors
    keep the gateway's handler: it is the more specific)."""

    def handler(_request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
        log.warning("%s did not answer: %s: %s", what, type(exc).__name__, exc)
        return error_reply(
            GatewayError(
                503,
                f"{what[0].upper()}{what[1:]} cannot be reached right now; try again shortly.",
                type="server_error",
                code=code,
                headers={"retry-after": "5"},
            )
        )

    return {Exception: handler}
