"""Options of the ``trtllm`` backend.

One backend kind serves the two ways TensorRT-LLM is put behind HTTP: ``trtllm-serve`` (an
OpenAI-compatible server, ``api: openai``) and Triton Inference Server's generate extension
in front of a TensorRT-LLM model repository (``api: triton``). The options extend the
``openai`` backend's (API key, extra headers, timeouts, connection pool); the fields that
only make sense for one of the two APIs say so.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from shuniu.backends.http import OpenAIOptions, server_root, url_path
from shuniu.core.config import Options

__all__ = ["ChatTemplate", "TrtllmOptions"]


class ChatTemplate(Options):
    """How chat messages become the one prompt string Triton's generate endpoint takes
    (``api: triton`` only; ``trtllm-serve`` applies the model's own template).

    ``{role}`` and ``{content}`` are replaced literally (not ``str.format``), so other
    braces in the template or in messages need no escaping."""

    message: str
    """Template of one message, e.g. ``"<|im_start|>{role}\\n{content}<|im_end|>\\n"``."""
    roles: dict[str, str] = Field(default_factory=dict)
    """Per-role templates that replace ``message`` for that role (``system``, ``user``,
    ``assistant``, ``tool``), for formats that mark roles differently."""
    prefix: str = ""
    """Text before the first message, e.g. ``"<|begin_of_text|>"``."""
    generation_prompt: str = ""
    """Text after the last message that opens the assistant's turn, e.g.
    ``"<|im_start|>assistant\\n"``."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings added to every chat request (the end-of-turn marker when the engine's
    ``end_id`` is not it), e.g. ``["<|im_end|>"]``."""

    @field_validator("message")
    @classmethod
    def _has_content(cls, value: str) -> str:
        if "{content}" not in value:
            raise ValueError("must contain {content}")
        return value


class TrtllmOptions(OpenAIOptions):
    launch_base_url: ClassVar[str] = "http://{host}:{port}"
    """``base_url`` of an engine shuniu launches (``launch:``) when none is given: the server root."""

    base_url: str
    """The server's address, e.g. ``http://127.0.0.1:8000``: ``trtllm-serve``'s root (a
    trailing ``/v1`` is accepted and dropped) or Triton's HTTP endpoint (its
    ``--http-port``). May be left out when the entry has ``launch:``."""
    api: Literal["openai", "triton"] = "openai"
    """``openai``: ``trtllm-serve``'s OpenAI-compatible API (chat and completions forwarded
    as sent). ``triton``: Triton Inference Server's generate extension
    (``/v2/models/{triton_model}/generate_stream``) in front of a TensorRT-LLM model."""
    model: str | None = None
    """``api: openai``: the model name ``trtllm-serve`` serves. Default: read from
    ``/v1/models`` (the pool's own name when served, else the server's only model).
    Ignored with ``api: triton`` (see ``triton_model``)."""
    health_path: str | None = None  # type: ignore[assignment]
    """Path under ``base_url`` probed by health checks. Default: ``/health`` for
    ``trtllm-serve`` (200 while the executor is alive, 503 once it died),
    ``/v2/health/ready`` for Triton (the model's own ``/v2/models/{triton_model}/ready`` is
    probed too)."""
    probe_timeout_s: float = Field(2.0, gt=0)
    """Longest wait for a health, model-list or metadata probe, and for a Prometheus scrape."""
    load_from: Literal["auto", "stats", "prometheus", "none"] = "auto"
    """Where the engine's own load is read. ``stats``: ``trtllm-serve``'s JSON iteration
    statistics (``stats_path``), read by a background poller. ``prometheus``: Prometheus
    text (``metrics_url``): ``trtllm-serve``'s ``/prometheus/metrics`` (servers run with
    ``return_perf_metrics: true``) or Triton's metrics port. ``none``: no engine load; the
    gateway balances on its own in-flight counts. ``auto``: for ``api: openai``,
    ``prometheus`` when ``/prometheus/metrics`` publishes TensorRT-LLM's load gauges (the
    server then drains the statistics itself), else ``stats``; for ``api: triton``,
    ``prometheus``."""
    stats_path: str = "/metrics"
    """``trtllm-serve``'s JSON iteration statistics endpoint (``load_from: stats``)."""
    stats_timeout_s: float = Field(10.0, gt=0)
    """Longest wait for one ``stats_path`` answer. ``trtllm-serve`` holds the request open
    until no new iteration arrived for 2 s, so answers are slow by design."""
    stats_max_age_s: float = Field(5.0, gt=0)
    """A statistics snapshot older than this is not reported (the gateway then ages the
    last one and falls back to its own counts)."""
    metrics_url: str | None = None
    """Full URL of the Prometheus page (``load_from: prometheus``). Default:
    ``{base_url}/prometheus/metrics`` for ``trtllm-serve``; for Triton, ``base_url``'s host
    at its port plus ``metrics_port_offset``, path ``/metrics``."""
    metrics_port_offset: int = Field(2, ge=-65535, le=65535)
    """``api: triton``: Triton's metrics port minus its HTTP port, when ``metrics_url`` is
    not given. Triton's defaults (8000 and 8002) make it 2."""
    metrics_model: str | None = None
    """``api: triton``: only read metric series whose ``model`` label is this (e.g.
    ``tensorrt_llm``), for a Triton hosting several TensorRT-LLM models. Default: every
    series is summed."""
    forward_priority: bool = False
    """``api: openai``: send the scheduler's priority as ``trtllm-serve``'s ``priority``
    (a number in 0..1, higher first; only honoured by servers run with
    ``scheduler_config.waiting_queue_policy: priority``), mapped so that the gateway's
    priority 0 is the engine's default 0.5 and smaller gateway priorities rank higher. When
    off, a ``priority`` the client sent is removed (``trtllm-serve`` rejects vLLM-style
    integer priorities, and clients must not reorder the engine's queue)."""
    triton_model: str = "ensemble"
    """``api: triton``: the Triton model requests go to: ``ensemble`` or
    ``tensorrt_llm_bls`` (TensorRT-LLM's inflight-batcher repository), ``tensorrt_llm`` for
    the LLM-API (PyTorch) model repository."""
    triton_inputs: Literal["auto", "ensemble", "llmapi"] = "auto"
    """``api: triton``: the model's input names. ``ensemble``: ``max_tokens``,
    ``temperature``, ``stop_words`` ... (the ``ensemble`` and ``tensorrt_llm_bls`` models).
    ``llmapi``: ``sampling_param_max_tokens`` ... (the LLM-API model). ``auto``: read from
    the model's metadata (``GET /v2/models/{triton_model}``), which also tells whether the
    model can return token counts (``return_num_output_tokens``)."""
    default_max_tokens: int = Field(512, ge=1)
    """``api: triton``: ``max_tokens`` sent when the client gives none (TensorRT-LLM's
    ensemble requires one)."""
    accumulate_tokens: bool = False
    """``api: triton``: the ``tensorrt_llm_bls`` model runs with its ``accumulate_tokens``
    parameter on, so each streamed ``text_output`` holds the whole text so far; the
    backend forwards only what is new."""
    chat_template: ChatTemplate | None = None
    """``api: triton``: how chat messages are turned into the prompt text. Without it, chat
    requests are refused with 400 (Triton's generate endpoint takes raw text)."""

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return server_root(value)

    @field_validator("metrics_url")
    @classmethod
    def _metrics_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value

    @field_validator("health_path", "stats_path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        return url_path(value)

    @model_validator(mode="after")
    def _per_api(self) -> TrtllmOptions:
        if self.api == "triton" and self.load_from == "stats":
            raise ValueError("load_from: stats is trtllm-serve's JSON endpoint; Triton has prometheus")
        return self

    # -- derived values -------------------------------------------------------------------

    @property
    def load_source(self) -> Literal["stats", "prometheus", "none"]:
        """``load_from`` with ``auto`` resolved for the API."""
        if self.load_from == "auto":
            return "stats" if self.api == "openai" else "prometheus"
        return self.load_from

    @property
    def health_url(self) -> str:
        default = "/health" if self.api == "openai" else "/v2/health/ready"
        return self.base_url + (self.health_path or default)

    @property
    def prometheus_url(self) -> str:
        """Where ``load_from: prometheus`` scrapes."""
        if self.metrics_url is not None:
            return self.metrics_url
        if self.api == "openai":
            return f"{self.base_url}/prometheus/metrics"
        from urllib.parse import urlsplit

        parts = urlsplit(self.base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or "127.0.0.1"
        if ":" in host:  # an IPv6 literal goes back into brackets
            host = f"[{host}]"
        return f"{parts.scheme}://{host}:{port + self.metrics_port_offset}/metrics"
