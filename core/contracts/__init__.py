"""Every contract a plugin implements, in one place.

=================  =====================================  ==============================
kind               contract (this package)                registered by
=================  =====================================  ==============================
backend            :class:`Backend` (:class:`BackendBase`) ``register_backends``
balancer           :class:`Balancer`                       ``register_balancers``
filter             :class:`Filter`                         ``register_filters``
scorer             :class:`Scorer`                         ``register_scorers``
scheduler          :class:`Scheduler`                      ``register_schedulers``
authenticator      :class:`Authenticator`                  ``register_authenticators``
rate-limit store   :class:`RateLimitStore`                 ``register_rate_limiters``
cache store        :class:`CacheStore`                     ``register_caches``
file store         :class:`FileStore`                      ``register_file_stores``
hardware probe     :class:`HardwareProbe`                  ``register_hardware``
classifier         :class:`Classifier`                     ``register_classifiers``
discovery          :class:`Discovery` (yields :class:`Target`) ``register_discovery``
capacity model     :class:`CapacityModel`                  ``register_capacity_models``
command            :data:`CommandGroup` (click)            ``register_commands``
=================  =====================================  ==============================

Policies see the gateway through :class:`EndpointView`, :class:`PoolView` and
:class:`Ticket`, never through the gateway object itself. Each ``register`` callback is
typed (:data:`RegisterBackend`, ...), and each contract documents where on the request path
it runs. Optional members have defaults on the contract; subclass it to inherit them.
"""

from __future__ import annotations

from shuniu.core.contracts.auth import Authenticator, AuthenticatorOptions
from shuniu.core.contracts.backend import GENERATION, Backend, BackendBase, EndpointSpec
from shuniu.core.contracts.balancing import Balancer, Filter, Scorer
from shuniu.core.contracts.cache import CacheStore
from shuniu.core.contracts.capacity import CapacityModel, CapacityTarget, EngineEntry, TokenMix
from shuniu.core.contracts.classifier import Classifier
from shuniu.core.contracts.commands import CommandGroup
from shuniu.core.contracts.conformance import conform, optional
from shuniu.core.contracts.discovery import Discovery, Target
from shuniu.core.contracts.files import FileStore, StoredFile
from shuniu.core.contracts.fleet import SharedIndex
from shuniu.core.contracts.hardware import DeviceReading, HardwareProbe, ProbeReport
from shuniu.core.contracts.ratelimit import Decision, Lease, Rate, RateLimitStore
from shuniu.core.contracts.registration import (
    AuthenticatorFactory,
    BackendFactory,
    BalancerFactory,
    CacheStoreFactory,
    CapacityModelFactory,
    ClassifierFactory,
    DiscoveryFactory,
    FileStoreFactory,
    FilterFactory,
    HardwareProbeFactory,
    RateLimitStoreFactory,
    Register,
    RegisterAuthenticator,
    RegisterBackend,
    RegisterBalancer,
    RegisterCacheStore,
    RegisterCapacityModel,
    RegisterClassifier,
    RegisterDiscovery,
    RegisterFileStore,
    RegisterFilter,
    RegisterHardwareProbe,
    RegisterRateLimitStore,
    RegisterScheduler,
    RegisterScorer,
    Registration,
    SchedulerFactory,
    ScorerFactory,
)
from shuniu.core.contracts.scheduler import Scheduler
from shuniu.core.contracts.views import EndpointView, PoolView, Ticket

__all__ = [
    "GENERATION",
    "Authenticator",
    "AuthenticatorFactory",
    "AuthenticatorOptions",
    "Backend",
    "BackendBase",
    "BackendFactory",
    "Balancer",
    "BalancerFactory",
    "CacheStore",
    "CacheStoreFactory",
    "CapacityModel",
    "CapacityModelFactory",
    "CapacityTarget",
    "Classifier",
    "ClassifierFactory",
    "CommandGroup",
    "Decision",
    "DeviceReading",
    "Discovery",
    "DiscoveryFactory",
    "EndpointSpec",
    "EndpointView",
    "EngineEntry",
    "FileStore",
    "FileStoreFactory",
    "Filter",
    "FilterFactory",
    "HardwareProbe",
    "HardwareProbeFactory",
    "Lease",
    "PoolView",
    "ProbeReport",
    "Rate",
    "RateLimitStore",
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
    "Scheduler",
    "SchedulerFactory",
    "Scorer",
    "ScorerFactory",
    "SharedIndex",
    "StoredFile",
    "Target",
    "Ticket",
    "TokenMix",
    "conform",
    "optional",
]
