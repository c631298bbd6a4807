"""Forwarding to a remote ``vllm serve`` and reading its own load from ``/metrics``.

The request path is the ``openai`` backend's (pooled keep-alive aiohttp connections, error
mapping, SSE parsing, usage always requested); this subclass only changes the body it
forwards (served model name, ``priority``, ``cache_salt``) and adds what a vLLM server has
beyond the OpenAI API: ``/health``, ``/metrics`` and the served model's ``max_model_len``
in ``/v1/models``.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import replace
from typing import Any, ClassVar

import msgspec

from shuniu.backends.http import (
    OpenAIEngine,
    OpenAIOptions,
    Prober,
    probe_headers,
)
from shuniu.backends.vllm.metrics import parse_vllm_metrics
from shuniu.backends.vllm.options import VllmOptions
from shuniu.core.contracts import EndpointSpec
from shuniu.core.types import EndpointLoad, Health, InferenceRequest

__all__ = ["VllmBackend", "choose_model", "tenant_salt"]

_PROCESS_SECRET = secrets.token_bytes(32)
"""The ``cache_salt`` key when no ``cache_salt_secret`` is configured: one per process, so
every endpoint of a gateway agrees, but two gateways (or one restarted) do not."""

_MAX_SALTS = 65536
"""Salts remembered per endpoint before the memo is emptied (an open gateway taking tenants
from headers could otherwise grow it without bound)."""


def tenant_salt(key: bytes, tenant: str) -> str:
    """The ``cache_salt`` of ``tenant``: a 256-bit keyed BLAKE2b, hex (64 characters; vLLM
    takes up to 128, and recommends 256 bits). Stable for a key, and neither reversible nor
    guessable without it, so a tenant's salt does not reveal, or let anyone forge, another's."""
    return hashlib.blake2b(tenant.encode(), key=key, digest_size=32, person=b"shuniu-salt").hexdigest()


def choose_model(
    entries: list[dict[str, Any]], configured: str | None, public: str
) -> tuple[dict[str, Any] | None, str | None]:
    """The ``/v1/models`` entry this endpoint serves, or ``None`` and the reason.

    ``configured`` (``options.model``) must be listed. Without it: the pool's ``public`` name
    if the server serves it, else the server's only model (several names with one ``root``
    are aliases of one model, as vLLM lists ``--served-model-name a b``).
    """
    ids = [e["id"] for e in entries]
    if configured is not None:
        for entry in entries:
            if entry["id"] == configured:
                return entry, None
        return None, f"the server serves {', '.join(ids) or 'no models'}, not {configured!r} (options.model)"
    for entry in entries:
        if entry["id"] == public:
            return entry, None
    if not entries:
        return None, "the server lists no models in /v1/models"
    if len({e.get("root") or e["id"] for e in entries}) == 1:
        return entries[0], None
    return None, f"the server serves several models ({', '.join(ids)}); set options.model"


class VllmBackend(OpenAIEngine):
    kind: ClassVar[str] = "vllm"
    discovery: ClassVar[str | None] = "GET /v1/models"

    def __init__(self, spec: EndpointSpec) -> None:
        opts = spec.options
        assert isinstance(opts, VllmOptions)
        # The openai backend forwards to an API root; ours is the server root (for /health
        # and /metrics), so it gets its own options with every field it knows, at /v1.
        api = OpenAIOptions.model_validate(
            {
                **{name: getattr(opts, name) for name in OpenAIOptions.model_fields},
                "base_url": f"{opts.base_url}/v1",
                "health_path": "/models",
            }
        )
        super().__init__(replace(spec, options=api))
        self.vllm_options = opts
        self.public_model = spec.model
        self._models_url = f"{opts.base_url}/v1/models"
        self._health_url = opts.base_url + opts.health_path
        self._metrics_url = opts.base_url + opts.metrics_path
        self.prober = Prober(
            lambda: self._session, probe_headers(opts.headers, opts.api_key), opts.probe_timeout_s
        )
        self.served_model: str | None = None
        """The upstream model name once ``/v1/models`` confirmed it."""
        self.model_problem: str | None = None
        """Why ``/v1/models`` did not settle the served model (health reports it)."""
        self._send_model = opts.model or spec.model  # until /v1/models says otherwise
        self._forward_priority = opts.forward_priority
        self._salt_key: bytes | None = None
        if opts.cache_salt == "tenant":
            secret = opts.cache_salt_secret
            key = secret.get_secret_value().encode() if secret is not None else _PROCESS_SECRET
            # BLAKE2b takes keys of up to 64 bytes; a longer secret is hashed down to one.
            self._salt_key = key if len(key) <= 64 else hashlib.blake2b(key).digest()
        self._salts: dict[str, str] = {}

    # -- lifecycle and probes ---------------------------------------------------------------

    # start() (the openai backend's) runs discover() once: the served model and, unless
    # configured, max_model_len, from /v1/models.

    def _discovery_failed(self, problem: str) -> None:
        self.model_problem = problem

    def _model_name(self) -> str:
        return self._send_model

    async def discover(self) -> None:
        """Read ``/v1/models``: settle the upstream model name and, unless configured, the
        endpoint's ``max_model_len``. Raises on transport errors and non-200 answers."""
        data = await self.prober.fetch_json(self._models_url, "GET /v1/models")
        listed = data.get("data") if isinstance(data, dict) else None
        entries = [e for e in listed or () if isinstance(e, dict) and isinstance(e.get("id"), str)]
        entry, self.model_problem = choose_model(entries, self.vllm_options.model, self.public_model)
        if entry is None:
            return
        self.served_model = self._send_model = entry["id"]
        if self.max_model_len is None and isinstance(entry.get("max_model_len"), int):
            self.max_model_len = entry["max_model_len"]

    async def health(self) -> Health:
        """``/health`` answers 200, and the served model is known (``/v1/models`` is read
        until it is)."""
        pending = self._read_served_model if self.served_model is None else None
        return await self.prober.health(self._health_url, started=self._session is not None, pending=pending)

    async def _read_served_model(self) -> str | None:
        await self.discover()
        return None if self.served_model is not None else self.model_problem or "no served model"

    async def load(self) -> EndpointLoad:
        """The engine's load from ``/metrics``. Raises when the page cannot be read or holds
        no vLLM load series; the gateway then ages the last snapshot."""
        raw = await self.prober.fetch(self._metrics_url, f"GET {self.vllm_options.metrics_path}")
        return parse_vllm_metrics(raw)

    # -- the request body -------------------------------------------------------------------

    def salt(self, tenant: str) -> str:
        """The ``cache_salt`` sent for ``tenant`` (memoised: one hash per tenant, not per
        request)."""
        salt = self._salts.get(tenant)
        if salt is None:
            assert self._salt_key is not None
            if len(self._salts) >= _MAX_SALTS:
                self._salts.clear()
            salt = self._salts[tenant] = tenant_salt(self._salt_key, tenant)
        return salt

    def prepare_body(self, req: InferenceRequest) -> dict[str, Any]:
        """The client's body as forwarded: served model name, ``priority`` and ``cache_salt``
        set (or removed) by the options. A shallow copy; ``req.body`` is left alone."""
        body = dict(req.body)
        body["model"] = self._send_model
        if self._forward_priority:
            body["priority"] = req.priority
        else:
            body.pop("priority", None)
        if self._salt_key is not None:
            body["cache_salt"] = self.salt(req.principal.tenant)
        return body

    def _payload(self, req: InferenceRequest, stream: bool) -> bytes:
        # The openai backend's body hook: it adds stream options and encodes.
        return super()._payload(msgspec.structs.replace(req, body=self.prepare_body(req)), stream)
