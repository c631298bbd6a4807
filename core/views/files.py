"""The Files API (``/v1/files``), as OpenAI's: upload (multipart, ``purpose`` and
``file``), list, retrieve, content, delete.

A file belongs to the tenant of the credential that uploaded it; other tenants' credentials
get 404 for it, as if it did not exist; an admin key sees every tenant's. On an open gateway
every file is the ``anonymous`` tenant's. A ``batch`` file is checked line by line at upload
(:func:`shuniu.core.api.batch_input.check_batch_input`): a bad one is refused with the lines
that are wrong, and nothing is stored.
"""

from __future__ import annotations

import time
from typing import Any

from litestar import Request, Response, delete, get, post
from litestar.datastructures import UploadFile

from shuniu.core.api.batch_input import check_batch_input
from shuniu.core.contracts import FileStore, StoredFile
from shuniu.core.errors import GatewayError
from shuniu.core.ids import new_id
from shuniu.core.state import StateView
from shuniu.core.views.access import is_admin
from shuniu.core.views.pages import list_page, page_limit
from shuniu.core.views.replies import error_reply, json_reply, unavailable_on_error

__all__ = ["PURPOSES", "file_object", "files_routes"]

PURPOSES = frozenset({"batch", "user_data", "fine-tune", "assistants", "vision", "evals"})
"""Purposes a client may upload for (``batch`` files are checked); ``batch_output`` files
are written by the gateway only."""
_MULTIPART_SLACK = 1024 * 1024
"""Room for the multipart framing and the other fields above ``files.max_file_bytes``."""


def file_object(record: StoredFile) -> dict[str, Any]:
    """A file as OpenAI's API writes it."""
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "expires_at": record.expires_at,
        "status_details": None,
    }


def _not_found(file_id: str) -> Response[bytes]:
    return error_reply(
        GatewayError(404, f"No such File object: {file_id}", param="file_id", code="not_found")
    )


def files_routes(view: StateView) -> list[Any]:
    """The ``/v1/files`` handlers (none when ``files.enabled`` is off)."""
    if view.files is None:
        return []
    limit_bytes = view.config.files.max_file_bytes

    def owner(request: Request[Any, Any, Any]) -> tuple[FileStore, str | None] | Response[bytes]:
        """The store and the caller's tenant (``None``: an admin key, every tenant's)."""
        store = view.files
        assert store is not None
        headers = request.scope["headers"]
        if is_admin(view.config.gateway, headers):
            return store, None
        auth = view.tenancy.auth
        if not auth:
            return store, "anonymous"
        try:
            return store, auth.authenticate(headers).tenant
        except GatewayError as err:
            return error_reply(err)

    async def visible(store: FileStore, tenant: str | None, file_id: str) -> StoredFile | None:
        record = await store.get(file_id)
        if record is None or (tenant is not None and record.tenant != tenant):
            return None
        return record

    down = unavailable_on_error("the file store", "file_store_unavailable")

    @post(
        "/v1/files",
        status_code=200,
        request_max_body_size=limit_bytes + _MULTIPART_SLACK,
        exception_handlers=down,
    )
    async def upload(request: Request[Any, Any, Any]) -> Response[bytes]:
        who = owner(request)
        if isinstance(who, Response):
            return who
        store, tenant = who
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            return error_reply(
                GatewayError(
                    400,
                    "Send the file as multipart/form-data with the fields purpose and file.",
                    code="invalid_request",
                )
            )
        form = await request.form()
        purpose = form.get("purpose")
        upload = form.get("file")
        if not isinstance(purpose, str) or purpose not in PURPOSES:
            return error_reply(
                GatewayError(
                    400,
                    f"purpose must be one of {', '.join(sorted(PURPOSES))}.",
                    param="purpose",
                    code="invalid_value",
                )
            )
        if not isinstance(upload, UploadFile):
            return error_reply(
                GatewayError(
                    400, "Send the file's content in the field file.", param="file", code="invalid_value"
                )
            )
        content = await upload.read()
        await upload.close()
        if len(content) > limit_bytes:
            return error_reply(
                GatewayError(
                    413,
                    f"The file is {len(content)} bytes; the limit is {limit_bytes}.",
                    param="file",
                    code="file_too_large",
                )
            )
        lines = 0
        if purpose == "batch":
            try:
                lines = len(check_batch_input(content, view.config.files.max_batch_lines))
            except GatewayError as err:
                return error_reply(err)
        record = StoredFile(
            id=new_id("file-"),
            tenant=tenant or "anonymous",
            filename=(upload.filename or "upload")[:255],
            purpose=purpose,
            bytes=len(content),
            created_at=int(time.time()),
            lines=lines,
        )
        await store.put(record, content)
        return json_reply(200, file_object(record))

    @get("/v1/files", exception_handlers=down)
    async def listing(request: Request[Any, Any, Any]) -> Response[bytes]:
        who = owner(request)
        if isinstance(who, Response):
            return who
        store, tenant = who
        params = request.query_params
        purpose = params.get("purpose")
        order = params.get("order", "desc")
        try:
            limit = page_limit(params, 10000, 10000)
            if order not in ("asc", "desc"):
                raise GatewayError(400, "order: asc or desc.", param="order", code="invalid_value")
        except GatewayError as err:
            return error_reply(err)
        records = [
            r
            for r in await store.list()
            if (tenant is None or r.tenant == tenant) and (purpose is None or r.purpose == purpose)
        ]
        records.sort(key=lambda r: (r.created_at, r.id), reverse=order == "desc")
        return json_reply(200, list_page(records, params.get("after"), limit, lambda r: r.id, file_object))

    @get("/v1/files/{file_id:str}", exception_handlers=down)
    async def retrieve(request: Request[Any, Any, Any]) -> Response[bytes]:
        who = owner(request)
        if isinstance(who, Response):
            return who
        file_id = request.path_params["file_id"]
        record = await visible(*who, file_id)
        return _not_found(file_id) if record is None else json_reply(200, file_object(record))

    @get("/v1/files/{file_id:str}/content", exception_handlers=down)
    async def content(request: Request[Any, Any, Any]) -> Response[bytes]:
        who = owner(request)
        if isinstance(who, Response):
            return who
        file_id = request.path_params["file_id"]
        record = await visible(*who, file_id)
        data = await who[0].content(file_id) if record is not None else None
        if data is None:
            return _not_found(file_id)
        return Response(
            data,
            status_code=200,
            media_type="application/octet-stream",
            headers={"content-disposition": f'attachment; filename="{record.filename}"'},
        )

    @delete("/v1/files/{file_id:str}", status_code=200, exception_handlers=down)
    async def remove(request: Request[Any, Any, Any]) -> Response[bytes]:
        who = owner(request)
        if isinstance(who, Response):
            return who
        file_id = request.path_params["file_id"]
        record = await visible(*who, file_id)
        if record is None or not await who[0].delete(file_id):
            return _not_found(file_id)
        return json_reply(200, {"id": file_id, "object": "file", "deleted": True})

    return [upload, listing, retrieve, content, remove]
