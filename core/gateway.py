"""The gateway: composition and lifecycle.

It builds one gateway process from a resolved deployment and the plugin manager, wiring
the parts that live in their own modules:

- :class:`~shuniu.core.state.GatewayState`, what the gateway is made of now (built by
  :class:`~shuniu.core.pools.build.PoolBuilder`);
- :class:`~shuniu.core.pipeline.path.RequestPath`, the request path as stages;
- :class:`~shuniu.core.pools.watch.Watchers`, the health and load loops;
- :class:`~shuniu.core.operations.Operations`, reload and the admin API's changes;
- the observers (metrics, access log, status window, degradation, plugins) and tracing;
- :func:`~shuniu.core.http.app.build_app`, the HTTP application.

and starts and stops them in order (``docs/architecture.md`` has the picture).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shuniu.core.batch import BatchQueue, BatchRunner, RedisBatchQueue, SqlBatchQueue
from shuniu.core.config import Deployment, FleetConfig, RateLimitsConfig
from shuniu.core.config.loader import ResolvedDeployment
from shuniu.core.fleet import FleetSync, FleetTransport
from shuniu.core.governance import Governance, open_database
from shuniu.core.http.app import Dispatch, build_app
from shuniu.core.http.fleet import Peers
from shuniu.core.http.workers import WorkerInfo
from shuniu.core.observability.access_log import AccessLog
from shuniu.core.observability.hardware import HardwareReadings
from shuniu.core.observability.metrics import GatewayMetrics
from shuniu.core.observability.tracing import setup_tracing
from shuniu.core.operations import Operations
from shuniu.core.pipeline.degradation import OverloadMonitor
from shuniu.core.pipeline.intake import Intake
from shuniu.core.pipeline.path import RequestPath
from shuniu.core.pipeline.recording import Recorder
from shuniu.core.pipeline.router import Router
from shuniu.core.pipeline.routing import check_context
from shuniu.core.plugin_manager import PluginManager
from shuniu.core.pools.autoscale import Autoscalers
from shuniu.core.pools.build import PoolBuilder
from shuniu.core.pools.discovery import Discoveries
from shuniu.core.pools.launcher import ManagedEngine
from shuniu.core.pools.pool import Pool
from shuniu.core.pools.resilience import Resilience
from shuniu.core.pools.watch import Watchers
from shuniu.core.state import GatewayState
from shuniu.core.types import InferenceRequest
from shuniu.core.views.readiness import readiness
from shuniu.core.views.status import StatusWindow

__all__ = ["Gateway"]

log = logging.getLogger("shuniu.gateway")


class Gateway:
    """One gateway process: pools, their endpoints, and the HTTP app serving them."""

    def __init__(
        self,
        resolved: ResolvedDeployment,
        plugins: PluginManager,
        *,
        extra_routes: Sequence[Any] = (),
        worker: WorkerInfo | None = None,
        fleet: FleetTransport | None = None,
        virtual_time: bool = False,
    ) -> None:
        """``extra_routes`` are more Litestar route handlers to serve (e.g. the simulator
        server's ``/metrics``); ``worker``: this process is one of a supervised gateway's
        workers (:mod:`shuniu.core.http.workers`); ``fleet``: the line to the fleet's shared
        routing state (default: Redis, when the deployment has ``fleet:``); ``virtual_time``:
        the gateway runs on ``shuniu simulate``'s virtual clock, so work that would go to
        another process (capacity models) runs inline, while no simulated time passes."""
        self.plugins = plugins
        config = resolved.deployment
        gw = config.gateway
        builder = PoolBuilder(plugins)
        built = builder.build(resolved)
        self.governance = _governance(resolved)
        """The ledger, budgets and managed keys (``governance:``), or ``None``."""
        managed = self.governance.keys.table if self.governance and self.governance.keys else None
        degrades = [t.degrade for t in config.tiers.values() if t.degrade is not None]
        # The records' times are the event loop's; so is the monitor's clock.
        overload = OverloadMonitor(
            lambda: asyncio.get_running_loop().time(),
            min((d.half_life_s for d in degrades), default=5.0),
        )
        self.state = GatewayState(
            resolved,
            pools=built.pools,
            routes=built.routes,
            resilience=built.resilience,
            engines=built.engines,
            router=Router(config.models, built.pools),
            tenancy=builder.tenancy(resolved, built.pools, managed=managed),
            cache=builder.cache(resolved),
            overload=overload,
        )
        self.state.governance = self.governance
        self.state.files = builder.file_store(resolved)
        self.watchers = Watchers(self.state)
        fleet_cfg = config.fleet
        if fleet is None and fleet_cfg is not None:
            from shuniu.core.fleet.redis import RedisTransport

            fleet = RedisTransport(fleet_cfg)
        self.fleet: FleetSync | None = None
        """This gateway's share of the fleet's routing state (``fleet:``), or ``None``."""
        if fleet is not None:
            fleet_cfg = fleet_cfg or FleetConfig()
            self.fleet = FleetSync(
                fleet,
                lambda: self.state.pools,
                interval_s=fleet_cfg.sync_interval_s,
                stale_after_s=fleet_cfg.stale_after_s,
            )
            self.watchers.fleet = self.fleet
        self.operations = Operations(self.state, builder, self.watchers)
        self.discoveries = Discoveries(self.state, self.operations, builder)
        """The ``discovery:`` entries' watchers (endpoints found at run time)."""
        self.discoveries.build()
        self.operations.discovered = self.discoveries.owned
        self.autoscalers = Autoscalers(self.state, builder.capacity_model, inline=virtual_time)
        """The ``autoscaling:`` signals of the pools that have them."""
        if self.fleet is not None:
            self.autoscalers.peers = self.fleet.peer_demand
        self._builder = builder
        self.hardware = HardwareReadings(plugins)
        self.tracing = setup_tracing(gw.tracing)
        # The request_finished observers, called directly per request (never via pluggy).
        recorder = Recorder(
            plugins.hook_functions("request_finished"),
            record_prompts=gw.access_log is not None and gw.access_log.include_prompt,
        )
        if degrades:
            recorder.add(overload.observe)
        if self.governance is not None and self.governance.ledger is not None:
            recorder.add(self.governance.ledger.observe)
        self.metrics = (
            GatewayMetrics(self.state, self.hardware, self.fleet, self.discoveries) if gw.metrics else None
        )
        if self.metrics is not None:
            recorder.add(self.metrics.observe)
        self.access_log = AccessLog(gw.access_log) if gw.access_log is not None else None
        if self.access_log is not None:
            recorder.add(self.access_log.observe)
        self.status = StatusWindow(self.state.pools)
        """Recent requests per model, for the status page."""
        recorder.add(self.status.observe)
        self.worker = worker
        peers = Peers(worker) if worker is not None else None
        self.path = RequestPath(
            self.state, Intake(gw, pass_trace=self.tracing is None), recorder, self.tracing
        )
        batch_store = _batch_store(resolved, self.state) if not virtual_time else None
        self._virtual_time = virtual_time
        self._gc_young = gw.gc_young_threshold
        self._gc_saved: tuple[int, int, int] | None = None
        """The collector's thresholds before start() changed them, for stop()."""
        self._app_parts = (list(extra_routes), peers, batch_store)
        self._app: Dispatch | None = None
        if not virtual_time:
            self._build_app()  # a route that cannot be built fails here, at start-up
        if batch_store is not None:
            assert self.state.files is not None
            self.state.batches = BatchRunner(
                config.batches, batch_store, self.state.files, self.app, lambda: self.state.routes
            )

    def _build_app(self) -> Dispatch:
        extra_routes, peers, batch_store = self._app_parts
        litestar = build_app(
            path=self.path,
            state=self.state,
            ops=self.operations,
            metrics=self.metrics,
            hardware=self.hardware,
            status=self.status,
            created=int(time.time()),
            extra_routes=extra_routes,
            on_startup=self.start,
            on_shutdown=self.stop,
            peers=peers,
            fleet=self.fleet,
            batch_store=batch_store,
        )
        self._app = Dispatch(self.path, litestar, peers)
        return self._app

    @property
    def app(self) -> Dispatch:
        """The ASGI application to serve. On the virtual clock (``shuniu simulate``, which
        serves nothing over HTTP) it is built on first use: a capacity plan builds a gateway
        per trial, and the web app was most of that."""
        return self._app if self._app is not None else self._build_app()

    @property
    def litestar(self) -> Any:
        """The Litestar application behind :attr:`app` (its routes beyond the request path)."""
        return self.app.litestar

    # -- what the CLI, the simulator and tests read ---------------------------------------

    @property
    def config(self) -> Deployment:
        return self.state.config

    @property
    def pools(self) -> dict[str, Pool]:
        return self.state.pools

    @property
    def routes(self) -> dict[str, Pool]:
        return self.state.routes

    @property
    def router(self) -> Router:
        return self.state.router

    @property
    def resilience(self) -> dict[str, Resilience]:
        return self.state.resilience

    @property
    def engines(self) -> Mapping[str, ManagedEngine]:
        return self.state.engines

    @property
    def draining(self) -> bool:
        return self.state.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.state.draining = value

    def readiness(self, devices: dict[str, list[Any]] | None = None) -> tuple[bool, dict[str, Any]]:
        """``/ready``'s answer: ``(ready, body)``."""
        return readiness(self.state, devices)

    def check_context(self, req: InferenceRequest, pool: Pool) -> None:
        """400 when the prompt plus ``max_tokens`` exceed the pool's context window."""
        check_context(req, pool)

    async def reload(self) -> list[str]:
        """Re-read and apply the deployment file (see :meth:`Operations.reload`)."""
        return await self.operations.reload()

    async def reload_logged(self) -> None:
        await self.operations.reload_logged()

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start the launched engines, every backend, the health and load loops, and run
        the start-up hooks. Launched engines join balancing once their health probe passes."""
        state = self.state
        for engine in state.engines.values():
            engine.start()
        await asyncio.gather(*(e.backend.start() for p in state.pools.values() for e in p.endpoints))
        for pool in state.pools.values():
            pool.learn_max_model_len()
            for endpoint in pool.endpoints:
                self.watchers.watch(pool, endpoint)
        await state.kv_events.start(state.pools)
        if self.fleet is not None:
            await self.fleet.start()
        if self.governance is not None:
            await self.governance.start()
        if state.batches is not None:
            await state.batches.start()
        self.discoveries.start()
        self.autoscalers.start()
        for fn in self.plugins.hook_functions("gateway_startup"):
            result = fn(gateway=self)
            if inspect.isawaitable(result):
                await result
        # Everything built so far lives as long as the process: move it out of the cyclic
        # GC's generations so full collections stop rescanning it (tens of ms each). On the
        # virtual clock the collection first is skipped: a capacity plan starts a gateway
        # per trial, and what little garbage is frozen with it is freed at stop().
        if not self._virtual_time:
            gc.collect()
        gc.freeze()
        # Fewer, larger young collections while serving (gateway.gc_young_threshold; the
        # simulator sets its own on the virtual clock). Undone at stop().
        young = self._gc_young
        if young is not None and not self._virtual_time and self._gc_saved is None:
            self._gc_saved = gc.get_threshold()
            gc.set_threshold(young, *self._gc_saved[1:])
        if self.metrics is not None:
            self.metrics.gc.start()
        state.started = True

    async def stop(self) -> None:
        """Run the shutdown hooks, stop the loops, the backends, then the engines, and
        flush the access log, traces and stores. In-flight requests were drained before."""
        state = self.state
        state.draining = True
        for fn in self.plugins.hook_functions("gateway_shutdown"):
            try:
                result = fn(gateway=self)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("a gateway_shutdown hook failed")
        await self.autoscalers.stop()
        await self.discoveries.stop()
        await self.watchers.stop()
        await state.kv_events.stop()
        if self.fleet is not None:
            await self.fleet.stop()
        results = await asyncio.gather(
            *(e.backend.stop() for p in state.pools.values() for e in p.endpoints), return_exceptions=True
        )
        self._builder.close()
        # Engines last: in-flight requests were drained before the shutdown hooks ran.
        results += await asyncio.gather(*(e.stop() for e in state.engines.values()), return_exceptions=True)
        if self.access_log is not None:
            self.access_log.stop()
        if self.tracing is not None:
            self.tracing.shutdown()
        if state.batches is not None:
            await state.batches.stop()
        if self.governance is not None:
            # Last of the request path's parts: every request has been recorded by now.
            try:
                await self.governance.stop()
            except Exception:
                log.exception("governance did not stop cleanly")
        cache = state.cache
        stores = [
            s for s in (state.tenancy.store, cache.store if cache else None, state.files) if s is not None
        ]
        results += await asyncio.gather(*(s.close() for s in stores), return_exceptions=True)
        # Undo start()'s gc.freeze() so a stopped gateway can be collected (a capacity plan
        # builds and stops many in one process).
        gc.unfreeze()
        if self._gc_saved is not None:
            gc.set_threshold(*self._gc_saved)
            self._gc_saved = None
        if self.metrics is not None:
            self.metrics.gc.stop()
        for r in results:
            if isinstance(r, BaseException):
                log.warning("a backend or engine failed to stop cleanly: %r", r)


def _base(resolved: ResolvedDeployment) -> Path:
    """The deployment file's folder (relative database paths start there), else the
    working directory."""
    source = Path(resolved.source)
    return source.parent if source.is_file() else Path.cwd()


def _batch_store(resolved: ResolvedDeployment, state: GatewayState) -> BatchQueue | None:
    """The Batch API's queue (``batches:``), or ``None`` when the API is off."""
    cfg = resolved.deployment.batches
    if not cfg.enabled or state.files is None:
        return None
    if cfg.database.startswith(("redis", "rediss", "unix")):
        return RedisBatchQueue(cfg.database, lease_s=cfg.lease_s)
    return SqlBatchQueue(open_database(cfg.database, base=_base(resolved), timeout_s=10.0))


def _governance(resolved: ResolvedDeployment) -> Governance | None:
    """The deployment's governance, or ``None`` without a ``governance:`` section."""
    config = resolved.deployment
    cfg = config.governance
    if cfg is None:
        return None
    base = _base(resolved)
    enabled = cfg.keys.enabled
    if enabled is None:
        enabled = bool(config.auth.authenticators) and cfg.ledger is not None
    return Governance(
        cfg,
        base=base,
        default_output_tokens=(config.rate_limits or RateLimitsConfig()).default_output_tokens,
        keys_enabled=enabled,
    )
