"""What a running gateway is made of right now, in one object, and the read-only view of it
that the views (``/ready``, ``/status``, ``/metrics``, the admin API) depend on.

The gateway owns one :class:`GatewayState`. Building (start-up, reload, the admin API)
writes to it; the request path and the views read it. A reload swaps its pools, routes and
tenancy as a whole, between two requests (everything runs on one event loop), so a reader
sees either the old deployment or the new one, never a mix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from shuniu.core.batch import BatchRunner
from shuniu.core.config import Deployment, ModelConfig
from shuniu.core.contracts import FileStore
from shuniu.core.governance import Governance
from shuniu.core.kv_events.wiring import KvEventWiring
from shuniu.core.pipeline.degradation import OverloadMonitor
from shuniu.core.pipeline.response_cache import ResponseCache
from shuniu.core.pipeline.router import Router
from shuniu.core.pools.launcher import ManagedEngine
from shuniu.core.pools.pool import EndpointState, Pool
from shuniu.core.pools.resilience import Resilience
from shuniu.core.tenancy.tenancy import Tenancy

if TYPE_CHECKING:
    from shuniu.core.config.loader import ResolvedDeployment

__all__ = ["GatewayState", "StateView", "shared_stores"]


class StateView(Protocol):
    """The gateway as the views read it: pools and their endpoints, launched engines,
    resilience and degradation state, the response cache's counters. Read-only by
    contract: a view never changes what it reads (changes go through
    :class:`shuniu.core.operations.Operations`)."""

    @property
    def config(self) -> Deployment: ...

    @property
    def resolved(self) -> ResolvedDeployment: ...

    @property
    def pools(self) -> Mapping[str, Pool]: ...

    @property
    def resilience(self) -> Mapping[str, Resilience]: ...

    @property
    def engines(self) -> Mapping[str, ManagedEngine]: ...

    @property
    def router(self) -> Router: ...

    @property
    def overload(self) -> OverloadMonitor: ...

    @property
    def cache(self) -> ResponseCache | None: ...

    @property
    def tenancy(self) -> Tenancy: ...
    @property
    def governance(self) -> Governance | None: ...

    @property
    def files(self) -> FileStore | None: ...

    @property
    def batches(self) -> BatchRunner | None: ...

    @property
    def kv_events(self) -> KvEventWiring: ...

    @property
    def started(self) -> bool: ...

    @property
    def draining(self) -> bool: ...

    @property
    def auth_enabled(self) -> bool: ...

    def model_config(self, name: str) -> ModelConfig: ...

    def find_endpoint(self, name: str) -> tuple[Pool, EndpointState] | None: ...


class GatewayState:
    """The gateway's current deployment, pools, tenancy and caches (implements
    :class:`StateView`)."""

    __slots__ = (
        "batches",
        "cache",
        "config",
        "draining",
        "engines",
        "files",
        "governance",
        "kv_events",
        "overload",
        "pools",
        "resilience",
        "resolved",
        "router",
        "routes",
        "started",
        "tenancy",
    )

    def __init__(
        self,
        resolved: ResolvedDeployment,
        *,
        pools: dict[str, Pool],
        routes: dict[str, Pool],
        resilience: dict[str, Resilience],
        engines: dict[str, ManagedEngine],
        router: Router,
        tenancy: Tenancy,
        cache: ResponseCache | None,
        overload: OverloadMonitor,
    ) -> None:
        self.resolved = resolved
        self.config: Deployment = resolved.deployment
        self.pools = pools
        """Model name → its pool."""
        self.routes = routes
        """Every name a client may send (model names and aliases) → its pool."""
        self.resilience = resilience
        """Model → its pool's ejection, retry and timeout state."""
        self.engines = engines
        """Endpoint name → the engine process the gateway launched for it (``launch:``)."""
        self.router = router
        self.tenancy = tenancy
        self.cache = cache
        self.overload = overload
        self.batches: BatchRunner | None = None
        """The Batch API's runner (``batches:``)."""
        self.files: FileStore | None = None
        """The Files API's store (``files:``), kept across reloads."""
        self.governance: Governance | None = None
        """The ledger, budgets and managed keys (``governance:``), kept across reloads."""
        self.kv_events = KvEventWiring()
        """The engines' KV-event streams into the balancers that route by them (rewired
        by a reload)."""
        self.started = False
        self.draining = False

    @property
    def auth_enabled(self) -> bool:
        return bool(self.tenancy.auth)

    def model_config(self, name: str) -> ModelConfig:
        return self.config.models[name]

    def find_endpoint(self, name: str) -> tuple[Pool, EndpointState] | None:
        """The pool and endpoint named ``name``, or ``None``."""
        for pool in self.pools.values():
            for e in pool.endpoints:
                if e.name == name:
                    return pool, e
        return None


def shared_stores(view: StateView) -> dict[str, bool]:
    """The deployment's stores that can answer without their server (Redis), by name
    (``rate_limits``, ``cache``, ``budgets``) → whether they do now. An in-process store has no
    ``degraded`` flag and is not listed."""
    cache = view.cache
    out: dict[str, bool] = {}
    for name, store in (("rate_limits", view.tenancy.store), ("cache", cache.store if cache else None)):
        flag = getattr(store, "degraded", None)
        if isinstance(flag, bool):
            out[name] = flag
    governance = view.governance
    if governance is not None and governance.cfg.redis_url is not None:
        out["budgets"] = governance.counters.degraded
    return out
