"""Hardware probes: what accelerators and CPU this machine has, and how busy they are.

The built-in probes (``nvidia`` through NVML, ``ascend`` through torch_npu or ``npu-smi``,
``cpu`` from ``/proc``) register through the ``register_hardware`` hook like any plugin;
:func:`probe_all` runs them, :func:`hardware_snapshot` turns the reports into JSON-able data
for ``shuniu hardware --json`` and the gateway's ``/admin/hardware``. See docs/hardware.md.
"""

from __future__ import annotations

from shuniu.core.contracts import DeviceReading, HardwareProbe, ProbeReport
from shuniu.core.observability.hardware import (
    hardware_snapshot,
    hardware_snapshot_async,
    probe_all,
    probe_all_async,
    run_probe,
)

__all__ = [
    "DeviceReading",
    "HardwareProbe",
    "ProbeReport",
    "hardware_snapshot",
    "hardware_snapshot_async",
    "probe_all",
    "probe_all_async",
    "run_probe",
]
