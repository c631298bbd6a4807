"""The gateway: builds pools from a deployment, runs the request pipeline, serves HTTP.

The two inference routes are raw ASGI handlers (mounted in the Litestar app) so the hot
path is: read body → parse → route → scheduler.admit → backend.stream → SSE out, with no
framework layers, no per-request ``pm.hook`` calls and no per-request INFO logging.
Everything else (models, health, readiness, errors for unknown routes) is ordinary Litestar.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, asgi, get
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException

from shuniu.core.access_log import AccessLog
from shuniu.core.admin import admin_routes
from shuniu.core.composite import Composite
from shuniu.core.config_loader import QUICKSTART_NAME, ResolvedDeployment, expand_endpoints, load_deployment
from shuniu.core.errors import (
    ConfigError,
    GatewayError,
    Problem,
    context_too_long,
    method_not_allowed,
    model_not_found,
    not_found,
    upstream_error,
)
from shuniu.core.http import Receive, Scope, Send, new_request_id, read_body, send_error, send_json
from shuniu.core.interfaces import EndpointSpec
from shuniu.core.launcher import (
    ManagedEngine,
    base_url_template,
    engine_url,
    pick_port,
    plan_engine,
    with_base_url,
)
from shuniu.core.load import adapt_limit, freshness
from shuniu.core.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from shuniu.core.metrics import GatewayMetrics
from shuniu.core.openai_api import StreamEncoder, encode_completion, parse_request
from shuniu.core.overload import OverloadMonitor
from shuniu.core.plugin_manager import PluginManager
from shuniu.core.pool import EndpointState, Pool, Ticket
from shuniu.core.resilience import Resilience, Watchdog
from shuniu.core.response_cache import Filler, ResponseCache
from shuniu.core.routing import Router
from shuniu.core.status_page import PAGE_CONTENT_TYPE, PAGE_HEADERS, StatusWindow, render_page, status_json
from shuniu.core.tenancy import Admission, Tenancy, Tier, limits_in_use
from shuniu.core.tracing import RequestTrace, setup_tracing
from shuniu.core.types import ANONYMOUS, Api, InferenceRequest, Outcome, Principal, RequestRecord

__all__ = ["Gateway"]

log = logging.getLogger("shuniu.gateway")
_encode = msgspec.json.Encoder().encode
_HIT = b"hit"
_HARDWARE_TTL_S = 2.0
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class _Disconnect:
    """Watches ``receive`` for the client going away and cancels the handler task."""

    __slots__ = ("disconnected", "finished", "task")

    def __init__(self) -> None:
        self.disconnected = False
        self.finished = False
        self.task: asyncio.Task[None] | None = None

    def start(self, receive: Receive) -> None:
        self.task = asyncio.get_running_loop().create_task(self._watch(receive, asyncio.current_task()))

    async def _watch(self, receive: Receive, handler: asyncio.Task[Any] | None) -> None:
        # Swallowing our own cancellation (and dropping the task reference in stop) keeps
        # each request from leaving a reference cycle (exception → traceback → frame → self)
        # for the cyclic GC, whose full passes were the gateway's worst latency tail.
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not self.finished and handler is not None:
                        self.disconnected = True
                        handler.cancel()
                    return
        except asyncio.CancelledError:
            return
        finally:
            handler = None

    def stop(self) -> None:
        self.finished = True
        task, self.task = self.task, None
        if task is not None:
            task.cancel()


class _Dispatch:
    """The ASGI entry point: the two inference routes go straight to their handler, which
    saves Litestar's routing and per-message send wrappers on every request and every
    streamed chunk; everything else (and the lifespan) is the Litestar app. Litestar mounts
    the same handlers, so both paths behave alike."""

    __slots__ = ("gateway", "hot", "litestar")

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.litestar = gateway.litestar
        self.hot: dict[str, Api] = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            api = self.hot.get(scope["path"])
            if api is not None:
                try:
                    await self.gateway.handle(api, scope, receive, send)
                except Exception as exc:  # a bug, not a client error: still no traceback out
                    await _internal_error(send, scope, exc)
                return
        await self.litestar(scope, receive, send)


class Gateway:
    """One gateway process: pools, their endpoints, and the HTTP app serving them."""

    def __init__(
        self,
        resolved: ResolvedDeployment,
        plugins: PluginManager,
        *,
        extra_routes: Sequence[Any] = (),
    ) -> None:
        """``extra_routes`` are more Litestar route handlers to serve (e.g. the simulator
        server's ``/metrics``)."""
        self.resolved = resolved
        self._extra_routes = list(extra_routes)
        self.config = resolved.deployment
        self.plugins = plugins
        self.pools: dict[str, Pool] = {}
        self.resilience: dict[str, Resilience] = {}
        """Model → its pool's ejection, retry and timeout state."""
        self.routes: dict[str, Pool] = {}
        self.draining = False
        self.started = False
        self.engines: dict[str, ManagedEngine] = {}
        """Endpoint name → the engine process the gateway launched for it (``launch:``)."""
        self._health_tasks: list[asyncio.Task[None]] = []
        self._endpoint_tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._observers: list[Callable[[RequestRecord], Any]] = plugins.hook_functions("request_finished")
        gw = self.config.gateway
        self._max_body = gw.max_body_bytes
        self._max_header_bytes = gw.max_header_bytes
        self._max_messages = gw.max_messages
        self._max_prompt_tokens = gw.max_prompt_tokens
        self._created_models = int(time.time())
        self._build()
        self.router = Router(self.config.models, self.pools)
        self.tenancy = self._build_tenancy()
        self._identity_headers = self.tenancy.identity_headers
        self.cache = self._build_cache()
        self._hardware: tuple[float, bytes] | None = None
        self._hardware_lock = asyncio.Lock()
        self.hardware_readings: dict[str, Any] | None = None
        """The last hardware snapshot (for ``/metrics``)."""
        self._record_prompts = gw.access_log is not None and gw.access_log.include_prompt
        self.tracing = setup_tracing(gw.tracing)
        # The records' times are the event loop's; so is the monitor's clock.
        degrades = [t.degrade for t in self.config.tiers.values() if t.degrade is not None]
        self.overload = OverloadMonitor(
            lambda: asyncio.get_running_loop().time(),
            min((d.half_life_s for d in degrades), default=5.0),
        )
        if degrades:
            self._observers.append(self.overload.observe)
        self.metrics = GatewayMetrics(self) if gw.metrics else None
        if self.metrics is not None:
            self._observers.append(self.metrics.observe)
        self.access_log = AccessLog(gw.access_log) if gw.access_log is not None else None
        if self.access_log is not None:
            self._observers.append(self.access_log.observe)
        self.status = StatusWindow(self.pools)
        """Recent requests per model, for the status page."""
        self._observers.append(self.status.observe)
        self.litestar = self._make_app()
        self.app = _Dispatch(self)
        """The ASGI application to serve."""

    # -- building ----------------------------------------------------------------------

    def _build(self, reuse: dict[tuple[str, str, str], EndpointState] | None = None) -> None:
        """Build the pools of ``self.config`` into ``self.pools`` (and routes, resilience,
        engines). ``reuse`` (a reload): (model, endpoint name, its config as JSON) → an
        existing endpoint to keep, with its backend, health and engine, instead of a new one."""
        backends = self.plugins.registered("backends")
        schedulers = self.plugins.registered("schedulers")
        # Ports for launched engines with `port: 0`, picked now (the backends are built with
        # their address) and kept across restarts.
        picked: set[int] = set()
        for model_name, model in self.config.models.items():
            endpoints: list[EndpointState] = []
            plans = []
            for index, replica, ep_name in expand_endpoints(model_name, model.endpoints):
                ep_cfg = model.endpoints[index]
                if reuse is not None:
                    kept = reuse.get((model_name, ep_name, ep_cfg.model_dump_json()))
                    if kept is not None:
                        endpoints.append(kept)
                        continue
                options = self.resolved.endpoint_options.get((model_name, index))
                extra: dict[str, Any] = {}
                plan = None
                if ep_cfg.launch is not None:
                    launch = ep_cfg.launch
                    port = launch.port + replica if launch.port else pick_port(launch.host, picked)
                    plan = plan_engine(launch, model=model_name, name=ep_name, replica=replica, port=port)
                    template = base_url_template(type(options)) if options is not None else None
                    if template is not None and "base_url" not in ep_cfg.options:
                        options = with_base_url(options, engine_url(template, launch.host, port))
                    # The environment too: a backend may read its devices from it
                    # (e.g. ASCEND_RT_VISIBLE_DEVICES).
                    extra["launch"] = {"host": launch.host, "port": port, "env": dict(plan.env)}
                spec = EndpointSpec(
                    name=ep_name,
                    model=model_name,
                    options=options,
                    replica=replica,
                    max_model_len=model.max_model_len,
                    extra=extra,
                )
                backend = backends[ep_cfg.kind].factory(spec)
                endpoint = EndpointState(
                    ep_name,
                    backend,
                    weight=ep_cfg.weight,
                    version=ep_cfg.version,
                    max_concurrency=ep_cfg.max_concurrency,
                    labels=dict(ep_cfg.labels),
                )
                if plan is not None:
                    # Out of balancing until the engine's first passing health probe.
                    endpoint.healthy = False
                    endpoint.last_health_detail = "engine not started"
                    plans.append((endpoint, plan))
                endpoints.append(endpoint)
            balancer = self._balancer(model_name, model)
            scheduler = schedulers[model.scheduler.policy].factory(
                self.resolved.scheduler_options.get(model_name)
            )
            pool = Pool(model_name, endpoints, balancer, scheduler, max_model_len=model.max_model_len)
            self.pools[model_name] = pool
            self.resilience[model_name] = Resilience(pool, model.retries, model.outlier, model.timeouts)
            for alias in [model_name, *model.aliases]:
                self.routes[alias] = pool
            for endpoint, plan in plans:
                self.engines[endpoint.name] = ManagedEngine(
                    plan, on_down=functools.partial(pool.set_healthy, endpoint, False)
                )
            if reuse is not None:
                for endpoint in endpoints:
                    engine = self.engines.get(endpoint.name)
                    if engine is not None and engine.plan is not None:
                        # A kept engine reports going down to its new pool.
                        engine._on_down = functools.partial(pool.set_healthy, endpoint, False)

    def _build_tenancy(self, store: Any = None) -> Tenancy:
        registered = self.plugins.registered("authenticators")
        authenticators = [
            registered[cfg.kind].factory(self.resolved.authenticator_options.get(i))
            for i, cfg in enumerate(self.config.auth.authenticators)
        ]
        rl = self.config.rate_limits
        if store is None and (
            rl is not None or limits_in_use(self.config, self.resolved.authenticator_options)
        ):
            name = rl.store if rl is not None else "memory"
            store = self.plugins.registered("rate_limiters")[name].factory(self.resolved.rate_limit_options)
        tenancy = Tenancy(self.config, authenticators, store)
        priorities = tenancy.priorities
        if priorities:
            for pool in self.pools.values():
                adopt = getattr(pool.scheduler, "adopt_tiers", None)
                if adopt is not None:
                    adopt(priorities)
        return tenancy

    def _build_cache(self) -> ResponseCache | None:
        cfg = self.config.cache
        if cfg is None:
            return None
        store = self.plugins.registered("caches")[cfg.store].factory(self.resolved.cache_options)
        return ResponseCache(cfg, store)

    def _balancer(self, model_name: str, model: Any) -> Any:
        cfg = model.balancer
        policy = cfg.effective_policy
        if policy is not None:
            return self.plugins.registered("balancers")[policy].factory(
                self.resolved.balancer_options.get(model_name)
            )
        filters = self.plugins.registered("filters")
        scorers = self.plugins.registered("scorers")
        return Composite(
            [
                filters[f.name].factory(self.resolved.filter_options.get((model_name, i)))
                for i, f in enumerate(cfg.filters)
            ],
            [
                (scorers[sc.name].factory(self.resolved.scorer_options.get((model_name, i))), sc.weight)
                for i, sc in enumerate(cfg.scorers)
            ],
        )

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start the launched engines, every backend, the health checkers, and run the
        start-up hooks. Launched engines join balancing once their health probe passes."""
        for engine in self.engines.values():
            engine.start()
        await asyncio.gather(*(e.backend.start() for p in self.pools.values() for e in p.endpoints))
        for pool in self.pools.values():
            if pool.max_model_len is None:
                lens = [e.backend.max_model_len for e in pool.endpoints if e.backend.max_model_len]
                pool.max_model_len = min(lens) if lens else None
            for endpoint in pool.endpoints:
                self._watch(pool, endpoint)
        for fn in self.plugins.hook_functions("gateway_startup"):
            result = fn(gateway=self)
            if inspect.isawaitable(result):
                await result
        # Everything built so far lives as long as the process: move it out of the cyclic
        # GC's generations so full collections stop rescanning it (tens of ms each).
        gc.collect()
        gc.freeze()
        self.started = True

    async def stop(self) -> None:
        self.draining = True
        for fn in self.plugins.hook_functions("gateway_shutdown"):
            try:
                result = fn(gateway=self)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("a gateway_shutdown hook failed")
        for task in self._health_tasks:
            task.cancel()
        await asyncio.gather(*self._health_tasks, return_exceptions=True)
        self._health_tasks.clear()
        results = await asyncio.gather(
            *(e.backend.stop() for p in self.pools.values() for e in p.endpoints), return_exceptions=True
        )
        # Engines last: in-flight requests were drained before the shutdown hooks ran.
        results += await asyncio.gather(*(e.stop() for e in self.engines.values()), return_exceptions=True)
        if self.access_log is not None:
            self.access_log.stop()
        if self.tracing is not None:
            self.tracing.shutdown()
        stores = [s for s in (self.tenancy.store, self.cache.store if self.cache else None) if s is not None]
        results += await asyncio.gather(*(s.close() for s in stores), return_exceptions=True)
        # Undo start()'s gc.freeze() so a stopped gateway can be collected (a capacity plan
        # builds and stops many in one process).
        gc.unfreeze()
        for r in results:
            if isinstance(r, BaseException):
                log.warning("a backend or engine failed to stop cleanly: %r", r)

    async def _health_loop(self, pool: Pool, endpoint: EndpointState, cfg: Any) -> None:
        loop = asyncio.get_running_loop()
        fails = passes = probes = 0
        engine = self.engines.get(endpoint.name)
        while True:
            if engine is not None and not engine.probing:
                # A launched engine that is not running is not probed: its port may have been
                # taken by another process. Its supervisor took the endpoint out already.
                fails = passes = 0
                endpoint.last_health_detail = f"engine {engine.state}: {engine.detail}"
                await asyncio.sleep(cfg.interval_s)
                continue
            generation = engine.generation if engine is not None else 0
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that races with completion, and this loop would never stop.
            try:
                async with asyncio.timeout(cfg.timeout_s):
                    health = await endpoint.backend.health()
                ok, detail = health.ok, health.detail
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                ok, detail = False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            probes += 1
            if ok and cfg.generation_every is not None and probes % cfg.generation_every == 0:
                ok, detail = await _generation_probe(pool.name, endpoint, cfg.generation_timeout_s, loop)
            endpoint.last_health_detail = detail
            if ok:
                if endpoint.ejected and self.resilience[pool.name].maybe_return(endpoint, loop.time()):
                    pool.scheduler.wake(pool)
                passes, fails = passes + 1, 0
                if not endpoint.healthy and passes >= cfg.healthy_after:
                    if engine is None:
                        log.warning("endpoint %s is healthy again", endpoint.name)
                    elif not engine.admits(generation):
                        # The engine went down (or restarted) while this probe ran.
                        passes = 0
                        await asyncio.sleep(cfg.interval_s)
                        continue
                    else:
                        self._refresh_max_model_len(pool)
                    pool.set_healthy(endpoint, True)
            else:
                fails, passes = fails + 1, 0
                if endpoint.healthy and fails >= cfg.unhealthy_after:
                    log.warning("endpoint %s is unhealthy: %s", endpoint.name, detail)
                    pool.set_healthy(endpoint, False)
            await asyncio.sleep(cfg.interval_s)

    def _watch(self, pool: Pool, endpoint: EndpointState) -> None:
        """Start the endpoint's health and load loops."""
        model = self.config.models[pool.name]
        tasks = [
            asyncio.create_task(
                self._health_loop(pool, endpoint, model.health), name=f"health:{endpoint.name}"
            ),
            asyncio.create_task(self._load_loop(pool, endpoint, model.load), name=f"load:{endpoint.name}"),
        ]
        self._health_tasks.extend(tasks)
        self._endpoint_tasks[endpoint.name] = tasks

    # -- run-time changes (the admin API) ----------------------------------------------------

    async def reload(self) -> list[str]:
        """Re-read the deployment file and apply it without dropping a request. Raises
        :class:`ConfigError` (nothing changed) when the file is invalid or asks for what
        only a restart can do. Returns what changed.

        Endpoints whose entry is unchanged are kept as they are (backend, health, launched
        engine, requests in flight); new ones start before they are swapped in; removed
        ones drain (in-flight requests finish) and then stop. Pools get fresh schedulers
        and balancers: requests already queued are served by the old ones."""
        if self.resolved.source in (QUICKSTART_NAME, "<text>"):
            raise ConfigError(
                [Problem("", "only a deployment read from a file can be reloaded")], self.resolved.source
            )
        resolved = load_deployment(self.resolved.source, self.plugins)
        new_cfg = resolved.deployment
        problems = _reload_problems(self.config, new_cfg)
        if problems:
            raise ConfigError(problems, self.resolved.source)
        reuse: dict[tuple[str, str, str], EndpointState] = {}
        old_by_name: dict[str, tuple[Pool, EndpointState]] = {}
        for model_name, model in self.config.models.items():
            pool = self.pools[model_name]
            by_name = {e.name: e for e in pool.endpoints}
            for index, _replica, ep_name in expand_endpoints(model_name, model.endpoints):
                endpoint = by_name.get(ep_name)
                if endpoint is not None:
                    key = (model_name, ep_name, model.endpoints[index].model_dump_json())
                    reuse[key] = endpoint
            for e in pool.endpoints:  # endpoints added through the admin API are kept too
                old_by_name[e.name] = (pool, e)
        # Build the new pools (synchronous: no request runs in between), then put the
        # current state back until the new backends have started.
        saved = (self.resolved, self.config, self.pools, self.routes, self.resilience, self.engines)
        self.resolved, self.config = resolved, new_cfg
        self.pools, self.routes, self.resilience, self.engines = {}, {}, {}, dict(self.engines)
        try:
            self._build(reuse)
            new = (self.pools, self.routes, self.resilience, self.engines)
        finally:
            self.resolved, self.config, self.pools, self.routes, self.resilience, self.engines = saved
        new_pools, new_routes, new_resilience, new_engines = new
        kept = {id(e) for p in new_pools.values() for e in p.endpoints}
        old = {id(e) for _, e in old_by_name.values()}
        added = [(p, e) for p in new_pools.values() for e in p.endpoints if id(e) not in old]
        removed = [(p, e) for p, e in old_by_name.values() if id(e) not in kept]
        removed_names = {e.name for _, e in removed}
        await asyncio.gather(*(e.backend.start() for _, e in added))
        # The swap.
        old_pools = self.pools
        self.resolved, self.config = resolved, new_cfg
        self.pools, self.routes, self.resilience = new_pools, new_routes, new_resilience
        self.engines = {name: eng for name, eng in new_engines.items() if name not in removed_names}
        self.router = Router(new_cfg.models, new_pools)
        old_store = self.tenancy.store
        same_limits = new_cfg.rate_limits == saved[1].rate_limits
        self.tenancy = self._build_tenancy(store=old_store if same_limits else None)
        self._identity_headers = self.tenancy.identity_headers
        if new_cfg.cache != saved[1].cache:
            old_cache = self.cache
            self.cache = self._build_cache()
            if old_cache is not None:
                await old_cache.store.close()
        if not same_limits and old_store is not None:
            await old_store.close()
        # Health and load loops follow each endpoint into its new pool.
        for pool in new_pools.values():
            if pool.max_model_len is None:
                lens = [e.backend.max_model_len for e in pool.endpoints if e.backend.max_model_len]
                pool.max_model_len = min(lens) if lens else None
            for endpoint in pool.endpoints:
                for task in self._endpoint_tasks.pop(endpoint.name, []):
                    task.cancel()
                self._watch(pool, endpoint)
        for pool in old_pools.values():
            pool.scheduler.wake(pool)
        for _, endpoint in removed:
            endpoint.draining = True
        for name, engine in new_engines.items():
            if name not in saved[5]:
                engine.start()
        if removed:
            asyncio.get_running_loop().create_task(self._retire([e for _, e in removed], saved[5]))
        changes = [f"added endpoint {e.name} to {p.name}" for p, e in added]
        changes += [f"removing endpoint {e.name} from {p.name} (draining)" for p, e in removed]
        added_models = sorted(set(new_pools) - set(old_pools))
        removed_models = sorted(set(old_pools) - set(new_pools))
        changes += [f"added model {m}" for m in added_models] + [f"removed model {m}" for m in removed_models]
        changes.append(
            "reloaded: pools, routes, traffic, tiers, auth, limits"
            + (", cache" if new_cfg.cache != saved[1].cache else "")
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

    async def _retire(self, endpoints: list[EndpointState], engines: dict[str, ManagedEngine]) -> None:
        """Stop removed endpoints once nothing runs on them (or the shutdown grace is over)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.gateway.graceful_shutdown_s
        while any(e.in_flight for e in endpoints) and loop.time() < deadline:  # noqa: ASYNC110 - a background poll of counters
            await asyncio.sleep(0.05)
        for endpoint in endpoints:
            for task in self._endpoint_tasks.pop(endpoint.name, []):
                task.cancel()
            try:
                await endpoint.backend.stop()
            except Exception:
                log.warning("endpoint %s did not stop cleanly", endpoint.name)
            engine = engines.get(endpoint.name)
            if engine is not None:
                await engine.stop()

    def find_endpoint(self, name: str) -> tuple[Pool, EndpointState] | None:
        for pool in self.pools.values():
            for e in pool.endpoints:
                if e.name == name:
                    return pool, e
        return None

    async def add_endpoint(self, model: str, cfg: Any, options: Any) -> EndpointState:
        """Build, start and add one endpoint to a model's pool. It joins balancing after its
        first passing health probe. ``cfg`` is a validated :class:`EndpointConfig` without
        ``launch`` and with ``replicas: 1``; ``options`` its validated backend options."""
        pool = self.pools[model]
        name = cfg.name
        spec = EndpointSpec(name=name, model=model, options=options, max_model_len=pool.max_model_len)
        backend = self.plugins.registered("backends")[cfg.kind].factory(spec)
        endpoint = EndpointState(
            name,
            backend,
            weight=cfg.weight,
            version=cfg.version,
            max_concurrency=cfg.max_concurrency,
            labels=dict(cfg.labels),
        )
        endpoint.healthy = False
        endpoint.last_health_detail = "added; waiting for its first health probe"
        await backend.start()
        pool.add(endpoint)
        self._watch(pool, endpoint)
        log.warning("endpoint %s added to %s (version %s)", name, model, cfg.version)
        return endpoint

    def log_change(self, what: str) -> None:
        log.warning("admin: %s", what)

    def set_draining(self, endpoint: EndpointState, draining: bool) -> None:
        """Draining: no new requests; those in flight finish."""
        pool_endpoint = self.find_endpoint(endpoint.name)
        endpoint.draining = draining
        if not draining and pool_endpoint is not None:
            pool_endpoint[0].scheduler.wake(pool_endpoint[0])
        log.warning("endpoint %s %s", endpoint.name, "draining" if draining else "back in balancing")

    async def remove_endpoint(self, pool: Pool, endpoint: EndpointState) -> None:
        """Take a drained endpoint (nothing in flight) out of its pool and stop it."""
        pool.remove(endpoint)
        tasks = self._endpoint_tasks.pop(endpoint.name, [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._health_tasks = [t for t in self._health_tasks if t not in tasks]
        await endpoint.backend.stop()
        log.warning("endpoint %s removed from %s", endpoint.name, pool.name)

    def _refresh_max_model_len(self, pool: Pool) -> None:
        """A launched engine joined: its backend may now know the context window, which was
        unknown when the gateway started (the deployment's own value always wins)."""
        if self.config.models[pool.name].max_model_len is not None:
            return
        lens = [e.backend.max_model_len for e in pool.endpoints if e.backend.max_model_len]
        if lens:
            pool.max_model_len = min(lens)

    async def _load_loop(self, pool: Pool, endpoint: EndpointState, cfg: Any) -> None:
        """Poll the engine's own load; age the last snapshot when polls fail; adapt the
        endpoint's concurrency limit to the engine's backlog."""
        loop = asyncio.get_running_loop()
        timeout = max(cfg.interval_s, 1.0)
        while True:
            try:
                async with asyncio.timeout(timeout):
                    snap = await endpoint.backend.load()
            except asyncio.CancelledError:
                raise
            except Exception:
                snap = None
                failed = True
            else:
                failed = False
            now = loop.time()
            if snap is not None:
                endpoint.load = snap
                endpoint.load_at = now
                endpoint.load_weight = 1.0
                if adapt_limit(endpoint, snap, cfg):
                    pool.scheduler.wake(pool)
            elif failed and endpoint.load is not None:
                endpoint.load_weight = freshness(now - endpoint.load_at, cfg.stale_after_s)
                if endpoint.load_weight == 0.0:
                    endpoint.load = None
            else:
                # No load view at all: no snapshot to weigh, and nothing to adapt the limit to.
                endpoint.load = None
                endpoint.load_weight = 0.0
                if not failed:
                    return
            await asyncio.sleep(cfg.interval_s)

    # -- the hot path ------------------------------------------------------------------

    async def handle(self, api: Api, scope: Scope, receive: Receive, send: Send) -> None:
        """One inference request, from raw ASGI to the last byte."""
        request_id = new_request_id(scope)
        loop = asyncio.get_running_loop()
        if scope["method"] != "POST":
            await send_error(send, method_not_allowed(scope["method"], scope["path"]), request_id)
            return
        arrival = loop.time()
        req: InferenceRequest | None = None
        tenancy = self.tenancy
        tier: Tier | None = None
        degraded: bytes | None = None
        headers = scope["headers"]
        trace = self.tracing.start(api, headers, time.time_ns()) if self.tracing is not None else None
        try:
            if headers:
                self._check_header_size(headers)
            # The credential first: an unauthenticated client's body is never read.
            principal = None
            if tenancy.auth:
                principal = (
                    tenancy.auth.authenticate(headers)
                    if trace is None
                    else _traced_auth(trace, headers, tenancy)
                )
            raw = await read_body(scope, receive, self._max_body)
            req = parse_request(raw, api, request_id, arrival)
            if principal is not None:
                req.principal = principal
            if trace is not None:
                trace.request(req)
            self._check_size(req)
            pool = self.routes.get(req.model)
            if pool is None:
                raise model_not_found(req.model)
            if headers:
                self._apply_headers(req, headers, arrival)
            if tenancy.checks_tier:
                tier = tenancy.tier_of(req.principal)
                tenancy.check(req, tier, pool.name)
                if tier.degrade is not None and self.overload.degraded(pool.name, tier.name, tier.degrade):
                    pool, degraded = self._degrade(req, tier, pool)
            pool = self.router.resolve(req, pool)
            self.check_context(req, pool)
        except GatewayError as err:
            await send_error(send, err, request_id)
            if self._observers or trace is not None:
                rec = self._rejected_record(request_id, api, req, err, arrival, loop.time())
                self._call_observers(rec)
                if trace is not None:
                    trace.finish(rec)
            return
        watch = _Disconnect()
        watch.start(receive)
        record = _Progress()
        record.pool = pool.name
        record.trace = trace
        admission: Admission | None = None
        cache_key: str | None = None
        filler: Filler | None = None
        try:
            extra: list[tuple[bytes, bytes]] = [] if degraded is None else [(b"x-shuniu-degraded", degraded)]
            if tenancy.store is not None:
                try:
                    acquiring = tenancy.acquire(req, tier or tenancy.tiers["default"])
                    admission = await (
                        acquiring if trace is None else _traced(trace, "shuniu.rate_limit", acquiring)
                    )
                except GatewayError as err:
                    record.fail(err)
                    await send_error(send, err, req.id)
                    return
                if admission is not None:
                    extra = [*extra, *admission.headers] if extra else admission.headers
            cache = self.cache
            if cache is not None:
                lookup = self._cache_lookup(cache, req, pool, tier, extra, send, loop, record)
                cache_key, filler, state = await (
                    lookup if trace is None else _traced(trace, "shuniu.cache", lookup)
                )
                if state is _HIT:
                    return
                extra = [*extra, (b"x-shuniu-cache", state)]
            if req.stream:
                await self._stream(req, pool, send, loop, record, extra, filler)
            else:
                await self._complete(req, pool, send, loop, record, extra, filler)
        except asyncio.CancelledError:
            if not watch.disconnected:
                raise
            record.outcome = Outcome.CANCELLED
            record.status = 499
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
        finally:
            watch.stop()
            if cache_key is not None and filler is not None:
                await self._cache_finish(cache_key, req, record, filler)
            if admission is not None:
                await self._settle(admission, record)
            if self._observers or trace is not None:
                rec = self._record(req, record, loop.time())
                self._call_observers(rec)
                if trace is not None:
                    trace.finish(rec, record.finish_reason)

    def _degrade(self, req: InferenceRequest, tier: Tier, pool: Pool) -> tuple[Pool, bytes]:
        """Apply the tier's degradation while the pool is overloaded; say what was done in
        ``x-shuniu-degraded``."""
        cfg = tier.degrade
        assert cfg is not None
        if cfg.shed:
            self.overload.count(pool.name, tier.name, "shed")
            raise GatewayError(
                503,
                f"`{pool.name}` is overloaded; requests of tier {tier.name!r} are refused until it recovers.",
                type="server_error",
                code="overloaded",
                headers={"retry-after": "5", "x-shuniu-degraded": "shed"},
            )
        done = []
        if cfg.max_tokens is not None and (req.max_tokens is None or req.max_tokens > cfg.max_tokens):
            req.max_tokens = cfg.max_tokens
            req.body["max_tokens"] = cfg.max_tokens
            req.body.pop("max_completion_tokens", None)
            done.append(f"max_tokens={cfg.max_tokens}")
            self.overload.count(pool.name, tier.name, "max_tokens")
        if cfg.route_to is not None and cfg.route_to != pool.name:
            self.overload.count(pool.name, tier.name, "route")
            pool = self.pools[cfg.route_to]
            done.append(f"model={cfg.route_to}")
        return pool, ",".join(done).encode() if done else b"none"

    def _check_header_size(self, headers: Any) -> None:
        size = 0
        for key, value in headers:
            size += len(key) + len(value) + 4
        if size > self._max_header_bytes:
            raise GatewayError(
                431,
                f"The request headers are larger than this gateway accepts ({self._max_header_bytes} bytes).",
                code="headers_too_large",
            )

    def _check_size(self, req: InferenceRequest) -> None:
        if req.api == "chat":
            count = len(req.body["messages"])
            if count > self._max_messages:
                raise GatewayError(
                    400,
                    f"The request has {count} messages; this gateway accepts at most {self._max_messages}.",
                    param="messages",
                    code="too_many_messages",
                )
        limit = self._max_prompt_tokens
        if limit is not None and req.prompt_tokens > limit:
            raise GatewayError(
                400,
                f"The prompt is about {req.prompt_tokens} tokens; this gateway accepts at most {limit}.",
                param="messages" if req.api == "chat" else "prompt",
                code="prompt_too_long",
            )

    async def _cache_lookup(
        self,
        cache: ResponseCache,
        req: InferenceRequest,
        pool: Pool,
        tier: Tier | None,
        extra: list[tuple[bytes, bytes]],
        send: Send,
        loop: asyncio.AbstractEventLoop,
        record: _Progress,
    ) -> tuple[str | None, Filler | None, bytes]:
        """Answer from the cache (→ state ``_HIT``, response sent), or say whether this
        request fills the entry: ``(key, filler, state)`` with state ``miss``/``bypass``/``skip``."""
        control = cache.control(req)
        if control == "no-store" or not cache.cacheable(req, tier is not None and tier.cache):
            return None, None, b"skip" if control != "no-store" else b"bypass"
        versions = req.version or pool.versions_key
        key = cache.key(req, pool.name, versions)
        if control == "no-cache":
            return key, Filler(), b"bypass"
        answer, fills = await cache.lookup(key)
        if answer is None:
            return (key, Filler(), b"miss") if fills else (None, None, b"miss")
        record.cached = True
        record.endpoint = None
        record.first_token = loop.time()
        record.prompt_tokens = answer.prompt_tokens
        record.completion_tokens = answer.completion_tokens
        headers = [*extra, (b"x-shuniu-cache", b"hit")]
        if req.stream:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [*_SSE_HEADERS, (b"x-request-id", req.id.encode()), *headers],
                }
            )
            await send({"type": "http.response.body", "body": cache.as_sse(req, answer), "more_body": False})
        else:
            await send_json(send, 200, cache.as_json(req, answer), req.id, raw_headers=headers)
        return None, None, _HIT

    async def _cache_finish(self, key: str, req: InferenceRequest, record: _Progress, filler: Filler) -> None:
        cache = self.cache
        assert cache is not None
        try:
            if record.outcome is None and record.status == 200:
                await cache.fill(key, req, filler)
            else:
                await cache.abandon(key)
        except Exception:
            log.exception("storing an answer in the cache failed")

    async def _settle(self, admission: Admission, record: _Progress) -> None:
        # A cached answer cost the engines nothing: its whole token reservation goes back.
        used = 0 if record.cached else record.prompt_tokens + record.completion_tokens
        try:
            await self.tenancy.settle(admission, used)
        except Exception:
            log.exception("settling rate limits failed")

    def _apply_headers(self, req: InferenceRequest, headers: Any, arrival: float) -> None:
        req.headers = headers
        if self.tracing is None:
            # No spans of our own: the client's trace context goes to the engine unchanged.
            parent = req.header(b"traceparent")
            if parent is not None:
                state = req.header(b"tracestate")
                req.trace_headers = {"traceparent": parent.decode("latin-1")}
                if state is not None:
                    req.trace_headers["tracestate"] = state.decode("latin-1")
        deadline = req.header(b"x-shuniu-deadline-ms")
        if deadline is not None:
            try:
                budget_ms = float(deadline)
            except ValueError:
                budget_ms = -1.0
            if not budget_ms > 0 or budget_ms == float("inf"):
                raise GatewayError(
                    400,
                    "Header x-shuniu-deadline-ms must be a positive number of milliseconds.",
                    param="x-shuniu-deadline-ms",
                    code="invalid_value",
                )
            req.deadline = arrival + budget_ms / 1000.0
        if self._identity_headers:
            tenant = req.header(b"x-shuniu-tenant")
            tier = req.header(b"x-shuniu-tier")
            if tenant is not None or tier is not None:
                req.principal = Principal(
                    tenant=tenant.decode("latin-1") if tenant else "anonymous",
                    tier=tier.decode("latin-1") if tier else "default",
                )

    def check_context(self, req: InferenceRequest, pool: Pool) -> None:
        """400 when the prompt plus ``max_tokens`` exceed the pool's context window."""
        limit = pool.max_model_len
        if limit is None:
            return
        wanted = req.max_tokens or 0
        if req.prompt_tokens + wanted > limit or req.prompt_tokens >= limit:
            raise context_too_long(limit, req.prompt_tokens, wanted)

    async def _admit(self, req: InferenceRequest, pool: Pool, record: _Progress) -> Ticket:
        trace = record.trace
        if trace is None:
            ticket = await pool.scheduler.admit(req, pool)
        else:
            span = trace.child("shuniu.queue")
            try:
                ticket = await pool.scheduler.admit(req, pool)
            except BaseException as exc:
                trace.fail(span, exc.code if isinstance(exc, GatewayError) else type(exc).__name__)
                span.end()
                raise
            span.add_event("endpoint picked", {"shuniu.endpoint": ticket.endpoint.name})
            span.end()
            record.upstream = trace.upstream(req, ticket.endpoint.name)
        record.endpoint = ticket.endpoint.name
        record.admitted = ticket.admitted
        return ticket

    async def _complete(
        self,
        req: InferenceRequest,
        pool: Pool,
        send: Send,
        loop: asyncio.AbstractEventLoop,
        record: _Progress,
        extra: list[tuple[bytes, bytes]],
        filler: Filler | None,
    ) -> None:
        while True:
            try:
                ticket = await self._admit(req, pool, record)
            except GatewayError as err:
                record.fail(err)
                await send_error(send, err, req.id, extra)
                return
            res = self.resilience[pool.name]
            outcome = Outcome.ERROR
            err: GatewayError | None = None
            try:
                limit = _first_token_limit(res, req, loop)
                if limit is None:
                    result = await ticket.endpoint.backend.complete(req)
                else:
                    async with asyncio.timeout(limit):
                        result = await ticket.endpoint.backend.complete(req)
                outcome = Outcome.OK
            except GatewayError as exc:
                err = exc
            except TimeoutError:
                err = _timeout_error(res, req, loop)
            except asyncio.CancelledError:
                outcome = Outcome.CANCELLED
                raise
            except Exception as exc:
                err = _backend_failure(ticket.endpoint, exc)
            finally:
                self._attempt_over(ticket, outcome, record)
            if err is None:
                res.succeeded(ticket.endpoint, loop.time())
                break
            retry = await self._after_failure(req, pool, ticket.endpoint, err, record, loop)
            if retry is None:
                record.fail(err)
                await send_error(send, err, req.id, extra)
                return
            pool = retry
        record.first_token = loop.time()
        record.prompt_tokens = result.usage.prompt_tokens
        record.completion_tokens = result.usage.completion_tokens
        record.finish_reason = result.finish_reason
        if filler is not None:
            filler.completion(result)
        await send_json(send, 200, encode_completion(req, result), req.id, raw_headers=extra)

    def _attempt_over(self, ticket: Ticket, outcome: Outcome, record: _Progress) -> None:
        """One engine attempt ended: free its slot, close its span, settle the retry count."""
        ticket.pool.scheduler.release(ticket, outcome)
        if record.upstream is not None:
            record.end_upstream()
        if record.retrying:
            record.retrying = False
            self.resilience[ticket.pool.name].retrying -= 1

    async def _after_failure(
        self,
        req: InferenceRequest,
        pool: Pool,
        endpoint: EndpointState,
        err: GatewayError,
        record: _Progress,
        loop: asyncio.AbstractEventLoop,
    ) -> Pool | None:
        """An attempt failed before the first byte. Count it against the endpoint, and say
        which pool to try next (``None``: answer with the error)."""
        if err.status < 500:
            return None  # the engine refused the request itself: another would too
        await self._engine_suspect(endpoint)
        res = self.resilience[pool.name]
        res.failed(endpoint, loop.time())
        tried = (req.tried or frozenset()) | {endpoint.name}
        req.tried = tried
        if record.attempts >= res.retries.max_retries:
            target = None
        elif res.has_alternative(tried) and res.budget_allows():
            target = pool
        else:
            target = None
        if target is None:
            fallback = res.retries.fallback
            if fallback is None or record.fell_back or record.attempts > res.retries.max_retries:
                return None
            record.fell_back = True
            target = self.pools[fallback]
            req.tried = None
        record.attempts += 1
        record.retrying = True
        tres = self.resilience[target.name]
        tres.retrying += 1
        code = err.code or "error"
        res.retries_by_reason[code] = res.retries_by_reason.get(code, 0) + 1
        return target

    async def _stream(
        self,
        req: InferenceRequest,
        pool: Pool,
        send: Send,
        loop: asyncio.AbstractEventLoop,
        record: _Progress,
        extra: list[tuple[bytes, bytes]],
        filler: Filler | None,
    ) -> None:
        # Attempts until one produces a first chunk: a failure before the first byte is
        # still an ordinary HTTP error, so it can be retried on another endpoint.
        while True:
            try:
                ticket = await self._admit(req, pool, record)
            except GatewayError as err:
                record.fail(err)
                await send_error(send, err, req.id, extra)
                return
            res = self.resilience[pool.name]
            gen = ticket.endpoint.backend.stream(req)
            err: GatewayError | None = None
            try:
                limit = _first_token_limit(res, req, loop)
                if limit is None:
                    first = await gen.__anext__()
                else:
                    async with asyncio.timeout(limit):
                        first = await gen.__anext__()
            except StopAsyncIteration:
                first = None
            except GatewayError as exc:
                err = exc
            except TimeoutError:
                err = _timeout_error(res, req, loop)
            except asyncio.CancelledError:
                await _close(gen)
                self._attempt_over(ticket, Outcome.CANCELLED, record)
                raise
            except Exception as exc:
                err = _backend_failure(ticket.endpoint, exc)
            if err is None:
                break
            await _close(gen)
            self._attempt_over(ticket, Outcome.ERROR, record)
            retry = await self._after_failure(req, pool, ticket.endpoint, err, record, loop)
            if retry is None:
                record.fail(err)
                await send_error(send, err, req.id, extra)
                return
            pool = retry
        encoder = StreamEncoder(req)
        outcome = Outcome.ERROR
        timeouts = res.timeouts
        deadline = req.arrival + timeouts.total_s if timeouts.total_s is not None else None
        dog = Watchdog(loop, timeouts.idle_s, deadline) if timeouts.idle_s is not None or deadline else None
        try:
            record.first_token = loop.time()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [*_SSE_HEADERS, (b"x-request-id", req.id.encode()), *extra],
                }
            )
            head = encoder.start()
            if first is not None:
                head += encoder.chunk(first)
                await send({"type": "http.response.body", "body": head, "more_body": True})
                if filler is not None:
                    filler.chunk(first)
                async for chunk in gen:
                    if dog is not None:
                        dog.last = loop.time()
                    if filler is not None:
                        filler.chunk(chunk)
                    data = encoder.chunk(chunk)
                    if data:
                        await send({"type": "http.response.body", "body": data, "more_body": True})
            elif head:
                await send({"type": "http.response.body", "body": head, "more_body": True})
            outcome = Outcome.OK
            if dog is not None:
                dog.stop()
            await send({"type": "http.response.body", "body": encoder.end(), "more_body": False})
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if dog is None or dog.fired is None or task is None or task.uncancel() > 0:
                outcome = Outcome.CANCELLED
                raise
            # The watchdog's cancellation, not the client's: end the stream with an error.
            err = _stream_timeout(dog.fired, timeouts)
            record.fail(err)
            record.status = 200
            await send({"type": "http.response.body", "body": StreamEncoder.error(err), "more_body": False})
            res.failed(ticket.endpoint, loop.time())
        except Exception as exc:
            if not isinstance(exc, GatewayError) or exc.status >= 500:
                await self._engine_suspect(ticket.endpoint)
                res.failed(ticket.endpoint, loop.time())
            err = exc if isinstance(exc, GatewayError) else _backend_failure(ticket.endpoint, exc)
            record.fail(err)
            record.status = 200
            await send({"type": "http.response.body", "body": StreamEncoder.error(err), "more_body": False})
        else:
            res.succeeded(ticket.endpoint, loop.time())
        finally:
            if dog is not None:
                dog.stop()
            try:
                await _close(gen)
            finally:
                self._attempt_over(ticket, outcome, record)
                usage = encoder.final_usage()
                record.prompt_tokens = usage.prompt_tokens
                record.completion_tokens = usage.completion_tokens
                record.finish_reason = encoder.finish_reason
                if filler is not None and filler.usage is None:
                    filler.usage = usage

    async def _engine_suspect(self, endpoint: EndpointState) -> None:
        """A request to ``endpoint`` failed. If it is a launched engine whose process just
        died, take it out of balancing now, before the request's slot is released: an
        endpoint that fails at once would otherwise pull the whole queue into errors before
        the exit is reaped. Failure path only."""
        if self.engines:
            engine = self.engines.get(endpoint.name)
            if engine is not None:
                await engine.confirm_exit()

    def _rejected_record(
        self,
        request_id: str,
        api: Api,
        req: InferenceRequest | None,
        err: GatewayError,
        arrival: float,
        now: float,
    ) -> RequestRecord:
        """Observers hear about requests refused before admission too (bad body, unknown model)."""
        return RequestRecord(
            id=request_id,
            model=req.model if req is not None else "",
            api=api,
            stream=req.stream if req is not None else False,
            status=err.status,
            outcome=Outcome.ERROR,
            error_code=err.code,
            prompt_tokens=req.prompt_tokens if req is not None else 0,
            arrival=arrival,
            finished=now,
            principal=req.principal if req is not None else ANONYMOUS,
            prompt=req.prompt if req is not None and self._record_prompts else None,
        )

    def _record(self, req: InferenceRequest, progress: _Progress, now: float) -> RequestRecord:
        return RequestRecord(
            id=req.id,
            model=req.model,
            api=req.api,
            stream=req.stream,
            status=progress.status,
            outcome=progress.outcome if progress.outcome is not None else Outcome.OK,
            endpoint=progress.endpoint,
            error_code=progress.error_code,
            prompt_tokens=progress.prompt_tokens,
            completion_tokens=progress.completion_tokens,
            arrival=req.arrival,
            admitted=progress.admitted,
            first_token=progress.first_token,
            finished=now,
            principal=req.principal,
            pool=progress.pool,
            cached=progress.cached,
            retries=progress.attempts,
            prompt=req.prompt if self._record_prompts else None,
        )

    def _call_observers(self, rec: RequestRecord) -> None:
        for fn in self._observers:
            try:
                fn(record=rec)
            except Exception:
                log.exception("a request_finished observer failed")

    # -- the HTTP app ------------------------------------------------------------------

    async def endpoint_devices(self) -> dict[str, list[Any]]:
        """Endpoint name → the accelerator readings of its engine, for backends that can
        tell (``devices()``, e.g. ``ascend``); each backend caches its own probe."""
        names: list[str] = []
        calls = []
        for pool in self.pools.values():
            for e in pool.endpoints:
                devices = getattr(e.backend, "devices", None)
                if devices is not None:
                    names.append(e.name)
                    calls.append(asyncio.wait_for(devices(), 5.0))
        if not calls:
            return {}
        results = await asyncio.gather(*calls, return_exceptions=True)
        return {
            name: [msgspec.to_builtins(d) for d in result]
            for name, result in zip(names, results, strict=True)
            if not isinstance(result, BaseException)
        }

    def readiness(self, devices: dict[str, list[Any]] | None = None) -> tuple[bool, dict[str, Any]]:
        models: dict[str, Any] = {}
        now = asyncio.get_running_loop().time() if self.started else 0.0
        ready = self.started and not self.draining
        for name, pool in self.pools.items():
            healthy = sum(1 for e in pool.endpoints if e.healthy)
            ready = ready and healthy > 0
            models[name] = {
                "healthy_endpoints": healthy,
                "queued": getattr(pool.scheduler, "queued", None),
                "endpoints": [
                    {
                        "name": e.name,
                        "kind": e.backend.kind,
                        "version": e.version,
                        "healthy": e.healthy,
                        "detail": e.last_health_detail,
                        "in_flight": e.in_flight,
                        "in_flight_tokens": e.in_flight_tokens,
                        "limit": e.limit or None,
                        "load_weight": round(e.load_weight, 3),
                        "ejected": e.ejected,
                        "ejections": e.ejections,
                        **({"ejected_for_s": round(max(0.0, e.ejected_until - now), 1)} if e.ejected else {}),
                        "draining": e.draining,
                        "completed": e.completed,
                        "errors": e.errors,
                        "load": msgspec.to_builtins(e.load) if e.load is not None else None,
                        **self._launch_view(e),
                        **({"devices": devices[e.name]} if devices and e.name in devices else {}),
                    }
                    for e in pool.endpoints
                ],
            }
        status = "draining" if self.draining else ("ready" if ready else "not_ready")
        return ready, {"status": status, "models": models}

    async def hardware_snapshot(self) -> bytes:
        """The hardware probes' readings as JSON, at most one probe run per
        ``_HARDWARE_TTL_S`` (NVML start-up or ``npu-smi`` per request would be wasteful)."""
        loop = asyncio.get_running_loop()
        cached = self._hardware
        if cached is not None and loop.time() - cached[0] < _HARDWARE_TTL_S:
            return cached[1]
        async with self._hardware_lock:
            cached = self._hardware
            if cached is not None and loop.time() - cached[0] < _HARDWARE_TTL_S:
                return cached[1]
            # Imported here: the probes are plugins of their own; a gateway that never
            # serves this route never loads them.
            from shuniu.hardware.probe import hardware_snapshot_async

            snapshot = await hardware_snapshot_async(plugins=self.plugins)
            body = _encode(snapshot)
            self._hardware = (loop.time(), body)
            self.hardware_readings = snapshot
            return body

    def _serves_metrics(self) -> bool:
        if self.metrics is None:
            return False
        return not any("/metrics" in getattr(h, "paths", ()) for h in self._extra_routes)

    def _launch_view(self, endpoint: EndpointState) -> dict[str, Any]:
        engine = self.engines.get(endpoint.name)
        return {"launch": engine.snapshot()} if engine is not None else {}

    def _make_app(self) -> Litestar:
        gateway = self

        @asgi("/v1/chat/completions", copy_scope=False)
        async def chat_completions(scope: Scope, receive: Receive, send: Send) -> None:
            await gateway.handle("chat", scope, receive, send)

        @asgi("/v1/completions", copy_scope=False)
        async def completions(scope: Scope, receive: Receive, send: Send) -> None:
            await gateway.handle("completions", scope, receive, send)

        @get("/v1/models", sync_to_thread=False)
        def models(request: Request[Any, Any, Any]) -> Response[bytes]:
            data = []
            for name, model in gateway.config.models.items():
                pool = gateway.pools[name]
                for alias in [name, *model.aliases]:
                    data.append(
                        {
                            "id": alias,
                            "object": "model",
                            "created": gateway._created_models,
                            "owned_by": model.owned_by,
                            "root": name,
                            "max_model_len": pool.max_model_len,
                        }
                    )
            return _json_response(request, 200, {"object": "list", "data": data})

        @get("/health", sync_to_thread=False)
        def health(request: Request[Any, Any, Any]) -> Response[bytes]:
            return _json_response(request, 200, {"status": "ok"})

        @get("/ready")
        async def ready(request: Request[Any, Any, Any]) -> Response[bytes]:
            ok, body = gateway.readiness(await gateway.endpoint_devices())
            return _json_response(request, 200 if ok else 503, body)

        @get("/metrics", include_in_schema=False)
        async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
            m = gateway.metrics
            assert m is not None
            if gateway.config.gateway.metrics_hardware:
                await gateway.hardware_snapshot()
            return Response(m.render(), status_code=200, media_type=METRICS_CONTENT_TYPE)

        @get("/admin/hardware")
        async def hardware(request: Request[Any, Any, Any]) -> Response[bytes]:
            if gateway.tenancy.auth:
                try:
                    gateway.tenancy.auth.authenticate(request.scope["headers"])
                except GatewayError as err:
                    return _bytes_response(request, err.status, err.body(), err.headers)
            return _bytes_response(request, 200, await gateway.hardware_snapshot())

        status_body = render_page().encode()

        @get("/", sync_to_thread=False, include_in_schema=False)
        def root(request: Request[Any, Any, Any]) -> Response[bytes]:
            # Relative, so the page is found behind a proxy that serves the gateway under a prefix.
            return Response(b"", status_code=302, media_type="text/plain", headers={"location": "status"})

        @get("/status", sync_to_thread=False, include_in_schema=False)
        def status_page(request: Request[Any, Any, Any]) -> Response[bytes]:
            # The page is a static shell: the data comes from /status.json, with the user's key.
            return Response(status_body, status_code=200, media_type=PAGE_CONTENT_TYPE, headers=PAGE_HEADERS)

        @get("/status.json", include_in_schema=False)
        async def status_data(request: Request[Any, Any, Any]) -> Response[bytes]:
            if gateway.tenancy.auth:
                try:
                    gateway.tenancy.auth.authenticate(request.scope["headers"])
                except GatewayError as err:
                    return _bytes_response(request, err.status, err.body(), err.headers)
            body = _encode(status_json(gateway))
            return _bytes_response(request, 200, body, {"cache-control": "no-store"})

        return Litestar(
            route_handlers=[
                chat_completions,
                completions,
                models,
                health,
                ready,
                hardware,
                root,
                status_page,
                status_data,
                # A server that brings its own /metrics (the simulator's fake vLLM) keeps it.
                *([metrics] if self._serves_metrics() else []),
                *admin_routes(self),
                *self._extra_routes,
            ],
            exception_handlers={HTTPException: _http_exception, Exception: _unexpected},
            on_startup=[self.start],
            on_shutdown=[self.stop],
            openapi_config=None,
            debug=False,
            logging_config=None,
        )


class _Progress:
    """What the pipeline learned about one request, for the observers."""

    __slots__ = (
        "admitted",
        "attempts",
        "cached",
        "completion_tokens",
        "endpoint",
        "error_code",
        "fell_back",
        "finish_reason",
        "first_token",
        "outcome",
        "pool",
        "prompt_tokens",
        "retrying",
        "status",
        "trace",
        "upstream",
    )

    def __init__(self) -> None:
        self.status = 200
        self.outcome: Outcome | None = None
        self.endpoint: str | None = None
        self.error_code: str | None = None
        self.admitted: float | None = None
        self.first_token: float | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached = False
        self.pool: str | None = None
        self.finish_reason: str | None = None
        self.attempts = 0
        """Retries so far (0: the first attempt)."""
        self.retrying = False
        """The current attempt is a retry (counted in the pool's retry budget)."""
        self.fell_back = False
        self.trace: RequestTrace | None = None
        self.upstream: Any = None
        """The upstream span, while the engine call runs (tracing on)."""

    def end_upstream(self) -> None:
        span, self.upstream = self.upstream, None
        if span is not None:
            if self.outcome is Outcome.ERROR and self.trace is not None:
                self.trace.fail(span, self.error_code)
            span.end()

    def fail(self, err: GatewayError) -> None:
        self.status = err.status
        self.outcome = Outcome.ERROR
        self.error_code = err.code


async def _internal_error(send: Send, scope: Scope, exc: Exception) -> None:
    log.error("unexpected error on %s %s", scope.get("method"), scope.get("path"), exc_info=exc)
    err = GatewayError(500, "The gateway hit an internal error.", type="server_error", code="internal_error")
    try:
        await send_error(send, err, new_request_id(scope))
    except Exception:  # the response had already started; the connection will be closed
        pass


def _backend_failure(endpoint: EndpointState, exc: BaseException) -> GatewayError:
    log.error("endpoint %s failed: %s: %s", endpoint.name, type(exc).__name__, exc)
    return upstream_error(f"The engine endpoint {endpoint.name} failed ({type(exc).__name__}).")


def _json_response(request: Request[Any, Any, Any], status: int, payload: Any) -> Response[bytes]:
    return _bytes_response(request, status, _encode(payload))


def _bytes_response(
    request: Request[Any, Any, Any], status: int, body: bytes, headers: dict[str, str] | None = None
) -> Response[bytes]:
    return Response(
        body,
        status_code=status,
        media_type="application/json",
        headers={**(headers or {}), "x-request-id": new_request_id(request.scope)},
    )


def _http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    if isinstance(exc, NotFoundException):
        err = not_found(request.url.path)
    elif isinstance(exc, MethodNotAllowedException):
        err = method_not_allowed(request.method, request.url.path)
    else:
        err = GatewayError(exc.status_code, str(exc.detail), code="http_error")
    return _bytes_response(request, err.status, err.body(), err.headers)


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    log.error("unexpected error on %s %s: %r", request.method, request.url.path, exc, exc_info=exc)
    err = GatewayError(500, "The gateway hit an internal error.", type="server_error", code="internal_error")
    return _bytes_response(request, 500, err.body())


def _traced_auth(trace: RequestTrace, headers: Any, tenancy: Tenancy) -> Principal:
    span = trace.child("shuniu.auth")
    try:
        principal = tenancy.auth.authenticate(headers)
    except GatewayError as err:
        trace.fail(span, err.code)
        raise
    finally:
        span.end()
    span.set_attribute("shuniu.key_id", principal.key_id or "")
    return principal


async def _traced(trace: RequestTrace, name: str, step: Any) -> Any:
    """Await ``step`` inside a child span ``name`` of the request's trace."""
    span = trace.child(name)
    try:
        return await step
    except GatewayError as err:
        trace.fail(span, err.code)
        raise
    finally:
        span.end()


async def _close(gen: Any) -> None:
    """Close an engine stream (cancels the engine's work if it is still running)."""
    try:
        await gen.aclose()
    except Exception:  # a stream that failed may fail again on close; the error is known
        pass


def _first_token_limit(
    res: Resilience, req: InferenceRequest, loop: asyncio.AbstractEventLoop
) -> float | None:
    """Seconds this attempt may take to its first token: the TTFT limit, or what is left
    of the request's total time, whichever is shorter."""
    t = res.timeouts
    limit = t.ttft_s
    if t.total_s is not None:
        left = req.arrival + t.total_s - loop.time()
        limit = left if limit is None else min(limit, left)
    if limit is not None and limit <= 0:
        limit = 0.001
    return limit


def _timeout_error(res: Resilience, req: InferenceRequest, loop: asyncio.AbstractEventLoop) -> GatewayError:
    t = res.timeouts
    if t.total_s is not None and loop.time() >= req.arrival + t.total_s - 0.001:
        return GatewayError(
            504,
            f"The request did not finish within {t.total_s:g} s.",
            type="timeout_error",
            code="request_timeout",
        )
    return GatewayError(
        504,
        f"The engine produced no token within {t.ttft_s:g} s.",
        type="timeout_error",
        code="ttft_timeout",
    )


def _stream_timeout(kind: str, timeouts: Any) -> GatewayError:
    if kind == "idle":
        return GatewayError(
            504,
            f"The engine sent nothing for {timeouts.idle_s:g} s; the stream was ended.",
            type="timeout_error",
            code="idle_timeout",
        )
    return GatewayError(
        504,
        f"The request did not finish within {timeouts.total_s:g} s; the stream was ended.",
        type="timeout_error",
        code="request_timeout",
    )


def _reload_problems(old: Any, new: Any) -> list[Problem]:
    """What a reload cannot apply: listening settings and launched engines."""
    problems = []
    for field in ("host", "port", "server"):
        if getattr(old.gateway, field) != getattr(new.gateway, field):
            problems.append(Problem(f"gateway.{field}", "changes only with a restart"))
    launched_old = {
        (m, i): ep.launch.model_dump_json()
        for m, model in old.models.items()
        for i, ep in enumerate(model.endpoints)
        if ep.launch
    }
    launched_new = {
        (m, i): ep.launch.model_dump_json()
        for m, model in new.models.items()
        for i, ep in enumerate(model.endpoints)
        if ep.launch
    }
    if launched_old != launched_new:
        problems.append(Problem("models", "launched engines (`launch:` entries) change only with a restart"))
    return problems


async def _generation_probe(
    model: str, endpoint: EndpointState, timeout_s: float, loop: asyncio.AbstractEventLoop
) -> tuple[bool, str]:
    """One token from the engine, outside the scheduler (a health check, not traffic). An
    engine that refuses the request (4xx) is alive; only errors, 5xx and timeouts fail it."""
    req = InferenceRequest(
        id=f"health-{endpoint.name}",
        api="completions",
        model=model,
        body={"model": model, "prompt": "ping", "max_tokens": 1},
        prompt="ping",
        prompt_tokens=1,
        max_tokens=1,
        arrival=loop.time(),
    )
    try:
        async with asyncio.timeout(timeout_s):
            await endpoint.backend.complete(req)
    except asyncio.CancelledError:
        raise
    except TimeoutError:
        return False, f"generation probe: no token within {timeout_s:g} s"
    except GatewayError as err:
        if err.status < 500:
            return True, f"generation probe answered {err.status}"
        return False, f"generation probe failed: {err.message}"
    except Exception as exc:
        return False, f"generation probe failed: {type(exc).__name__}"
    return True, "generation probe ok"
