"""Hardware probes: what accelerators and CPU this machine has, and how busy they are.

The built-in probes (``nvidia`` through NVML, ``ascend`` through torch_npu or ``npu-smi``,
``cpu`` from ``/proc``) register through the ``register_hardware`` hook like any plugin;
:func:`probe_all` runs them, :func:`hardware_snapshot` turns the reports into JSON-able data
for ``shuniu hardware --json`` and the gateway's ``/admin/hardware``. See docs/hardware.md.

The probes' own helpers (visible-device mapping) are exported here too, for backends that
read their engine's devices, and loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shuniu.core.contracts import DeviceReading, HardwareProbe, ProbeReport
from shuniu.core.lazy import lazy_exports
from shuniu.core.observability.hardware import (
    hardware_snapshot,
    hardware_snapshot_async,
    probe_all,
    probe_all_async,
    run_probe,
)

if TYPE_CHECKING:
    from shuniu.hardware.ascend import AscendProbe, map_ascend_visible_devices
    from shuniu.hardware.nvidia import NvidiaProbe, map_cuda_visible_devices

__all__ = [
    "AscendProbe",
    "DeviceReading",
    "HardwareProbe",
    "NvidiaProbe",
    "ProbeReport",
    "hardware_snapshot",
    "hardware_snapshot_async",
    "map_ascend_visible_devices",
    "map_cuda_visible_devices",
    "probe_all",
    "probe_all_async",
    "run_probe",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AscendProbe": "shuniu.hardware.ascend",
        "map_ascend_visible_devices": "shuniu.hardware.ascend",
        "NvidiaProbe": "shuniu.hardware.nvidia",
        "map_cuda_visible_devices": "shuniu.hardware.nvidia",
    },
)
