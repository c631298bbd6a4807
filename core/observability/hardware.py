"""Run the registered hardware probes: :func:`probe_all` (sync, for the CLI),
:func:`probe_all_async` (each probe in a worker thread, for the gateway),
:func:`hardware_snapshot` (the JSON-able body of ``/admin/hardware``), and
:class:`HardwareReadings`, the gateway's cached copy of it (``/admin/hardware``,
``/metrics``).

Probes come from the ``register_hardware`` hook, like every other plugin, so
``SHUNIU_DISABLE_PLUGINS=hw_ascend`` removes the Ascend probe and a third-party
distribution can add its own.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from shuniu.core.contracts import ProbeReport

if TYPE_CHECKING:
    from shuniu.core.contracts import Registration
    from shuniu.core.plugin_manager import PluginManager

__all__ = [
    "DEFAULT_ASYNC_TIMEOUT_S",
    "HardwareReadings",
    "hardware_snapshot",
    "hardware_snapshot_async",
    "probe_all",
    "probe_all_async",
    "run_probe",
]

# Longer than the npu-smi probe's own 10 s limit, short enough for an admin endpoint.
DEFAULT_ASYNC_TIMEOUT_S = 15.0


def _selected(names: Iterable[str] | None, plugins: PluginManager | None) -> list[tuple[str, Registration]]:
    if plugins is None:
        from shuniu.core.plugin_manager import load_plugins

        plugins = load_plugins()
    registered = plugins.registered("hardware")
    if names is None:
        # Accelerators first, then the CPU, each group by name.
        return sorted(registered.items(), key=lambda item: (item[0] == "cpu", item[0]))
    wanted = list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in registered]
    if unknown:
        raise ValueError(
            f"unknown hardware probe(s): {', '.join(unknown)}; "
            f"available: {', '.join(sorted(registered)) or '(none)'}"
        )
    return [(n, registered[n]) for n in wanted]


def run_probe(name: str, registration: Registration) -> ProbeReport:
    """Build and run one probe. Never raises: a failing probe becomes an unavailable report."""
    start = time.perf_counter()
    try:
        options = registration.options() if registration.options is not None else None
        report = registration.factory(options).probe()
        if not isinstance(report, ProbeReport):
            report = ProbeReport.unavailable(
                name,
                f"probe returned {type(report).__name__}, not a ProbeReport (plugin {registration.plugin!r})",
            )
    except Exception as exc:  # a broken probe must not hide the others
        report = ProbeReport.unavailable(name, f"probe failed: {type(exc).__name__}: {exc}")
    return msgspec.structs.replace(
        report, probe=name, duration_ms=round((time.perf_counter() - start) * 1000, 3)
    )


def probe_all(
    names: Iterable[str] | None = None, *, plugins: PluginManager | None = None
) -> list[ProbeReport]:
    """Run every registered probe (or those named), one after the other.

    ``plugins`` defaults to a freshly loaded plugin manager. An unknown name raises
    :class:`ValueError` listing the available probes.
    """
    return [run_probe(name, reg) for name, reg in _selected(names, plugins)]


async def probe_all_async(
    names: Iterable[str] | None = None,
    *,
    plugins: PluginManager | None = None,
    timeout_s: float = DEFAULT_ASYNC_TIMEOUT_S,
) -> list[ProbeReport]:
    """:func:`probe_all` for an event loop: each probe runs in a worker thread
    (``asyncio.to_thread``), all at once, so NVML calls or ``npu-smi`` never block the loop.

    A probe still running after ``timeout_s`` is reported unavailable (its thread cannot be
    stopped; it finishes in the background).
    """
    selected = _selected(names, plugins)

    async def one(name: str, reg: Registration) -> ProbeReport:
        try:
            return await asyncio.wait_for(asyncio.to_thread(run_probe, name, reg), timeout_s)
        except TimeoutError:
            return ProbeReport.unavailable(name, f"probe did not answer within {timeout_s:g} s")

    return list(await asyncio.gather(*(one(n, r) for n, r in selected)))


def _snapshot(reports: list[ProbeReport]) -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "time": time.time(),
        "probes": [msgspec.to_builtins(r) for r in reports],
    }


def hardware_snapshot(
    names: Iterable[str] | None = None, *, plugins: PluginManager | None = None
) -> dict[str, Any]:
    """Every probe's report as plain JSON-able data: ``{"host", "time", "probes": [...]}``
    (what ``shuniu hardware --json`` prints and ``/admin/hardware`` serves)."""
    return _snapshot(probe_all(names, plugins=plugins))


async def hardware_snapshot_async(
    names: Iterable[str] | None = None,
    *,
    plugins: PluginManager | None = None,
    timeout_s: float = DEFAULT_ASYNC_TIMEOUT_S,
) -> dict[str, Any]:
    """:func:`hardware_snapshot` without blocking the event loop (for a gateway handler)."""
    return _snapshot(await probe_all_async(names, plugins=plugins, timeout_s=timeout_s))


_encode = msgspec.json.Encoder().encode
_TTL_S = 2.0
"""Probe at most this often: NVML start-up or ``npu-smi`` per request would be wasteful."""


class HardwareReadings:
    """The gateway's hardware snapshot: probed on demand, at most once per ``ttl_s``."""

    def __init__(self, plugins: PluginManager, ttl_s: float = _TTL_S) -> None:
        self._plugins = plugins
        self._ttl_s = ttl_s
        self._cached: tuple[float, bytes] | None = None
        self._lock = asyncio.Lock()
        self.readings: dict[str, Any] | None = None
        """The last snapshot as data (for ``/metrics``), ``None`` before the first probe."""

    async def snapshot(self) -> bytes:
        """The readings as JSON, probing again when the last ones are older than ``ttl_s``."""
        loop = asyncio.get_running_loop()
        cached = self._cached
        if cached is not None and loop.time() - cached[0] < self._ttl_s:
            return cached[1]
        async with self._lock:
            cached = self._cached
            if cached is not None and loop.time() - cached[0] < self._ttl_s:
                return cached[1]
            snapshot = await hardware_snapshot_async(plugins=self._plugins)
            body = _encode(snapshot)
            self._cached = (loop.time(), body)
            self.readings = snapshot
            return body
