"""The ``ascend`` backend: vllm-ascend through the vLLM adapter, or MindIE Service through
its vLLM-compatible OpenAI API, each with the NPU readings of its engine.

``engine: vllm-ascend`` is the ``vllm`` backend unchanged (vllm-ascend is a platform plugin
of vLLM: the API server, ``/health``, ``/metrics``, ``priority`` and ``cache_salt`` are
vLLM's own), plus :meth:`devices`.

``engine: mindie`` reuses the same request path (pooled aiohttp, the body forwarded as sent,
``/v1/models`` discovery) and changes what MindIE does differently
(docs/backends/ascend.md has the sources):

- its planes: health probes on the management port, ``/metrics`` on the metrics port, the
  OpenAI API on the business port (one port for all when configured so);
- its load page: vLLM's old metric names without the ``vllm:`` prefix;
- its errors: ``{"error": "...", "error_type": "Input Validation Error"}`` with 422 or 424
  for requests it refuses, which clients get as OpenAI-style 400s;
- its streams: usage in the last chunk, and a failure after the first byte written into
  the body *raw* (no ``data:`` framing, no ``[DONE]``) before the stream ends normally, so a
  stream that ends without ``[DONE]`` is an error here, with MindIE's words in it;
- its context window: ``maxSeqLen`` from the management plane's ``/v1/config``, since its
  ``/v1/models`` has no ``max_model_len``;
- no per-request ``priority`` or ``cache_salt`` on its OpenAI API: neither is sent, and
  ``max_completion_tokens`` (which MindIE does not read) is sent as ``max_tokens``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, ClassVar

import msgspec

from shuniu.backends.ascend.metrics import parse_mindie_metrics
from shuniu.backends.ascend.npu import DeviceSelection, endpoint_report, read_npus, select_devices
from shuniu.backends.ascend.options import AscendOptions
from shuniu.backends.http import (
    PROBE_ERRORS,
    STREAM_BREAKS,
    ProbeError,
    SseLines,
    data_payload,
    end_stream,
    stream_broken,
)
from shuniu.backends.vllm import VllmBackend
from shuniu.core.contracts import GENERATION, DeviceReading, EndpointSpec, ProbeReport
from shuniu.core.errors import GatewayError, upstream_error
from shuniu.core.types import Chunk, EndpointLoad, InferenceRequest

__all__ = ["AscendVllmBackend", "MindieBackend", "build_backend", "mindie_error_message"]

_STRAY_LIMIT = 2048
"""Bytes of unframed stream text kept for the error message (MindIE's raw error)."""


def mindie_error_message(raw: bytes) -> tuple[str, str | None]:
    """The message and ``error_type`` of a MindIE error body.

    MindIE answers ``{"error": "<message>", "error_type": "<kind>"}``; its health probes
    ``{"message": "..."}``; its TGI-style ``/generate`` ``{"Error": ...}``. Anything else
    (an OpenAI-style body from a proxy in front, plain text) is read as well as it can be.
    """
    text = raw[:1000].decode("utf-8", "replace").strip()
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return text, None
    if not isinstance(body, dict):
        return text, None
    error = body.get("error", body.get("Error"))
    kind = body.get("error_type")
    kind = kind if isinstance(kind, str) else None
    if isinstance(error, str):
        return error, kind
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"], kind or (error.get("type") if isinstance(error.get("type"), str) else None)
    if isinstance(body.get("message"), str):
        return body["message"], kind
    return text, kind


class _NpuDevices:
    """:meth:`devices` for both engines: the endpoint's NPUs through ``npu-smi``."""

    name: str
    device_selection: DeviceSelection
    _device_max_age_s: float

    def _init_devices(self, options: AscendOptions, spec: EndpointSpec) -> None:
        self.device_selection = select_devices(options.devices, spec.extra)
        self._device_max_age_s = options.device_max_age_s

    async def device_report(self) -> ProbeReport:
        """The Ascend probe's report narrowed to this endpoint's NPUs (renumbered as the
        engine sees them), or an unavailable report saying why there are none."""
        if not self.device_selection.local:
            return endpoint_report(
                ProbeReport(probe="ascend", available=True), self.device_selection, self.name
            )
        try:
            report = await read_npus(self._device_max_age_s)
        except Exception as exc:  # the probe reports its own failures; this is a bug's net
            report = ProbeReport.unavailable(
                "ascend", f"the Ascend probe failed: {type(exc).__name__}: {exc}"
            )
        return endpoint_report(report, self.device_selection, self.name)

    async def devices(self) -> list[DeviceReading]:
        """This endpoint's NPUs: memory (HBM) used and total, AI Core usage, temperature,
        power and health, as ``npu-smi info`` reports them. Empty when the engine is remote
        or the machine has no readable NPU (``device_report()`` says why)."""
        return list((await self.device_report()).devices)


def _resolved(spec: EndpointSpec) -> tuple[AscendOptions, EndpointSpec]:
    opts = spec.options
    assert isinstance(opts, AscendOptions)
    # The vllm backend reads health_path as a path; give it the engine's default.
    resolved = opts.model_copy(update={"health_path": opts.engine_health_path()})
    return opts, replace(spec, options=resolved)


class AscendVllmBackend(_NpuDevices, VllmBackend):
    """``engine: vllm-ascend``: the ``vllm`` backend, plus the endpoint's NPU readings."""

    kind: ClassVar[str] = "ascend"

    def __init__(self, spec: EndpointSpec) -> None:
        opts, resolved = _resolved(spec)
        super().__init__(resolved)
        self.ascend_options = opts
        self._init_devices(opts, spec)


class MindieBackend(_NpuDevices, VllmBackend):
    """``engine: mindie``: MindIE Service's OpenAI API, health probes and metrics."""

    kind: ClassVar[str] = "ascend"
    serves: frozenset[str] = GENERATION  # MindIE Service has no embeddings or rerank API

    def __init__(self, spec: EndpointSpec) -> None:
        opts, resolved = _resolved(spec)
        super().__init__(resolved)
        self.ascend_options = opts
        self._init_devices(opts, spec)
        # The business plane (base_url) serves /v1/*; the others may be elsewhere.
        self._health_url = opts.management_root() + opts.engine_health_path()
        self._metrics_url = opts.metrics_root() + opts.metrics_path
        self._config_url = opts.management_root() + "/v1/config"
        # MindIE Service has no vLLM-style /tokenize: `tokenizer: engine` cannot ask it.
        self._tokenize_url = None
        self.tokenizes = False

    # -- probes -----------------------------------------------------------------------------

    async def discover(self) -> None:
        """``/v1/models`` for the served name, then, unless the context window is known,
        ``maxSeqLen`` from the management plane's ``/v1/config`` (quietly: older MindIE
        releases, or a management plane out of reach, just leave it unknown)."""
        await super().discover()
        if self.max_model_len is None and self.served_model is not None:
            self.max_model_len = await self._max_seq_len()

    async def _max_seq_len(self) -> int | None:
        try:
            status, raw = await self.prober.get(self._config_url)
            if status != 200:
                return None
            data = msgspec.json.decode(raw)
        except (ProbeError, *PROBE_ERRORS):
            return None
        value = data.get("maxSeqLen") if isinstance(data, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    async def load(self) -> EndpointLoad:
        """The engine's load from MindIE's ``/metrics``. Raises when the page cannot be read
        (MindIE answers 500 unless started with ``MIES_SERVICE_MONITOR_MODE=1``; its message
        is in the error) or holds no load series; the gateway then ages the last snapshot."""
        status, raw = await self.prober.get(self._metrics_url)
        if status != 200:
            message, _ = mindie_error_message(raw)
            path = self.ascend_options.metrics_path
            raise ProbeError(f"GET {path}: HTTP {status}" + (f": {message}" if message else ""))
        return parse_mindie_metrics(raw)

    # -- requests ---------------------------------------------------------------------------

    def prepare_body(self, req: InferenceRequest) -> dict[str, Any]:
        """The client's body with the served model name; ``priority`` removed (MindIE's
        OpenAI API does not take one, and a future one would reject 0) and
        ``max_completion_tokens`` sent as ``max_tokens`` (the only limit MindIE reads;
        without it MindIE generates up to its ``maxIterTimes``)."""
        body = dict(req.body)
        body["model"] = self._send_model
        body.pop("priority", None)
        if "max_completion_tokens" in body:
            limit = body.pop("max_completion_tokens")
            body.setdefault("max_tokens", limit)
        return body

    def _error(self, status: int, raw: bytes) -> GatewayError:
        message, kind = mindie_error_message(raw)
        if status in (400, 422, 424):
            # Validation (422 "Input Validation Error") and refused generation parameters
            # (424 "Generation Error"): the client's request, as MindIE saw it.
            code = kind.lower().replace(" ", "_") if kind else None
            return GatewayError(400, message or f"The engine refused the request (HTTP {status}).", code=code)
        detail = f": {message}" if message else ""
        return upstream_error(
            f"The engine endpoint {self.name} answered HTTP {status}{detail}", 503 if status == 503 else 502
        )

    async def stream(self, req: InferenceRequest) -> AsyncIterator[Chunk]:  # type: ignore[override]
        """MindIE's SSE stream. Unlike vLLM, MindIE reports a failure after the first byte
        by writing its message unframed into the body and ending the stream cleanly, with no
        ``[DONE]``; so lines outside the SSE framing are kept, and a stream that ends
        without ``[DONE]`` raises with them."""
        resp = await self._post(req, stream=True)
        chat = req.api == "chat"
        complete = False
        stray = bytearray()
        try:
            async for line in SseLines(resp.content):
                payload = data_payload(line)
                if payload is None:
                    text = line.strip()
                    if text and len(stray) < _STRAY_LIMIT:
                        stray += text[: _STRAY_LIMIT - len(stray)] + b" "
                    continue
                if payload == b"[DONE]":
                    await resp.read()
                    complete = True
                    return
                chunk = self._event_chunk(payload, chat)
                if chunk is not None:
                    yield chunk
            said, _ = mindie_error_message(bytes(stray).strip()) if stray else ("", None)
            raise upstream_error(
                f"The engine endpoint {self.name} ended the stream without finishing"
                + (f": {said}" if said else ".")
            )
        except STREAM_BREAKS as exc:
            raise stream_broken(self.name, exc) from None
        finally:
            # Dropping the connection is how MindIE learns to stop the generation.
            end_stream(resp, complete)


def build_backend(spec: EndpointSpec) -> AscendVllmBackend | MindieBackend:
    """The backend for ``spec``'s engine."""
    opts = spec.options
    assert isinstance(opts, AscendOptions)
    return MindieBackend(spec) if opts.engine == "mindie" else AscendVllmBackend(spec)
