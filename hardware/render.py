"""``shuniu hardware``'s human-readable output: one rich table per available probe, one
line per unavailable probe with the reason."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from shuniu.core.contracts import DeviceReading, ProbeReport

__all__ = ["print_reports"]

GIB = 1024**3
_VISIBLE_PREFIX = {"nvidia": "cuda:", "ascend": "npu:"}
_VERSIONS = {
    "driver_version": "driver",
    "cuda_driver_version": "CUDA",
    "npu_smi_version": "npu-smi",
    "torch_npu_version": "torch_npu",
}


def _visible(d: DeviceReading) -> str:
    if d.visible_index is None:
        return "hidden"
    return f"{_VISIBLE_PREFIX.get(d.kind, '')}{d.visible_index}"


def _memory(d: DeviceReading) -> str:
    if d.memory_total_bytes is None:
        return "-"
    used = "?" if d.memory_used_bytes is None else f"{d.memory_used_bytes / GIB:.1f}"
    return f"{used} / {d.memory_total_bytes / GIB:.1f}"


def _power(d: DeviceReading) -> str:
    if d.power_w is None:
        return "-" if d.power_limit_w is None else f"? / {d.power_limit_w:.0f} W"
    if d.power_limit_w is None:
        return f"{d.power_w:.1f} W"
    return f"{d.power_w:.0f} / {d.power_limit_w:.0f} W"


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _title(report: ProbeReport) -> str:
    details = [report.source or "?"]
    for key, label in _VERSIONS.items():
        if key in report.info:
            details.append(f"{label} {report.info[key]}")
    return f"{report.probe} ({', '.join(details)})"


def _table(report: ProbeReport) -> Table:
    table = Table(title=_title(report), title_justify="left")
    with_health = any("health" in d.extra for d in report.devices)
    columns = ["device", "visible as", "name", "memory GiB (used / total)", "util", "temp", "power"]
    if with_health:
        columns.append("health")
    for col in columns:
        table.add_column(col, overflow="fold", no_wrap=col not in ("name",))
    for d in report.devices:
        row: list[Any] = [
            str(d.index),
            _visible(d),
            Text(d.name),
            _memory(d),
            _opt(d.utilization * 100 if d.utilization is not None else None, "{:.0f}%"),
            _opt(d.temperature_c, "{:.0f} °C"),
            _power(d),
        ]
        if with_health:
            row.append(str(d.extra.get("health", "-")))
        table.add_row(*row)
    return table


def print_reports(reports: Sequence[ProbeReport], console: Console) -> None:
    """Print each report: a table of its devices, or why the probe is unavailable."""
    for report in reports:
        if not report.available:
            line = Text.assemble(
                (report.probe, "bold yellow"), ": unavailable: ", report.reason or "no reason given"
            )
            console.print(line)
        elif not report.devices:
            console.print(Text.assemble((report.probe, "bold"), f" ({report.source}): no devices found"))
        else:
            console.print(_table(report))
        for warning in report.warnings:
            console.print(Text.assemble(("  warning: ", "yellow"), warning))
