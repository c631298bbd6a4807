"""Options of the ``tgi`` backend.

``base_url`` is the TGI server's root: its native API (``/generate``, ``/generate_stream``,
``/info``, ``/health``, ``/metrics``) lives there and its Messages API under ``/v1``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from shuniu.backends.http import server_root, url_path
from shuniu.core.config import Options

__all__ = ["TgiOptions"]


class TgiOptions(Options):
    launch_base_url: ClassVar[str] = "http://{host}:{port}"
    """``base_url`` of an engine shuniu launches (``launch:``) when none is given: the server root."""

    base_url: str
    """The TGI server's address, e.g. ``http://127.0.0.1:8080``. A trailing ``/v1`` (the
    Messages API root, as the OpenAI SDK takes it) is accepted and dropped: TGI's own API
    (``/generate_stream``, ``/info``, ``/health``, ``/metrics``) is at the root. May be left
    out when the entry has ``launch:``: ``http://{host}:{port}`` of each engine."""
    adapter_id: str | None = None
    """A LoRA adapter the server loaded (``--lora-adapters``) to run every request with:
    sent as ``parameters.adapter_id`` on ``/generate_stream`` and as ``model`` on the
    Messages API. Default: the base model (the Messages API gets ``model: "tgi"``; TGI
    takes any other ``model`` value for an adapter id, so the client's model name is never
    forwarded)."""
    api_key: str | None = None
    """The server's ``--api-key``, sent as ``Authorization: Bearer ...`` on every request
    and probe (write ``${ENV_VAR}``; it is never logged)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra headers sent with every request and probe (e.g. for a proxy in front of TGI)."""
    connect_timeout_s: float = Field(5.0, gt=0)
    """Longest wait to open a connection."""
    timeout_s: float = Field(600.0, gt=0)
    """Longest a whole request (a stream included) may take."""
    max_connections: int = Field(1024, ge=1)
    """Pooled keep-alive connections to this server, at most."""
    http_client: Literal["shuniu", "aiohttp"] = "shuniu"
    """The client of the calls on the request path: ``shuniu``, a lean HTTP/1.1 client
    (``http://`` only; an ``https://`` server uses aiohttp anyway), or ``aiohttp``. Probes
    always use aiohttp."""
    health_path: str = "/health"
    """Path under the server root probed by health checks. TGI answers 200 while its model
    shards answer and 503 (``error_type: healthcheck``) once they do not."""
    metrics_path: str = "/metrics"
    """Path under the server root of TGI's Prometheus metrics, read every
    ``load.interval_s`` for the load view (batch size, queue size, batch token budget)."""
    probe_timeout_s: float = Field(2.0, gt=0)
    """Longest wait for a ``/health``, ``/info`` or ``/metrics`` answer."""

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return server_root(value)

    @field_validator("health_path", "metrics_path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        return url_path(value)

    @field_validator("adapter_id")
    @classmethod
    def _adapter(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty (leave it out to use the base model)")
        return value
