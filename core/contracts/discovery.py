"""Discovery: where a pool's engines are, when they are not listed in the deployment file.

An endpoint entry with ``discovery:`` names a source (``dns``, ``kubernetes``, or one a
plugin registers with ``register_discovery``). The source watches whatever knows the
engines (DNS records, a Service's EndpointSlices, a registry) and yields the whole current
set of :class:`Target` each time it may have changed. The gateway does the rest, off the
request path (:mod:`shuniu.core.pools.discovery`): a new ready target becomes an endpoint
built from the entry (its backend's ``base_url`` pointed at the target), which joins
balancing after its first passing health probe; a target that goes away or stops being
ready is drained and removed once nothing runs on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["Discovery", "Target"]


@dataclass(frozen=True, slots=True)
class Target:
    """One engine a discovery source found."""

    key: str
    """Its identity while it lives, stable across lookups: a pod's name, ``ip-port``. The
    endpoint is named ``<entry name>-<key>``."""
    host: str
    """Address to reach it at (an IP address or a host name)."""
    port: int
    """Port to reach it at."""
    ready: bool = True
    """Whether it may take requests now. A target that is not ready never joins (or is
    drained); one that becomes ready joins after its health probe passes."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Labels for the endpoint, on top of the entry's: ``version`` sets its version (for
    canary splits); others (``zone``, ``node``, ``hardware``) are for policies such as the
    ``locality`` filter."""


@runtime_checkable
class Discovery(Protocol):
    """A source of targets for one endpoint entry. Built once per entry by the factory
    registered with ``register_discovery`` (``factory(options)``)."""

    def watch(self) -> AsyncIterator[Sequence[Target]]:
        """Yield the complete set of targets now, then again each time it may have changed
        (yielding an unchanged set is harmless). Runs in its own task, never on the
        request path. Raise on a failure the source cannot ride out: the gateway logs it,
        keeps the endpoints it has, and calls ``watch()`` again after a backoff. The
        iteration is closed (``aclose``) when the gateway stops."""
        ...
