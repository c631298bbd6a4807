"""Tenancy on the request path: who is calling (authentication), what their tier lets them
do (models, ``max_tokens``, prompt length), and how much (rate limits).

Built once per gateway from the deployment. Each step costs nothing when the deployment
does not use it: no authenticators → no credential check; no tier with limits → no store
call. Rate-limit plans (the list of limits that apply to a principal) are computed once per
principal and kept in a bounded table.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any, Final

from shuniu.core.config import Deployment, LimitsConfig, TierConfig
from shuniu.core.contracts import Authenticator, AuthenticatorOptions, Decision, Lease, Rate, RateLimitStore
from shuniu.core.errors import GatewayError, model_not_found
from shuniu.core.tenancy.admission import Admission
from shuniu.core.tenancy.auth import AuthChain
from shuniu.core.tenancy.binding import Binding
from shuniu.core.tenancy.ratelimit_headers import (
    LIMIT_REQUESTS,
    LIMIT_TOKENS,
    format_reset,
    reset_bytes,
    taken_headers,
)
from shuniu.core.types import InferenceRequest, Limits, Principal

__all__ = ["Admission", "Tenancy", "Tier", "format_reset", "limits_in_use", "reset_bytes"]

_MINUTE = 60.0
_DAY = 86400.0
_MAX_PLANS = 65536
_MAX_RECENT = 4096
_NO_LIMITS = Limits()


class Tier:
    """A tier, compiled for the request path."""

    __slots__ = (
        "cache",
        "degrade",
        "key_limits",
        "max_prompt_tokens",
        "max_tokens_default",
        "max_tokens_limit",
        "models",
        "name",
        "priority",
        "sizes",
        "tenant_limits",
    )

    def __init__(self, name: str, cfg: TierConfig) -> None:
        self.name = name
        self.priority = cfg.priority
        self.models = frozenset(cfg.models) if cfg.models is not None else None
        self.max_tokens_default = cfg.max_tokens_default
        self.max_tokens_limit = cfg.max_tokens_limit
        self.max_prompt_tokens = cfg.max_prompt_tokens
        self.sizes = not (
            cfg.max_tokens_default is None and cfg.max_tokens_limit is None and cfg.max_prompt_tokens is None
        )
        """Whether the tier fills in or limits ``max_tokens`` or limits the prompt."""
        self.key_limits = _limits(cfg.key_limits)
        self.tenant_limits = _limits(cfg.tenant_limits)
        self.cache = cfg.cache
        self.degrade = cfg.degrade


def _limits(cfg: LimitsConfig | None) -> Limits:
    if cfg is None:
        return _NO_LIMITS
    return Limits(cfg.rpm, cfg.rpd, cfg.tpm, cfg.tpd, cfg.concurrency)


def _merge(base: Limits, override: Limits | None) -> Limits:
    if override is None:
        return base
    return Limits(
        override.rpm if override.rpm is not None else base.rpm,
        override.rpd if override.rpd is not None else base.rpd,
        override.tpm if override.tpm is not None else base.tpm,
        override.tpd if override.tpd is not None else base.tpd,
        override.concurrency if override.concurrency is not None else base.concurrency,
    )


class _Plan:
    """The limits that apply to one principal, compiled once: the request-counting rates
    ready to send, the token rates as templates (their cost is each request's
    reservation), and the ``x-ratelimit-*`` header values that never change."""

    __slots__ = (
        "active",
        "binding",
        "leases",
        "max_reservable",
        "native",
        "request_limit_headers",
        "request_limits",
        "request_rates",
        "requests",
        "scopes",
        "token_limit_headers",
        "token_limits",
        "tokens",
    )

    def __init__(self, principal: Principal, tier: Tier) -> None:
        self.requests: list[tuple[str, float, float, str]] = []
        """(key, limit, period, label) of request-counting rates."""
        self.tokens: list[tuple[str, float, float, str]] = []
        self.leases: list[Lease] = []
        self.scopes: list[tuple[str, Limits]] = []
        if principal.key_id is not None:
            self.scopes.append(
                (f"k:{principal.tenant}:{principal.key_id}", _merge(tier.key_limits, principal.limits))
            )
        self.scopes.append((f"t:{principal.tenant}", tier.tenant_limits))
        for scope, limits in self.scopes:
            who = f"key {principal.key_id!r}" if scope.startswith("k:") else f"tenant {principal.tenant!r}"
            if limits.rpm is not None:
                self.requests.append(
                    (scope + ":rpm", limits.rpm, _MINUTE, f"requests per minute (RPM) of {who}")
                )
            if limits.rpd is not None:
                self.requests.append((scope + ":rpd", limits.rpd, _DAY, f"requests per day (RPD) of {who}"))
            if limits.tpm is not None:
                self.tokens.append((scope + ":tpm", limits.tpm, _MINUTE, f"tokens per minute (TPM) of {who}"))
            if limits.tpd is not None:
                self.tokens.append((scope + ":tpd", limits.tpd, _DAY, f"tokens per day (TPD) of {who}"))
            if limits.concurrency is not None:
                self.leases.append(Lease(scope + ":conc", limits.concurrency))
        self.active = bool(self.requests or self.tokens or self.leases)
        self.request_rates = [Rate(key, limit, period, 1.0) for key, limit, period, _ in self.requests]
        """A request costs one unit of each: the same rates for every request."""
        self.max_reservable = min((limit for _, limit, _, _ in self.tokens), default=math.inf)
        """A reservation above this can never pass (429 at once, without the store)."""
        self.request_limits = [b"%d" % int(limit) for _, limit, _, _ in self.requests]
        self.token_limits = [b"%d" % int(limit) for _, limit, _, _ in self.tokens]
        self.request_limit_headers = [(LIMIT_REQUESTS, value) for value in self.request_limits]
        self.token_limit_headers = [(LIMIT_TOKENS, value) for value in self.token_limits]
        self.binding: Any = None
        """The store's compiled form of these limits (a store with ``bind``), made on first
        use."""
        self.native: Binding | None = None
        """``binding``'s :class:`Binding`, when it has one (its ``native``): called
        directly, a C call in a compiled build."""

    def too_large(self, reserved: int) -> GatewayError:
        label, limit = next((label, limit) for _, limit, _, label in self.tokens if reserved > limit)
        return GatewayError(
            429,
            f"Request too large for {label}: limit {int(limit)}, requested {reserved} "
            "(prompt plus max_tokens). Send a shorter prompt or a smaller max_tokens.",
            type="tokens",
            code="rate_limit_exceeded",
        )


class Tenancy:
    """Authentication, tiers and rate limits for one gateway."""

    def __init__(
        self,
        deployment: Deployment,
        authenticators: list[Authenticator],
        store: RateLimitStore | None,
        managed: Authenticator | None = None,
    ) -> None:
        """``managed``: the table of keys managed at run time, asked after the deployment's
        authenticators."""
        self.auth = AuthChain([*authenticators, managed] if managed is not None else authenticators)
        self.identity_headers = deployment.gateway.identity_headers and not self.auth
        tiers = {"default": TierConfig(), **deployment.tiers}  # type: ignore[call-arg]
        batches = deployment.batches
        if batches.enabled and batches.tier not in tiers:
            # Batch requests run in their own tier, behind every interactive one.
            tiers[batches.tier] = TierConfig(priority=batches.priority)  # type: ignore[call-arg]
        self.tiers: dict[str, Tier] = {name: Tier(name, cfg) for name, cfg in tiers.items()}
        self.store = store
        # A store that keeps its state in this process can answer without a coroutine.
        self._acquire_now = getattr(store, "acquire_now", None)
        self._settle_now = getattr(store, "settle_now", None)
        self.sync = self._acquire_now is not None and self._settle_now is not None
        """:meth:`acquire_now` and :meth:`settle_now` may be used instead of the coroutines."""
        # An in-process store may also compile a principal's limits once (``bind``): then a
        # request books them without a Rate or a Decision built for it.
        self._bind = getattr(store, "bind", None) if self.sync else None
        self._recent: dict[int, tuple[Principal, Tier, _Plan]] = {}
        """id(principal) → its plan: authenticators hand out the same principal object per
        credential, and an int key hashes for free (the entry holds the principal, so its id
        cannot be reused while it is here)."""
        cfg = deployment.rate_limits
        self.default_output_tokens = cfg.default_output_tokens if cfg is not None else 256
        self.send_headers = cfg.headers if cfg is not None else True
        self._plans: dict[tuple[str, str | None, str, Limits | None], _Plan] = {}
        self._prefix = os.urandom(6).hex()
        self._counter = 0
        # Anything to check per request beyond authentication?
        self.checks_tier = bool(deployment.tiers) or bool(self.auth)

    @property
    def priorities(self) -> dict[str, int]:
        """Tier name → priority, for tiers that set one (for the scheduler)."""
        return {name: t.priority for name, t in self.tiers.items() if t.priority is not None}

    # -- per request ----------------------------------------------------------------------

    def tier_of(self, principal: Principal) -> Tier:
        tier = self.tiers.get(principal.tier)
        if tier is None:
            raise GatewayError(
                403,
                "Your credential names a tier this gateway does not serve.",
                type="permission_error",
                code="unknown_tier",
            )
        return tier

    def check_models(self, req: InferenceRequest, tier: Tier, root: str) -> None:
        """404 when the tier or the credential may not use the request's model. ``root`` is
        the model's own name (``req.model`` may be an alias)."""
        allowed = tier.models
        if allowed is not None and req.model not in allowed and root not in allowed:
            raise model_not_found(req.model)
        own = req.principal.models
        if own is not None and req.model not in own and root not in own:
            raise model_not_found(req.model)

    def checked_tier(self, req: InferenceRequest, root: str) -> Tier:
        """The caller's tier (:meth:`tier_of`), with :meth:`check` done: one call on the
        request path instead of three."""
        principal = req.principal
        tier = self.tiers.get(principal.tier)
        if tier is None:
            return self.tier_of(principal)  # its 403
        if tier.models is not None or principal.models is not None:
            self.check_models(req, tier, root)
        if tier.sizes:
            self._check_sizes(req, tier)
        return tier

    def check(self, req: InferenceRequest, tier: Tier, root: str) -> None:
        """Models, ``max_tokens`` and prompt length against the tier and the credential.
        ``root`` is the model's own name (``req.model`` may be an alias)."""
        self.check_models(req, tier, root)
        self._check_sizes(req, tier)

    def _check_sizes(self, req: InferenceRequest, tier: Tier) -> None:
        """``max_tokens`` (filled in from the tier's default, or checked against its limit)
        and the prompt's length against the tier."""
        if req.max_tokens is None:
            if tier.max_tokens_default is not None:
                req.max_tokens = tier.max_tokens_default
                # Engines read the body: the default must reach them too.
                req.body["max_tokens"] = tier.max_tokens_default
        elif tier.max_tokens_limit is not None and req.max_tokens > tier.max_tokens_limit:
            raise GatewayError(
                400,
                f"max_tokens is {req.max_tokens}, above the {tier.max_tokens_limit} your tier allows.",
                param="max_tokens",
                code="max_tokens_exceeded",
            )
        if tier.max_prompt_tokens is not None and req.prompt_tokens > tier.max_prompt_tokens:
            raise GatewayError(
                400,
                f"The prompt is about {req.prompt_tokens} tokens, above the "
                f"{tier.max_prompt_tokens} your tier allows.",
                param="messages" if req.api == "chat" else "prompt",
                code="prompt_too_long",
            )

    def _plan(self, principal: Principal, tier: Tier) -> _Plan:
        recent = self._recent.get(id(principal))
        if recent is not None and recent[0] is principal and recent[1] is tier:
            return recent[2]
        key = (principal.tenant, principal.key_id, tier.name, principal.limits)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()  # rebuilt on demand; bounded memory for many tenants
            plan = self._plans[key] = _Plan(principal, tier)
        if len(self._recent) >= _MAX_RECENT:
            self._recent.clear()
        self._recent[id(principal)] = (principal, tier, plan)
        return plan

    def _admit(
        self, req: InferenceRequest, tier: Tier
    ) -> tuple[_Plan, list[Rate], list[Rate], int, str] | None:
        """What the store is asked for this request: ``(plan, rates, token_rates, reserved,
        token)``, or ``None`` when no limit applies; 429 for a reservation no token limit
        can ever hold."""
        plan = self._plan(req.principal, tier)
        if not plan.active:
            return None
        reserved = self._reservation(req, plan)
        if plan.tokens:
            cost = float(reserved)
            token_rates = [Rate(key, limit, period, cost) for key, limit, period, _ in plan.tokens]
            rates = plan.request_rates + token_rates
        else:
            token_rates = []
            rates = plan.request_rates
        self._counter += 1
        return plan, rates, token_rates, reserved, f"{self._prefix}{self._counter:x}"

    def _reservation(self, req: InferenceRequest, plan: _Plan) -> int:
        """The tokens ``req`` reserves (prompt plus ``max_tokens`` or the default); 429 for a
        reservation no token limit can ever hold."""
        # max_tokens 0: a pooling request, which generates nothing.
        max_tokens = req.max_tokens
        reserved = req.prompt_tokens + (max_tokens if max_tokens is not None else self.default_output_tokens)
        if reserved > plan.max_reservable:
            raise plan.too_large(reserved)
        return reserved

    def _admission(
        self, decision: Decision, plan: _Plan, token_rates: list[Rate], reserved: int, token: str
    ) -> Admission:
        headers = self._headers(plan, decision) if self.send_headers else []
        if not decision.allowed:
            raise self._refusal(plan, decision, headers)
        return Admission(token, token_rates, plan.leases, reserved, headers)

    async def acquire(self, req: InferenceRequest, tier: Tier) -> Admission | None:
        """Take the request's share of every limit that applies, or raise 429."""
        store = self.store
        if store is None:
            return None
        asked = self._admit(req, tier)
        if asked is None:
            return None
        plan, rates, token_rates, reserved, token = asked
        decision = await store.acquire(rates, plan.leases, token)
        return self._admission(decision, plan, token_rates, reserved, token)

    def acquire_now(self, req: InferenceRequest, tier: Tier) -> Admission | None:
        """:meth:`acquire` without a coroutine, for a store that keeps its state in this
        process (:attr:`sync` is true)."""
        if self._bind is not None:
            # The common case without the general path's Rates and Decision: the plan, the
            # reservation, the store's binding and the headers.
            plan = self._plan(req.principal, tier)
            if not plan.active:
                return None
            max_tokens = req.max_tokens
            # A reservation above every token limit is refused by ``take`` (which cannot
            # book it) and answered with its 429 by the general path below.
            if max_tokens is None:
                max_tokens = self.default_output_tokens
            reserved = req.prompt_tokens + max_tokens
            binding = plan.binding
            if binding is None:
                binding = plan.binding = self._bind(plan.request_rates, _templates(plan), plan.leases)
                native = getattr(binding, "native", None)
                plan.native = native if isinstance(native, Binding) else None
            self._counter += 1
            booking = self._counter  # an int: the binding's leases are this process's own
            native = plan.native
            if native is not None:
                taken = native.take(float(reserved), booking)
                binding = native  # settled there too (see settle_now)
            else:
                taken = binding.take(float(reserved), booking)
            if taken is not None:
                headers = (
                    taken_headers(plan.request_limit_headers, plan.token_limit_headers, taken)
                    if self.send_headers
                    else []
                )
                return Admission(booking, _NO_RATES, plan.leases, reserved, headers, binding)
            # Refused: the store's full answer, for the 429 and its headers.
        asked = self._admit(req, tier)
        if asked is None:
            return None
        plan, rates, token_rates, reserved, token = asked
        decision = self._acquire_now(rates, plan.leases, token)  # type: ignore[misc]
        return self._admission(decision, plan, token_rates, reserved, token)

    @staticmethod
    def _adjustments(admission: Admission, used_tokens: int) -> list[tuple[Rate, float]]:
        """Each token rate moved by what the request used beyond (or short of) its
        reservation; empty when it used exactly that."""
        delta = float(used_tokens - admission.reserved)
        return [(rate, delta) for rate in admission.tokens] if delta else []

    async def settle(self, admission: Admission, used_tokens: int) -> None:
        """Give back the unused part of the token reservation and the leases."""
        store = self.store
        if store is None:
            return
        if admission.binding is not None:  # booked by the store's binding: settled there
            self.settle_now(admission, used_tokens)
            return
        adjust = self._adjustments(admission, used_tokens)
        if adjust or admission.leases:
            await store.settle(adjust, admission.leases, str(admission.token))

    def settle_now(self, admission: Admission, used_tokens: int) -> None:
        """:meth:`settle` without a coroutine (:attr:`sync` is true)."""
        binding = admission.binding
        # Booked by the store's binding: given back there, in one call (on a Binding, the
        # compiled loops, a C call in a compiled build; on another binding, looked up).
        if isinstance(binding, Binding):
            binding.give_back(float(used_tokens - admission.reserved), admission.token)
            return
        if binding is not None:
            binding.give_back(float(used_tokens - admission.reserved), admission.token)
            return
        adjust = self._adjustments(admission, used_tokens)
        if adjust or admission.leases:
            self._settle_now(adjust, admission.leases, str(admission.token))  # type: ignore[misc]

    # -- responses ------------------------------------------------------------------------

    @staticmethod
    def _headers(plan: _Plan, decision: Decision) -> list[tuple[bytes, bytes]]:
        """OpenAI's ``x-ratelimit-*`` headers from the tightest request and token limits."""
        remaining, reset = decision.remaining, decision.reset_s
        n = len(plan.request_limits)
        if len(remaining) < n + len(plan.token_limits):
            return []
        req = _tightest(remaining, 0, n) if n else -1
        tok = _tightest(remaining, n, len(remaining)) if plan.token_limits else -1
        return taken_headers(
            plan.request_limit_headers,
            plan.token_limit_headers,
            (
                req,
                int(remaining[req]) if req >= 0 else 0,
                reset[req] if req >= 0 else 0.0,
                tok - n if tok >= 0 else -1,
                int(remaining[tok]) if tok >= 0 else 0,
                reset[tok] if tok >= 0 else 0.0,
            ),
        )

    @staticmethod
    def _refusal(plan: _Plan, decision: Decision, headers: list[tuple[bytes, bytes]]) -> GatewayError:
        extra = {k.decode(): v.decode() for k, v in headers}
        if decision.denied == "store_unavailable":
            extra["retry-after"] = "1"
            return GatewayError(
                503,
                "Rate limits cannot be checked right now; try again shortly.",
                type="server_error",
                code="rate_limiter_unavailable",
                headers=extra,
            )
        wait = decision.retry_after_s
        retry = "1" if not math.isfinite(wait) else str(max(1, math.ceil(wait)))
        extra["retry-after"] = retry
        label, kind = _describe(plan, decision.denied)
        if kind == "concurrency":
            message = f"Too many concurrent requests for {label}. Wait for one to finish."
        else:
            when = f"in {format_reset(wait)}" if math.isfinite(wait) else "later"
            message = f"Rate limit reached for {label}. Please try again {when}."
        return GatewayError(
            429,
            message,
            type="tokens" if kind == "tokens" else "requests",
            code="rate_limit_exceeded",
            headers=extra,
        )


_NO_RATES: Final[list[Rate]] = []  # Final: a constant in compiled code


def _templates(plan: _Plan) -> list[Rate]:
    """The plan's token rates for a store binding (their cost is given per request)."""
    return [Rate(key, limit, period, 1.0) for key, limit, period, _ in plan.tokens]


def _describe(plan: _Plan, key: str | None) -> tuple[str, str]:
    for entries, kind in ((plan.requests, "requests"), (plan.tokens, "tokens")):
        for k, limit, _period, label in entries:
            if k == key:
                return f"{label}: limit {int(limit)}", kind
    for lease in plan.leases:
        if lease.key == key:
            scope = lease.key.rsplit(":", 1)[0]
            who = "your key" if scope.startswith("k:") else "your tenant"
            return f"{who} (limit {lease.limit} at once)", "concurrency"
    return "your limits", "requests"


def limits_in_use(deployment: Deployment, authenticator_options: Mapping[int, Any]) -> bool:
    """Whether any tier or credential sets a limit (then a store is needed)."""
    for tier in deployment.tiers.values():
        for cfg in (tier.key_limits, tier.tenant_limits):
            if cfg is not None and any(v is not None for v in cfg.model_dump().values()):
                return True
    return any(
        isinstance(options, AuthenticatorOptions) and options.sets_limits()
        for options in authenticator_options.values()
    )


def _tightest(remaining: tuple[float, ...], start: int, end: int) -> int:
    """The index, in ``start`` to ``end``, of the limit with the least left (the first on a
    tie)."""
    best, low = start, remaining[start]
    for i in range(start + 1, end):
        if remaining[i] < low:
            best, low = i, remaining[i]
    return best
