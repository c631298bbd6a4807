"""Options of the ``tei`` backend.

``base_url`` is the TEI server's root: its native API (``/embed``, ``/rerank``, ``/info``,
``/health``, ``/metrics``) lives there.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from shuniu.backends.http import server_root, url_path
from shuniu.core.config import Options

__all__ = ["TeiOptions"]


class TeiOptions(Options):
    launch_base_url: ClassVar[str] = "http://{host}:{port}"
    """``base_url`` of an engine shuniu launches (``launch:``) when none is given: the server root."""

    base_url: str
    """The TEI server's address, e.g. ``http://127.0.0.1:8080``. A trailing ``/v1`` (its
    OpenAI-compatible root) is accepted and dropped: the native API is used. May be left
    out when the entry has ``launch:``: ``http://{host}:{port}`` of each engine."""
    api_key: str | None = None
    """The server's ``--api-key``, sent as ``Authorization: Bearer ...`` on every request
    and probe (write ``${ENV_VAR}``; it is never logged)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra headers sent with every request and probe."""
    normalize: bool = True
    """``normalize`` of ``/embed``: vectors of length 1 (TEI's default, and what OpenAI's
    embeddings are)."""
    truncate: bool | None = None
    """``truncate`` of ``/embed`` and ``/rerank``: cut inputs longer than the model takes
    instead of refusing them. ``None``: the server's default (``--auto-truncate``). A
    client's ``truncate`` in the request body wins."""
    prompt_name: str | None = None
    """``prompt_name`` of ``/embed``: a prompt of the model's sentence-transformers
    configuration to put before every input (e.g. ``query``)."""
    connect_timeout_s: float = Field(5.0, gt=0)
    """Longest wait to open a connection."""
    timeout_s: float = Field(120.0, gt=0)
    """Longest a whole request may take."""
    max_connections: int = Field(1024, ge=1)
    """Pooled keep-alive connections to this server, at most."""
    health_path: str = "/health"
    """Path under the server root probed by health checks (200 while the model answers)."""
    metrics_path: str = "/metrics"
    """Path under the server root of TEI's Prometheus metrics, read every
    ``load.interval_s`` for the load view (queue size, batch sizes)."""
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
