"""Budgets on the request path: each request's tokens and cost reserved against every
budget of its key, tenant and project at admission (429 ``budget_exceeded`` when one would
be overrun), settled with the real usage when it ends.

A request reserves its prompt plus its ``max_tokens`` (or ``rate_limits``'s
``default_output_tokens``), and what those would cost at its model's prices; the
settlement gives back what it did not use. A budget's soft threshold (``soft``, a share of
it) adds ``x-shuniu-budget-warning`` to the response, counts in
``shuniu_budget_warnings_total`` and is logged once per scope and period.

Plans (the budgets that apply to a principal) are built once per principal and kept in a
bounded table, as the rate limits' are.
"""

from __future__ import annotations

import calendar
import logging
import math
import time
from typing import Any

from shuniu.core.config import BudgetConfig, GovernanceConfig
from shuniu.core.errors import GatewayError
from shuniu.core.governance.counters import Counters
from shuniu.core.governance.prices import Prices
from shuniu.core.http.asgi import header_value
from shuniu.core.types import Budget, InferenceRequest, Principal

__all__ = ["BudgetHold", "Budgets", "budget_of", "window"]

log = logging.getLogger("shuniu.budgets")

_MAX_PLANS = 65536
_MICRO = 1_000_000
_DAY = 86400
_KEEP_S = _DAY
"""How long a counter outlives its window (reports of yesterday's spend, clock skew)."""
_TOTAL_TTL_S = 400 * _DAY
"""A ``total`` counter's expiry, renewed on every use (the ledger restores it otherwise)."""
_LEVELS = {"k": "key", "t": "tenant", "p": "project"}


def budget_of(cfg: BudgetConfig) -> Budget:
    return Budget(period=cfg.period, tokens=cfg.tokens, cost=cfg.cost, soft=cfg.soft)


def window(period: str, now: float) -> tuple[str, float]:
    """The window of ``period`` that ``now`` falls in, and when it ends (``inf`` for
    ``total``)."""
    if period == "total":
        return "all", math.inf
    t = time.gmtime(now)
    if period == "day":
        start = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
        return f"d{t.tm_year:04d}{t.tm_mon:02d}{t.tm_mday:02d}", float(start + _DAY)
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return f"m{t.tm_year:04d}{t.tm_mon:02d}", float(calendar.timegm((year, month, 1, 0, 0, 0)))


def window_start(period: str, now: float) -> float:
    """When the current window of ``period`` began."""
    if period == "total":
        return 0.0
    t = time.gmtime(now)
    if period == "day":
        return float(calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0)))
    return float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)))


def _ttl(ends: float, now: float) -> int:
    """Seconds a counter of the window ending at ``ends`` is kept from ``now``."""
    return _TOTAL_TTL_S if math.isinf(ends) else int(ends - now) + _KEEP_S


class _Line:
    """One budget of one scope."""

    __slots__ = ("booked", "budget", "ends", "key", "label", "level", "limit", "name", "scope", "ttl", "unit")

    def __init__(self, scope: str, name: str, budget: Budget) -> None:
        self.scope = scope
        self.name = name
        """The key's id, the tenant's or the project's name."""
        self.level = _LEVELS[scope[0]]
        self.label = f"{self.level} {name!r}"
        self.budget = budget
        self.unit = "tok" if budget.tokens is not None else "cost"
        self.limit = budget.tokens if budget.tokens is not None else math.floor((budget.cost or 0.0) * _MICRO)
        # The current window's counter key, computed when a window starts, not per request.
        self.ends = -math.inf
        self.key = ""
        self.ttl = 0
        self.booked: tuple[str, str, int] = ("", "", 0)

    def roll(self, now: float) -> None:
        """Move to the window ``now`` falls in."""
        name, ends = window(self.budget.period, now)
        self.ends = ends
        self.key = f"{self.scope}:{name}:{self.unit}"
        # Counted from the window's start, so it stays right for the whole window.
        self.ttl = _ttl(ends, now)
        self.booked = (self.key, self.unit, self.ttl)


class BudgetHold:
    """A request's reservation against its budgets, settled when it ends."""

    __slots__ = ("entries", "headers", "micros", "model", "tokens")

    def __init__(
        self, entries: list[tuple[str, str, int]], tokens: int, micros: int, model: str, headers: list[Any]
    ) -> None:
        self.entries = entries
        """(counter key, unit, ttl_s) of every budget booked."""
        self.tokens = tokens
        self.micros = micros
        self.model = model
        self.headers: list[tuple[bytes, bytes]] = headers
        """``x-shuniu-budget-warning`` when a soft threshold was passed."""


class Budgets:
    """The budgets of one gateway: plans per principal, the counters, the prices."""

    def __init__(
        self,
        cfg: GovernanceConfig,
        counters: Counters,
        prices: Prices,
        default_output_tokens: int,
    ) -> None:
        self.counters = counters
        self.prices = prices
        self.default_output_tokens = default_output_tokens
        self._tenants: dict[str, tuple[Budget, ...]] = {
            name: tuple(budget_of(b) for b in t.budgets) for name, t in cfg.tenants.items() if t.budgets
        }
        self._projects: dict[str, tuple[Budget, ...]] = {
            name: tuple(budget_of(b) for b in p.budgets) for name, p in cfg.projects.items() if p.budgets
        }
        self._plans: dict[tuple[str, str | None, str | None, tuple[Budget, ...]], list[_Line]] = {}
        self._warned: set[tuple[str, str]] = set()
        self.warnings: dict[tuple[str, str], int] = {}
        """(level, period) → requests warned (a soft threshold passed)."""
        self.refusals: dict[tuple[str, str], int] = {}
        """(level, period) → requests refused (a hard limit)."""
        self.any_for_tenants = bool(self._tenants) or bool(self._projects)

    def plan(self, principal: Principal) -> list[_Line]:
        key = (principal.tenant, principal.key_id, principal.project, principal.budgets)
        lines = self._plans.get(key)
        if lines is None:
            lines = []
            if principal.key_id is not None:
                for b in principal.budgets:
                    lines.append(_Line(f"k:{principal.tenant}:{principal.key_id}", principal.key_id, b))
            for b in self._tenants.get(principal.tenant, ()):
                lines.append(_Line(f"t:{principal.tenant}", principal.tenant, b))
            if principal.project is not None:
                for b in self._projects.get(principal.project, ()):
                    lines.append(_Line(f"p:{principal.project}", principal.project, b))
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            self._plans[key] = lines
        return lines

    async def reserve(self, req: InferenceRequest, model: str) -> BudgetHold | None:
        """Book the request against its budgets, or raise 429 ``budget_exceeded``."""
        lines = self.plan(req.principal)
        if not lines:
            return None
        out = req.max_tokens if req.max_tokens is not None else self.default_output_tokens
        tokens = req.prompt_tokens + out
        micros = math.ceil(self.prices.cost(model, req.prompt_tokens, 0, out) * _MICRO)
        now = time.time()
        entries = []
        booked = []
        for line in lines:
            if now >= line.ends:
                line.roll(now)
            entries.append((line.key, tokens if line.unit == "tok" else micros, line.limit, line.ttl))
            booked.append(line.booked)
        denied, values = await self.counters.reserve(entries)
        if denied >= 0:
            raise self._refusal(lines[denied], values[denied], entries[denied][1], now)
        headers: list[tuple[bytes, bytes]] = []
        for i, line in enumerate(lines):
            limit = entries[i][2]
            used = values[i] + entries[i][1]
            if used >= line.budget.soft * limit:
                headers.append((b"x-shuniu-budget-warning", header_value(self._warn(line, used, limit, now))))
        return BudgetHold(booked, tokens, micros, model, headers)

    def settle(self, hold: BudgetHold, tokens: int, cost: float) -> None:
        """Book the difference between the real usage and the reservation."""
        d_tokens = tokens - hold.tokens
        d_micros = math.ceil(cost * _MICRO) - hold.micros
        add = self.counters.add
        for key, unit, ttl in hold.entries:
            add(key, d_tokens if unit == "tok" else d_micros, ttl)

    def _warn(self, line: _Line, used: int, limit: int, now: float) -> str:
        period = line.budget.period
        stat = (line.level, period)
        self.warnings[stat] = self.warnings.get(stat, 0) + 1
        share = min(999, math.floor(100 * used / limit)) if limit else 100
        name, _ends = window(period, now)
        if (line.scope, name) not in self._warned:
            if len(self._warned) > _MAX_PLANS:
                self._warned.clear()
            self._warned.add((line.scope, name))
            log.warning(
                "budget: %s has used %d%% of its %s %s budget",
                line.label,
                share,
                _period_name(period),
                "token" if line.unit == "tok" else "cost",
            )
        return f'{line.level}="{line.name}"; period={period}; unit={_unit(line)}; used={share}%'

    def _refusal(self, line: _Line, used: int, amount: int, now: float) -> GatewayError:
        period = line.budget.period
        stat = (line.level, period)
        self.refusals[stat] = self.refusals.get(stat, 0) + 1
        _name, ends = window(period, now)
        limit = line.limit
        if line.unit == "tok":
            spent = f"{used:,} of its {limit:,} tokens"
            asked = f"{amount:,} tokens"
        else:
            currency = self.prices.currency
            spent = f"{used / _MICRO:,.4f} of its {limit / _MICRO:,.4f} {currency}"
            asked = f"up to {amount / _MICRO:,.4f} {currency}"
        headers: dict[str, str] = {}
        if math.isinf(ends):
            when = "This budget does not reset."
        else:
            wait = max(1, math.ceil(ends - now))
            headers["retry-after"] = str(wait)
            headers["x-shuniu-budget-reset"] = str(int(ends))
            when = f"It resets at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(ends))}."
        hint = " Send a smaller max_tokens to fit what is left." if used < limit else ""
        return GatewayError(
            429,
            f"Budget exceeded: {line.label} has used {spent} {_period_text(period)}; this request "
            f"reserves {asked}. {when}{hint}",
            type="budget_exceeded",
            code="budget_exceeded",
            headers=headers,
        )

    # -- reconciliation -----------------------------------------------------------------

    def periods(self) -> set[str]:
        """The periods some budget of this gateway uses (keys' budgets as seen so far)."""
        out = {b.period for bs in (*self._tenants.values(), *self._projects.values()) for b in bs}
        for lines in self._plans.values():
            out.update(line.budget.period for line in lines)
        return out

    def reconcile_values(
        self, period: str, spent: list[tuple[str, str | None, str | None, int, float]], now: float
    ) -> dict[str, tuple[int, int]]:
        """Counter values of ``period``'s current window from the ledger's sums."""
        name, ends = window(period, now)
        ttl = _ttl(ends, now)
        totals: dict[str, list[float]] = {}
        for tenant, key_id, project, tokens, cost in spent:
            scopes = [f"t:{tenant}"]
            if key_id is not None:
                scopes.append(f"k:{tenant}:{key_id}")
            if project is not None:
                scopes.append(f"p:{project}")
            for scope in scopes:
                entry = totals.setdefault(scope, [0, 0.0])
                entry[0] += tokens
                entry[1] += cost
        out: dict[str, tuple[int, int]] = {}
        for scope, (tokens, cost) in totals.items():
            out[f"{scope}:{name}:tok"] = (int(tokens), ttl)
            out[f"{scope}:{name}:cost"] = (math.ceil(cost * _MICRO), ttl)
        return out


def _unit(line: _Line) -> str:
    return "tokens" if line.unit == "tok" else "cost"


def _period_name(period: str) -> str:
    return {"day": "daily", "month": "monthly", "total": "total"}[period]


def _period_text(period: str) -> str:
    return {"day": "today (UTC)", "month": "this month (UTC)", "total": "in total"}[period]
