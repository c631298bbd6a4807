"""Changing a running gateway: reload the deployment file (``SIGHUP``, ``POST
/admin/reload``), add, drain and remove endpoints, and set a model's version split.

Every change is logged once, at WARNING. A reload is validated first: a bad file, or a
change only a restart can apply, changes nothing and the problems are listed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from shuniu.core.config import Deployment, EndpointConfig
from shuniu.core.config.loader import QUICKSTART_NAME, expand_endpoints, load_deployment
from shuniu.core.contracts import Registration
from shuniu.core.errors import ConfigError, Problem
from shuniu.core.pipeline.router import Router
from shuniu.core.pools.build import PoolBuilder, ReuseKey
from shuniu.core.pools.launcher import ManagedEngine
from shuniu.core.pools.pool import EndpointState, Pool
from shuniu.core.pools.watch import Watchers
from shuniu.core.state import GatewayState

__all__ = ["Operations", "reload_problems"]

log = logging.getLogger("shuniu.gateway")


class Operations:
    """The run-time changes the admin API and ``SIGHUP`` make."""

    def __init__(self, state: GatewayState, builder: PoolBuilder, watchers: Watchers) -> None:
        self._state = state
        self._builder = builder
        self._watchers = watchers
        self.discovered: Callable[[], dict[str, list[EndpointState]]] = dict
        """The endpoints the deployment's ``discovery:`` entries found, by model (set by the
        gateway): a reload carries them into the new pools."""

    # -- endpoints and traffic ------------------------------------------------------------

    def backends(self) -> dict[str, Registration]:
        """The registered backends (``kind:`` → registration), for entries to add."""
        return self._builder.plugins.registered("backends")

    def set_traffic(self, model: str, weights: dict[str, float]) -> dict[str, float]:
        """Replace the model's version split (the caller validated the versions)."""
        self._state.router.set_traffic(model, weights)
        log.warning("admin: traffic of %s set to %s", model, weights or "any version")
        return self._state.router.traffic(model)

    def set_draining(self, endpoint: EndpointState, draining: bool) -> None:
        """Draining: no new requests; those in flight finish."""
        found = self._state.find_endpoint(endpoint.name)
        endpoint.draining = draining
        if not draining and found is not None:
            found[0].scheduler.wake(found[0])
        log.warning("endpoint %s %s", endpoint.name, "draining" if draining else "back in balancing")

    async def add_endpoint(self, model: str, cfg: EndpointConfig, options: Any) -> EndpointState:
        """Build, start and add one endpoint to a model's pool. It joins balancing after its
        first passing health probe. ``cfg`` is a validated entry without ``launch`` and with
        ``replicas: 1``; ``options`` its validated backend options."""
        pool = self._state.pools[model]
        endpoint = self._builder.endpoint(model, cfg, options, pool)
        await endpoint.backend.start()
        pool.add(endpoint)
        self._watchers.watch(pool, endpoint)
        log.warning("endpoint %s added to %s (version %s)", cfg.name, model, cfg.version)
        return endpoint

    @staticmethod
    async def wait_idle(endpoints: list[EndpointState], timeout_s: float) -> None:
        """Until nothing is in flight on ``endpoints`` (draining ones), or ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any(e.in_flight for e in endpoints) and loop.time() < deadline:  # noqa: ASYNC110 - a background poll of counters
            await asyncio.sleep(0.05)

    async def remove_endpoint(self, pool: Pool, endpoint: EndpointState) -> None:
        """Take a drained endpoint (nothing in flight) out of its pool and stop it."""
        pool.remove(endpoint)
        await self._watchers.unwatch(endpoint.name)
        await endpoint.backend.stop()
        log.warning("endpoint %s removed from %s", endpoint.name, pool.name)

    # -- reload -------------------------------------------------------------------------

    async def reload(self) -> list[str]:
        """Re-read the deployment file and apply it without dropping a request. Raises
        :class:`ConfigError` (nothing changed) when the file is invalid or asks for what
        only a restart can do. Returns what changed.

        Endpoints whose entry is unchanged are kept as they are (backend, health, launched
        engine, requests in flight); new ones start before they are swapped in; removed
        ones drain (in-flight requests finish) and then stop. Pools get fresh schedulers
        and balancers: requests already queued are served by the old ones."""
        state = self._state
        old_resolved = state.resolved
        if old_resolved.source in (QUICKSTART_NAME, "<text>"):
            raise ConfigError(
                [Problem("", "only a deployment read from a file can be reloaded")], old_resolved.source
            )
        resolved = load_deployment(old_resolved.source, self._builder.plugins)
        old_cfg, new_cfg = state.config, resolved.deployment
        problems = reload_problems(old_cfg, new_cfg)
        if problems:
            raise ConfigError(problems, old_resolved.source)
        reuse: dict[ReuseKey, EndpointState] = {}
        old_by_name: dict[str, tuple[Pool, EndpointState]] = {}
        for model_name, model in old_cfg.models.items():
            pool = state.pools[model_name]
            by_name = {e.name: e for e in pool.endpoints}
            for index, _replica, ep_name in expand_endpoints(model_name, model.endpoints):
                endpoint = by_name.get(ep_name)
                if endpoint is not None:
                    reuse[(model_name, ep_name, model.endpoints[index].model_dump_json())] = endpoint
            for e in pool.endpoints:  # endpoints added through the admin API are kept too
                old_by_name[e.name] = (pool, e)
        # Synchronous: no request runs while the new pools are built.
        new = self._builder.build(resolved, reuse, state.engines)
        for model_name, pool in new.pools.items():
            # The autoscaling signals keep their counts across the reload (same window).
            old_pool = state.pools.get(model_name)
            if old_pool is not None and old_pool.demand is not None and pool.demand is not None:
                if old_pool.demand.span == pool.demand.span:
                    pool.demand = old_pool.demand
        for model_name, found in self.discovered().items():
            if model_name in new.pools:  # a reload keeps the discovery entries (reload_problems)
                for endpoint in found:
                    new.pools[model_name].add(endpoint)
        old_engines = state.engines
        kept = {id(e) for p in new.pools.values() for e in p.endpoints}
        old = {id(e) for _, e in old_by_name.values()}
        added = [(p, e) for p in new.pools.values() for e in p.endpoints if id(e) not in old]
        removed = [(p, e) for p, e in old_by_name.values() if id(e) not in kept]
        removed_names = {e.name for _, e in removed}
        await asyncio.gather(*(e.backend.start() for _, e in added))
        # The swap.
        old_pools = state.pools
        state.resolved, state.config = resolved, new_cfg
        state.pools, state.routes, state.resilience = new.pools, new.routes, new.resilience
        state.engines = {name: eng for name, eng in new.engines.items() if name not in removed_names}
        state.router = Router(new_cfg.models, new.pools)
        old_store = state.tenancy.store
        same_limits = new_cfg.rate_limits == old_cfg.rate_limits
        governance = state.governance
        managed = governance.keys.table if governance is not None and governance.keys is not None else None
        state.tenancy = self._builder.tenancy(
            resolved, new.pools, store=old_store if same_limits else None, managed=managed
        )
        cache_changed = new_cfg.cache != old_cfg.cache
        if cache_changed:
            old_cache = state.cache
            state.cache = self._builder.cache(resolved)
            if old_cache is not None:
                await old_cache.store.close()
        if not same_limits and old_store is not None:
            await old_store.close()
        # New balancers: their KV-event indexes get the endpoints' streams.
        await state.kv_events.stop()
        await state.kv_events.start(new.pools)
        # Health and load loops follow each endpoint into its new pool.
        for pool in new.pools.values():
            pool.learn_max_model_len()
            for endpoint in pool.endpoints:
                self._watchers.watch(pool, endpoint)
        for pool in old_pools.values():
            pool.scheduler.wake(pool)
        for _, endpoint in removed:
            endpoint.draining = True
        for name, engine in new.engines.items():
            if name not in old_engines:
                engine.start()
        if removed:
            asyncio.get_running_loop().create_task(
                self._retire([e for _, e in removed], old_engines, new_cfg.gateway.graceful_shutdown_s)
            )
        changes = [f"added endpoint {e.name} to {p.name}" for p, e in added]
        changes += [f"removing endpoint {e.name} from {p.name} (draining)" for p, e in removed]
        added_models = sorted(set(new.pools) - set(old_pools))
        removed_models = sorted(set(old_pools) - set(new.pools))
        changes += [f"added model {m}" for m in added_models] + [f"removed model {m}" for m in removed_models]
        changes.append(
            "reloaded: pools, routes, traffic, tiers, auth, limits" + (", cache" if cache_changed else "")
        )
        log.warning("deployment reloaded from %s: %s", resolved.source, "; ".join(changes))
        return changes

    async def reload_logged(self) -> None:
        """A reload asked for by ``SIGHUP``: its outcome goes to the log."""
        try:
            await self.reload()
        except ConfigError as exc:
            log.error("reload refused, nothing changed: %s", exc)
        except Exception:
            log.exception("reload failed")

    async def _retire(
        self, endpoints: list[EndpointState], engines: dict[str, ManagedEngine], grace_s: float
    ) -> None:
        """Stop removed endpoints once nothing runs on them (or the shutdown grace is over)."""
        await self.wait_idle(endpoints, grace_s)
        for endpoint in endpoints:
            await self._watchers.unwatch(endpoint.name)
            try:
                await endpoint.backend.stop()
            except Exception:
                log.warning("endpoint %s did not stop cleanly", endpoint.name)
            engine = engines.get(endpoint.name)
            if engine is not None:
                await engine.stop()


def reload_problems(old: Deployment, new: Deployment) -> list[Problem]:
    """What a reload cannot apply: listening settings and launched engines."""
    problems = []
    for field in (
        "host",
        "port",
        "server",
        "header_timeout_s",
        "body_timeout_s",
        "keep_alive_s",
        "max_connections",
    ):
        if getattr(old.gateway, field) != getattr(new.gateway, field):
            problems.append(Problem(f"gateway.{field}", "changes only with a restart"))

    # The ledger, the file store, and the batch queue and its runner are built once, at start.
    for section in ("governance", "files", "batches"):
        if getattr(old, section) != getattr(new, section):
            problems.append(Problem(section, "changes only with a restart"))

    def launched(d: Deployment) -> dict[tuple[str, int], str]:
        return {
            (m, i): ep.launch.model_dump_json()
            for m, model in d.models.items()
            for i, ep in enumerate(model.endpoints)
            if ep.launch
        }

    if launched(old) != launched(new):
        problems.append(Problem("models", "launched engines (`launch:` entries) change only with a restart"))

    def discovered(d: Deployment) -> dict[tuple[str, int], str]:
        return {
            (m, i): ep.model_dump_json()
            for m, model in d.models.items()
            for i, ep in enumerate(model.endpoints)
            if ep.discovery
        }

    if discovered(old) != discovered(new):
        problems.append(Problem("models", "discovered entries (`discovery:`) change only with a restart"))
    return problems
