"""The NPUs an Ascend endpoint runs on, read with the Ascend hardware probe.

The probe (``shuniu.hardware.ascend.AscendProbe``) runs ``npu-smi info`` in a worker thread,
so the event loop never waits for it, and one reading serves every endpoint of the gateway
for ``device_max_age_s``: an eight-replica pool costs one ``npu-smi`` run, not eight.
``torch_npu`` is deliberately not used here, although the probe prefers it elsewhere:
``torch.npu.mem_get_info`` sets up a device context on every NPU it reads, inside the
gateway's process, taking device memory next to the engines; and it only sees the NPUs the
gateway's own ``ASCEND_RT_VISIBLE_DEVICES`` lets it see, not the engine's.

Which NPUs are the endpoint's (:func:`select_devices`): ``options.devices``, else the
``ASCEND_RT_VISIBLE_DEVICES`` of the engine's launch environment (when the gateway passes
it in ``EndpointSpec.extra["launch"]["env"]``), else every NPU for a launched engine, and
none for a remote one (the gateway's ``npu-smi`` cannot see another machine).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from shuniu.core.contracts import ProbeReport
from shuniu.hardware import AscendProbe, map_ascend_visible_devices

__all__ = [
    "VISIBLE_DEVICES_ENV",
    "DeviceSelection",
    "clear_npu_cache",
    "endpoint_report",
    "read_npus",
    "select_devices",
]

VISIBLE_DEVICES_ENV = "ASCEND_RT_VISIBLE_DEVICES"
_PROBE = "ascend"


@dataclass(frozen=True, slots=True)
class DeviceSelection:
    """Which of the machine's NPUs belong to one endpoint."""

    source: str
    """Where the selection came from, in words (shown in the report's ``info``)."""
    ids: tuple[int, ...] | None = None
    """Logical device ids in the engine's own order; ``None`` with ``visible_env`` unset:
    every NPU of the machine."""
    visible_env: str | None = None
    """An ``ASCEND_RT_VISIBLE_DEVICES`` value still to be applied (with CANN's rules, which
    need the machine's device count, known only once ``npu-smi`` has answered)."""
    local: bool = True
    """``False``: the engine is not on this machine, so there is nothing to read."""


def select_devices(devices: Sequence[int] | None, extra: Mapping[str, Any] | None) -> DeviceSelection:
    """The endpoint's NPUs from its options' ``devices`` and its spec's ``extra``."""
    if devices is not None:
        return DeviceSelection(source="options.devices", ids=tuple(devices))
    launch = (extra or {}).get("launch")
    if not isinstance(launch, Mapping):
        return DeviceSelection(
            source="remote engine: set options.devices if it runs on the gateway's machine", local=False
        )
    env = launch.get("env")
    value = env.get(VISIBLE_DEVICES_ENV) if isinstance(env, Mapping) else None
    if isinstance(value, str):
        return DeviceSelection(source=f"launch.env {VISIBLE_DEVICES_ENV}={value}", visible_env=value)
    # A launched engine whose environment the gateway did not pass on: it inherits the
    # gateway's own variable, or sees every NPU without one.
    inherited = os.environ.get(VISIBLE_DEVICES_ENV)
    if inherited is not None:
        return DeviceSelection(
            source=f"the gateway's {VISIBLE_DEVICES_ENV}={inherited}", visible_env=inherited
        )
    return DeviceSelection(source="launched engine without ASCEND_RT_VISIBLE_DEVICES: every NPU")


# -- one shared npu-smi reading ---------------------------------------------------------------

_Key = tuple[str | None, str]
_readings: dict[_Key, tuple[float, ProbeReport]] = {}
_pending: dict[tuple[int, _Key], asyncio.Task[ProbeReport]] = {}


def clear_npu_cache() -> None:
    """Forget the shared reading (tests; a machine whose NPUs changed)."""
    _readings.clear()


def _probe(npu_smi: str | None, environ: dict[str, str]) -> ProbeReport:
    return AscendProbe(environ=environ, npu_smi=npu_smi, use_torch=False).probe()


async def read_npus(max_age_s: float, *, npu_smi: str | None = None) -> ProbeReport:
    """Every NPU of this machine as ``npu-smi info`` lists them, at most ``max_age_s`` old.

    Concurrent callers share one run. The probe sees the machine without the gateway's own
    ``ASCEND_RT_VISIBLE_DEVICES`` (the engines have their own), so every chip is listed with
    ``visible_index`` equal to its logical id until :func:`endpoint_report` renumbers them.
    """
    environ = {k: v for k, v in os.environ.items() if k != VISIBLE_DEVICES_ENV}
    key: _Key = (npu_smi, environ.get("PATH", ""))
    hit = _readings.get(key)
    if hit is not None and time.monotonic() - hit[0] < max_age_s:
        return hit[1]
    loop = asyncio.get_running_loop()
    pending_key = (id(loop), key)
    task = _pending.get(pending_key)
    if task is None:
        task = loop.create_task(asyncio.to_thread(_probe, npu_smi, environ))
        _pending[pending_key] = task
        task.add_done_callback(lambda _t: _pending.pop(pending_key, None))
    # shield: one caller cancelled (its request went away) must not cancel the others' read.
    report = await asyncio.shield(task)
    _readings[key] = (time.monotonic(), report)
    return report


def endpoint_report(report: ProbeReport, selection: DeviceSelection, endpoint: str) -> ProbeReport:
    """``report`` narrowed to the endpoint's NPUs, each renumbered as the engine sees it
    (``visible_index``: ``npu:N`` inside the engine), with the reasons for anything left out."""
    info: dict[str, Any] = {**report.info, "endpoint": endpoint, "devices_from": selection.source}
    if not selection.local:
        return ProbeReport.unavailable(_PROBE, selection.source)
    if not report.available:
        return msgspec.structs.replace(report, info=info)
    warnings = list(report.warnings)
    ids: list[int] | None
    if selection.visible_env is not None:
        ids, mapping_warnings = map_ascend_visible_devices(selection.visible_env, len(report.devices))
        warnings.extend(mapping_warnings)
    else:
        ids = list(selection.ids) if selection.ids is not None else None
    if ids is None:
        devices = list(report.devices)
    else:
        by_id = {d.index: d for d in report.devices}
        devices = [
            msgspec.structs.replace(by_id[d], visible_index=position)
            for position, d in enumerate(ids)
            if d in by_id
        ]
        missing = [d for d in ids if d not in by_id]
        if missing:
            listed = ", ".join(str(d.index) for d in report.devices) or "none"
            warnings.append(
                f"NPU(s) {missing} of endpoint {endpoint} are not on this machine (npu-smi lists {listed})"
            )
        info["device_ids"] = ids
    return msgspec.structs.replace(report, devices=devices, warnings=warnings, info=info)
