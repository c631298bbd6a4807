"""Endpoints found at run time: one task per ``discovery:`` entry keeps its pool's
endpoints matching the targets the source reports.

A source (:class:`~shuniu.core.contracts.Discovery`) yields the whole current set of
targets each time it may have changed; :meth:`EntryDiscovery.reconcile` compares it with
the endpoints this entry owns:

- a ready target with no endpoint becomes one, built from the entry (its backend's
  ``base_url`` pointed at the target, the target's labels added, ``version`` from its
  ``version`` label) and out of balancing until its first passing health probe;
- an endpoint whose target went away or is not ready drains (no new requests) and is
  removed once nothing runs on it, or after ``drain_timeout_s``; a target that comes
  back while its endpoint drains is taken back into balancing.

A source that fails (an API server or DNS server unreachable) changes nothing: the
endpoints found so far keep serving, and the source is watched again after a backoff.
Nothing here runs on the request path.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from shuniu.core.config import DiscoveryConfig, EndpointConfig
from shuniu.core.contracts import GENERATION, Discovery, Target
from shuniu.core.pools.build import PoolBuilder
from shuniu.core.pools.launcher import base_url_template, connect_host, engine_url, with_base_url
from shuniu.core.pools.pool import EndpointState
from shuniu.core.state import GatewayState

if TYPE_CHECKING:
    from shuniu.core.operations import Operations

__all__ = ["Discoveries", "EntryDiscovery", "endpoint_name", "target_url"]

log = logging.getLogger("shuniu.discovery")

_MAX_BACKOFF_S = 30.0
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def endpoint_name(prefix: str, target: Target) -> str:
    """``<prefix>-<key>``, with what a URL path or a metric label would trip on replaced
    (an IPv6 address's colons become dashes)."""
    return f"{prefix}-{_UNSAFE.sub('-', target.key).strip('-')}"


def target_url(options: Any, given: str | None, target: Target) -> Any:
    """The entry's backend options with ``base_url`` aimed at ``target``: the scheme and
    path of the entry's own ``base_url`` when it has one (``https://x/v1``), the backend's
    launch template otherwise. Options without a ``base_url`` field are returned as they
    are (such a backend cannot be discovered; the runner says so)."""
    template = base_url_template(type(options)) if options is not None else None
    if template is None:
        return options
    if given:
        parts = urlsplit(given)
        netloc = f"{connect_host(target.host)}:{target.port}"
        return with_base_url(options, urlunsplit((parts.scheme, netloc, parts.path, parts.query, "")))
    return with_base_url(options, engine_url(template, target.host, target.port))


class EntryDiscovery:
    """The endpoints of one ``discovery:`` entry of one model."""

    def __init__(
        self,
        state: GatewayState,
        ops: Operations,
        model: str,
        entry: EndpointConfig,
        options: Any,
        source: Discovery,
    ) -> None:
        assert entry.discovery is not None
        self._state = state
        self._ops = ops
        self.model = model
        self.entry = entry
        self.cfg: DiscoveryConfig = entry.discovery
        self.options = options
        self.source = source
        self.prefix = entry.name or model
        self.owned: dict[str, EndpointState] = {}
        """Endpoints this entry added and has not removed yet, by name."""
        self.targets: dict[str, Target] = {}
        """The last set the source reported, by endpoint name."""
        self.failures = 0
        """Times the source failed (for metrics)."""
        self.error: str | None = None
        """The last failure, until the source works again."""
        self._retiring: dict[str, asyncio.Task[None]] = {}
        self._warned: set[str] = set()

    # -- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Watch the source for as long as the gateway runs."""
        backoff = self.cfg.backoff_s
        while True:
            watch = self.source.watch()
            try:
                async for targets in watch:
                    await self.reconcile(targets)
                    if self.error is not None:
                        log.warning("discovery of %s/%s works again", self.model, self.prefix)
                        self.error = None
                    backoff = self.cfg.backoff_s
            except Exception as exc:  # (a cancellation is not one: it ends the loop)
                self.failures += 1
                detail = f"{type(exc).__name__}: {exc}"
                if detail != self.error:
                    log.warning(
                        "discovery of %s/%s failed (%s); keeping its %d endpoints, trying again",
                        self.model,
                        self.prefix,
                        detail,
                        len(self.owned),
                    )
                self.error = detail
            finally:
                aclose = getattr(watch, "aclose", None)
                if aclose is not None:
                    try:
                        await aclose()
                    except Exception:  # a failed source may fail again on close
                        pass
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def stop(self) -> None:
        tasks = list(self._retiring.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- one report -------------------------------------------------------------------------

    async def reconcile(self, targets: Sequence[Target]) -> None:
        """Make the entry's endpoints match ``targets`` (the whole current set)."""
        reported = {endpoint_name(self.prefix, t): t for t in targets}
        self.targets = reported
        ready = {name: t for name, t in reported.items() if t.ready}
        for name, target in ready.items():
            endpoint = self.owned.get(name)
            if endpoint is None:
                await self._add(name, target)
                continue
            labels = self._labels(target)
            if labels != endpoint.labels:
                endpoint.labels = labels
            retiring = self._retiring.pop(name, None)
            if retiring is not None:
                retiring.cancel()
                self._ops.set_draining(endpoint, False)
        for name, endpoint in list(self.owned.items()):
            if name not in ready and name not in self._retiring:
                self._ops.set_draining(endpoint, True)
                self._retiring[name] = asyncio.create_task(
                    self._retire(name, endpoint), name=f"retire:{name}"
                )

    def _labels(self, target: Target) -> dict[str, str]:
        labels = {**self.entry.labels, **target.labels}
        labels.pop("version", None)
        return labels

    async def _add(self, name: str, target: Target) -> None:
        if self._state.find_endpoint(name) is not None:
            self._warn(name, f"discovery of {self.model}: endpoint {name} exists already; target skipped")
            return
        options = target_url(self.options, self.entry.options.get("base_url"), target)
        cfg = self.entry.model_copy(
            update={
                "name": name,
                "discovery": None,
                "labels": self._labels(target),
                "version": target.labels.get("version", self.entry.version),
            }
        )
        try:
            endpoint = await self._ops.add_endpoint(self.model, cfg, options)
        except Exception as exc:  # the backend could not start: try again on the next report
            self._warn(name, f"discovered endpoint {name} could not start: {type(exc).__name__}: {exc}")
            return
        unserved = set(self._state.config.models[self.model].serves) - getattr(
            endpoint.backend, "serves", GENERATION
        )
        if unserved:
            self._warn(
                name,
                f"discovered endpoint {name}: backend {self.entry.kind!r} does not serve "
                f"{' or '.join(sorted(unserved))}, which model {self.model} serves; removed",
            )
            await self._remove(name, endpoint)
            return
        self._warned.discard(name)
        self.owned[name] = endpoint

    async def _retire(self, name: str, endpoint: EndpointState) -> None:
        await self._ops.wait_idle([endpoint], self.cfg.drain_timeout_s)
        self._retiring.pop(name, None)
        self.owned.pop(name, None)
        await self._remove(name, endpoint)

    async def _remove(self, name: str, endpoint: EndpointState) -> None:
        # From the pool it is in now (a reload may have moved it to a new one).
        found = self._state.find_endpoint(name)
        if found is not None:
            await self._ops.remove_endpoint(found[0], endpoint)

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)

    def counts(self) -> Mapping[str, int]:
        """Endpoints by state: ``serving``, ``starting`` (waiting for a health probe),
        ``draining``, and targets ``not_ready``."""
        out = {"serving": 0, "starting": 0, "draining": 0, "not_ready": 0}
        for e in self.owned.values():
            key = "draining" if e.draining else "serving" if e.healthy else "starting"
            out[key] += 1
        out["not_ready"] = sum(1 for t in self.targets.values() if not t.ready)
        return out


class Discoveries:
    """Every ``discovery:`` entry of one gateway, and their tasks."""

    def __init__(self, state: GatewayState, ops: Operations, builder: PoolBuilder) -> None:
        self._state = state
        self._ops = ops
        self._builder = builder
        self.entries: list[EntryDiscovery] = []
        self._tasks: list[asyncio.Task[None]] = []

    def build(self) -> None:
        """One :class:`EntryDiscovery` per ``discovery:`` entry of the deployment, its source
        built by the registered factory (start-up; the entries change only with a restart)."""
        resolved = self._state.resolved
        for model_name, model in resolved.deployment.models.items():
            for i, entry in enumerate(model.endpoints):
                if entry.discovery is None:
                    continue
                source = self._builder.discovery(
                    entry.discovery.kind, resolved.discovery_options.get((model_name, i))
                )
                options = resolved.endpoint_options.get((model_name, i))
                if base_url_template(type(options)) is None:
                    log.warning(
                        "models.%s.endpoints[%d]: backend %r has no base_url, so every target "
                        "found is the same engine",
                        model_name,
                        i,
                        entry.kind,
                    )
                self.entries.append(
                    EntryDiscovery(self._state, self._ops, model_name, entry, options, source)
                )

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(e.run(), name=f"discovery:{e.model}/{e.prefix}") for e in self.entries
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await asyncio.gather(*(e.stop() for e in self.entries), return_exceptions=True)

    def owned(self) -> dict[str, list[EndpointState]]:
        """The endpoints found so far, by model (a reload carries them into the new pools)."""
        out: dict[str, list[EndpointState]] = {}
        for e in self.entries:
            out.setdefault(e.model, []).extend(e.owned.values())
        return out
