"""The admin API's keys: ``/admin/keys``, API keys managed at run time
(``governance.keys``), stored hashed in the ledger's database.

- ``POST /admin/keys`` ``{"tenant": "acme", "tier": "pro", "project": "search", "models":
  [...], "limits": {"rpm": 60}, "budgets": [{"period": "day", "tokens": 100000}],
  "expires_in_s": 2592000, "id": "acme-ci", "description": "..."}``: a new key, answered
  ONCE in ``key`` (only its hash is kept);
- ``GET /admin/keys`` and ``GET /admin/keys/{id}``: the keys' settings (never a hash);
- ``DELETE /admin/keys/{id}``: revoke (refused from then on; the row stays, for reports);
- ``POST /admin/keys/{id}/rotate`` ``{"grace_s": 3600}``: a new secret for the same key id,
  settings and budgets; the old one keeps working for ``grace_s`` (default 0).

A change is at once effective on the gateway (worker) that made it, and on the others
within ``governance.keys.refresh_s`` (each reads the key table); revoking is never undone
by a refresh. Ids of the deployment file's keys cannot be taken.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from litestar import Request, Response, delete, get, post
from pydantic import Field, ValidationError, model_validator

from shuniu.core.config import BudgetConfig, LimitsConfig, Options
from shuniu.core.contracts import AuthenticatorOptions
from shuniu.core.errors import GatewayError
from shuniu.core.governance import KeyManager, KeyRow
from shuniu.core.state import StateView
from shuniu.core.views.access import admin_refusal
from shuniu.core.views.replies import error_reply, json_reply

__all__ = ["KeySpec", "key_routes"]

_SECRET_FIELDS = ("hash", "previous_hash")
_NO_STORE = {"cache-control": "no-store"}
"""Key listings and new secrets are never cached by a proxy."""


class KeySpec(Options):
    """The body of ``POST /admin/keys``."""

    id: str | None = Field(None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@-]+$")
    """A name for the key (default: a random one)."""
    tenant: str = Field(min_length=1, max_length=128)
    tier: str = "default"
    project: str | None = Field(None, min_length=1, max_length=128)
    models: list[str] | None = None
    limits: LimitsConfig | None = None
    budgets: list[BudgetConfig] = Field(default_factory=list)
    description: str | None = Field(None, max_length=1000)
    expires_in_s: float | None = Field(None, gt=0)
    expires_at: float | None = Field(None, gt=0)
    """Seconds since 1970."""

    @model_validator(mode="after")
    def _one_expiry(self) -> KeySpec:
        if self.expires_in_s is not None and self.expires_at is not None:
            raise ValueError("give expires_in_s or expires_at, not both")
        return self


class RotateSpec(Options):
    grace_s: float = Field(0.0, ge=0, le=30 * 86400)
    """How long the old secret keeps working."""


def _public(row: KeyRow, now: float) -> dict[str, Any]:
    out = {k: v for k, v in msgspec.structs.asdict(row).items() if k not in _SECRET_FIELDS and v is not None}
    if row.revoked_at is not None:
        state = "revoked"
    elif row.expires_at is not None and row.expires_at <= now:
        state = "expired"
    else:
        state = "active"
    out["state"] = state
    if row.previous_expires_at is not None and row.previous_expires_at > now:
        out["previous_secret_valid_until"] = row.previous_expires_at
    out.pop("previous_expires_at", None)
    return out


def _invalid(exc: ValidationError) -> GatewayError:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "<body>"
    return GatewayError(400, f"{where}: {first['msg']}", param=where, code="invalid_value")


def key_routes(view: StateView) -> list[Any]:
    """The ``/admin/keys`` handlers (404 ``keys_disabled`` without managed keys)."""

    def manager(request: Request[Any, Any, Any]) -> KeyManager | Response[bytes]:
        if (err := admin_refusal(view.config.gateway, request.scope["headers"])) is not None:
            return error_reply(err)
        governance = view.governance
        if governance is None or governance.keys is None:
            return error_reply(
                GatewayError(
                    404,
                    "Keys are not managed at run time here (governance.keys and a ledger in the deployment).",
                    code="keys_disabled",
                )
            )
        return governance.keys

    def file_key_ids() -> set[str]:
        ids: set[str] = set()
        for options in view.resolved.authenticator_options.values():
            if isinstance(options, AuthenticatorOptions):
                ids |= options.key_ids()
        return ids

    def unavailable(exc: Exception) -> Response[bytes]:
        return error_reply(
            GatewayError(
                503,
                f"The key table cannot be reached right now ({type(exc).__name__}); nothing changed.",
                type="server_error",
                code="ledger_unavailable",
                headers={"retry-after": "5"},
            )
        )

    @post("/admin/keys", status_code=201)
    async def create(request: Request[Any, Any, Any]) -> Response[bytes]:
        keys = manager(request)
        if isinstance(keys, Response):
            return keys
        try:
            spec = KeySpec.model_validate(msgspec.json.decode(await request.body()))
        except msgspec.DecodeError:
            return error_reply(GatewayError(400, "The body must be a JSON object.", code="invalid_json"))
        except ValidationError as exc:
            return error_reply(_invalid(exc))
        tiers = view.tenancy.tiers
        if spec.tier not in tiers:
            return error_reply(
                GatewayError(
                    400,
                    f"tier: no tier {spec.tier!r} (tiers: {', '.join(sorted(tiers))}).",
                    param="tier",
                    code="invalid_value",
                )
            )
        names = {a for name, m in view.config.models.items() for a in (name, *m.aliases)}
        unknown = sorted(set(spec.models or ()) - names)
        if unknown:
            return error_reply(
                GatewayError(
                    400,
                    f"models: no model named {', '.join(map(repr, unknown))}.",
                    param="models",
                    code="invalid_value",
                )
            )
        key_id = spec.id or f"key-{secrets.token_hex(4)}"
        if key_id in file_key_ids():
            return error_reply(
                GatewayError(
                    409, f"id: {key_id!r} is a key of the deployment file.", param="id", code="conflict"
                )
            )
        now = time.time()
        expires = (
            spec.expires_at
            if spec.expires_at is not None
            else (now + spec.expires_in_s if spec.expires_in_s is not None else None)
        )
        row = KeyRow(
            id=key_id,
            hash="",
            tenant=spec.tenant,
            tier=spec.tier,
            project=spec.project,
            models=spec.models,
            limits=spec.limits.model_dump(exclude_none=True) if spec.limits is not None else None,
            budgets=[b.model_dump(exclude_none=True) for b in spec.budgets] or None,
            description=spec.description,
            expires_at=expires,
        )
        try:
            if await keys.get(key_id) is not None:
                return error_reply(
                    GatewayError(409, f"id: a key {key_id!r} exists.", param="id", code="conflict")
                )
            secret, stored = await keys.create(row)
        except Exception as exc:
            return unavailable(exc)
        return json_reply(201, {"key": secret, **_public(stored, now)}, _NO_STORE)

    @get("/admin/keys")
    async def listing(request: Request[Any, Any, Any]) -> Response[bytes]:
        keys = manager(request)
        if isinstance(keys, Response):
            return keys
        try:
            rows = await keys.list()
        except Exception as exc:
            return unavailable(exc)
        now = time.time()
        return json_reply(200, {"object": "list", "data": [_public(r, now) for r in rows]}, _NO_STORE)

    async def one_key(
        request: Request[Any, Any, Any], change: Callable[[KeyManager, str], Awaitable[KeyRow | None]]
    ) -> Response[bytes]:
        """``change`` applied to the key of the path (a read, a revocation), answered."""
        keys = manager(request)
        if isinstance(keys, Response):
            return keys
        try:
            row = await change(keys, request.path_params["key_id"])
        except Exception as exc:
            return unavailable(exc)
        if row is None:
            return error_reply(GatewayError(404, "No such managed key.", code="not_found"))
        return json_reply(200, _public(row, time.time()), _NO_STORE)

    @get("/admin/keys/{key_id:str}")
    async def one(request: Request[Any, Any, Any]) -> Response[bytes]:
        return await one_key(request, KeyManager.get)

    @delete("/admin/keys/{key_id:str}", status_code=200)
    async def revoke(request: Request[Any, Any, Any]) -> Response[bytes]:
        return await one_key(request, KeyManager.revoke)

    @post("/admin/keys/{key_id:str}/rotate", status_code=200)
    async def rotate(request: Request[Any, Any, Any]) -> Response[bytes]:
        keys = manager(request)
        if isinstance(keys, Response):
            return keys
        raw = await request.body()
        try:
            spec = RotateSpec.model_validate(msgspec.json.decode(raw) if raw.strip() else {})
        except msgspec.DecodeError:
            return error_reply(GatewayError(400, "The body must be a JSON object.", code="invalid_json"))
        except ValidationError as exc:
            return error_reply(_invalid(exc))
        try:
            rotated = await keys.rotate(request.path_params["key_id"], spec.grace_s)
        except Exception as exc:
            return unavailable(exc)
        if rotated is None:
            return error_reply(GatewayError(404, "No such managed key (or it is revoked).", code="not_found"))
        secret, row = rotated
        return json_reply(200, {"key": secret, **_public(row, time.time())}, _NO_STORE)

    return [create, listing, one, revoke, rotate]
