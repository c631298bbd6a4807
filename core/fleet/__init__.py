"""Routing state shared by the gateways of a fleet (``fleet:``): see :mod:`.sync`."""

from __future__ import annotations

from shuniu.core.fleet.hub import FleetTransport, MemoryHub
from shuniu.core.fleet.sync import FleetBatch, FleetSync

__all__ = ["FleetBatch", "FleetSync", "FleetTransport", "MemoryHub"]
