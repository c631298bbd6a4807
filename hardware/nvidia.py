"""``nvidia``: NVIDIA GPUs through NVML (the ``pynvml`` module of ``nvidia-ml-py``).

NVML numbers every GPU on the machine by PCI bus id and ignores ``CUDA_VISIBLE_DEVICES``;
an engine process sees the GPUs that variable lists, renumbered from 0, in CUDA's order.
:func:`map_cuda_visible_devices` applies CUDA's documented rules so each reading carries
both numbers, and says when the mapping is an assumption rather than exact.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from shuniu.core import hookimpl
from shuniu.core.contracts import DeviceReading, HardwareProbe, ProbeReport, RegisterHardwareProbe

__all__ = ["MISSING_REASON", "NvidiaProbe", "VisibleMap", "map_cuda_visible_devices"]

NAME = "nvidia"
SOURCE = "nvml"
MISSING_REASON = "nvidia-ml-py not installed (pip install 'shuniu[nvidia]')"

_INT = re.compile(r"^-?\d+$")


@dataclass(frozen=True, slots=True)
class VisibleMap:
    """Which probe index a process sees as which device number."""

    positions: dict[int, int]
    """Probe (NVML) index → visible index, for the GPUs the process can see."""
    warnings: list[str] = field(default_factory=list)
    mig: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """Parent GPU index → the MIG instances of it that the variable selects."""


def map_cuda_visible_devices(
    value: str | None,
    uuids: Sequence[str | None],
    *,
    names: Sequence[str] = (),
    mig_uuids: Mapping[int, Sequence[str]] | None = None,
    device_order: str | None = None,
) -> VisibleMap:
    """Apply ``CUDA_VISIBLE_DEVICES`` (``value``; ``None`` when unset) to the GPUs NVML
    listed (``uuids[i]`` is the UUID of NVML index ``i``).

    CUDA's rules (CUDA C Programming Guide, "CUDA Environment Variables"): the value is a
    comma-separated list of indices, GPU UUIDs or unique UUID prefixes (``GPU-8932f937``),
    or MIG ids (``MIG-<uuid>``, or the older ``MIG-GPU-<uuid>/<gi>/<ci>``); the listed
    devices are renumbered 0, 1, ... in the order given; an empty value hides every GPU;
    an invalid entry hides itself and every entry after it. A GPU listed twice is treated as
    invalid here (CUDA's documentation does not say what a repeat does).

    Indices mean CUDA's order, which is fastest first unless ``CUDA_DEVICE_ORDER`` is
    ``PCI_BUS_ID``; NVML's order is PCI bus id. When indices are involved and the order is
    not ``PCI_BUS_ID`` the result assumes both orders agree, and a warning says so.
    """
    count = len(uuids)
    mig_uuids = mig_uuids or {}
    order = (device_order or "FASTEST_FIRST").strip().upper()
    warnings: list[str] = []
    if value is None:
        positions = {i: i for i in range(count)}
        if count > 1 and order != "PCI_BUS_ID":
            warnings.append(_order_warning(names, "CUDA_VISIBLE_DEVICES is unset, so CUDA numbers every GPU"))
        return VisibleMap(positions, warnings)
    if not value.strip():
        return VisibleMap({}, ["CUDA_VISIBLE_DEVICES is empty: no GPU is visible to CUDA"])

    positions: dict[int, int] = {}
    mig: dict[int, list[dict[str, Any]]] = {}
    used_index = False
    visible = 0
    for position, raw in enumerate(value.split(",")):
        entry = raw.strip()
        target, problem, mig_id = _resolve(entry, uuids, mig_uuids)
        if target is not None and mig_id is None and target in positions:
            target, problem = None, "the GPU is already listed"
        if target is None:
            rest = value.split(",")[position:]
            warnings.append(
                f"CUDA_VISIBLE_DEVICES entry {entry!r} is invalid ({problem}): CUDA ignores it and "
                f"every entry after it ({','.join(r.strip() for r in rest)!r})"
            )
            break
        used_index = used_index or _INT.match(entry) is not None
        if mig_id is not None:
            mig.setdefault(target, []).append({"visible_index": visible, "id": mig_id})
        positions.setdefault(target, visible)
        visible += 1
    if used_index and count > 1 and order != "PCI_BUS_ID":
        warnings.append(_order_warning(names, "CUDA_VISIBLE_DEVICES uses device indices"))
    return VisibleMap(positions, warnings, mig)


def _resolve(
    entry: str, uuids: Sequence[str | None], mig_uuids: Mapping[int, Sequence[str]]
) -> tuple[int | None, str, str | None]:
    """(NVML index, why not, MIG id) for one ``CUDA_VISIBLE_DEVICES`` entry."""
    if _INT.match(entry):
        n = int(entry)
        if 0 <= n < len(uuids):
            return n, "", None
        return None, f"there are {len(uuids)} GPU(s), numbered 0 to {len(uuids) - 1}", None
    if entry.startswith("MIG-GPU-"):
        # Pre-R470 form MIG-GPU-<gpu uuid>/<gi>/<ci>: the parent GPU is named directly.
        parent = _unique_prefix(entry.removeprefix("MIG-").split("/", 1)[0], uuids)
        if parent is None:
            return None, "no single GPU has that UUID", None
        return parent, "", entry
    if entry.startswith("MIG-"):
        hits = [gpu for gpu, migs in mig_uuids.items() for m in migs if m.startswith(entry)]
        if len(hits) == 1:
            return hits[0], "", entry
        return None, "no single MIG instance has that UUID", None
    if entry.startswith("GPU-"):
        hit = _unique_prefix(entry, uuids)
        if hit is None:
            return None, "no single GPU has a UUID starting so", None
        return hit, "", None
    return None, "not an index, a GPU-<uuid> or a MIG-<uuid>", None


def _unique_prefix(prefix: str, uuids: Sequence[str | None]) -> int | None:
    hits = [i for i, u in enumerate(uuids) if u is not None and u.startswith(prefix)]
    return hits[0] if len(hits) == 1 else None


def _order_warning(names: Sequence[str], what: str) -> str:
    mixed = len(set(names)) > 1
    return (
        f"{what} in CUDA's order, and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA orders GPUs "
        "fastest first, NVML by PCI bus id. visible_index assumes the two orders agree"
        + (
            ", which is unlikely here: these GPUs are different models."
            if mixed
            else " (usual for identical GPUs, not guaranteed)."
        )
        + " Set CUDA_DEVICE_ORDER=PCI_BUS_ID, or list GPU UUIDs, for an exact mapping."
    )


def _text(value: Any) -> Any:
    """Older nvidia-ml-py returned ``bytes`` for strings; newer ones return ``str``."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class NvidiaProbe(HardwareProbe):
    """Reads every GPU NVML can see: name, memory, utilization, temperature, power."""

    def __init__(self, options: object | None = None, *, environ: Mapping[str, str] | None = None) -> None:
        # ``environ``: whose CUDA_VISIBLE_DEVICES to apply (default: this process's).
        self._environ = environ

    def probe(self) -> ProbeReport:
        try:
            import pynvml
        except ImportError:
            return ProbeReport.unavailable(NAME, MISSING_REASON, source=SOURCE)
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError, or OSError from a broken libnvidia-ml
            return ProbeReport.unavailable(NAME, _init_reason(pynvml, exc), source=SOURCE)
        try:
            return _Reader(pynvml, os.environ if self._environ is None else self._environ).read()
        finally:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()


def _init_reason(nvml: ModuleType, exc: BaseException) -> str:
    def is_a(name: str) -> bool:
        cls = getattr(nvml, name, None)
        return isinstance(cls, type) and isinstance(exc, cls)

    if is_a("NVMLError_DriverNotLoaded"):
        return f"NVML driver not loaded: {exc}"
    if is_a("NVMLError_LibraryNotFound"):
        return (
            f"NVML library not found: {exc} (libnvidia-ml.so.1 comes with the NVIDIA driver; "
            "is the driver installed, and visible inside this container?)"
        )
    if is_a("NVMLError_NoPermission"):
        return f"NVML refused access: {exc}"
    return f"NVML initialisation failed: {type(exc).__name__}: {exc}"


class _Reader:
    """One NVML session's readings (between nvmlInit and nvmlShutdown)."""

    def __init__(self, nvml: ModuleType, environ: Mapping[str, str]) -> None:
        self.nvml = nvml
        self.environ = environ
        self.error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        self.not_supported: type[BaseException] | tuple[()] = getattr(nvml, "NVMLError_NotSupported", ())

    def call(self, errors: dict[str, str], what: str, fn_name: str, *args: Any) -> Any:
        """One NVML call; ``None`` when the device does not support it (recorded in
        ``errors`` when it failed for another reason)."""
        fn: Callable[..., Any] | None = getattr(self.nvml, fn_name, None)
        if fn is None:
            errors[what] = f"{fn_name} is missing from this nvidia-ml-py"
            return None
        try:
            return fn(*args)
        except self.not_supported:
            return None
        except self.error as exc:
            errors[what] = str(exc)
            return None

    def read(self) -> ProbeReport:
        nvml = self.nvml
        info: dict[str, Any] = {}
        top: dict[str, str] = {}
        driver = self.call(top, "driver_version", "nvmlSystemGetDriverVersion")
        if driver is not None:
            info["driver_version"] = _text(driver)
        cuda = self.call(top, "cuda_driver_version", "nvmlSystemGetCudaDriverVersion")
        if isinstance(cuda, int):
            info["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except self.error as exc:
            return ProbeReport.unavailable(NAME, f"NVML could not count the GPUs: {exc}", source=SOURCE)

        raw: list[dict[str, Any]] = [self._device(i) for i in range(count)]
        cvd = self.environ.get("CUDA_VISIBLE_DEVICES")
        mig_uuids = {d["index"]: d["mig_uuids"] for d in raw if d["mig_uuids"]}
        mapping = map_cuda_visible_devices(
            cvd,
            [d["uuid"] for d in raw],
            names=[d["name"] for d in raw],
            mig_uuids=mig_uuids,
            device_order=self.environ.get("CUDA_DEVICE_ORDER"),
        )
        warnings = list(mapping.warnings)
        for d in raw:
            if d["extra"].get("mig_enabled"):
                warnings.append(
                    f"MIG is enabled on GPU {d['index']}: CUDA sees its MIG instances, not the whole "
                    "GPU, and the memory and utilization shown are the whole GPU's"
                )
        devices = []
        for d in raw:
            extra = d["extra"]
            if d["index"] in mapping.mig:
                extra["visible_mig_instances"] = mapping.mig[d["index"]]
            devices.append(
                DeviceReading(
                    kind=NAME,
                    index=d["index"],
                    visible_index=mapping.positions.get(d["index"]),
                    name=d["name"],
                    uuid=d["uuid"],
                    bus_id=d["bus_id"],
                    memory_used_bytes=d["used"],
                    memory_total_bytes=d["total"],
                    utilization=d["util"],
                    temperature_c=d["temp"],
                    power_w=d["power"],
                    power_limit_w=d["limit"],
                    extra=extra,
                )
            )
        if cvd is not None:
            info["CUDA_VISIBLE_DEVICES"] = cvd
        if top:
            info["errors"] = top
        return ProbeReport(
            probe=NAME, available=True, source=SOURCE, devices=devices, warnings=warnings, info=info
        )

    def _device(self, index: int) -> dict[str, Any]:
        nvml = self.nvml
        errors: dict[str, str] = {}
        out: dict[str, Any] = {
            "index": index, "name": "unknown", "uuid": None, "bus_id": None, "used": None,
            "total": None, "util": None, "temp": None, "power": None, "limit": None,
            "mig_uuids": [], "extra": {},
        }  # fmt: skip
        handle = self.call(errors, "handle", "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            # A lost or inaccessible GPU still shows up, with the reason.
            out["extra"]["errors"] = errors or {"handle": "not supported"}
            return out
        name = self.call(errors, "name", "nvmlDeviceGetName", handle)
        if name is not None:
            out["name"] = _text(name)
        uuid = self.call(errors, "uuid", "nvmlDeviceGetUUID", handle)
        out["uuid"] = _text(uuid) if uuid is not None else None
        pci = self.call(errors, "bus_id", "nvmlDeviceGetPciInfo", handle)
        if pci is not None:
            out["bus_id"] = _text(getattr(pci, "busId", None))
        memory = self.call(errors, "memory", "nvmlDeviceGetMemoryInfo", handle)
        if memory is not None:
            out["used"], out["total"] = int(memory.used), int(memory.total)
        rates = self.call(errors, "utilization", "nvmlDeviceGetUtilizationRates", handle)
        if rates is not None:
            out["util"] = float(rates.gpu) / 100.0
        temp = self.call(
            errors,
            "temperature",
            "nvmlDeviceGetTemperature",
            handle,
            getattr(nvml, "NVML_TEMPERATURE_GPU", 0),
        )
        out["temp"] = float(temp) if temp is not None else None
        power = self.call(errors, "power", "nvmlDeviceGetPowerUsage", handle)  # milliwatts
        out["power"] = power / 1000.0 if power is not None else None
        limit = self.call(errors, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", handle)  # milliwatts
        out["limit"] = limit / 1000.0 if limit is not None else None
        if hasattr(nvml, "nvmlDeviceGetMigMode"):
            mode = self.call(errors, "mig_mode", "nvmlDeviceGetMigMode", handle)
            if mode is not None:
                enabled = bool(mode[0])
                out["extra"]["mig_enabled"] = enabled
                if enabled and "MIG-" in self.environ.get("CUDA_VISIBLE_DEVICES", ""):
                    out["mig_uuids"] = self._mig_uuids(handle, errors)
        if errors:
            out["extra"]["errors"] = errors
        return out

    def _mig_uuids(self, handle: Any, errors: dict[str, str]) -> list[str]:
        """The UUIDs of a GPU's MIG instances (only read when CUDA_VISIBLE_DEVICES names one)."""
        found: list[str] = []
        slots = self.call(errors, "mig_count", "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        for slot in range(int(slots)):
            # Empty slots raise NVMLError_NotFound: not an error worth reporting.
            ignore: dict[str, str] = {}
            mig = self.call(ignore, "mig", "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            if mig is None:
                continue
            uuid = self.call(ignore, "mig_uuid", "nvmlDeviceGetUUID", mig)
            if uuid is not None:
                found.append(_text(uuid))
        return found


@hookimpl
def register_hardware(register: RegisterHardwareProbe) -> None:
    register(
        NAME,
        NvidiaProbe,
        description="NVIDIA GPUs through NVML (nvidia-ml-py): memory, utilization, temperature, power.",
    )
