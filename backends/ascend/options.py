"""Options of the ``ascend`` backend.

They extend the ``vllm`` backend's options (and through them the ``openai`` backend's: API
key, extra headers, timeouts, connection pool), since with ``engine: vllm-ascend`` the
backend *is* the vLLM adapter, and MindIE Service's OpenAI API is close enough to vLLM's that
the same request path serves it. What is Ascend's own: which engine, where MindIE keeps its
management and metrics planes, and which NPUs the endpoint's engine runs on.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from shuniu.backends.http import http_url, url_path
from shuniu.backends.vllm import VllmOptions

__all__ = ["ENGINE_HEALTH_PATHS", "AscendOptions", "Engine"]

Engine = Literal["vllm-ascend", "mindie"]

ENGINE_HEALTH_PATHS: dict[str, str] = {"vllm-ascend": "/health", "mindie": "/v2/health/live"}
"""The health probe of each engine when ``health_path`` is not set. MindIE's ``/health`` is
documented as about to be retired (MindIE 3.x), and its ``/v2/health/ready`` answers 503
while the engine is merely busy, which would take a loaded replica out of balancing;
``/v2/health/live`` answers 200 while the engine can serve, busy or not."""


class AscendOptions(VllmOptions):
    launch_base_url: ClassVar[str] = "http://{host}:{port}"
    """``base_url`` of an engine shuniu launches (``launch:``) when none is given: the server root."""

    engine: Engine = "vllm-ascend"
    """The engine behind the endpoint. ``vllm-ascend``: vLLM with the vllm-ascend platform
    plugin (vLLM's own API, ``/health`` and ``/metrics``; everything the ``vllm`` backend
    does applies). ``mindie``: MindIE Service (``mindieservice_daemon``) through its
    vLLM-compatible OpenAI API (``/v1/chat/completions``, ``/v1/completions``), its health
    probes and its Prometheus ``/metrics``."""
    base_url: str
    """The server's address. ``vllm-ascend``: the server root, e.g.
    ``http://10.0.0.7:8000``. ``mindie``: the business plane (``ipAddress`` and ``port`` of
    MindIE's ``config.json``, port 1025 by default), e.g. ``http://10.0.0.7:1025``. A trailing
    ``/v1`` is accepted and dropped. May be left out when the entry has ``launch:``."""
    health_path: str | None = None
    """Path probed by health checks. Default: ``/health`` for vllm-ascend; for mindie
    ``/v2/health/live`` on ``management_url`` (200 while the service can serve, busy or not;
    503 while starting or stopped; 500 when a node is abnormal)."""
    management_url: str | None = None
    """mindie only: MindIE's management plane, where its health probes and ``/v1/config``
    live (``managementIpAddress`` and ``managementPort`` of ``config.json``, port 1026 by
    default), e.g. ``http://10.0.0.7:1026``. Default: ``base_url``, which is right when
    MindIE runs with one address and one port for every plane (as a launched engine should)."""
    metrics_url: str | None = None
    """mindie only: where MindIE serves its Prometheus ``/metrics`` (``managementIpAddress``
    and ``metricsPort``, port 1027 by default). Default: ``management_url``. MindIE only
    answers it when started with ``MIES_SERVICE_MONITOR_MODE=1``."""
    devices: list[int] | None = Field(None, min_length=1)
    """NPUs of this endpoint's engine, as logical device ids of the gateway's machine (what
    ``npu-smi info`` lists and ``ASCEND_RT_VISIBLE_DEVICES`` takes), in the order the engine
    numbers them, e.g. ``[4, 5, 6, 7]``. Only for engines on the gateway's own machine:
    ``devices()`` reads them with ``npu-smi``. Default: the ``ASCEND_RT_VISIBLE_DEVICES`` of
    the entry's ``launch.env`` when the gateway passes it on, every NPU for a launched engine
    without it, and none for a remote engine."""
    device_max_age_s: float = Field(5.0, ge=0)
    """How long one ``npu-smi info`` reading is reused (one run serves every endpoint of the
    gateway); 0 reads afresh each time."""

    @field_validator("health_path", "metrics_path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        return url_path(value)

    @field_validator("management_url", "metrics_url")
    @classmethod
    def _plane_url(cls, value: str | None) -> str | None:
        return None if value is None else http_url(value)

    @field_validator("devices")
    @classmethod
    def _devices(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if any(d < 0 for d in value):
            raise ValueError("device ids are 0 or more")
        if len(set(value)) != len(value):
            raise ValueError("a device is listed twice")
        return value

    @model_validator(mode="after")
    def _engine_fields(self) -> AscendOptions:
        if self.engine == "vllm-ascend":
            for name in ("management_url", "metrics_url"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name} is for engine: mindie; vllm-ascend serves everything under base_url"
                    )
        elif self.forward_priority:
            # MindIE's OpenAI endpoints take no per-request priority (only its native /infer
            # and Triton-style APIs do), so forwarding one would do nothing.
            raise ValueError("forward_priority is not supported with engine: mindie")
        return self

    def engine_health_path(self) -> str:
        """``health_path``, or the engine's default probe."""
        return self.health_path or ENGINE_HEALTH_PATHS[self.engine]

    def management_root(self) -> str:
        """Where MindIE's management plane answers."""
        return self.management_url or self.base_url

    def metrics_root(self) -> str:
        """Where MindIE's metrics plane answers."""
        return self.metrics_url or self.management_root()
