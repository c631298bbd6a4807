"""``GET /v1/usage``: what the ledger recorded, totalled by group.

An admin key sees every tenant; any other credential sees its own tenant only (a
``tenant`` filter naming another is refused); on an open gateway (no authenticators)
everyone sees everything, as they may use everything. The buffer is written before the
query, so this gateway's latest requests are in the answer; another gateway's appear within
its ``ledger.flush_interval_s``.

Query parameters: ``since`` and ``until`` (``7d``, ``12h``, ``30m``, a date
``2026-12-01``, an ISO time or seconds since 1970; default the last day, until now),
``tenant``, ``key``, ``project``, ``model``, ``group_by`` (comma-separated: ``tenant``,
``key``, ``project``, ``tier``, ``model``, ``served``, ``endpoint``, ``status``, ``api``,
``gateway``, and ``day`` or ``hour``), ``limit`` (rows, at most 10,000).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Request, Response, get

from shuniu.core.errors import GatewayError
from shuniu.core.governance import GROUPS, UsageQuery
from shuniu.core.state import StateView
from shuniu.core.views.access import is_admin
from shuniu.core.views.replies import bad_value, error_reply, json_reply

__all__ = ["UsageSummary", "parse_time", "usage_routes"]

_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_MAX_ROWS = 10_000
_CHOICES = (*GROUPS, "day", "hour")


def parse_time(text: str, now: float) -> float:
    """``7d`` (ago), a date, an ISO time or seconds since 1970 → seconds since 1970, or
    ``ValueError``."""
    text = text.strip()
    if m := _AGO.match(text):
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


class UsageSummary:
    """The status page's usage section: the last day by tenant and model (one tenant's for
    a tenant's key), read from the ledger at most every ``ttl_s`` per tenant, however many
    pages poll."""

    def __init__(self, view: StateView, ttl_s: float = 10.0) -> None:
        self.view = view
        self.ttl_s = ttl_s
        self._cache: dict[str | None, tuple[float, dict[str, Any]]] = {}

    async def get(self, tenant: str | None) -> dict[str, Any] | None:
        governance = self.view.governance
        if governance is None or governance.database is None:
            return None
        now = time.time()
        hit = self._cache.get(tenant)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        query = UsageQuery(
            since=now - 86400, until=now + 1, tenant=tenant, group_by=("tenant", "model"), limit=50
        )
        if governance.ledger is not None:
            await governance.ledger.flush()  # this gateway's latest requests are in
        try:
            rows = await governance.database.usage(query)
        except Exception:
            return {"available": False}
        if len(self._cache) > 1000:
            self._cache.clear()
        answer = {
            "available": True,
            "window_s": 86400,
            "currency": governance.prices.currency,
            "rows": [msgspec.to_builtins(r) for r in rows],
        }
        self._cache[tenant] = (now, answer)
        return answer


def usage_routes(view: StateView) -> list[Any]:
    @get("/v1/usage")
    async def usage(request: Request[Any, Any, Any]) -> Response[bytes]:
        governance = view.governance
        if governance is None or governance.ledger is None or governance.database is None:
            return error_reply(
                GatewayError(
                    404,
                    "This gateway keeps no usage ledger (governance.ledger in the deployment).",
                    code="not_found",
                )
            )
        headers = request.scope["headers"]
        tenant: str | None = None
        if not is_admin(view.config.gateway, headers) and view.tenancy.auth:
            try:
                tenant = view.tenancy.auth.authenticate(headers).tenant
            except GatewayError as err:
                return error_reply(err)
        params = request.query_params
        now = time.time()
        try:
            since = parse_time(params.get("since", "1d"), now)
        except ValueError:
            return bad_value(
                "since", "since: give 7d, 12h, 30m, a date (2026-12-01), an ISO time or seconds."
            )
        try:
            until = parse_time(params["until"], now) if "until" in params else now + 1
        except ValueError:
            return bad_value(
                "until", "until: give 7d, 12h, 30m, a date (2026-12-01), an ISO time or seconds."
            )
        asked_tenant = params.get("tenant")
        if tenant is not None and asked_tenant is not None and asked_tenant != tenant:
            return error_reply(
                GatewayError(
                    403,
                    "Your key sees its own tenant's usage only.",
                    type="permission_error",
                    code="forbidden_tenant",
                )
            )
        groups = tuple(g.strip() for g in params.get("group_by", "").split(",") if g.strip())
        unknown = [g for g in groups if g not in GROUPS and g not in ("day", "hour")]
        if unknown:
            return bad_value(
                "group_by",
                f"group_by: unknown {', '.join(unknown)} (choose from {', '.join(_CHOICES)}).",
            )
        if "day" in groups and "hour" in groups:
            return bad_value("group_by", "group_by: day or hour, not both.")
        try:
            limit = int(params.get("limit", "1000"))
            if not 1 <= limit <= _MAX_ROWS:
                raise ValueError
        except ValueError:
            return bad_value("limit", f"limit: a whole number from 1 to {_MAX_ROWS}.")
        query = UsageQuery(
            since=since,
            until=until,
            tenant=tenant if tenant is not None else asked_tenant,
            key_id=params.get("key"),
            project=params.get("project"),
            model=params.get("model"),
            group_by=groups,
            limit=limit,
        )
        await governance.ledger.flush()
        try:
            rows = await governance.database.usage(query)
        except Exception:
            return error_reply(
                GatewayError(
                    503,
                    "The usage ledger cannot be read right now; try again shortly.",
                    type="server_error",
                    code="ledger_unavailable",
                    headers={"retry-after": "5"},
                )
            )
        body = {
            "object": "list",
            "since": since,
            "until": min(until, now),
            "currency": governance.prices.currency,
            "group_by": list(groups),
            "data": rows,
        }
        if tenant is not None:
            body["tenant"] = tenant
        return json_reply(200, body, {"cache-control": "no-store"})

    return [usage]
