"""The authenticator contract: a bearer credential → a :class:`~shuniu.core.types.Principal`.

Where it runs: first thing on every inference request, before the body is read (an
unauthenticated client's body is never read), and on the routes that need a credential
(``/status.json``, ``/admin/hardware``). A deployment lists authenticators
(``auth.authenticators``); the gateway asks them in order. Each one either claims the
credential (returns a principal, or raises a 401 when it is its kind but not valid) or
passes (returns ``None``: not its kind, e.g. an API-key authenticator shown a JWT).

An authenticator's options may subclass :class:`AuthenticatorOptions` to tell the
deployment check which tiers and models its credentials name, and whether they set rate
limits of their own (then the gateway needs a rate-limit store even when no tier sets one).
"""

from __future__ import annotations

from typing import Any, Protocol

from shuniu.core.config import Options
from shuniu.core.types import Principal

__all__ = ["Authenticator", "AuthenticatorOptions"]


class Authenticator(Protocol):
    """Turns a bearer credential into a principal. Built once from its options.

    An authenticator may set a class attribute ``stable = True`` when a credential it
    accepted maps to the same principal for as long as the authenticator lives (static keys
    from the deployment: nothing expires or is revoked while it runs). When every
    authenticator of a deployment is stable, the gateway remembers each accepted credential
    and asks none of them again for it. Absent: ``False``.
    """

    def authenticate(self, credential: str, headers: Any) -> Principal | None:
        """The principal for ``credential``; ``None`` when it is not this authenticator's
        kind of credential; raise :func:`shuniu.core.tenancy.invalid_credentials` when it
        is but fails.

        Synchronous and CPU-only (a hash, a signature check): it runs on the hot path.
        ``headers`` are the raw ASGI header pairs, for schemes that need more than the token.
        """
        ...


class AuthenticatorOptions(Options):
    """Base class for authenticator options that know what their credentials name."""

    def referenced_tiers(self) -> dict[str, str]:
        """Tier name → where it is named (e.g. ``keys[2].tier``), for the deployment check
        (every tier named must exist). Default: none."""
        return {}

    def referenced_models(self) -> dict[str, str]:
        """Model name → where it is named, for the deployment check. Default: none."""
        return {}

    def sets_limits(self) -> bool:
        """Whether some credential carries rate limits of its own. Default: no."""
        return False

    def sets_budgets(self) -> bool:
        """Whether some credential carries budgets of its own (then the deployment needs
        ``governance:``). Default: no."""
        return False

    def key_ids(self) -> set[str]:
        """The ids of the credentials it lists, so keys created at run time cannot take one.
        Default: none."""
        return set()
