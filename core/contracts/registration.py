"""What the ``register_*`` hooks hand a plugin: a typed ``register`` callback per kind of
thing, and the :class:`Registration` it records.

A plugin annotates its hook with the callback's type, so a factory of the wrong shape is a
type error in the plugin, not a surprise at start-up::

    @hookimpl
    def register_balancers(register: RegisterBalancer) -> None:
        register("least_busy", LeastBusy, options=LeastBusyOptions)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from shuniu.core.contracts.auth import Authenticator
from shuniu.core.contracts.backend import Backend, EndpointSpec
from shuniu.core.contracts.balancing import Balancer, Filter, Scorer
from shuniu.core.contracts.cache import CacheStore
from shuniu.core.contracts.capacity import CapacityModel, CapacityTarget
from shuniu.core.contracts.classifier import Classifier
from shuniu.core.contracts.discovery import Discovery
from shuniu.core.contracts.files import FileStore
from shuniu.core.contracts.hardware import HardwareProbe
from shuniu.core.contracts.ratelimit import RateLimitStore
from shuniu.core.contracts.scheduler import Scheduler

__all__ = [
    "AuthenticatorFactory",
    "BackendFactory",
    "BalancerFactory",
    "CacheStoreFactory",
    "CapacityModelFactory",
    "ClassifierFactory",
    "DiscoveryFactory",
    "FileStoreFactory",
    "FilterFactory",
    "HardwareProbeFactory",
    "RateLimitStoreFactory",
    "Register",
    "RegisterAuthenticator",
    "RegisterBackend",
    "RegisterBalancer",
    "RegisterCacheStore",
    "RegisterCapacityModel",
    "RegisterClassifier",
    "RegisterDiscovery",
    "RegisterFileStore",
    "RegisterFilter",
    "RegisterHardwareProbe",
    "RegisterRateLimitStore",
    "RegisterScheduler",
    "RegisterScorer",
    "Registration",
    "SchedulerFactory",
    "ScorerFactory",
]

F_contra = TypeVar("F_contra", contravariant=True)


@dataclass(frozen=True, slots=True)
class Registration:
    """What a ``register`` callback records: a name, how to build it, and its options.

    ``options`` is a pydantic model (subclass :class:`shuniu.core.config.Options`) that
    validates the ``options:`` mapping of the YAML entry selecting this name; ``None`` means
    the thing takes no options (its factory then receives ``None``).
    """

    name: str
    factory: Callable[..., Any]
    options: type | None = None
    description: str = ""
    plugin: str = ""
    """Name of the plugin that registered it (filled in by the plugin manager)."""


class Register(Protocol[F_contra]):
    """The callback a ``register_*`` hook receives. Call it once per thing registered."""

    def __call__(
        self, name: str, factory: F_contra, *, options: type | None = None, description: str = ""
    ) -> None:
        """Record ``factory`` under ``name`` (the ``kind:``/``policy:``/``store:`` a
        deployment selects it by). ``options`` validates the entry's ``options:``;
        ``description`` is shown by ``shuniu plugins``. A name registered twice is a
        start-up error naming both plugins."""
        ...


# What each kind's factory takes and returns. ``options`` is an instance of the options
# model given at registration (validated from the YAML entry), or ``None`` without one.
BackendFactory = Callable[[EndpointSpec], Backend]
BalancerFactory = Callable[[Any], Balancer]
FilterFactory = Callable[[Any], Filter]
ScorerFactory = Callable[[Any], Scorer]
SchedulerFactory = Callable[[Any], Scheduler]
AuthenticatorFactory = Callable[[Any], Authenticator]
RateLimitStoreFactory = Callable[[Any], RateLimitStore]
CacheStoreFactory = Callable[[Any], CacheStore]
HardwareProbeFactory = Callable[[Any], HardwareProbe]
ClassifierFactory = Callable[[Any], Classifier]
DiscoveryFactory = Callable[[Any], Discovery]
CapacityModelFactory = Callable[[Any, CapacityTarget], CapacityModel]
FileStoreFactory = Callable[[Any], FileStore]

RegisterBackend = Register[BackendFactory]
RegisterBalancer = Register[BalancerFactory]
RegisterFilter = Register[FilterFactory]
RegisterScorer = Register[ScorerFactory]
RegisterScheduler = Register[SchedulerFactory]
RegisterAuthenticator = Register[AuthenticatorFactory]
RegisterRateLimitStore = Register[RateLimitStoreFactory]
RegisterCacheStore = Register[CacheStoreFactory]
RegisterHardwareProbe = Register[HardwareProbeFactory]
RegisterClassifier = Register[ClassifierFactory]
RegisterDiscovery = Register[DiscoveryFactory]
RegisterCapacityModel = Register[CapacityModelFactory]
RegisterFileStore = Register[FileStoreFactory]
