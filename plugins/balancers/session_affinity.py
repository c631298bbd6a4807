"""``session_affinity``: requests of one session (a body field such as OpenAI's ``user``, or
a header) go to the same endpoint, by rendezvous hashing; requests without one fall back to
another policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from hashlib import blake2b
from math import log
from typing import Literal

from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Balancer, EndpointView, RegisterBalancer
from shuniu.core.types import InferenceRequest
from shuniu.plugins.balancers.least_requests import LeastRequests
from shuniu.plugins.balancers.round_robin import RoundRobin

__all__ = ["SessionAffinity", "SessionAffinityOptions", "session_key_hash"]

_MASK = (1 << 64) - 1
# Odd 64-bit multiplier (splitmix64's). One multiply of ``key_hash ^ salt`` is enough mixing
# here: for a fixed key the salts (blake2b of the names) already make the endpoints' values
# independent, and the multiply's high bits, which decide the ranking, depend on every bit
# of the product, which keeps the share of keys per endpoint even (checked against the
# full splitmix64 finalizer: same spread, a third of the cost).
_MUL = 0xBF58476D1CE4E5B9
_U_SCALE = 2.0**-52
# Distinct blake2b personalizations, so a session key equal to an endpoint name does not
# hash to that endpoint's salt.
_KEY_PERSON = b"shuniu-session"
_SALT_PERSON = b"shuniu-endpoint"


class SessionAffinityOptions(Options):
    """Options of the ``session_affinity`` balancer."""

    key: str | None = Field("user", min_length=1)
    """Top-level field of the request body that names the session (OpenAI's ``user`` by
    default); a string or integer value counts, an empty string or any other type does
    not. ``null`` uses only ``header``."""
    header: str | None = Field(None, min_length=1)
    """Request header that names the session (case-insensitive), e.g. ``x-session-id``.
    When set and present (non-empty) it wins over ``key``."""
    fallback: Literal["least_requests", "round_robin"] = "least_requests"
    """How requests without a session key are placed."""


def session_key_hash(key: bytes) -> int:
    """The 64-bit hash of a session key (the same in every process and on every host)."""
    return int.from_bytes(blake2b(key, digest_size=8, person=_KEY_PERSON).digest(), "little")


def _salt(name: str) -> int:
    return int.from_bytes(blake2b(name.encode(), digest_size=8, person=_SALT_PERSON).digest(), "little")


class SessionAffinity(Balancer):
    """Weighted rendezvous (highest-random-weight) hashing of the session key over the
    candidates: each candidate scores ``weight / -ln(h)``, with ``h`` in (0, 1) a hash of
    the key and the endpoint's name, and the highest score wins.

    Hence: the same key goes to the same endpoint while it is a candidate; an endpoint
    that leaves (saturated, unhealthy, removed) moves only its own sessions, each to its
    own second choice, spread over the rest by weight, and they come back when it returns;
    an endpoint added takes only the sessions it now wins, about ``weight / total`` of
    them. The hash depends only on the key and the endpoint names (blake2b, not Python's
    per-process ``hash``), so gateways sharing the endpoint names agree on every session.

    Per pick: one blake2b of the key, then per candidate one 64-bit multiply of the key
    hash with the endpoint's cached salt (and a ``log`` when the weights differ). O(n).
    """

    __slots__ = ("_fallback", "_header", "_key", "_salts")

    def __init__(self, options: SessionAffinityOptions | None = None) -> None:
        options = options or SessionAffinityOptions()
        self._key = options.key
        # ASGI header names arrive lower-cased; compare against the lower-cased bytes.
        self._header = options.header.lower().encode("latin-1") if options.header else None
        inner = LeastRequests() if options.fallback == "least_requests" else RoundRobin()
        self._fallback: Callable[[InferenceRequest, Sequence[EndpointView]], EndpointView | None]
        self._fallback = inner.pick
        self._salts: dict[str, int] = {}

    def session_key(self, req: InferenceRequest) -> bytes | None:
        """The request's session key, or ``None`` when it has none."""
        if self._header is not None:
            value = req.header(self._header)
            if value:
                return value
        if self._key is not None:
            raw = req.body.get(self._key)
            if isinstance(raw, str):
                return raw.encode() if raw else None
            if isinstance(raw, int) and not isinstance(raw, bool):
                return str(raw).encode()
        return None

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
        if len(endpoints) <= 1:
            return endpoints[0] if endpoints else None
        key = self.session_key(req)
        if key is None:
            return self._fallback(req, endpoints)
        kh = session_key_hash(key)
        salts = self._salts
        mask = _MASK
        mul = _MUL
        w0 = endpoints[0].weight
        uniform = True
        for e in endpoints:
            if e.weight != w0:
                uniform = False
                break
        best = endpoints[0]
        if uniform:
            # Equal weights rank in the same order as the raw hashes (the score is monotonic in
            # them), so skip the log.
            best_x = -1
            for e in endpoints:
                salt = salts.get(e.name)
                if salt is None:
                    salt = salts[e.name] = _salt(e.name)
                x = ((kh ^ salt) * mul) & mask
                if x > best_x:
                    best_x = x
                    best = e
            return best
        best_score = -1.0
        for e in endpoints:
            salt = salts.get(e.name)
            if salt is None:
                salt = salts[e.name] = _salt(e.name)
            x = ((kh ^ salt) * mul) & mask
            # Top 52 bits plus a half: strictly inside (0, 1), so the log is finite and < 0.
            score = e.weight / -log(((x >> 12) + 0.5) * _U_SCALE)
            if score > best_score:
                best_score = score
                best = e
        return best


@hookimpl
def register_balancers(register: RegisterBalancer) -> None:
    register(
        "session_affinity",
        SessionAffinity,
        options=SessionAffinityOptions,
        description="Same session (body field or header) to the same endpoint, by rendezvous hashing.",
    )
