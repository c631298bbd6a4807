"""Readiness (``GET /ready``, and the base of ``/admin/state`` and ``/status.json``): per
model its healthy endpoints and queue, per endpoint its health, load, limits, ejection,
drain and launch state, and the accelerators it runs on; and the model list
(``GET /v1/models``)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from shuniu.core.pools.pool import EndpointState
from shuniu.core.state import StateView

__all__ = ["endpoint_devices", "model_list", "readiness", "readiness_summary"]

_DEVICES_TIMEOUT_S = 5.0


async def endpoint_devices(view: StateView) -> dict[str, list[Any]]:
    """Endpoint name → the accelerator readings of its engine, for backends that can tell
    (``devices()`` does not answer ``None``); each backend caches its own probe."""
    names: list[str] = []
    calls = []
    for pool in view.pools.values():
        for e in pool.endpoints:
            names.append(e.name)
            calls.append(asyncio.wait_for(e.backend.devices(), _DEVICES_TIMEOUT_S))
    if not calls:
        return {}
    results = await asyncio.gather(*calls, return_exceptions=True)
    return {
        name: [msgspec.to_builtins(d) for d in result]
        for name, result in zip(names, results, strict=True)
        if result is not None and not isinstance(result, BaseException)
    }


def readiness(view: StateView, devices: dict[str, list[Any]] | None = None) -> tuple[bool, dict[str, Any]]:
    """``(ready, body)``: ready once started, not draining, and every model has a healthy
    endpoint."""
    models: dict[str, Any] = {}
    now = asyncio.get_running_loop().time() if view.started else 0.0
    ready = view.started and not view.draining
    for name, pool in view.pools.items():
        healthy = sum(1 for e in pool.endpoints if e.healthy)
        ready = ready and healthy > 0
        models[name] = {
            "healthy_endpoints": healthy,
            "queued": pool.scheduler.queued,
            "endpoints": [_endpoint(view, e, now, devices) for e in pool.endpoints],
        }
        if pool.scaling is not None:
            models[name]["autoscaling"] = pool.scaling.to_json()
    status = "draining" if view.draining else ("ready" if ready else "not_ready")
    return ready, {"status": status, "models": models}


def readiness_summary(view: StateView) -> tuple[bool, dict[str, Any]]:
    """``(ready, body)`` for a caller without an admin key: ready or not, and per model its
    healthy and total endpoints and its queue; no names, addresses or health details."""
    ready, body = readiness(view)
    models = {
        name: {
            "healthy_endpoints": m["healthy_endpoints"],
            "endpoints": len(m["endpoints"]),
            "queued": m["queued"],
        }
        for name, m in body["models"].items()
    }
    return ready, {"status": body["status"], "models": models}


def _endpoint(
    view: StateView, e: EndpointState, now: float, devices: dict[str, list[Any]] | None
) -> dict[str, Any]:
    engine = view.engines.get(e.name)
    return {
        "name": e.name,
        "kind": e.backend.kind,
        "version": e.version,
        "labels": e.labels,
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
        **({"launch": engine.snapshot()} if engine is not None else {}),
        **({"devices": devices[e.name]} if devices and e.name in devices else {}),
    }


def model_list(view: StateView, created: int) -> dict[str, Any]:
    """``GET /v1/models``: every model name and alias, in OpenAI's shape."""
    data = []
    for name, model in view.config.models.items():
        pool = view.pools[name]
        for alias in [name, *model.aliases]:
            data.append(
                {
                    "id": alias,
                    "object": "model",
                    "created": created,
                    "owned_by": model.owned_by,
                    "root": name,
                    "max_model_len": pool.max_model_len,
                }
            )
    return {"object": "list", "data": data}
