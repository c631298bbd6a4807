"""The background loops that keep each endpoint's view current: a health loop (is the
engine answering? takes it out of balancing and back) and a load loop (the engine's own
load, aged when polls fail, and the adaptive concurrency limit).

Two tasks per endpoint, started when the gateway starts (or the endpoint joins) and
cancelled when it leaves. Nothing here runs on the request path.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from shuniu.core.config import HealthConfig, LoadConfig
from shuniu.core.errors import GatewayError
from shuniu.core.pools.load import adapt_limit, freshness
from shuniu.core.pools.pool import EndpointState, Pool
from shuniu.core.state import GatewayState
from shuniu.core.types import InferenceRequest

__all__ = ["Watchers", "generation_probe", "refresh_max_model_len"]

log = logging.getLogger("shuniu.gateway")


class Watchers:
    """The health and load loops of every endpoint of one gateway."""

    def __init__(self, state: GatewayState) -> None:
        self._state = state
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}
        self.fleet: Any = None
        """The gateway's :class:`~shuniu.core.fleet.FleetSync` (``fleet:``): one gateway of
        the fleet polls each engine and the others take its snapshots."""

    def watch(self, pool: Pool, endpoint: EndpointState) -> None:
        """Start (or restart, in its current pool) the endpoint's health and load loops."""
        for task in self._tasks.pop(endpoint.name, []):
            task.cancel()
        model = self._state.config.models[pool.name]
        self._tasks[endpoint.name] = [
            asyncio.create_task(
                self._health_loop(pool, endpoint, model.health), name=f"health:{endpoint.name}"
            ),
            asyncio.create_task(self._load_loop(pool, endpoint, model.load), name=f"load:{endpoint.name}"),
        ]

    async def unwatch(self, name: str) -> None:
        """Stop the loops of endpoint ``name`` (it is leaving)."""
        tasks = self._tasks.pop(name, [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Stop every loop (shutdown)."""
        tasks = [t for ts in self._tasks.values() for t in ts]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _health_loop(self, pool: Pool, endpoint: EndpointState, cfg: HealthConfig) -> None:
        loop = asyncio.get_running_loop()
        fails = passes = probes = 0
        engine = self._state.engines.get(endpoint.name)
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
                ok, detail = await generation_probe(pool.name, endpoint, cfg.generation_timeout_s, loop)
            endpoint.last_health_detail = detail
            if ok:
                res = self._state.resilience.get(pool.name)
                if endpoint.ejected and res is not None and res.maybe_return(endpoint, loop.time()):
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
                        refresh_max_model_len(pool, self._state.config.models[pool.name].max_model_len)
                    pool.set_healthy(endpoint, True)
            else:
                fails, passes = fails + 1, 0
                if endpoint.healthy and fails >= cfg.unhealthy_after:
                    log.warning("endpoint %s is unhealthy: %s", endpoint.name, detail)
                    pool.set_healthy(endpoint, False)
            await asyncio.sleep(cfg.interval_s)

    async def _load_loop(self, pool: Pool, endpoint: EndpointState, cfg: LoadConfig) -> None:
        """Poll the engine's own load; age the last snapshot when polls fail; adapt the
        endpoint's concurrency limit to the engine's backlog."""
        loop = asyncio.get_running_loop()
        timeout = cfg.timeout_s if cfg.timeout_s is not None else max(cfg.interval_s, 1.0)
        shared_s = 3 * cfg.interval_s
        adapted = 0.0
        while True:
            fleet = self.fleet
            if fleet is not None and not fleet.polls(pool.name, endpoint.name, loop.time(), shared_s):
                # Another gateway polls this engine for the fleet; the sync puts its snapshots
                # in place as they arrive. Here: adapt the limit to each new one, and age.
                got = fleet.shared_load(pool.name, endpoint.name)
                now = loop.time()
                if got is not None and got[1] > adapted:
                    adapted = got[1]
                    if adapt_limit(endpoint, got[0], cfg):
                        pool.scheduler.wake(pool)
                if endpoint.load is not None:
                    endpoint.load_weight = freshness(now - endpoint.load_at, cfg.stale_after_s)
                    if endpoint.load_weight == 0.0:
                        endpoint.load = None
                await asyncio.sleep(cfg.interval_s)
                continue
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
                if snap is not None and fleet is not None:
                    fleet.offer(pool.name, endpoint.name, snap)
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


def refresh_max_model_len(pool: Pool, configured: int | None) -> None:
    """The pool's context window from its backends, unless the deployment sets one: a
    launched engine that joined may now know it, which was unknown when the gateway started."""
    if configured is not None:
        return
    lens = [e.backend.max_model_len for e in pool.endpoints if e.backend.max_model_len]
    if lens:
        pool.max_model_len = min(lens)


async def generation_probe(
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
