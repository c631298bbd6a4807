"""A fake Kubernetes API server: the parts of it that endpoint discovery reads, built from
the Kubernetes API reference (``discovery.k8s.io/v1`` EndpointSlice, ``core/v1`` Pod, the
list and watch semantics of "API Concepts"). Named as a fake: no API server runs here.

What it serves:

- ``GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=k=v``: an
  ``EndpointSliceList`` whose ``metadata.resourceVersion`` is the store's current version.
- the same with ``watch=1``: newline-delimited watch events (``{"type", "object"}``) of the
  changes after ``resourceVersion`` (every change since the start when it is absent, as a
  list-then-watch client never asks), ``BOOKMARK`` events when asked for with
  ``allowWatchBookmarks``, ended after ``timeoutSeconds``. A ``resourceVersion`` older
  than the compacted history gets what the reference documents for an expired version:
  an ``ERROR`` event whose object is a ``Status`` with code 410 and reason ``Expired``
  (or, with ``expire_as_status``, an HTTP 410 answer).
- ``GET /api/v1/namespaces/{ns}/pods/{name}``: the Pod, or a 404 ``Status``.
- with ``token`` set, a request without ``Authorization: Bearer <token>`` gets a 401
  ``Status``.

The test drives it from its own thread: :meth:`apply_slice`, :meth:`delete_slice`,
:meth:`add_pod`, :meth:`compact` (forget history: older versions expire),
:meth:`bookmark`, :meth:`drop_watches` (close every open watch mid-stream).
"""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.threaded_app import ThreadedApp

__all__ = ["FakeKubeApi", "SliceEndpoint"]

SERVICE_LABEL = "kubernetes.io/service-name"


@dataclass
class SliceEndpoint:
    """One entry of an EndpointSlice's ``endpoints``."""

    pod: str
    address: str
    ready: bool | None = True
    """``None``: the condition left out (the reference: to be read as ready)."""
    zone: str | None = None
    node: str | None = None
    terminating: bool = False

    def to_api(self, namespace: str) -> dict[str, Any]:
        conditions: dict[str, Any] = {"serving": bool(self.ready), "terminating": self.terminating}
        if self.ready is not None:
            conditions["ready"] = self.ready
        out: dict[str, Any] = {
            "addresses": [self.address],
            "conditions": conditions,
            "targetRef": {"kind": "Pod", "namespace": namespace, "name": self.pod, "uid": f"uid-{self.pod}"},
        }
        if self.zone:
            out["zone"] = self.zone
        if self.node:
            out["nodeName"] = self.node
        return out


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class _Event:
    version: int
    type: str
    object: dict[str, Any]


@dataclass
class Requests:
    lists: int = 0
    watches: list[str | None] = field(default_factory=list)
    """The ``resourceVersion`` each watch asked for."""
    pods: list[str] = field(default_factory=list)
    unauthorized: int = 0


class FakeKubeApi(ThreadedApp):
    def __init__(
        self, *, namespace: str = "llm", token: str | None = None, expire_as_status: bool = False
    ) -> None:
        super().__init__()
        self.namespace = namespace
        self.token = token
        self.expire_as_status = expire_as_status
        self.version = 1000
        self.slices: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.history: list[_Event] = []
        self.compacted = 0
        """Versions at or below this are forgotten: a watch from one of them expires."""
        self.requests = Requests()
        self._changed: asyncio.Condition | None = None
        self._watches: set[web.StreamResponse] = set()
        self._bookmarks = 0
        self._released: asyncio.Event | None = None
        self._closing = False

    # -- driven from the test's thread ----------------------------------------------------

    def _call(self, fn: Any, *args: Any) -> Any:
        async def run() -> Any:
            result = fn(*args)
            assert self._changed is not None
            async with self._changed:
                self._changed.notify_all()
            return result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def apply_slice(self, name: str, service: str, port: int, endpoints: list[SliceEndpoint]) -> int:
        """Create or replace EndpointSlice ``name`` of ``service``; returns its version."""
        return int(self._call(self._apply, name, service, port, endpoints))

    def delete_slice(self, name: str) -> None:
        self._call(self._delete, name)

    def add_pod(self, name: str, labels: dict[str, str]) -> None:
        self._call(self._add_pod, name, labels)

    def compact(self) -> None:
        """Forget the history so far (etcd compaction): watches from older versions expire."""
        self._call(self._compact)

    def bookmark(self) -> None:
        """Send a BOOKMARK event on every open watch that asked for bookmarks."""
        self._call(self._bookmark)

    def drop_watches(self) -> None:
        """Close every open watch connection mid-stream (the client must resume)."""
        self._call(self._drop)

    def stop(self) -> None:
        """End open watches first (a handler waiting for changes would hold up the
        server's cleanup), then stop."""

        def close() -> None:
            self._closing = True
            assert self._released is not None
            self._released.set()

        self._call(close)
        super().stop()

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    def hold(self) -> None:
        """Deliver nothing on open watches and keep new ones waiting, until :meth:`release`
        (so a test can change the store while the client is away)."""
        self._call(lambda: self._released.clear())  # type: ignore[union-attr]

    def release(self) -> None:
        self._call(lambda: self._released.set())  # type: ignore[union-attr]

    # -- the store (on the server's loop) -----------------------------------------------

    def _apply(self, name: str, service: str, port: int, endpoints: list[SliceEndpoint]) -> int:
        self.version += 1
        kind = "MODIFIED" if name in self.slices else "ADDED"
        obj = {
            "kind": "EndpointSlice",
            "apiVersion": "discovery.k8s.io/v1",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {SERVICE_LABEL: service, "endpointslice.kubernetes.io/managed-by": "fake"},
                "resourceVersion": str(self.version),
                "generation": 1,
            },
            "addressType": "IPv4",
            "endpoints": [e.to_api(self.namespace) for e in endpoints],
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        }
        self.slices[name] = obj
        self.history.append(_Event(self.version, kind, copy.deepcopy(obj)))
        return self.version

    def _delete(self, name: str) -> None:
        obj = self.slices.pop(name)
        self.version += 1
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = str(self.version)
        self.history.append(_Event(self.version, "DELETED", gone))

    def _add_pod(self, name: str, labels: dict[str, str]) -> None:
        self.version += 1
        self.pods[name] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "resourceVersion": str(self.version),
            },
            "spec": {},
            "status": {"phase": "Running"},
        }

    def _compact(self) -> None:
        self.compacted = self.version
        self.history = []

    def _bookmark(self) -> None:
        self._bookmarks += 1

    def _drop(self) -> None:
        for resp in list(self._watches):
            transport = resp._req.transport if resp._req is not None else None  # type: ignore[attr-defined]
            if transport is not None:
                transport.close()
        self._watches.clear()

    # -- HTTP ---------------------------------------------------------------------------

    def routes(self, app: web.Application) -> None:
        self._changed = asyncio.Condition()
        self._released = asyncio.Event()
        self._released.set()
        app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self._slices)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._pod)

    def _authorized(self, request: web.Request) -> web.Response | None:
        if self.token is None or request.headers.get("Authorization") == f"Bearer {self.token}":
            return None
        self.requests.unauthorized += 1
        return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)

    async def _pod(self, request: web.Request) -> web.Response:
        if (refused := self._authorized(request)) is not None:
            return refused
        name = request.match_info["name"]
        self.requests.pods.append(name)
        pod = self.pods.get(name) if request.match_info["ns"] == self.namespace else None
        if pod is None:
            return web.json_response(_status(404, "NotFound", f'pods "{name}" not found'), status=404)
        return web.json_response(pod)

    def _selected(self, obj: dict[str, Any], selector: str | None) -> bool:
        if not selector:
            return True
        key, _, value = selector.partition("=")
        return bool(obj["metadata"]["labels"].get(key) == value)

    async def _slices(self, request: web.Request) -> web.StreamResponse:
        if (refused := self._authorized(request)) is not None:
            return refused
        q = request.query
        selector = q.get("labelSelector")
        ns_ok = request.match_info["ns"] == self.namespace
        if q.get("watch") not in ("1", "true"):
            self.requests.lists += 1
            items = [o for o in self.slices.values() if ns_ok and self._selected(o, selector)]
            return web.json_response(
                {
                    "kind": "EndpointSliceList",
                    "apiVersion": "discovery.k8s.io/v1",
                    "metadata": {"resourceVersion": str(self.version)},
                    "items": items,
                }
            )
        since_text = q.get("resourceVersion")
        self.requests.watches.append(since_text)
        assert self._released is not None
        await self._released.wait()
        since = int(since_text) if since_text else 0
        expired = since_text is not None and since < self.compacted
        if expired and self.expire_as_status:
            return web.json_response(
                _status(410, "Expired", f"too old resource version: {since} ({self.compacted})"), status=410
            )
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        self._watches.add(resp)

        async def send(event: dict[str, Any]) -> None:
            await resp.write(json.dumps(event).encode() + b"\n")

        try:
            if expired:
                await send(
                    {
                        "type": "ERROR",
                        "object": _status(
                            410, "Expired", f"too old resource version: {since} ({self.compacted})"
                        ),
                    }
                )
                return resp
            bookmarks = q.get("allowWatchBookmarks") == "true"
            timeout = float(q.get("timeoutSeconds") or 1800)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            sent_bookmarks = self._bookmarks
            assert self._changed is not None
            while loop.time() < deadline and not self._closing:
                await self._released.wait()
                for event in [e for e in self.history if e.version > since]:
                    since = event.version
                    if ns_ok and self._selected(event.object, selector):
                        await send({"type": event.type, "object": event.object})
                if bookmarks and self._bookmarks != sent_bookmarks:
                    sent_bookmarks = self._bookmarks
                    since = self.version
                    await send(
                        {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": "EndpointSlice",
                                "apiVersion": "discovery.k8s.io/v1",
                                "metadata": {"resourceVersion": str(self.version)},
                            },
                        }
                    )
                async with self._changed:
                    try:
                        async with asyncio.timeout(max(0.0, deadline - loop.time())):
                            await self._changed.wait()
                    except TimeoutError:
                        break
        except (ConnectionResetError, RuntimeError):
            pass  # dropped by drop_watches() or by the client
        finally:
            self._watches.discard(resp)
        return resp
