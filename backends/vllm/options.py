"""Options of the ``vllm`` backend.

They extend the ``openai`` backend's options (API key, extra headers, timeouts, connection
pool), so whatever that backend learns to tune, this one takes too. ``base_url`` differs:
here it is the server's root, since ``/health`` and ``/metrics`` live beside ``/v1``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, SecretStr, field_validator

from shuniu.backends.http import OpenAIOptions, server_root, url_path

__all__ = ["VllmOptions"]


class VllmOptions(OpenAIOptions):
    launch_base_url: ClassVar[str] = "http://{host}:{port}"
    """``base_url`` of an engine shuniu launches (``launch:``) when none is given: the server root."""

    base_url: str
    """The vLLM server's address, e.g. ``http://127.0.0.1:8000``. A trailing ``/v1`` (the API
    root, as the OpenAI SDK takes it) is accepted and dropped: the OpenAI API is under
    ``/v1``, ``/health`` and ``/metrics`` at the root. May be left out when the entry has
    ``launch:``: ``http://{host}:{port}`` of each engine."""
    model: str | None = None
    """The model name the server serves (its ``--served-model-name``). Default: read from
    ``/v1/models``: the pool's own name when the server serves it, else the server's only
    model. A server serving several models needs this set."""
    health_path: str = "/health"
    """Path under the server root probed by health checks. vLLM answers 200 while its engine
    is alive and 503 once the engine died."""
    tokenize_path: str | None = "/tokenize"
    """Path under the server root of vLLM's ``/tokenize`` (chat template applied), which the
    model's ``tokenizer: engine`` counts prompts with; ``null`` to never ask."""
    metrics_path: str = "/metrics"
    """Path under the server root of vLLM's Prometheus metrics, read every
    ``load.interval_s`` for the load view (running, waiting, KV usage, prefix cache)."""
    probe_timeout_s: float = Field(2.0, gt=0)
    """Longest wait for a ``/health``, ``/metrics`` or ``/v1/models`` answer."""
    forward_priority: bool = False
    """Send the priority shuniu's scheduler gave the request (``priority``, smaller runs
    first) so the engine orders its own queue the same way. Only for servers started with
    ``--scheduling-policy priority``: a server on the default ``fcfs`` policy rejects any
    non-zero priority with 400. When off, a ``priority`` the client put in the body is
    removed, so clients cannot reorder the engine's queue behind the gateway's back."""
    cache_salt: Literal["tenant", "off"] = "tenant"
    """``tenant``: set the body's ``cache_salt`` to a keyed hash of the request's tenant, so
    vLLM's prefix cache is shared within a tenant and never across tenants (one tenant
    cannot time another's cached prompts); a ``cache_salt`` the client sent is overwritten.
    ``off``: the body's ``cache_salt`` is passed through as the client sent it."""
    cache_salt_secret: SecretStr | None = None
    """Key of the tenant hash (write ``${ENV_VAR}``; at least 16 characters). Every gateway
    in front of the same engines must use the same secret, or each gateway's requests get
    their own salt and a tenant's prefix-cache hits are split between gateways. Default: a
    random key per gateway process (salts then change at every restart, which costs one
    cold prefix cache per tenant, never a leak)."""

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return server_root(value)

    @field_validator("cache_salt_secret")
    @classmethod
    def _secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (a short key is guessable)")
        return value

    @field_validator("health_path", "metrics_path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        return url_path(value)
