"""The JSON answers the views' Litestar handlers send: a payload, or a
:class:`~shuniu.core.errors.GatewayError` as its OpenAI-style error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from litestar import Response

from shuniu.core.errors import GatewayError

__all__ = ["bad_value", "error_reply", "json_reply"]

_encode = msgspec.json.Encoder().encode


def json_reply(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Response[bytes]:
    return Response(_encode(payload), status_code=status, media_type="application/json", headers=headers)


def error_reply(err: GatewayError) -> Response[bytes]:
    return Response(err.body(), status_code=err.status, media_type="application/json", headers=err.headers)


def bad_value(param: str, message: str) -> Response[bytes]:
    """A 400 ``invalid_value`` naming ``param``."""
    return error_reply(GatewayError(400, message, param=param, code="invalid_value"))
