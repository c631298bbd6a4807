"""The hardware-probe contract, and what a probe reports: one :class:`ProbeReport` per
probe, one :class:`DeviceReading` per device it found.

A ``register_hardware`` hook registers ``factory(options) -> HardwareProbe``. The gateway
runs the probes for ``/admin/hardware`` and ``/metrics`` (each in a worker thread, at most
once per two seconds) and ``shuniu hardware`` runs them from the command line.

Both report types are frozen msgspec structs, so a report turns into JSON
(``msgspec.json.encode``) or plain Python (``msgspec.to_builtins``) without hand-written
conversion.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import msgspec

__all__ = ["DeviceReading", "HardwareProbe", "ProbeReport"]


class DeviceReading(msgspec.Struct, frozen=True, kw_only=True):
    """One device as a probe saw it at one moment. ``None`` means "not reported"."""

    kind: str
    """``nvidia``, ``ascend`` or ``cpu`` for the built-in probes."""
    index: int
    """The device's number in the probe's own enumeration: the NVML index (PCI bus order,
    ignoring ``CUDA_VISIBLE_DEVICES``), the NPU logical device id (what
    ``ASCEND_RT_VISIBLE_DEVICES`` lists), or 0 for the CPU."""
    visible_index: int | None
    """The number a process with this environment would use for the device (``cuda:N``,
    ``npu:N``) after ``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES``; ``None``
    when those variables hide it."""
    name: str
    uuid: str | None = None
    bus_id: str | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization: float | None = None
    """Busy fraction, 0 to 1 (GPU utilization, NPU AI Core usage, CPU load per core)."""
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    """Probe-specific readings (health, chip ids, MIG mode, per-field errors ...)."""


class ProbeReport(msgspec.Struct, frozen=True, kw_only=True):
    """The result of running one probe. A probe whose library, tool or driver is missing
    says so in :attr:`reason` instead of raising."""

    probe: str
    available: bool
    source: str | None = None
    """Where the readings came from: ``nvml``, ``torch_npu``, ``npu-smi``, ``procfs``."""
    reason: str | None = None
    """Why the probe is unavailable (``None`` when it is available)."""
    devices: list[DeviceReading] = msgspec.field(default_factory=list)
    warnings: list[str] = msgspec.field(default_factory=list)
    """Caveats about the readings, e.g. a visible-devices mapping that may be inexact."""
    info: dict[str, Any] = msgspec.field(default_factory=dict)
    """Facts about the probe's source: driver version, ``npu-smi`` version, load average."""
    duration_ms: float | None = None
    """How long the probe took (filled in by the probe runner)."""

    @classmethod
    def unavailable(
        cls, probe: str, reason: str, *, source: str | None = None, warnings: list[str] | None = None
    ) -> ProbeReport:
        return cls(probe=probe, available=False, source=source, reason=reason, warnings=warnings or [])


@runtime_checkable
class HardwareProbe(Protocol):
    """What a ``register_hardware`` factory returns: ``factory(options)`` → a probe.

    ``probe()`` is synchronous (the gateway runs it in a worker thread) and must not raise
    for a missing library, tool or driver (return :meth:`ProbeReport.unavailable`); the
    runner still turns an unexpected exception into an unavailable report.
    """

    def probe(self) -> ProbeReport: ...
