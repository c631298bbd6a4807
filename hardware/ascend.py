"""``ascend``: Huawei Ascend NPUs through ``torch_npu``, else by parsing ``npu-smi info``.

``torch_npu`` (which comes with the CANN toolkit) gives the device count, names and free /
total memory of the NPUs this process may use; it already applies
``ASCEND_RT_VISIBLE_DEVICES``. ``npu-smi info`` (which comes with the NPU driver) lists every
chip on the machine with its health, power, temperature, AI Core usage and memory;
:func:`map_ascend_visible_devices` then applies ``ASCEND_RT_VISIBLE_DEVICES`` as CANN
documents it.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shuniu.core import hookimpl
from shuniu.core.contracts import DeviceReading, HardwareProbe, ProbeReport, RegisterHardwareProbe
from shuniu.hardware.types import MIB

__all__ = [
    "AscendProbe",
    "NpuSmiChip",
    "NpuSmiTable",
    "map_ascend_visible_devices",
    "parse_npu_smi_info",
]

NAME = "ascend"
ENV = "ASCEND_RT_VISIBLE_DEVICES"
DEFAULT_TIMEOUT_S = 10.0

# "3437 / 65536", "59356/ 65536", "0    / 0": a used/total pair; anything else one value.
_VALUE = re.compile(r"(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)|(\S+)")
_VERSION = re.compile(r"npu-smi\s+(\S+)\s+Version:\s*(\S+)")


# --------------------------------------------------------------------------- ASCEND_RT_VISIBLE_DEVICES


def map_ascend_visible_devices(
    value: str | None, count: int | None = None
) -> tuple[list[int] | None, list[str]]:
    """The logical device ids ``ASCEND_RT_VISIBLE_DEVICES`` makes visible, in the order the
    process numbers them (``None``: the variable is unset, every device is visible), and
    warnings.

    CANN's rules (CANN environment variable reference, ``ASCEND_RT_VISIBLE_DEVICES``): device
    ids are logical ids separated by commas with no other characters; at the first other
    character or invalid id (not below ``count``, when known) the rest is ignored, so
    ``"1, 2,3"`` means ``[1]``; recent CANN versions support only ascending lists. A
    repeated id, and an empty value, are not documented: a repeat is treated as invalid,
    an empty value as unset, each with a warning.
    """
    if value is None:
        return None, []
    if not value.strip():
        return None, [f"{ENV} is set but empty; CANN does not document that case, so it is taken as unset"]
    ids: list[int] = []
    warnings: list[str] = []
    for token in value.split(","):
        problem = None
        if not re.fullmatch(r"[0-9]+", token):
            problem = "only digits and commas are allowed"
        elif count is not None and int(token) >= count:
            problem = f"there are {count} device(s), numbered 0 to {count - 1}"
        elif int(token) in ids:
            problem = "the device is already listed"
        if problem is not None:
            warnings.append(
                f"{ENV}={value!r}: entry {token!r} is invalid ({problem}); the runtime ignores it and "
                "everything after it"
            )
            break
        ids.append(int(token))
    if ids != sorted(ids):
        warnings.append(
            f"{ENV}={value!r} is not in ascending order, which recent CANN versions do not support"
        )
    return ids, warnings


# --------------------------------------------------------------------------- npu-smi info


@dataclass(frozen=True, slots=True)
class NpuSmiChip:
    """One chip row of ``npu-smi info`` with its card's row."""

    npu_id: int
    name: str
    health: str
    chip_id: int
    device_id: int | None
    """The ``Device`` column (310P tables print the logical device id there)."""
    phy_id: int | None
    """The ``Phy-ID`` column (Atlas A3 tables: the chip's physical id)."""
    bus_id: str | None
    power_w: float | None
    temperature_c: float | None
    aicore_percent: float | None
    hbm_mb: tuple[float, float] | None
    memory_mb: tuple[float, float] | None


@dataclass(frozen=True, slots=True)
class NpuSmiTable:
    version: str | None = None
    chips: list[NpuSmiChip] = field(default_factory=list)
    has_header: bool = False


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _values(cell: str, names: list[str]) -> dict[str, Any]:
    """The values of a multi-column cell by header name: a number, a (used, total) pair or
    ``None`` (``-``, ``NA``)."""
    out: dict[str, Any] = {}
    for name, match in zip(names, _VALUE.finditer(cell), strict=False):
        if match.group(3) is None:
            out[name] = (float(match.group(1)), float(match.group(2)))
            continue
        try:
            out[name] = float(match.group(3))
        except ValueError:
            out[name] = None
    return out


def _int(token: str) -> int | None:
    return int(token) if token.isdigit() else None


def parse_npu_smi_info(text: str) -> NpuSmiTable:
    """Parse the device table ``npu-smi info`` prints (910B, 310P and Atlas A3 layouts).

    Each card is a row ``| NPU Name | Health | Power(W) Temp(C) ... |`` followed by one row
    per chip ``| Chip [Device|Phy-ID] | Bus-Id | AICore(%) Memory-Usage(MB) [HBM-Usage(MB)] |``
    (A3 and 310P Duo cards repeat the card row before each chip, after a ``+---`` line).
    Columns inside a cell are matched by the header's names, so a layout without
    ``HBM-Usage`` (310P) or with a ``-`` power reading (the second die of an A3 card)
    still parses. The process table that follows is ignored.
    """
    version = None
    npu_names: list[str] = []
    chip_columns: list[str] = []
    chip_names: list[str] = []
    chips: list[NpuSmiChip] = []
    card: dict[str, Any] | None = None
    after_separator = False
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("+"):
            after_separator = True
            continue
        if not stripped.startswith("|"):
            continue
        cells = _cells(stripped)
        if version is None and (m := _VERSION.search(stripped)):
            version = m.group(2)
            continue
        if any("Process id" in c or "Process name" in c for c in cells):
            break  # the per-process table: rows look like card rows, so stop here
        if len(cells) < 3:
            continue
        if cells[0].startswith("NPU") and "Health" in cells[1]:
            npu_names = cells[2].split()
            continue
        if cells[0].startswith("Chip") and "Bus-Id" in cells[1]:
            chip_columns = cells[0].split()
            chip_names = cells[2].split()
            continue
        if not npu_names or not chip_names:
            continue
        first = cells[0].split()
        if not first or _int(first[0]) is None:
            continue
        if after_separator:
            # The first row of a block describes the card.
            card = {
                "npu_id": int(first[0]),
                "name": " ".join(first[1:]) or "unknown",
                "health": cells[1],
                **_values(cells[2], npu_names),
            }
            after_separator = False
            continue
        if card is None:
            continue
        ids = dict(zip(chip_columns, (_int(t) for t in first), strict=False))
        metrics = _values(cells[2], chip_names)
        chips.append(
            NpuSmiChip(
                npu_id=card["npu_id"],
                name=card["name"],
                health=card["health"],
                chip_id=ids.get("Chip") or 0,
                device_id=ids.get("Device"),
                phy_id=ids.get("Phy-ID"),
                bus_id=cells[1] or None,
                power_w=_number(card.get("Power(W)")),
                temperature_c=_number(card.get("Temp(C)")),
                aicore_percent=_number(metrics.get("AICore(%)")),
                hbm_mb=_pair(metrics.get("HBM-Usage(MB)")),
                memory_mb=_pair(metrics.get("Memory-Usage(MB)")),
            )
        )
    return NpuSmiTable(version=version, chips=chips, has_header=bool(npu_names and chip_names))


def _number(value: Any) -> float | None:
    return value if isinstance(value, float) else None


def _pair(value: Any) -> tuple[float, float] | None:
    return value if isinstance(value, tuple) else None


# --------------------------------------------------------------------------- the probe


class AscendProbe(HardwareProbe):
    """Ascend NPUs: ``torch_npu`` when it imports, else ``npu-smi info``."""

    def __init__(
        self,
        options: object | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        npu_smi: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        use_torch: bool = True,
    ) -> None:
        self._environ = environ
        self._npu_smi = npu_smi
        self._timeout_s = timeout_s
        self._use_torch = use_torch

    def probe(self) -> ProbeReport:
        environ = os.environ if self._environ is None else self._environ
        why_not_torch = "torch_npu not used"
        if self._use_torch:
            report, why_not_torch = self._from_torch_npu(environ)
            if report is not None:
                return report
        return self._from_npu_smi(environ, why_not_torch)

    # -- torch_npu -----------------------------------------------------------------------

    def _from_torch_npu(self, environ: Mapping[str, str]) -> tuple[ProbeReport | None, str]:
        try:
            # torch_npu first: when it is missing this fails fast, without importing torch.
            torch_npu = importlib.import_module("torch_npu")
            torch = importlib.import_module("torch")
        except ModuleNotFoundError as exc:
            return None, f"{exc.name or 'torch_npu'} is not installed"
        except Exception as exc:  # e.g. CANN libraries missing: torch_npu raises on import
            return None, f"torch_npu failed to import: {type(exc).__name__}: {exc}"
        npu = getattr(torch, "npu", None)
        if npu is None:
            return None, "torch_npu imported but torch.npu is missing"
        try:
            count = int(npu.device_count())
        except Exception as exc:
            return None, f"torch.npu.device_count() failed: {type(exc).__name__}: {exc}"
        if count == 0:
            return None, "torch_npu sees no NPU (torch.npu.device_count() is 0)"
        # torch_npu already applied ASCEND_RT_VISIBLE_DEVICES: device i of this process is
        # the i-th listed logical id.
        ids, warnings = map_ascend_visible_devices(environ.get(ENV))
        if ids is not None and len(ids) < count:
            warnings.append(f"{ENV} lists {len(ids)} device(s) but torch_npu sees {count}")
            ids = None
        devices = []
        for i in range(count):
            errors: dict[str, str] = {}
            name = "unknown"
            try:
                name = str(npu.get_device_name(i))
            except Exception as exc:
                errors["name"] = f"{type(exc).__name__}: {exc}"
            used = total = None
            try:
                free, total_bytes = npu.mem_get_info(i)
                total, used = int(total_bytes), int(total_bytes) - int(free)
            except Exception as exc:
                errors["memory"] = f"{type(exc).__name__}: {exc}"
            devices.append(
                DeviceReading(
                    kind=NAME,
                    index=ids[i] if ids is not None else i,
                    visible_index=i,
                    name=name,
                    memory_used_bytes=used,
                    memory_total_bytes=total,
                    extra={"errors": errors} if errors else {},
                )
            )
        info: dict[str, Any] = {}
        if (version := getattr(torch_npu, "__version__", None)) is not None:
            info["torch_npu_version"] = str(version)
        if environ.get(ENV) is not None:
            info[ENV] = environ[ENV]
        return (
            ProbeReport(
                probe=NAME, available=True, source="torch_npu", devices=devices, warnings=warnings, info=info
            ),
            "",
        )

    # -- npu-smi -------------------------------------------------------------------------

    def _from_npu_smi(self, environ: Mapping[str, str], why_not_torch: str) -> ProbeReport:
        exe = self._npu_smi or shutil.which("npu-smi", path=environ.get("PATH", os.defpath))
        if exe is None:
            return ProbeReport.unavailable(
                NAME,
                f"no Ascend NPU tooling found: {why_not_torch}, and npu-smi is not on PATH "
                "(npu-smi comes with the Ascend NPU driver, torch_npu with the CANN toolkit)",
            )
        try:
            done = subprocess.run(
                [exe, "info"],
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                timeout=self._timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return ProbeReport.unavailable(
                NAME, f"{exe} info did not answer within {self._timeout_s:g} s", source="npu-smi"
            )
        except OSError as exc:
            return ProbeReport.unavailable(NAME, f"cannot run {exe}: {exc}", source="npu-smi")
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            tail = " / ".join(said[-3:])[-400:] or "no output"
            return ProbeReport.unavailable(
                NAME, f"{exe} info exited with status {done.returncode}: {tail}", source="npu-smi"
            )
        table = parse_npu_smi_info(done.stdout)
        if not table.has_header:
            first = next((ln.strip() for ln in done.stdout.splitlines() if ln.strip()), "no output")
            return ProbeReport.unavailable(
                NAME,
                f"{exe} info printed no NPU table I can read (first line: {first[:200]!r})",
                source="npu-smi",
            )
        return _report_from_table(table, environ, why_not_torch)


def _report_from_table(table: NpuSmiTable, environ: Mapping[str, str], why_not_torch: str) -> ProbeReport:
    # Logical device ids (what ASCEND_RT_VISIBLE_DEVICES lists): the Device column where the
    # table has one (310P), else the order the chips are listed in. The NPU column is the
    # card id, which is not the logical id on multi-chip cards or inside a container that
    # was given only some cards.
    logical = [c.device_id if c.device_id is not None else n for n, c in enumerate(table.chips)]
    ids, warnings = map_ascend_visible_devices(environ.get(ENV), len(table.chips))
    positions = {d: i for i, d in enumerate(ids)} if ids is not None else {d: d for d in logical}
    devices = []
    for chip, device_id in zip(table.chips, logical, strict=True):
        memory = chip.hbm_mb if chip.hbm_mb is not None and chip.hbm_mb[1] > 0 else chip.memory_mb
        extra: dict[str, Any] = {"npu_id": chip.npu_id, "chip_id": chip.chip_id, "health": chip.health}
        if chip.phy_id is not None:
            extra["phy_id"] = chip.phy_id
        extra["memory_kind"] = "hbm" if memory is chip.hbm_mb else "ddr"
        devices.append(
            DeviceReading(
                kind=NAME,
                index=device_id,
                visible_index=positions.get(device_id),
                name=chip.name,
                bus_id=chip.bus_id,
                # npu-smi's "MB" are MiB: a 64 GB 910B shows 65536.
                memory_used_bytes=round(memory[0] * MIB) if memory else None,
                memory_total_bytes=round(memory[1] * MIB) if memory else None,
                utilization=chip.aicore_percent / 100.0 if chip.aicore_percent is not None else None,
                temperature_c=chip.temperature_c,
                power_w=chip.power_w,
                extra=extra,
            )
        )
    info: dict[str, Any] = {"torch_npu": why_not_torch}
    if table.version is not None:
        info["npu_smi_version"] = table.version
    if environ.get(ENV) is not None:
        info[ENV] = environ[ENV]
    return ProbeReport(
        probe=NAME, available=True, source="npu-smi", devices=devices, warnings=warnings, info=info
    )


@hookimpl
def register_hardware(register: RegisterHardwareProbe) -> None:
    register(
        NAME,
        AscendProbe,
        description="Ascend NPUs through torch_npu, else npu-smi info: memory, AI Core usage, "
        "temperature, power, health.",
    )
