"""The Batch API (``/v1/batches``), as OpenAI's: create, retrieve, list, cancel.

A batch belongs to the tenant of the credential that created it (others get 404; an admin
key sees every tenant's), and its requests run as that credential: its models, limits and
budgets apply. The input file must be a ``batch`` file of the same tenant; the runner
(:mod:`shuniu.core.batch.runner`) validates it against the endpoint, runs it, and writes
the output and error files.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from litestar import Request, Response, get, post

from shuniu.core.api.batch_input import BATCH_URLS
from shuniu.core.batch import TERMINAL, BatchQueue, BatchRecord, batch_object, parse_window
from shuniu.core.errors import GatewayError
from shuniu.core.ids import new_id
from shuniu.core.state import StateView
from shuniu.core.types import ANONYMOUS, Principal
from shuniu.core.views.access import is_admin
from shuniu.core.views.pages import list_page, page_limit
from shuniu.core.views.replies import bad_value, error_reply, json_reply, unavailable_on_error

__all__ = ["batches_routes"]


class _Create(msgspec.Struct):
    input_file_id: Any = None
    endpoint: Any = None
    completion_window: Any = "24h"
    metadata: Any = None


def batches_routes(view: StateView, store: BatchQueue | None) -> list[Any]:
    """The ``/v1/batches`` handlers (none without a batch queue)."""
    if store is None:
        return []

    def caller(request: Request[Any, Any, Any]) -> tuple[Principal, bool] | Response[bytes]:
        """The caller's principal, and whether it holds an admin key (sees every tenant)."""
        headers = request.scope["headers"]
        auth = view.tenancy.auth
        admin = is_admin(view.config.gateway, headers)
        if not auth:
            return ANONYMOUS, admin
        if admin:
            return ANONYMOUS, True
        try:
            return auth.authenticate(headers), False
        except GatewayError as err:
            return error_reply(err)

    async def visible(principal: Principal, admin: bool, batch_id: str) -> BatchRecord | None:
        batch = await store.get(batch_id)
        if batch is None or (not admin and batch.tenant != principal.tenant):
            return None
        return batch

    def not_found(batch_id: str) -> Response[bytes]:
        return error_reply(
            GatewayError(404, f"No batch found with id '{batch_id}'.", param="batch_id", code="not_found")
        )

    async def answer(batch: BatchRecord) -> Response[bytes]:
        counts = (await store.counts([batch.id])).get(batch.id, {})
        return json_reply(200, batch_object(batch, counts))

    down = unavailable_on_error("the batch queue", "batch_queue_unavailable")

    @post("/v1/batches", status_code=200, exception_handlers=down)
    async def create(request: Request[Any, Any, Any]) -> Response[bytes]:
        who = caller(request)
        if isinstance(who, Response):
            return who
        principal, _admin = who
        try:
            spec = msgspec.json.decode(await request.body(), type=_Create)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return error_reply(GatewayError(400, "The body must be a JSON object.", code="invalid_json"))
        if spec.endpoint not in BATCH_URLS:
            return bad_value("endpoint", f"endpoint must be one of {', '.join(sorted(BATCH_URLS))}.")
        window = parse_window(spec.completion_window) if isinstance(spec.completion_window, str) else None
        if window is None:
            return bad_value(
                "completion_window", "completion_window must be a whole number of hours, 1h to 168h (24h)."
            )
        metadata = spec.metadata
        if metadata is not None and (
            not isinstance(metadata, dict)
            or len(metadata) > 16
            or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                for k, v in metadata.items()
            )
        ):
            return bad_value(
                "metadata", "metadata: at most 16 string pairs (keys up to 64, values up to 512 characters)."
            )
        files = view.files
        record = (
            await files.get(spec.input_file_id)
            if files is not None and isinstance(spec.input_file_id, str)
            else None
        )
        if record is None or record.tenant != principal.tenant:
            return error_reply(
                GatewayError(
                    404, f"No such File object: {spec.input_file_id}", param="input_file_id", code="not_found"
                )
            )
        if record.purpose != "batch":
            return bad_value(
                "input_file_id", f"The file's purpose is {record.purpose!r}; a batch needs a 'batch' file."
            )
        # Its requests run in the batch tier: the models the caller's own tier allows go with
        # them (narrowing the credential's), so a batch reaches no model the caller cannot.
        tier = view.tenancy.tiers.get(principal.tier)
        if tier is not None and tier.models is not None:
            allowed = tier.models if principal.models is None else tier.models & principal.models
            principal = msgspec.structs.replace(principal, models=frozenset(allowed))
        now = int(time.time())
        batch = BatchRecord(
            id=new_id("batch_"),
            tenant=principal.tenant,
            principal=principal,
            endpoint=spec.endpoint,
            input_file_id=record.id,
            completion_window=spec.completion_window,
            status="validating",
            created_at=now,
            expires_at=now + window,
            times={},
            metadata=metadata,
        )
        await store.create(batch)
        return await answer(batch)

    @get("/v1/batches", exception_handlers=down)
    async def listing(request: Request[Any, Any, Any]) -> Response[bytes]:
        who = caller(request)
        if isinstance(who, Response):
            return who
        principal, admin = who
        params = request.query_params
        try:
            limit = page_limit(params, 20, 100)
        except GatewayError as err:
            return error_reply(err)
        batches = await store.list(None if admin else principal.tenant)
        batches.sort(key=lambda b: (b.created_at, b.id), reverse=True)
        page = list_page(batches, params.get("after"), limit, lambda b: b.id, lambda b: b)
        counts = await store.counts([b.id for b in page["data"]])  # of this page's batches only
        page["data"] = [batch_object(b, counts.get(b.id, {})) for b in page["data"]]
        return json_reply(200, page)

    @get("/v1/batches/{batch_id:str}", exception_handlers=down)
    async def retrieve(request: Request[Any, Any, Any]) -> Response[bytes]:
        who = caller(request)
        if isinstance(who, Response):
            return who
        batch_id = request.path_params["batch_id"]
        batch = await visible(*who, batch_id)
        return not_found(batch_id) if batch is None else await answer(batch)

    @post("/v1/batches/{batch_id:str}/cancel", status_code=200, exception_handlers=down)
    async def cancel(request: Request[Any, Any, Any]) -> Response[bytes]:
        who = caller(request)
        if isinstance(who, Response):
            return who
        batch_id = request.path_params["batch_id"]
        batch = await visible(*who, batch_id)
        if batch is None:
            return not_found(batch_id)
        if batch.status in TERMINAL or batch.status == "finalizing":
            return error_reply(
                GatewayError(409, f"Cannot cancel a batch that is {batch.status}.", code="conflict")
            )
        if batch.status != "cancelling":
            await store.move(batch, ("validating", "in_progress"), "cancelling")
            batch = await store.get(batch_id) or batch
        return await answer(batch)

    return [create, listing, retrieve, cancel]
