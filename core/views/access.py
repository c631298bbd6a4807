"""Who may see what: admin keys (the admin API, ``/admin/hardware``, and the details of
``/ready`` and ``/status.json``) and metrics tokens (``/metrics``), each a list of SHA-256
hashes in the deployment (or an environment variable), compared in constant time.

Read from the gateway's current configuration on every call: a reload may change them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable
from typing import Any

from shuniu.core.config import GatewayConfig
from shuniu.core.errors import GatewayError
from shuniu.core.tenancy import bearer_token

__all__ = ["admin_hashes", "admin_refusal", "is_admin", "metrics_refusal"]


def _decoded(values: Iterable[str]) -> list[bytes]:
    out = []
    for v in values:
        try:
            out.append(bytes.fromhex(v.removeprefix("sha256:").lower()))
        except ValueError:
            continue  # reported at start-up by the deployment check
    return out


def _listed(keys: list[str], env: str | None) -> list[str]:
    values = list(keys)
    if env:
        values += os.environ.get(env, "").replace(",", " ").split()
    return values


def admin_hashes(cfg: GatewayConfig) -> list[bytes]:
    return _decoded(_listed(cfg.admin_keys, cfg.admin_keys_env))


def _matches(headers: Any, hashes: list[bytes]) -> bool | None:
    """``None`` without a credential, else whether it is one of ``hashes``."""
    key = bearer_token(headers)
    if key is None:
        return None
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
    return any(hmac.compare_digest(digest, h) for h in hashes)


def is_admin(cfg: GatewayConfig, headers: Any) -> bool:
    """Whether the request carries an admin key."""
    hashes = admin_hashes(cfg)
    return bool(hashes) and bool(_matches(headers, hashes))


def admin_refusal(cfg: GatewayConfig, headers: Any, what: str = "The admin API") -> GatewayError | None:
    """Why the request may not use an admin route (403 when no admin key is configured,
    401 without a credential, 403 with another key), or ``None``."""
    hashes = admin_hashes(cfg)
    if not hashes:
        return GatewayError(
            403, f"{what} is off: set gateway.admin_keys.", type="permission_error", code="admin_disabled"
        )
    match = _matches(headers, hashes)
    if match is None:
        return GatewayError(
            401, f"{what} needs an admin key.", code="missing_api_key", headers={"www-authenticate": "Bearer"}
        )
    if not match:
        return GatewayError(
            403,
            f"This key may not use {what[0].lower()}{what[1:]}.",
            type="permission_error",
            code="not_admin",
        )
    return None


def metrics_refusal(cfg: GatewayConfig, headers: Any) -> GatewayError | None:
    """Why the request may not read ``/metrics`` (only when metrics tokens are set)."""
    tokens = _decoded(_listed(cfg.metrics_keys, cfg.metrics_keys_env))
    if not tokens:
        return None
    match = _matches(headers, tokens + admin_hashes(cfg))
    if match is None:
        return GatewayError(
            401,
            "/metrics needs a bearer token.",
            code="missing_api_key",
            headers={"www-authenticate": "Bearer"},
        )
    if not match:
        return GatewayError(
            403, "This token may not read /metrics.", type="permission_error", code="not_admin"
        )
    return None
