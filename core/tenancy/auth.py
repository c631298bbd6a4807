"""Authentication: the credential on a request → a :class:`~shuniu.core.types.Principal`.

A deployment lists authenticators (``auth.authenticators``); the gateway asks them in order.
Each one looks at the bearer credential and either claims it (returns a principal, or raises
a 401 when the credential is its kind but not valid) or passes (returns ``None``: not its
kind of credential, e.g. an API-key authenticator shown a JWT). A credential nobody claims
is refused with 401. With no authenticators the gateway is open and every request is
anonymous.

Credentials never appear in errors or logs: messages name the problem, not the value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from shuniu.core.contracts import Authenticator
from shuniu.core.errors import GatewayError
from shuniu.core.http.asgi import header_map
from shuniu.core.types import Principal

__all__ = [
    "AuthChain",
    "bearer_token",
    "bearer_token_of",
    "invalid_credentials",
    "missing_credentials",
]

# Final: compiled code uses them as constants instead of looking them up in the module.
_AUTHORIZATION: Final = b"authorization"
_API_KEY: Final = b"api-key"  # Azure OpenAI's header, which some OpenAI clients send instead
_X_API_KEY: Final = b"x-api-key"  # Anthropic's header (its SDK sends the key there)
_BEARER: Final = b"bearer "
_BEARER_AS_SENT: Final = b"Bearer "


def missing_credentials() -> GatewayError:
    return GatewayError(
        401,
        "You didn't provide an API key. Send it in an Authorization header as "
        "'Authorization: Bearer YOUR_KEY'.",
        code="missing_api_key",
        headers={"www-authenticate": "Bearer"},
    )


def invalid_credentials(reason: str = "Incorrect API key provided.") -> GatewayError:
    """A 401 whose message says why, never what the credential was."""
    return GatewayError(
        401,
        reason,
        code="invalid_api_key",
        headers={"www-authenticate": 'Bearer error="invalid_token"'},
    )


def bearer_token(headers: Any) -> str | None:
    """The credential from ``Authorization: Bearer …`` (or an ``api-key`` or ``x-api-key``
    header) among the raw ASGI header pairs: :func:`bearer_token_of` their header map, so
    every route reads the same credential from the same headers."""
    return bearer_token_of(header_map(headers))


def bearer_token_of(headers: dict[bytes, bytes]) -> str | None:
    """The credential from a request's header map (name → first value, see
    :func:`~shuniu.core.http.asgi.header_map`): ``Authorization: Bearer …`` decides when that
    header is there, else ``api-key``, else ``x-api-key``."""
    value = headers.get(_AUTHORIZATION)
    if value is not None:
        # The scheme as clients write it first (no copy), then in any case.
        if value.startswith(_BEARER_AS_SENT) or value[:7].lower() == _BEARER:
            token = value[7:].strip()
            return token.decode("latin-1") if token else None
        return None
    value = headers.get(_API_KEY)
    if value is None:
        value = headers.get(_X_API_KEY)
        if value is None:
            return None
    token = value.strip()
    return token.decode("latin-1") if token else None


class AuthChain:
    """The deployment's authenticators, asked in order."""

    __slots__ = ("authenticators", "known", "stable")

    def __init__(self, authenticators: Sequence[Authenticator]) -> None:
        self.authenticators = tuple(authenticators)
        self.stable = all(getattr(a, "stable", False) is True for a in self.authenticators)
        """Every authenticator is stable (see :class:`~shuniu.core.contracts.Authenticator`):
        an accepted credential's principal is remembered in :attr:`known`."""
        self.known: dict[str, Principal] = {}
        """Accepted credentials' principals, by credential, when :attr:`stable` (bounded by
        what the authenticators accept: a deployment's keys)."""

    def __bool__(self) -> bool:
        return bool(self.authenticators)

    def authenticate(self, headers: Any, header_map: dict[bytes, bytes] | None = None) -> Principal:
        """The request's principal, or a 401 :class:`GatewayError`. ``header_map``: the
        request's headers by name, when the caller has made it (the credential is read
        from it; authenticators still get the raw ``headers``)."""
        credential = bearer_token(headers) if header_map is None else bearer_token_of(header_map)
        if credential is None:
            raise missing_credentials()
        known = self.known.get(credential)
        if known is not None:
            return known
        for authenticator in self.authenticators:
            principal = authenticator.authenticate(credential, headers)
            if principal is not None:
                if self.stable:
                    self.known[credential] = principal
                return principal
        raise invalid_credentials()
