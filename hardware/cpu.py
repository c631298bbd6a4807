"""``cpu``: the host CPU and memory, read from ``/proc`` (no psutil).

Reported as one device: the model name from ``/proc/cpuinfo``, logical cores (all, and
those this process may run on), memory total / available from ``/proc/meminfo``, and the
1-minute load average per usable core as a rough utilization. Where ``/proc`` is missing
(not Linux) the probe still answers with what the standard library knows.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from shuniu.core import hookimpl
from shuniu.core.contracts import DeviceReading, HardwareProbe, ProbeReport, RegisterHardwareProbe

__all__ = ["CpuProbe", "read_meminfo", "read_model_name"]

NAME = "cpu"

# x86 prints "model name"; many Arm kernels print no model name at all, some "Model"
# (Raspberry Pi) or "Hardware".
_MODEL_KEYS = ("model name", "Model", "Hardware", "cpu model", "Processor")


def read_model_name(text: str) -> str | None:
    """The CPU model named in ``/proc/cpuinfo`` text, if any."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key in _MODEL_KEYS and value.strip() and key not in found:
            found[key] = value.strip()
            if key == "model name":
                break
    return next((found[k] for k in _MODEL_KEYS if k in found), None)


def read_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as bytes (its ``kB`` are KiB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if sep and parts and parts[0].isdigit():
            scale = 1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1
            out[key.strip()] = int(parts[0]) * scale
    return out


def _cgroup_limits(root: Path) -> dict[str, float | int]:
    """cgroup v2 limits of this container, when set (a CPU quota and a memory cap are what
    an engine here really gets, whatever the host has)."""
    out: dict[str, float | int] = {}
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota != "max":
            out["cgroup_cpu_limit"] = int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        memory = (root / "memory.max").read_text().strip()
        if memory != "max":
            out["cgroup_memory_limit_bytes"] = int(memory)
    except (OSError, ValueError):
        pass
    return out


class CpuProbe(HardwareProbe):
    """The host CPU as one device."""

    def __init__(
        self, options: object | None = None, *, proc: Path = Path("/proc"), cgroup: Path | None = None
    ):
        self._proc = proc
        self._cgroup = cgroup if cgroup is not None else Path("/sys/fs/cgroup")

    def probe(self) -> ProbeReport:
        warnings: list[str] = []
        try:
            cpuinfo = (self._proc / "cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
        try:
            meminfo = read_meminfo((self._proc / "meminfo").read_text(errors="replace"))
        except OSError:
            meminfo = {}
            warnings.append(f"{self._proc / 'meminfo'} is not readable: memory is not reported")
        name = read_model_name(cpuinfo) or platform.processor() or platform.machine() or "unknown CPU"
        logical = os.cpu_count() or 1
        try:
            usable = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not on every platform
            usable = logical
        total = meminfo.get("MemTotal")
        available = meminfo.get("MemAvailable", meminfo.get("MemFree"))
        used = total - available if total is not None and available is not None else None
        utilization = None
        info: dict[str, object] = {"logical_cores": logical, "usable_cores": usable}
        try:
            load1, load5, load15 = os.getloadavg()
        except (AttributeError, OSError):
            pass
        else:
            # Load counts runnable (and, on Linux, uninterruptible) tasks: per core it is a
            # rough busy fraction, capped at 1 when the machine is oversubscribed.
            utilization = min(load1 / usable, 1.0)
            info["load_average"] = [load1, load5, load15]
        extra: dict[str, object] = {
            "logical_cores": logical,
            "usable_cores": usable,
            "architecture": platform.machine(),
        }
        if available is not None:
            extra["memory_available_bytes"] = available
        extra.update(_cgroup_limits(self._cgroup))
        device = DeviceReading(
            kind=NAME,
            index=0,
            visible_index=0,
            name=name,
            memory_used_bytes=used,
            memory_total_bytes=total,
            utilization=utilization,
            extra=extra,
        )
        return ProbeReport(
            probe=NAME,
            available=True,
            source="procfs" if meminfo else "stdlib",
            devices=[device],
            warnings=warnings,
            info=info,
        )


@hookimpl
def register_hardware(register: RegisterHardwareProbe) -> None:
    register(NAME, CpuProbe, description="The host CPU and memory, from /proc.")
