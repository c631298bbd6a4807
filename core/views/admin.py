"""The admin API: change a running gateway without a restart.

Every route needs an admin key (``gateway.admin_keys``: SHA-256 hashes, compared in constant
time; a tenant's API key is not enough). Without admin keys configured the routes answer
403. Changes are logged once each, at WARNING.

- ``GET /admin/state``: every pool, endpoint, version split, ejection and drain state.
- ``PUT /admin/models/{model}/traffic`` ``{"weights": {"v1": 90, "v2": 10}}``: the canary
  split (``{}`` removes it).
- ``POST /admin/endpoints/{name}/drain`` and ``/undrain``: no new requests / back in.
- ``POST /admin/models/{model}/endpoints``: add an endpoint (an ``endpoints[]`` entry of the
  deployment file, without ``launch``); it joins after its first passing health probe.
- ``DELETE /admin/endpoints/{name}``: remove a drained endpoint with nothing in flight
  (409 otherwise).
- ``POST /admin/reload``: re-read the deployment file and apply it (as ``SIGHUP`` does); a
  bad file changes nothing and the answer lists its problems.

A rolling update from version A to B is then: add B endpoints, move ``traffic`` step by
step, drain A, wait for their ``in_flight`` to reach 0, delete them.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, delete, get, post, put
from pydantic import ValidationError

from shuniu.core.config import EndpointConfig
from shuniu.core.errors import ConfigError, GatewayError
from shuniu.core.operations import Operations
from shuniu.core.state import StateView
from shuniu.core.views.access import admin_refusal
from shuniu.core.views.readiness import readiness
from shuniu.core.views.replies import error_reply, json_reply

__all__ = ["admin_routes"]


def admin_routes(view: StateView, ops: Operations) -> list[Any]:
    """The admin API's route handlers: they read ``view`` and change the gateway through
    ``ops``."""

    def check(request: Request[Any, Any, Any]) -> GatewayError | None:
        return admin_refusal(view.config.gateway, request.scope["headers"])

    @get("/admin/state")
    async def state(request: Request[Any, Any, Any]) -> Response[bytes]:
        if (err := check(request)) is not None:
            return error_reply(err)
        _ok, body = readiness(view)
        for name in view.pools:
            body["models"][name]["traffic"] = view.router.traffic(name)
        return json_reply(200, body)

    @put("/admin/models/{model:str}/traffic")
    async def traffic(request: Request[Any, Any, Any]) -> Response[bytes]:
        model = request.path_params["model"]
        if (err := check(request)) is not None:
            return error_reply(err)
        pool = view.pools.get(model)
        if pool is None:
            return error_reply(GatewayError(404, f"No model named {model!r}.", code="model_not_found"))
        try:
            data = msgspec.json.decode(await request.body())
            weights = data["weights"]
            if not isinstance(weights, dict) or not all(
                isinstance(k, str) and isinstance(v, int | float) and v >= 0 for k, v in weights.items()
            ):
                raise ValueError
        except (msgspec.DecodeError, KeyError, TypeError, ValueError):
            return error_reply(
                GatewayError(
                    400, 'Send {"weights": {"<version>": <weight >= 0>, ...}}.', code="invalid_value"
                )
            )
        unknown = sorted(set(weights) - pool.versions)
        if unknown:
            return error_reply(
                GatewayError(
                    400,
                    f"No endpoint of {model!r} runs version(s) {', '.join(unknown)} "
                    f"(versions: {', '.join(sorted(pool.versions))}).",
                    code="invalid_version",
                )
            )
        if weights and not any(w > 0 for w in weights.values()):
            return error_reply(
                GatewayError(400, "At least one weight must be above 0.", code="invalid_value")
            )
        traffic = ops.set_traffic(model, {k: float(v) for k, v in weights.items()})
        return json_reply(200, {"model": model, "traffic": traffic})

    async def _drain(request: Request[Any, Any, Any], name: str, on: bool) -> Response[bytes]:
        if (err := check(request)) is not None:
            return error_reply(err)
        found = view.find_endpoint(name)
        if found is None:
            return error_reply(GatewayError(404, f"No endpoint named {name!r}.", code="not_found"))
        _pool, endpoint = found
        ops.set_draining(endpoint, on)
        return json_reply(
            200, {"endpoint": name, "draining": endpoint.draining, "in_flight": endpoint.in_flight}
        )

    @post("/admin/endpoints/{name:str}/drain", status_code=200)
    async def drain(request: Request[Any, Any, Any]) -> Response[bytes]:
        return await _drain(request, request.path_params["name"], True)

    @post("/admin/endpoints/{name:str}/undrain", status_code=200)
    async def undrain(request: Request[Any, Any, Any]) -> Response[bytes]:
        return await _drain(request, request.path_params["name"], False)

    @post("/admin/models/{model:str}/endpoints", status_code=201)
    async def add(request: Request[Any, Any, Any]) -> Response[bytes]:
        model = request.path_params["model"]
        if (err := check(request)) is not None:
            return error_reply(err)
        if model not in view.pools:
            return error_reply(GatewayError(404, f"No model named {model!r}.", code="model_not_found"))
        try:
            data = msgspec.json.decode(await request.body())
            cfg = EndpointConfig.model_validate(data)
        except msgspec.DecodeError:
            return error_reply(
                GatewayError(400, "The body must be a JSON endpoint entry.", code="invalid_json")
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "<entry>"
            return error_reply(GatewayError(400, f"{where}: {first['msg']}", code="invalid_value"))
        problem = None
        if cfg.launch is not None:
            problem = "launch: is not supported at run time; start the engine and give its base_url"
        elif cfg.replicas != 1:
            problem = "add one endpoint at a time (replicas: 1)"
        elif not cfg.name:
            problem = "the endpoint needs a name"
        elif view.find_endpoint(cfg.name) is not None:
            problem = f"an endpoint named {cfg.name!r} exists"
        reg = ops.backends().get(cfg.kind)
        if problem is None and reg is None:
            problem = f"unknown backend {cfg.kind!r}"
        if problem is not None:
            return error_reply(GatewayError(400, problem, code="invalid_value"))
        assert reg is not None
        try:
            options = reg.options.model_validate(cfg.options) if reg.options is not None else None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return error_reply(GatewayError(400, f"options.{where}: {first['msg']}", code="invalid_value"))
        try:
            endpoint = await ops.add_endpoint(model, cfg, options)
        except Exception as exc:  # the backend could not start: nothing was added
            return error_reply(
                GatewayError(502, f"The endpoint could not start: {type(exc).__name__}: {exc}")
            )
        return json_reply(201, {"endpoint": endpoint.name, "model": model, "version": endpoint.version})

    @delete("/admin/endpoints/{name:str}", status_code=200)
    async def remove(request: Request[Any, Any, Any]) -> Response[bytes]:
        name = request.path_params["name"]
        if (err := check(request)) is not None:
            return error_reply(err)
        found = view.find_endpoint(name)
        if found is None:
            return error_reply(GatewayError(404, f"No endpoint named {name!r}.", code="not_found"))
        pool, endpoint = found
        if name in view.engines:
            return error_reply(
                GatewayError(409, "A launched engine is removed with the deployment file.", code="conflict")
            )
        if not endpoint.draining or endpoint.in_flight:
            return error_reply(
                GatewayError(
                    409,
                    f"Drain {name!r} first and wait until nothing is in flight "
                    f"(in flight: {endpoint.in_flight}).",
                    code="not_drained",
                )
            )
        if len(pool.endpoints) == 1:
            return error_reply(GatewayError(409, "A model keeps at least one endpoint.", code="conflict"))
        await ops.remove_endpoint(pool, endpoint)
        return json_reply(200, {"endpoint": name, "removed": True})

    @post("/admin/reload", status_code=200)
    async def reload(request: Request[Any, Any, Any]) -> Response[bytes]:
        if (err := check(request)) is not None:
            return error_reply(err)
        try:
            changes = await ops.reload()
        except ConfigError as exc:
            body = GatewayError(
                400,
                f"Reload refused, nothing changed: {len(exc.problems)} problem(s).",
                code="invalid_deployment",
            )
            payload = msgspec.json.decode(body.body())
            payload["error"]["problems"] = [str(p) for p in exc.problems]
            return json_reply(400, payload)
        return json_reply(200, {"reloaded": True, "changes": changes})

    return [state, traffic, drain, undrain, add, remove, reload]
