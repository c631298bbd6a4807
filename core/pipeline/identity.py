"""Identity and tenancy on the request path: the credential (checked before the body is
read), the tier's rules once the model is known, and the rate limits (taken after routing,
settled with the real usage when the request ends). Each step costs nothing when the
deployment does not use it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

from shuniu.core.errors import GatewayError
from shuniu.core.observability.tracing import RequestTrace, traced
from shuniu.core.pipeline.recording import Progress
from shuniu.core.pools.pool import Pool
from shuniu.core.tenancy.tenancy import Admission, Tenancy, Tier
from shuniu.core.types import InferenceRequest, Principal

__all__ = ["acquire", "authenticate", "check_tier", "settle", "settle_now"]

log = logging.getLogger("shuniu.gateway")


def authenticate(
    tenancy: Tenancy,
    headers: Any,
    trace: RequestTrace | None,
    header_map: dict[bytes, bytes] | None = None,
) -> Principal | None:
    """The caller's principal (401 without a valid credential), or ``None`` on an open
    gateway. ``header_map``: the request's headers by name (see ``AuthChain.authenticate``)."""
    if not tenancy.auth:
        return None
    if trace is None:
        return tenancy.auth.authenticate(headers, header_map)
    span = trace.child("shuniu.auth")
    try:
        principal = tenancy.auth.authenticate(headers, header_map)
        span.set_attribute("shuniu.key_id", principal.key_id or "")
    except GatewayError as err:
        trace.fail(span, err.code)
        raise
    finally:
        span.end()
    return principal


def check_tier(tenancy: Tenancy, req: InferenceRequest, pool: Pool) -> Tier | None:
    """The caller's tier, with its rules applied to ``req`` (models it may use, its
    ``max_tokens`` default and limit, its prompt limit); ``None`` when the deployment has
    neither tiers nor authentication."""
    if not tenancy.checks_tier:
        return None
    return tenancy.checked_tier(req, pool.name)


def check_model_access(tenancy: Tenancy, req: InferenceRequest, pool: Pool) -> None:
    """404 when the caller's tier or credential may not use the request's model (for routes
    that only read about a model, such as counting tokens)."""
    if tenancy.checks_tier:
        tenancy.check_models(req, tenancy.tier_of(req.principal), pool.name)


def acquire(
    tenancy: Tenancy, req: InferenceRequest, tier: Tier | None, trace: RequestTrace | None
) -> Awaitable[Admission | None]:
    """The request's hold on its rate limits (429 when one refuses), or ``None`` when no
    limit applies. Not a coroutine itself: without tracing, the store's own coroutine is
    returned as it is (one frame less per request)."""
    acquiring = tenancy.acquire(req, tier or tenancy.tiers["default"])
    return acquiring if trace is None else traced(trace, "shuniu.rate_limit", acquiring)


def _used(progress: Progress) -> int:
    """The tokens a request is charged: a cached answer cost the engines nothing, so its
    whole token reservation goes back."""
    return 0 if progress.cached else progress.prompt_tokens + progress.completion_tokens


async def settle(tenancy: Tenancy, admission: Admission, progress: Progress) -> None:
    """Give back the unused part of the token reservation, and the leases."""
    try:
        await tenancy.settle(admission, _used(progress))
    except Exception:
        log.exception("settling rate limits failed")


def settle_now(tenancy: Tenancy, admission: Admission, progress: Progress) -> None:
    """:func:`settle` for a store that keeps its state in this process (``tenancy.sync``)."""
    try:
        used = 0 if progress.cached else progress.prompt_tokens + progress.completion_tokens  # _used
        tenancy.settle_now(admission, used)
    except Exception:
        log.exception("settling rate limits failed")
