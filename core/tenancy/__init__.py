"""Tenancy: who is calling (authentication, :mod:`.auth`), what their tier lets them do and
how much (rate limits), compiled for the request path (:mod:`.tenancy`)."""

from __future__ import annotations

from shuniu.core.tenancy.auth import AuthChain, bearer_token, invalid_credentials, missing_credentials
from shuniu.core.tenancy.tenancy import Admission, Tenancy, Tier, format_reset, limits_in_use

__all__ = [
    "Admission",
    "AuthChain",
    "Tenancy",
    "Tier",
    "bearer_token",
    "format_reset",
    "invalid_credentials",
    "limits_in_use",
    "missing_credentials",
]
