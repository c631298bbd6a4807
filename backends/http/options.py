"""Option helpers of the HTTP backends (URLs, paths) and the options of an OpenAI-compatible
server (:class:`OpenAIOptions`), which the ``openai``, ``vllm`` and ``trtllm`` backends
take and extend."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from shuniu.core.config import Options

__all__ = ["OpenAIOptions", "http_url", "server_root", "url_path"]


def http_url(value: str) -> str:
    """An option's URL: ``http://`` or ``https://``, without a trailing ``/``."""
    if not value.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    return value.rstrip("/")


def server_root(value: str) -> str:
    """An engine's server root (``/health`` and ``/metrics`` hang off it): the URL without
    a trailing ``/v1``, which users often copy from OpenAI client settings."""
    return http_url(value).removesuffix("/v1").rstrip("/")


def url_path(value: str | None) -> str | None:
    """A path option: it must start with ``/`` (``None`` passes)."""
    if value is not None and not value.startswith("/"):
        raise ValueError("must start with /")
    return value


class OpenAIOptions(Options):
    launch_base_url: ClassVar[str] = "http://{host}:{port}/v1"
    """``base_url`` of an engine shuniu launches (``launch:``) when none is given: the API root."""

    base_url: str
    """The server's API root, as the OpenAI SDK takes it, e.g. ``http://127.0.0.1:9000/v1``.
    May be left out when the entry has ``launch:``: ``http://{host}:{port}/v1`` of each engine."""
    model: str | None = None
    """Model name to send upstream; defaults to the name the client asked for."""
    api_key: str | None = None
    """Bearer token for the upstream (write ``${ENV_VAR}``; it is never logged)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra headers sent with every upstream request."""
    connect_timeout_s: float = Field(5.0, gt=0)
    """Longest wait to open a connection."""
    timeout_s: float = Field(600.0, gt=0)
    """Longest a whole upstream request may take."""
    max_connections: int = Field(1024, ge=1)
    """Pooled keep-alive connections to this endpoint, at most."""
    http_client: Literal["shuniu", "aiohttp"] = "shuniu"
    """The client of the engine calls on the request path: ``shuniu``, a lean HTTP/1.1 client
    on ``httptools`` (a fraction of aiohttp's CPU per call; ``http://`` engines, an
    ``https://`` one uses aiohttp anyway), or ``aiohttp``. Probes always use aiohttp."""
    health_path: str = "/models"
    """Path under ``base_url`` probed by health checks (any 2xx is healthy)."""
    tokenize_path: str | None = None
    """Path under the server root (``base_url`` without ``/v1``) of a vLLM-style
    ``/tokenize`` (vLLM and SGLang serve one: ``/tokenize``), which the model's
    ``tokenizer: engine`` counts prompts with. ``None``: this server is not asked."""

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return http_url(value)

    @field_validator("tokenize_path")
    @classmethod
    def _tokenize_path(cls, value: str | None) -> str | None:
        return url_path(value)
