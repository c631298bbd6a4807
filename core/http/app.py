"""The gateway's HTTP application.

The two inference routes are raw ASGI handlers that :class:`Dispatch` calls directly,
which saves Litestar's routing and per-message send wrappers on every request and every
streamed chunk. Everything else (models, health, readiness, metrics, the status page, the
admin API, errors for unknown routes, the lifespan) is ordinary Litestar; Litestar mounts
the inference handlers too, so both paths behave alike.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, asgi, get
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException

from shuniu.core.api.openapi import openapi_document
from shuniu.core.api.wire import (
    ANTHROPIC,
    ANTHROPIC_COUNT,
    EMBEDDINGS,
    OPENAI,
    RERANK,
    RESPONSES,
    SCORE,
    Wire,
)
from shuniu.core.batch import BatchQueue
from shuniu.core.errors import GatewayError, method_not_allowed, not_found
from shuniu.core.fleet import FleetSync
from shuniu.core.http.asgi import Receive, Scope, Send, new_request_id, send_error
from shuniu.core.http.fleet import LOCAL, Peers, decode_status, merge_metrics, merge_status
from shuniu.core.observability.hardware import HardwareReadings
from shuniu.core.observability.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from shuniu.core.observability.metrics import GatewayMetrics
from shuniu.core.operations import Operations
from shuniu.core.pipeline.path import RequestPath
from shuniu.core.state import GatewayState, shared_stores
from shuniu.core.types import Api
from shuniu.core.views.access import admin_refusal, is_admin, metrics_refusal
from shuniu.core.views.admin import admin_routes
from shuniu.core.views.batches import batches_routes
from shuniu.core.views.files import files_routes
from shuniu.core.views.keys import key_routes
from shuniu.core.views.readiness import endpoint_devices, model_list, readiness, readiness_summary
from shuniu.core.views.status import StatusWindow, status_json
from shuniu.core.views.status_page import PAGE_CONTENT_TYPE, PAGE_HEADERS, render_page
from shuniu.core.views.usage import UsageSummary, usage_routes

__all__ = ["Dispatch", "build_app"]

log = logging.getLogger("shuniu.gateway")
_encode = msgspec.json.Encoder().encode


_CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})

POOLING_ROUTES: dict[str, tuple[Api, Wire]] = {
    "/v1/embeddings": ("embeddings", EMBEDDINGS),
    "/v1/rerank": ("rerank", RERANK),
    "/v2/rerank": ("rerank", RERANK),
    "/v1/score": ("score", SCORE),
}
"""The pooling APIs' routes (``/v2/rerank`` is Cohere's path for the same request)."""


class Dispatch:
    """The ASGI entry point: the inference routes go straight to the request path;
    everything else (and the lifespan) is the Litestar app. With ``peers`` (one worker of
    several), an admin change is applied by every worker before it is answered."""

    __slots__ = ("hot", "litestar", "path", "peers")

    def __init__(self, path: RequestPath, litestar: Litestar, peers: Peers | None = None) -> None:
        self.path = path
        self.litestar = litestar
        self.peers = peers
        self.hot: dict[str, tuple[Api, Wire]] = {
            "/v1/chat/completions": ("chat", OPENAI),
            "/v1/completions": ("completions", OPENAI),
            "/v1/messages": ("chat", ANTHROPIC),
            "/v1/responses": ("chat", RESPONSES),
            **{route: (api, wire) for route, (api, wire) in POOLING_ROUTES.items()},
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            route = self.hot.get(scope["path"])
            if route is not None:
                try:
                    await self.path.handle(route[0], route[1], scope, receive, send)
                except Exception as exc:  # a bug, not a client error: still no traceback out
                    await internal_error(send, scope, exc)
                return
            if (
                self.peers is not None
                and scope["method"] in _CHANGES
                and scope["path"].startswith("/admin/")
                # Keys live in the database: the others read the change from there.
                and not scope["path"].startswith("/admin/keys")
                and not any(k == LOCAL for k, _ in scope["headers"])
            ):
                await self._everywhere(self.peers, scope, receive, send)
                return
        await self.litestar(scope, receive, send)

    async def _everywhere(self, peers: Peers, scope: Scope, receive: Receive, send: Send) -> None:
        """An admin change: applied here, then (when it succeeded) by every other worker,
        then answered with this worker's answer."""
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return {"type": "http.disconnect"}
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        held: list[dict[str, Any]] = []

        async def hold(message: dict[str, Any]) -> None:
            held.append(message)

        await self.litestar(scope, replay, hold)
        status = next((m["status"] for m in held if m["type"] == "http.response.start"), 500)
        if status < 400:
            query = scope.get("query_string", b"")
            target = scope["path"] + ("?" + query.decode("latin-1") if query else "")
            await peers.ask_all(scope["method"], target, scope["headers"], body)
        for message in held:
            await send(message)


def build_app(
    *,
    path: RequestPath,
    state: GatewayState,
    ops: Operations,
    metrics: GatewayMetrics | None,
    hardware: HardwareReadings,
    status: StatusWindow,
    created: int,
    extra_routes: Sequence[Any],
    on_startup: Callable[[], Awaitable[None]],
    on_shutdown: Callable[[], Awaitable[None]],
    peers: Peers | None = None,
    fleet: FleetSync | None = None,
    batch_store: BatchQueue | None = None,
) -> Litestar:
    """The Litestar app of one gateway. ``extra_routes`` are more route handlers to serve
    (the simulator server's ``/metrics``, which then replaces the gateway's own)."""

    @asgi("/v1/chat/completions", copy_scope=False)
    async def chat_completions(scope: Scope, receive: Receive, send: Send) -> None:
        await path.handle("chat", OPENAI, scope, receive, send)

    @asgi("/v1/completions", copy_scope=False)
    async def completions(scope: Scope, receive: Receive, send: Send) -> None:
        await path.handle("completions", OPENAI, scope, receive, send)

    @asgi("/v1/messages", copy_scope=False)
    async def messages(scope: Scope, receive: Receive, send: Send) -> None:
        await path.handle("chat", ANTHROPIC, scope, receive, send)

    @asgi("/v1/messages/count_tokens", copy_scope=False)
    async def messages_count(scope: Scope, receive: Receive, send: Send) -> None:
        await path.count(ANTHROPIC_COUNT, scope, receive, send)

    @asgi("/v1/responses", copy_scope=False)
    async def responses(scope: Scope, receive: Receive, send: Send) -> None:
        await path.handle("chat", RESPONSES, scope, receive, send)

    def pooling_handler(route: str, api: Api, wire: Wire) -> Any:
        @asgi(route, copy_scope=False)
        async def pooled(scope: Scope, receive: Receive, send: Send) -> None:
            await path.handle(api, wire, scope, receive, send)

        return pooled

    pooling = [pooling_handler(route, api, wire) for route, (api, wire) in POOLING_ROUTES.items()]

    @get("/v1/models", sync_to_thread=False)
    def models(request: Request[Any, Any, Any]) -> Response[bytes]:
        return _json_response(request, 200, model_list(state, created))

    @get("/health", sync_to_thread=False)
    def health(request: Request[Any, Any, Any]) -> Response[bytes]:
        return _json_response(request, 200, {"status": "ok"})

    def details(request: Request[Any, Any, Any]) -> bool:
        """Whether this caller may see endpoint names, addresses and engine details."""
        cfg = state.config.gateway
        return cfg.readiness_details == "public" or is_admin(cfg, request.scope["headers"])

    @get("/ready")
    async def ready(request: Request[Any, Any, Any]) -> Response[bytes]:
        if details(request):
            ok, body = readiness(state, await endpoint_devices(state))
        else:
            ok, body = readiness_summary(state)
        if fleet is not None:
            # Routing goes on without the fleet's store (on local state): ready, but said.
            body["fleet"] = {"degraded": fleet.degraded}
        if stores := shared_stores(state):
            # Likewise limits and the cache: served without their Redis, but said.
            body["stores"] = {name: {"degraded": flag} for name, flag in stores.items()}
        return _json_response(request, 200 if ok else 503, body)

    @get("/metrics", include_in_schema=False)
    async def metrics_page(request: Request[Any, Any, Any]) -> Response[bytes]:
        assert metrics is not None
        if (err := metrics_refusal(state.config.gateway, request.scope["headers"])) is not None:
            return _bytes_response(request, err.status, err.body(), err.headers)
        if state.config.gateway.metrics_hardware:
            await hardware.snapshot()
        page = metrics.render()
        headers = request.scope["headers"]
        if peers is not None and not any(k == LOCAL for k, _ in headers):
            answers = await peers.ask_all("GET", "/metrics", headers)
            pages = [(peers.worker.index, page), *((i, b) for i, s, b in filter(None, answers) if s == 200)]
            page = merge_metrics(pages)
        return Response(page, status_code=200, media_type=METRICS_CONTENT_TYPE)

    openapi_body = _encode(openapi_document())

    @get("/openapi.json", sync_to_thread=False, include_in_schema=False)
    def openapi(request: Request[Any, Any, Any]) -> Response[bytes]:
        return _bytes_response(request, 200, openapi_body)

    def refused(request: Request[Any, Any, Any]) -> Response[bytes] | None:
        """A 401 when authentication is on and the request has no valid credential."""
        auth = state.tenancy.auth
        if auth:
            try:
                auth.authenticate(request.scope["headers"])
            except GatewayError as err:
                return _bytes_response(request, err.status, err.body(), err.headers)
        return None

    @get("/admin/hardware")
    async def hardware_page(request: Request[Any, Any, Any]) -> Response[bytes]:
        what = "The hardware readings"
        if (err := admin_refusal(state.config.gateway, request.scope["headers"], what)) is not None:
            return _bytes_response(request, err.status, err.body(), err.headers)
        return _bytes_response(request, 200, await hardware.snapshot())

    status_body = render_page().encode()

    @get("/", sync_to_thread=False, include_in_schema=False)
    def root(request: Request[Any, Any, Any]) -> Response[bytes]:
        # Relative, so the page is found behind a proxy that serves the gateway under a prefix.
        return Response(b"", status_code=302, media_type="text/plain", headers={"location": "status"})

    @get("/status", sync_to_thread=False, include_in_schema=False)
    def status_page(request: Request[Any, Any, Any]) -> Response[bytes]:
        # The page is a static shell: the data comes from /status.json, with the user's key.
        return Response(status_body, status_code=200, media_type=PAGE_CONTENT_TYPE, headers=PAGE_HEADERS)

    usage_summary = UsageSummary(state)

    @get("/status.json", include_in_schema=False)
    async def status_data(request: Request[Any, Any, Any]) -> Response[bytes]:
        admin = is_admin(state.config.gateway, request.scope["headers"])
        if not admin and (answer := refused(request)) is not None:
            return answer
        full = admin or state.config.gateway.readiness_details == "public"
        ok, body = readiness(state) if full else readiness_summary(state)
        data = status_json(ok, body, status, auth=state.auth_enabled)
        if state.governance is not None and state.governance.database is not None:
            # An admin (or anyone on an open gateway) sees every tenant; a key its own.
            auth = state.tenancy.auth
            tenant = None if admin or not auth else auth.authenticate(request.scope["headers"]).tenant
            data["usage"] = await usage_summary.get(tenant)
        if state.batches is not None:
            # The queue's totals (every tenant's, counts only; no batch ids or owners).
            data["batches"] = {
                "batches": state.batches.batches,
                "requests": state.batches.states,
                "running_here": len(state.batches.running),
            }
        if fleet is not None:
            data["fleet"] = fleet.status(asyncio.get_running_loop().time())
        headers = request.scope["headers"]
        if peers is not None:
            data["pid"] = os.getpid()
            if not any(k == LOCAL for k, _ in headers):
                answers = await peers.ask_all("GET", "/status.json", headers)
                others = [
                    (i, d)
                    for i, s, b in filter(None, answers)
                    if s == 200 and (d := decode_status(b)) is not None
                ]
                data = merge_status(data, peers.worker.index, others)
                answered = {w["index"] for w in data["workers"]}
                data["workers"] += [
                    {"index": i, "pid": None, "ready": False, "answered": False}
                    for i in range(peers.worker.count)
                    if i not in answered
                ]
                data["workers"].sort(key=lambda w: w["index"])
        return _bytes_response(request, 200, _encode(data), {"cache-control": "no-store"})

    # A server that brings its own /metrics (the simulator's fake vLLM) keeps it.
    own_metrics = any("/metrics" in getattr(h, "paths", ()) for h in extra_routes)
    return Litestar(
        route_handlers=[
            chat_completions,
            completions,
            messages,
            messages_count,
            responses,
            *pooling,
            models,
            health,
            ready,
            openapi,
            hardware_page,
            root,
            status_page,
            status_data,
            *([metrics_page] if metrics is not None and not own_metrics else []),
            *admin_routes(state, ops),
            *key_routes(state),
            *usage_routes(state),
            *files_routes(state),
            *batches_routes(state, batch_store),
            *extra_routes,
        ],
        exception_handlers={HTTPException: _http_exception, Exception: _unexpected},
        on_startup=[on_startup],
        on_shutdown=[on_shutdown],
        openapi_config=None,
        debug=False,
        logging_config=None,
    )


async def internal_error(send: Send, scope: Scope, exc: Exception) -> None:
    """A 500 for a bug on the request path: logged with its traceback, none sent out."""
    log.error("unexpected error on %s %s", scope.get("method"), scope.get("path"), exc_info=exc)
    err = GatewayError(500, "The gateway hit an internal error.", type="server_error", code="internal_error")
    try:
        await send_error(send, err, new_request_id(scope))
    except Exception:  # the response had already started; the connection will be closed
        pass


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
