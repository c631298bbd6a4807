"""Constants the hardware probes share. What a probe reports (:class:`ProbeReport`,
:class:`DeviceReading`) and the probe contract (:class:`HardwareProbe`) are in
:mod:`shuniu.core.contracts`."""

from __future__ import annotations

__all__ = ["MIB"]

MIB = 1024 * 1024
