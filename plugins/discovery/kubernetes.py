"""``kubernetes``: engines found in a Service's EndpointSlices, watched through the
Kubernetes API.

Lists the slices of the Service (``discovery.k8s.io/v1``, label
``kubernetes.io/service-name``), then watches them from the list's ``resourceVersion``
with bookmarks, as a client-go informer does: ``ADDED``/``MODIFIED``/``DELETED`` events
update the set, ``BOOKMARK`` events move the resume point, a watch the server ends is
resumed from the last version seen, and an expired version (HTTP 410 or an ``ERROR``
event with code 410) starts over with a fresh list. Every endpoint address of every slice
is one target: ready unless ``conditions.ready`` is false (the API says a missing value
means ready), keyed by its pod's name, labelled with its ``zone`` and ``node`` and, when
``pod_labels`` asks for them, with labels read off its Pod (once per pod).

In a pod the API address, the service-account token (read again on every request:
projected tokens rotate) and the cluster's CA come from the standard places; RBAC needs
``list`` and ``watch`` on ``endpointslices`` (and ``get`` on ``pods`` for
``pod_labels``) in the namespace. ``examples/kubernetes/`` has the Role.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Discovery, RegisterDiscovery, Target

__all__ = ["KubeApiError", "KubernetesDiscovery", "KubernetesOptions", "slice_targets"]

log = logging.getLogger("shuniu.discovery")

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubernetesOptions(Options):
    """Which Service's engines, and how to reach the API server."""

    service: str = Field(min_length=1)
    """The Service whose EndpointSlices list the engines (a headless one is typical)."""
    namespace: str | None = None
    """Its namespace; default: the gateway pod's own (from the service account), else
    ``default``."""
    port: str | int | None = None
    """The slice port to use, by name (``http``) or number; default: the slice's first."""
    api_url: str | None = None
    """The API server; default: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``
    (in a pod)."""
    token_file: str | None = f"{SERVICE_ACCOUNT}/token"
    """A bearer token, read before every request (projected tokens rotate); ``null`` or a
    missing file: no token."""
    ca_file: str | None = f"{SERVICE_ACCOUNT}/ca.crt"
    """The CA that signed the API server's certificate; a missing file: the system's CAs."""
    pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"version": "app.kubernetes.io/version", "hardware": "shuniu.io/hardware"}
    )
    """Endpoint label → the Pod label it is read from (``version`` sets the endpoint's
    version, for canary splits). Each Pod is read once; ``{}``: never read Pods."""
    watch_timeout_s: int = Field(290, ge=1)
    """How long one watch request lasts on the server (``timeoutSeconds``) before it is
    resumed; a quiet connection is treated as lost after this plus a minute."""
    timeout_s: float = Field(10.0, gt=0)
    """Connect and list timeout."""


class KubeApiError(Exception):
    """The API server refused or failed a request (status and message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def _slice_port(obj: dict[str, Any], wanted: str | int | None) -> int | None:
    for p in obj.get("ports") or []:
        if wanted is None or p.get("name") == wanted or p.get("port") == wanted:
            port = p.get("port")
            return int(port) if isinstance(port, int) else None
    return None


def slice_targets(
    obj: dict[str, Any], wanted_port: str | int | None, pod_labels: dict[str, dict[str, str]]
) -> list[Target]:
    """The targets of one EndpointSlice object (``pod_labels``: labels known per pod name)."""
    port = _slice_port(obj, wanted_port)
    if port is None:
        return []
    out = []
    for ep in obj.get("endpoints") or []:
        addresses = ep.get("addresses") or []
        if not addresses:
            continue
        conditions = ep.get("conditions") or {}
        ready = conditions.get("ready") is not False  # nil means ready (API reference)
        ref = ep.get("targetRef") or {}
        pod = ref.get("name") if ref.get("kind", "Pod") == "Pod" else None
        labels: dict[str, str] = {}
        if ep.get("zone"):
            labels["zone"] = str(ep["zone"])
        if ep.get("nodeName"):
            labels["node"] = str(ep["nodeName"])
        if pod is not None:
            labels.update(pod_labels.get(pod, {}))
        host = str(addresses[0])
        key = pod or ep.get("hostname") or f"{host}-{port}"
        out.append(Target(str(key), host, port, ready=ready, labels=labels))
    return out


class KubernetesDiscovery:
    """List, then watch, a Service's EndpointSlices."""

    def __init__(self, options: KubernetesOptions) -> None:
        self.options = options
        ns = options.namespace
        if ns is None:
            try:
                ns = Path(SERVICE_ACCOUNT, "namespace").read_text().strip() or "default"
            except OSError:
                ns = "default"
        self.namespace = ns
        self.base = options.api_url or _in_cluster_url()
        self.slices: dict[str, dict[str, Any]] = {}
        self.resource_version: str | None = None
        self.pod_labels: dict[str, dict[str, str]] = {}
        self.lists = 0
        """Full lists made (1 at start, one more per expiry or failure): for tests."""
        self._session: aiohttp.ClientSession | None = None

    # -- HTTP -------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        path = self.options.token_file
        if path:
            try:
                token = Path(path).read_text().strip()
            except OSError:
                token = ""
            if token:
                headers["Authorization"] = f"Bearer {token}"
        return headers

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            ssl_ctx: ssl.SSLContext | bool = True
            ca = self.options.ca_file
            if self.base.startswith("https") and ca and os.path.exists(ca):
                ssl_ctx = ssl.create_default_context(cafile=ca)
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_ctx))
        return self._session

    def _slices_path(self) -> str:
        selector = quote(f"kubernetes.io/service-name={self.options.service}", safe="")
        ns = quote(self.namespace, safe="")
        return f"{self.base}/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector={selector}"

    async def _get_json(self, url: str) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=self.options.timeout_s)
        async with self._client().get(url, headers=self._headers(), timeout=timeout) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise KubeApiError(resp.status, _message(body))
            data = json.loads(body)
            if not isinstance(data, dict):
                raise KubeApiError(resp.status, "the answer is not a JSON object")
            return data

    # -- list and watch ---------------------------------------------------------------------

    async def _list(self) -> None:
        data = await self._get_json(self._slices_path())
        self.lists += 1
        self.slices = {}
        for item in data.get("items") or []:
            name = (item.get("metadata") or {}).get("name")
            if name:
                self.slices[name] = item
        self.resource_version = (data.get("metadata") or {}).get("resourceVersion")
        await self._learn_pods()

    async def _learn_pods(self) -> None:
        if not self.options.pod_labels:
            return
        wanted = {
            ref["name"]
            for obj in self.slices.values()
            for ep in obj.get("endpoints") or []
            if (ref := ep.get("targetRef") or {}).get("kind", "Pod") == "Pod" and ref.get("name")
        }
        for pod in wanted - set(self.pod_labels):
            ns = quote(self.namespace, safe="")
            try:
                data = await self._get_json(f"{self.base}/api/v1/namespaces/{ns}/pods/{quote(pod, safe='')}")
            except (KubeApiError, aiohttp.ClientError, TimeoutError) as exc:
                log.warning(
                    "discovery: pod %s/%s unreadable (%s); its labels are not used", self.namespace, pod, exc
                )
                self.pod_labels[pod] = {}
                continue
            labels = (data.get("metadata") or {}).get("labels") or {}
            self.pod_labels[pod] = {
                mine: str(labels[theirs])
                for mine, theirs in self.options.pod_labels.items()
                if theirs in labels
            }
        for pod in set(self.pod_labels) - wanted:
            del self.pod_labels[pod]  # gone: a pod of the same name later is another pod

    def targets(self) -> list[Target]:
        out: dict[str, Target] = {}
        for name in sorted(self.slices):
            for t in slice_targets(self.slices[name], self.options.port, self.pod_labels):
                # A pod in two slices (during a slice split): ready wins.
                if t.key not in out or (t.ready and not out[t.key].ready):
                    out[t.key] = t
        return sorted(out.values(), key=lambda t: t.key)

    async def _watch_once(self) -> AsyncIterator[None]:
        """One watch request: yields after every change applied; returns when the server
        ends it; raises :class:`_Expired` on 410."""
        o = self.options
        url = f"{self._slices_path()}&watch=1&allowWatchBookmarks=true&timeoutSeconds={o.watch_timeout_s}" + (
            f"&resourceVersion={quote(self.resource_version, safe='')}" if self.resource_version else ""
        )
        timeout = aiohttp.ClientTimeout(total=None, connect=o.timeout_s, sock_read=o.watch_timeout_s + 60)
        async with self._client().get(url, headers=self._headers(), timeout=timeout) as resp:
            if resp.status == 410:
                raise _Expired
            if resp.status != 200:
                raise KubeApiError(resp.status, _message(await resp.read()))
            async for raw in resp.content:
                line = raw.strip()
                if not line:
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired
                    raise KubeApiError(int(obj.get("code") or 500), str(obj.get("message") or obj))
                meta = obj.get("metadata") or {}
                version = meta.get("resourceVersion")
                if version:
                    self.resource_version = version
                if kind == "BOOKMARK":
                    continue
                name = meta.get("name")
                if not name:
                    continue
                if kind == "DELETED":
                    self.slices.pop(name, None)
                elif kind in ("ADDED", "MODIFIED"):
                    self.slices[name] = obj
                else:
                    continue
                await self._learn_pods()
                yield None

    async def watch(self) -> AsyncIterator[Sequence[Target]]:
        try:
            await self._list()
            last = self.targets()
            yield last
            loop = asyncio.get_running_loop()
            while True:
                started, events = loop.time(), 0
                try:
                    async for _ in self._watch_once():
                        events += 1
                        now = self.targets()
                        if now != last:
                            yield now
                            last = now
                except _Expired:
                    log.info("discovery: watch of %s expired; listing again", self.options.service)
                    await self._list()
                    now = self.targets()
                    if now != last:
                        yield now
                        last = now
                except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
                    pass  # the connection dropped mid-watch: resume from the last version
                if not events and loop.time() - started < 1.0:
                    await asyncio.sleep(1.0)  # a server that ends every watch at once
        finally:
            if self._session is not None:
                await self._session.close()
                self._session = None


def _in_cluster_url() -> str:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return "https://kubernetes.default.svc"
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _message(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace")
    if isinstance(data, dict) and data.get("message"):
        return str(data["message"])
    return body[:200].decode("utf-8", "replace")


def _kubernetes(options: KubernetesOptions) -> Discovery:
    return KubernetesDiscovery(options)


@hookimpl
def register_discovery(register: RegisterDiscovery) -> None:
    register(
        "kubernetes",
        _kubernetes,
        options=KubernetesOptions,
        description="engines from a Service's EndpointSlices (list + watch, ready pods only)",
    )
