"""Hardware probes (NVIDIA, Ascend, CPU), the probe runner and ``shuniu hardware``.

No GPU or NPU here, so the vendor libraries are replaced by fakes in ``sys.modules`` (the
approach of vllm-ascend's ``tests/ut/conftest.py``); real torch is never imported:

- ``pynvml`` is faked with the names and behaviour of NVIDIA's ``nvidia-ml-py`` 13.x (read
  from its ``pynvml.py``): ``NVMLError(value)`` with one ``NVMLError_<Name>`` subclass per
  error code, constructed without arguments; functions take a device handle; memory and
  utilization come back as structs with ``used``/``total``/``free`` and ``gpu``; power in
  milliwatts; names and UUIDs as ``str``.
- ``torch`` + ``torch_npu`` are faked as a ``torch.npu`` namespace with ``device_count``,
  ``get_device_name`` and ``mem_get_info`` (returning ``(free, total)`` bytes).
- ``npu-smi`` is a shell script on ``PATH`` that prints a recorded ``npu-smi info``. The
  recordings in ``tests/data`` are published outputs:
  ``npu_smi_info_910b.txt``: 8 x 910B1, npu-smi 24.1.0, from the ``collect_env`` output
  of vllm-project/vllm-ascend issue #312;
  ``npu_smi_info_310p.txt``: 2 x 310P3 (the layout with a ``Device`` column and no HBM),
  from Ascend/ModelZoo-PyTorch ``ACL_PyTorch/contrib/cv/video_understanding/I3D_Nonlocal/README.md``;
  ``npu_smi_info_a3.txt``: the first card (two dies, ``Phy-ID`` column, ``-`` power on the
  second die) of an Atlas A3 machine, npu-smi 24.1.rc3.7, from vllm-project/vllm-ascend
  issue #4513.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from shuniu.core import hookimpl
from shuniu.core.cli import build_cli
from shuniu.core.contracts import HardwareProbe
from shuniu.core.plugin_manager import load_plugins
from shuniu.hardware import ProbeReport, hardware_snapshot, probe_all, probe_all_async
from shuniu.hardware.ascend import AscendProbe, map_ascend_visible_devices, parse_npu_smi_info
from shuniu.hardware.cpu import CpuProbe, read_meminfo, read_model_name
from shuniu.hardware.nvidia import MISSING_REASON, NvidiaProbe, map_cuda_visible_devices

DATA = Path(__file__).parent / "data"
MIB = 1024 * 1024

# --------------------------------------------------------------------------- a fake pynvml

UUID0 = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"  # the example UUID in CUDA's documentation
UUID1 = "GPU-5e4d2c1b-0f3a-4b6c-9d8e-7a6b5c4d3e2f"
H100_TOTAL = 81559 * MIB  # what nvidia-smi shows for an H100 80GB HBM3


def h100(index: int, uuid: str, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": uuid,
        "bus_id": f"00000000:{0x18 + 0x12 * index:02X}:00.0",
        "total": H100_TOTAL,
        "used": (60000 + 1000 * index) * MIB,
        "gpu_util": 87 - 10 * index,
        "temp": 61 + index,
        "power_mw": 512345 + 1000 * index,
        "limit_mw": 700000,
        "mig": [0, 0],
        "mig_uuids": [],
    }
    spec.update(overrides)
    return spec


def fake_pynvml(devices: list[dict[str, Any]], *, init_error: str | None = None) -> types.ModuleType:
    """A ``pynvml`` module modelled on nvidia-ml-py's API (see the module docstring)."""
    m = types.ModuleType("pynvml")
    codes = {"NotSupported": 3, "NoPermission": 4, "NotFound": 6, "DriverNotLoaded": 9,
             "LibraryNotFound": 12, "GpuIsLost": 15}  # fmt: skip
    texts = {3: "Not Supported", 4: "Insufficient Permissions", 6: "Not Found", 9: "Driver Not Loaded",
             12: "NVML Shared Library Not Found", 15: "GPU is lost"}  # fmt: skip

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            return texts.get(self.value, f"NVML Error with code {self.value}")

    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    for name, code in codes.items():

        def init(self: NVMLError, _code: int = code) -> None:
            NVMLError.__init__(self, _code)

        setattr(m, f"NVMLError_{name}", type(f"NVMLError_{name}", (NVMLError,), {"__init__": init}))
    m.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    m.calls = {"init": 0, "shutdown": 0}  # type: ignore[attr-defined]

    class Handle:
        def __init__(self, index: int, mig_uuid: str | None = None) -> None:
            self.index, self.mig_uuid = index, mig_uuid

    def value(index: int, key: str) -> Any:
        got = devices[index][key]
        if isinstance(got, type) and issubclass(got, BaseException):
            raise got()
        return got

    def nvmlInit() -> None:
        m.calls["init"] += 1  # type: ignore[attr-defined]
        if init_error is not None:
            raise getattr(m, f"NVMLError_{init_error}")()

    def nvmlShutdown() -> None:
        m.calls["shutdown"] += 1  # type: ignore[attr-defined]

    def nvmlDeviceGetHandleByIndex(index: int) -> Handle:
        if not 0 <= index < len(devices):
            raise NVMLError(2)  # Invalid Argument
        if devices[index].get("lost"):
            raise m.NVMLError_GpuIsLost()  # type: ignore[attr-defined]
        return Handle(index)

    def nvmlDeviceGetTemperature(handle: Handle, sensor: int) -> int:
        assert sensor == m.NVML_TEMPERATURE_GPU  # type: ignore[attr-defined]
        return value(handle.index, "temp")  # type: ignore[no-any-return]

    def nvmlDeviceGetUUID(handle: Handle) -> str:
        return handle.mig_uuid or value(handle.index, "uuid")

    def nvmlDeviceGetMigDeviceHandleByIndex(handle: Handle, slot: int) -> Handle:
        migs = devices[handle.index]["mig_uuids"]
        if slot >= len(migs) or migs[slot] is None:
            raise m.NVMLError_NotFound()  # type: ignore[attr-defined]
        return Handle(handle.index, migs[slot])

    m.nvmlInit = nvmlInit  # type: ignore[attr-defined]
    m.nvmlShutdown = nvmlShutdown  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = lambda: "550.54.15"  # type: ignore[attr-defined]
    m.nvmlSystemGetCudaDriverVersion = lambda: 12040  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = nvmlDeviceGetHandleByIndex  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: value(h.index, "name")  # type: ignore[attr-defined]
    m.nvmlDeviceGetUUID = nvmlDeviceGetUUID  # type: ignore[attr-defined]
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=value(h.index, "bus_id"))  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        total=value(h.index, "total"),
        used=value(h.index, "used"),
        free=value(h.index, "total") - value(h.index, "used"),
    )
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(
        gpu=value(h.index, "gpu_util"), memory=40
    )  # type: ignore[attr-defined]
    m.nvmlDeviceGetTemperature = nvmlDeviceGetTemperature  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerUsage = lambda h: value(h.index, "power_mw")  # type: ignore[attr-defined]
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: value(h.index, "limit_mw")  # type: ignore[attr-defined]
    m.nvmlDeviceGetMigMode = lambda h: value(h.index, "mig")  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7  # type: ignore[attr-defined]
    m.nvmlDeviceGetMigDeviceHandleByIndex = nvmlDeviceGetMigDeviceHandleByIndex  # type: ignore[attr-defined]
    return m


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Two H100s behind a fake pynvml."""
    fake = fake_pynvml([h100(0, UUID0), h100(1, UUID1)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def run_nvidia(env: dict[str, str] | None = None) -> ProbeReport:
    return NvidiaProbe(environ=env if env is not None else {}).probe()


def visible(report: ProbeReport) -> list[int | None]:
    return [d.visible_index for d in report.devices]


# --------------------------------------------------------------------------- NVIDIA


def test_nvidia_reads_every_field(nvml: types.ModuleType) -> None:
    report = run_nvidia({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert report.available and report.source == "nvml" and report.reason is None
    assert report.info["driver_version"] == "550.54.15"
    assert report.info["cuda_driver_version"] == "12.4"
    assert report.warnings == []
    first, second = report.devices
    assert first.kind == "nvidia" and first.index == 0 and first.visible_index == 0
    assert first.name == "NVIDIA H100 80GB HBM3"
    assert first.uuid == UUID0 and first.bus_id == "00000000:18:00.0"
    assert first.memory_total_bytes == H100_TOTAL and first.memory_used_bytes == 60000 * MIB
    assert first.utilization == pytest.approx(0.87)
    assert first.temperature_c == 61.0
    assert first.power_w == pytest.approx(512.345)  # milliwatts → watts
    assert first.power_limit_w == pytest.approx(700.0)
    assert first.extra == {"mig_enabled": False}
    assert (second.index, second.uuid, second.bus_id) == (1, UUID1, "00000000:2A:00.0")
    assert second.memory_used_bytes == 61000 * MIB and second.utilization == pytest.approx(0.77)
    assert nvml.calls == {"init": 1, "shutdown": 1}


def test_nvidia_warns_that_index_order_is_assumed_without_pci_bus_id(nvml: types.ModuleType) -> None:
    report = run_nvidia({})  # CUDA_DEVICE_ORDER unset: CUDA numbers fastest first
    assert visible(report) == [0, 1]
    (warning,) = report.warnings
    assert "CUDA_DEVICE_ORDER is not PCI_BUS_ID" in warning and "identical GPUs" in warning


def test_nvidia_mixed_models_make_the_order_warning_stronger(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml([h100(0, UUID0), h100(1, UUID1, name="NVIDIA L40S")])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    (warning,) = run_nvidia({"CUDA_VISIBLE_DEVICES": "1"}).warnings
    assert "different models" in warning


@pytest.mark.parametrize(
    ("value", "order", "expected", "warned"),
    [
        ("1", "PCI_BUS_ID", [None, 0], None),
        ("1,0", "PCI_BUS_ID", [1, 0], None),
        ("1", None, [None, 0], "CUDA_DEVICE_ORDER is not PCI_BUS_ID"),
        # UUIDs and unique UUID prefixes are exact whatever the order.
        (f"{UUID1},{UUID0}", None, [1, 0], None),
        ("GPU-5e4d", None, [None, 0], None),
        ("GPU-8932f937,1", "PCI_BUS_ID", [0, 1], None),
        # Empty hides every GPU.
        ("", None, [None, None], "CUDA_VISIBLE_DEVICES is empty"),
        # An invalid entry hides itself and everything after it.
        ("0,7,1", "PCI_BUS_ID", [0, None], "'7' is invalid"),
        ("1,-1,0", "PCI_BUS_ID", [None, 0], "'-1' is invalid"),
        ("GPU-ffff,0", "PCI_BUS_ID", [None, None], "'GPU-ffff' is invalid"),
        ("GPU-,0", "PCI_BUS_ID", [None, None], "no single GPU"),  # prefix of both UUIDs
        ("0,0,1", "PCI_BUS_ID", [0, None], "already listed"),
        ("0,cuda:1", "PCI_BUS_ID", [0, None], "'cuda:1' is invalid"),
    ],
)
def test_nvidia_cuda_visible_devices(
    nvml: types.ModuleType, value: str, order: str | None, expected: list[int | None], warned: str | None
) -> None:
    env = {"CUDA_VISIBLE_DEVICES": value, **({"CUDA_DEVICE_ORDER": order} if order else {})}
    report = run_nvidia(env)
    assert visible(report) == expected
    assert report.info["CUDA_VISIBLE_DEVICES"] == value
    if warned is None:
        assert report.warnings == []
    else:
        assert any(warned in w for w in report.warnings), report.warnings


def test_cuda_mapping_names_what_it_dropped() -> None:
    mapping = map_cuda_visible_devices("0,2,-1,1", [UUID0, UUID1, "GPU-aaaa"], device_order="PCI_BUS_ID")
    assert mapping.positions == {0: 0, 2: 1}
    (warning,) = mapping.warnings
    assert "'-1'" in warning and "'-1,1'" in warning


def test_nvidia_mig_instance_maps_to_its_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    migs = ["MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f", None, "MIG-0a1b2c3d-0000-5de3-91c7-45d71c87eb3f"]
    fake = fake_pynvml([h100(0, UUID0), h100(1, UUID1, mig=[1, 1], mig_uuids=migs)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    report = run_nvidia({"CUDA_VISIBLE_DEVICES": "MIG-0a1b2c3d"})
    assert visible(report) == [None, 0]
    assert report.devices[1].extra["visible_mig_instances"] == [{"visible_index": 0, "id": "MIG-0a1b2c3d"}]
    assert any("MIG is enabled on GPU 1" in w for w in report.warnings)
    # The pre-R470 form names the parent GPU directly.
    old_form = run_nvidia({"CUDA_VISIBLE_DEVICES": f"MIG-{UUID1}/1/0"})
    assert visible(old_form) == [None, 0]
    # A MIG UUID that matches no instance is invalid like any other entry.
    assert visible(run_nvidia({"CUDA_VISIBLE_DEVICES": "MIG-ffffffff"})) == [None, None]


def test_nvidia_not_supported_field_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    devices = [h100(0, UUID0), h100(1, UUID1)]
    fake = fake_pynvml(devices)
    devices[0]["power_mw"] = fake.NVMLError_NotSupported  # type: ignore[attr-defined]
    devices[1]["temp"] = fake.NVMLError_NoPermission  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    report = run_nvidia({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    first, second = report.devices
    assert first.power_w is None and first.power_limit_w == pytest.approx(700.0)
    assert "errors" not in first.extra  # "not supported" is an answer, not an error
    assert second.temperature_c is None
    assert second.extra["errors"] == {"temperature": "Insufficient Permissions"}
    assert second.power_w == pytest.approx(513.345)


def test_nvidia_lost_gpu_is_listed_with_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml([h100(0, UUID0), h100(1, UUID1, lost=True)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    report = run_nvidia({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert report.available
    lost = report.devices[1]
    assert lost.name == "unknown" and lost.memory_total_bytes is None
    assert lost.extra["errors"] == {"handle": "GPU is lost"}


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ("DriverNotLoaded", "NVML driver not loaded: Driver Not Loaded"),
        ("LibraryNotFound", "NVML library not found: NVML Shared Library Not Found (libnvidia-ml.so.1"),
        ("NoPermission", "NVML refused access: Insufficient Permissions"),
    ],
)
def test_nvidia_init_failure_is_a_reason(monkeypatch: pytest.MonkeyPatch, error: str, expected: str) -> None:
    fake = fake_pynvml([h100(0, UUID0)], init_error=error)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    report = run_nvidia()
    assert not report.available and report.devices == []
    assert report.reason is not None and report.reason.startswith(expected)
    assert fake.calls["shutdown"] == 0  # type: ignore[attr-defined]  # nothing to shut down


def test_nvidia_without_nvidia_ml_py_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if it were not installed
    report = run_nvidia()
    assert not report.available
    assert report.reason == MISSING_REASON
    assert "pip install 'shuniu[nvidia]'" in report.reason


def test_nvidia_shuts_nvml_down_when_reading_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml([h100(0, UUID0)])
    fake.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(fake.NVMLError_GpuIsLost())  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    report = run_nvidia()
    assert not report.available and report.reason == "NVML could not count the GPUs: GPU is lost"
    assert fake.calls == {"init": 1, "shutdown": 1}  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- Ascend: torch_npu


def fake_torch_npu(
    monkeypatch: pytest.MonkeyPatch, count: int, *, total_mib: int = 65536, used_mib: tuple[int, ...] = ()
) -> None:
    """``torch`` + ``torch_npu`` fakes: importing torch_npu registers ``torch.npu``."""
    torch = types.ModuleType("torch")
    used = used_mib or tuple(3000 + 100 * i for i in range(count))

    def mem_get_info(i: int) -> tuple[int, int]:
        if not 0 <= i < count:
            raise RuntimeError(f"Invalid device argument {i}")
        return (total_mib - used[i]) * MIB, total_mib * MIB

    torch.npu = types.SimpleNamespace(  # type: ignore[attr-defined]
        device_count=lambda: count, get_device_name=lambda i: "Ascend910B3", mem_get_info=mem_get_info
    )
    torch_npu = types.ModuleType("torch_npu")
    torch_npu.__version__ = "2.5.1.post1"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch_npu", torch_npu)


def test_ascend_reads_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch_npu(monkeypatch, 2, used_mib=(3318, 59356))
    report = AscendProbe(environ={}).probe()
    assert report.available and report.source == "torch_npu" and report.warnings == []
    assert report.info == {"torch_npu_version": "2.5.1.post1"}
    assert [(d.index, d.visible_index) for d in report.devices] == [(0, 0), (1, 1)]
    second = report.devices[1]
    assert second.kind == "ascend" and second.name == "Ascend910B3"
    assert second.memory_total_bytes == 65536 * MIB and second.memory_used_bytes == 59356 * MIB
    assert second.utilization is None and second.temperature_c is None  # torch_npu does not say


def test_ascend_torch_npu_maps_visible_devices_back_to_logical_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch_npu has already applied the variable: its device 0 is logical device 4.
    fake_torch_npu(monkeypatch, 2)
    report = AscendProbe(environ={"ASCEND_RT_VISIBLE_DEVICES": "4,6"}).probe()
    assert [(d.index, d.visible_index) for d in report.devices] == [(4, 0), (6, 1)]
    assert report.info["ASCEND_RT_VISIBLE_DEVICES"] == "4,6"


# --------------------------------------------------------------------------- Ascend: npu-smi


def fake_npu_smi(tmp_path: Path, body: str) -> dict[str, str]:
    """An ``npu-smi`` script in ``tmp_path``; the environment that puts it on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / "npu-smi"
    script.write_text(f'#!/bin/sh\n[ "$1" = info ] || exit 64\n{body}\n')
    script.chmod(0o755)
    return {"PATH": str(bindir)}


def recorded(tmp_path: Path, name: str) -> dict[str, str]:
    return fake_npu_smi(tmp_path, f"cat '{DATA / name}'")


@pytest.fixture
def no_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)


@pytest.mark.usefixtures("no_torch_npu")
def test_ascend_npu_smi_910b_matches_the_recording(tmp_path: Path) -> None:
    report = AscendProbe(environ=recorded(tmp_path, "npu_smi_info_910b.txt")).probe()
    assert report.available and report.source == "npu-smi"
    assert report.info["npu_smi_version"] == "24.1.0"
    assert report.info["torch_npu"] == "torch_npu is not installed"
    # Eight chips; the process table after them adds none.
    assert [d.index for d in report.devices] == list(range(8))
    assert [d.visible_index for d in report.devices] == list(range(8))
    first = report.devices[0]
    assert first.name == "910B1" and first.bus_id == "0000:C1:00.0"
    assert first.memory_used_bytes == 3437 * MIB and first.memory_total_bytes == 65536 * MIB
    assert first.power_w == pytest.approx(89.1) and first.temperature_c == 32.0
    assert first.utilization == 0.0
    assert first.extra == {"npu_id": 0, "chip_id": 0, "health": "OK", "memory_kind": "hbm"}
    # Every HBM pair, power and temperature, read back independently from the text.
    text = (DATA / "npu_smi_info_910b.txt").read_text()
    hbm = [(int(u), int(t)) for u, t in re.findall(r"(\d+) / (65536)", text)]
    cards = [
        (float(p), float(c)) for p, c in re.findall(r"\| \d\s+910B1\s+\| OK\s+\| ([\d.]+)\s+(\d+)", text)
    ]
    assert len(hbm) == len(cards) == 8
    assert [(d.memory_used_bytes, d.memory_total_bytes) for d in report.devices] == [
        (u * MIB, t * MIB) for u, t in hbm
    ]
    assert [(d.power_w, d.temperature_c) for d in report.devices] == cards


@pytest.mark.usefixtures("no_torch_npu")
def test_ascend_npu_smi_310p_uses_the_device_column_and_ddr(tmp_path: Path) -> None:
    report = AscendProbe(environ=recorded(tmp_path, "npu_smi_info_310p.txt")).probe()
    assert report.available and "npu_smi_version" not in report.info  # this layout has no version line
    first, second = report.devices
    assert (first.index, second.index) == (0, 1)
    assert second.name == "310P3" and second.bus_id == "0000:89:00.0"
    assert second.memory_used_bytes == 1070 * MIB and second.memory_total_bytes == 21534 * MIB
    assert second.extra["memory_kind"] == "ddr" and second.extra["npu_id"] == 1
    assert second.power_w == pytest.approx(15.4) and second.temperature_c == 43.0


@pytest.mark.usefixtures("no_torch_npu")
def test_ascend_npu_smi_a3_card_has_two_dies(tmp_path: Path) -> None:
    report = AscendProbe(environ=recorded(tmp_path, "npu_smi_info_a3.txt")).probe()
    die0, die1 = report.devices
    assert (die0.extra["npu_id"], die1.extra["npu_id"]) == (0, 0)
    assert (die0.index, die1.index) == (0, 1)
    assert (die0.extra["phy_id"], die1.extra["phy_id"]) == (0, 1)
    assert die0.power_w == pytest.approx(175.0) and die1.power_w is None  # "-" in the table
    assert die1.memory_used_bytes == 3215 * MIB and die1.temperature_c == 38.0


@pytest.mark.usefixtures("no_torch_npu")
@pytest.mark.parametrize(
    ("value", "expected", "warned"),
    [
        ("2,3", {2: 0, 3: 1}, None),
        ("1, 2,3", {1: 0}, "only digits and commas"),  # CANN's own example: the space ends it
        ("1,3,8", {1: 0, 3: 1}, "'8' is invalid"),  # 8 chips: ids 0..7
        ("5,2", {5: 0, 2: 1}, "ascending"),
        ("", {i: i for i in range(8)}, "taken as unset"),
    ],
)
def test_ascend_npu_smi_applies_ascend_rt_visible_devices(
    tmp_path: Path, value: str, expected: dict[int, int], warned: str | None
) -> None:
    env = {**recorded(tmp_path, "npu_smi_info_910b.txt"), "ASCEND_RT_VISIBLE_DEVICES": value}
    report = AscendProbe(environ=env).probe()
    assert {d.index: d.visible_index for d in report.devices if d.visible_index is not None} == expected
    assert len(report.devices) == 8  # hidden chips are still listed
    if warned is None:
        assert report.warnings == []
    else:
        assert any(warned in w for w in report.warnings), report.warnings


def test_ascend_visible_devices_rules() -> None:
    assert map_ascend_visible_devices(None) == (None, [])
    assert map_ascend_visible_devices("0,1,2")[0] == [0, 1, 2]
    assert map_ascend_visible_devices("1,2,-1,3")[0] == [1, 2]
    assert map_ascend_visible_devices("1,1")[0] == [1]
    assert map_ascend_visible_devices("3", count=2)[0] == []


@pytest.mark.usefixtures("no_torch_npu")
def test_ascend_falls_back_to_npu_smi_when_torch_npu_sees_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_torch_npu(monkeypatch, 0)
    report = AscendProbe(environ=recorded(tmp_path, "npu_smi_info_310p.txt")).probe()
    assert report.source == "npu-smi" and len(report.devices) == 2
    assert report.info["torch_npu"] == "torch_npu sees no NPU (torch.npu.device_count() is 0)"


def test_ascend_torch_npu_that_fails_to_import_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch_npu raises at import when the CANN libraries are missing.
    pkg = tmp_path / "site"
    pkg.mkdir()
    (pkg / "torch_npu.py").write_text("raise RuntimeError('libhccl.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    report = AscendProbe(environ=recorded(tmp_path, "npu_smi_info_910b.txt")).probe()
    assert report.source == "npu-smi"
    assert (
        report.info["torch_npu"]
        == "torch_npu failed to import: RuntimeError: libhccl.so: cannot open shared object file"
    )


@pytest.mark.usefixtures("no_torch_npu")
def test_ascend_without_npu_smi_says_why(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    report = AscendProbe(environ={"PATH": str(empty)}).probe()
    assert not report.available and report.devices == []
    assert report.reason is not None
    assert "torch_npu is not installed" in report.reason and "npu-smi is not on PATH" in report.reason


@pytest.mark.usefixtures("no_torch_npu")
def test_ascend_npu_smi_failure_is_a_reason(tmp_path: Path) -> None:
    # What npu-smi prints when the driver is not loaded.
    env = fake_npu_smi(tmp_path, "echo 'dcmi module initialize failed. ret is -8005' >&2; exit 1")
    report = AscendProbe(environ=env).probe()
    assert not report.available
    assert report.reason is not None
    assert re.search(
        r"npu-smi info exited with status 1: dcmi module initialize failed\. ret is -8005$", report.reason
    )


@pytest.mark.usefixtures("no_torch_npu")
def test_ascend_npu_smi_that_hangs_times_out(tmp_path: Path) -> None:
    env = fake_npu_smi(tmp_path, "exec sleep 30")
    report = AscendProbe(environ=env, timeout_s=0.3).probe()
    assert not report.available and report.reason is not None
    assert report.reason.endswith("info did not answer within 0.3 s")


@pytest.mark.usefixtures("no_torch_npu")
def test_ascend_unreadable_npu_smi_output(tmp_path: Path) -> None:
    report = AscendProbe(environ=fake_npu_smi(tmp_path, "echo 'Usage: npu-smi info [-h]'")).probe()
    assert not report.available and report.reason is not None
    assert "printed no NPU table" in report.reason and "Usage: npu-smi info" in report.reason


def test_parser_ignores_the_process_table() -> None:
    text = (DATA / "npu_smi_info_910b.txt").read_text()
    # The recording has one process on NPU 0; a second one is printed as the next row, which
    # has the shape of a chip row ("| 0  0 | <pid> | ... |") and must not become a chip.
    pad = "                 | "
    first = f"| 0       0{pad}641248        |                          | 113                     |"
    second = f"| 0       0{pad}641301        | python3                  | 58211                   |"
    assert first in text
    table = parse_npu_smi_info(text.replace(first, f"{first}\n{second}"))
    assert len(table.chips) == 8 and all(c.bus_id and c.bus_id.startswith("0000:") for c in table.chips)


# --------------------------------------------------------------------------- CPU


def test_cpu_probe_on_this_machine() -> None:
    report = CpuProbe().probe()
    assert report.available and report.source == "procfs"
    (cpu,) = report.devices
    assert cpu.kind == "cpu" and cpu.index == 0 and cpu.name
    assert cpu.memory_total_bytes is not None and cpu.memory_total_bytes > 0
    assert cpu.memory_used_bytes is not None and 0 <= cpu.memory_used_bytes <= cpu.memory_total_bytes
    assert cpu.utilization is not None and 0.0 <= cpu.utilization <= 1.0
    assert cpu.extra["logical_cores"] == os.cpu_count()
    assert 1 <= cpu.extra["usable_cores"] <= cpu.extra["logical_cores"]


def test_cpu_probe_reads_a_proc_tree(tmp_path: Path) -> None:
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()
    cgroup.mkdir()
    # An aarch64 /proc/cpuinfo has no "model name".
    (proc / "cpuinfo").write_text("processor\t: 0\nBogoMIPS\t: 200.00\nCPU part\t: 0xd01\n")
    (proc / "meminfo").write_text(
        "MemTotal:       24684092 kB\nMemFree:  20717312 kB\nMemAvailable:   22929352 kB\n"
    )
    (cgroup / "cpu.max").write_text("200000 100000\n")
    (cgroup / "memory.max").write_text("8589934592\n")
    (cpu,) = CpuProbe(proc=proc, cgroup=cgroup).probe().devices
    assert cpu.memory_total_bytes == 24684092 * 1024
    assert cpu.memory_used_bytes == (24684092 - 22929352) * 1024
    assert cpu.extra["cgroup_cpu_limit"] == 2.0
    assert cpu.extra["cgroup_memory_limit_bytes"] == 8 * 1024**3
    assert cpu.name  # falls back to the platform's name for the processor


def test_cpu_parsers() -> None:
    assert read_model_name("processor : 0\nmodel name : Intel(R) Xeon(R) Platinum 8480+\n") == (
        "Intel(R) Xeon(R) Platinum 8480+"
    )
    assert (
        read_model_name("processor : 0\nModel : Raspberry Pi 5 Model B Rev 1.0\n")
        == "Raspberry Pi 5 Model B Rev 1.0"
    )
    assert read_model_name("processor : 0\n") is None
    assert read_meminfo("MemTotal: 100 kB\nHugePages_Total: 0\n") == {
        "MemTotal": 102400,
        "HugePages_Total": 0,
    }


# --------------------------------------------------------------------------- the runner


def test_the_builtin_probes_are_plugins() -> None:
    plugins = load_plugins()
    registered = plugins.registered("hardware")
    assert {"nvidia", "ascend", "cpu"} <= registered.keys()
    assert {registered[n].plugin for n in ("nvidia", "ascend", "cpu")} == {"hw_nvidia", "hw_ascend", "hw_cpu"}
    for name in ("nvidia", "ascend", "cpu"):
        assert isinstance(registered[name].factory(None), HardwareProbe)


def test_probe_all_runs_every_probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setenv("PATH", str(tmp_path))
    reports = probe_all(plugins=load_plugins())
    assert [r.probe for r in reports][-1] == "cpu"  # accelerators first
    by_name = {r.probe: r for r in reports}
    assert {"nvidia", "ascend", "cpu"} <= by_name.keys()
    assert not by_name["nvidia"].available and not by_name["ascend"].available
    assert by_name["cpu"].available
    assert all(r.duration_ms is not None and r.duration_ms < 1000 for r in reports)


def test_disabled_probe_plugin_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHUNIU_DISABLE_PLUGINS", "hw_ascend")
    names = {r.probe for r in probe_all(plugins=load_plugins())}
    assert "ascend" not in names and {"nvidia", "cpu"} <= names


class _Plugin:
    """An in-code plugin registering the given probe classes."""

    def __init__(self, **probes: Any) -> None:
        self.probes = probes

    @hookimpl
    def register_hardware(self, register) -> None:  # type: ignore[no-untyped-def]
        for name, factory in self.probes.items():
            register(name, factory)


class _Boom:
    def __init__(self, options: object = None) -> None:
        pass

    def probe(self) -> ProbeReport:
        raise RuntimeError("boom")


class _NotAReport:
    def __init__(self, options: object = None) -> None:
        pass

    def probe(self) -> dict[str, str]:
        return {"probe": "odd"}


def test_a_broken_probe_does_not_hide_the_others() -> None:
    plugins = load_plugins(
        entry_points=False, extra=[("mine", _Plugin(boom=_Boom, odd=_NotAReport, cpu=CpuProbe))]
    )
    reports = {r.probe: r for r in probe_all(plugins=plugins)}
    assert reports["boom"].reason == "probe failed: RuntimeError: boom"
    assert reports["odd"].reason == "probe returned dict, not a ProbeReport (plugin 'mine')"
    assert reports["cpu"].available


def test_unknown_probe_name_lists_the_available_ones() -> None:
    plugins = load_plugins(entry_points=False, extra=[("mine", _Plugin(cpu=CpuProbe))])
    with pytest.raises(ValueError, match="unknown hardware probe\\(s\\): gpu; available: cpu"):
        probe_all(["gpu"], plugins=plugins)
    assert [r.probe for r in probe_all(["cpu"], plugins=plugins)] == ["cpu"]


async def test_probe_all_async_runs_probes_in_threads_at_once() -> None:
    # Both probes wait for each other: this only finishes if they run concurrently, and
    # neither runs on the event loop's thread.
    barrier = threading.Barrier(2, timeout=5)
    loop_thread = threading.get_ident()
    threads: list[int] = []

    class Meeting:
        def __init__(self, options: object = None) -> None:
            pass

        def probe(self) -> ProbeReport:
            threads.append(threading.get_ident())
            barrier.wait()
            return ProbeReport(probe="x", available=True, source="test")

    plugins = load_plugins(entry_points=False, extra=[("mine", _Plugin(a=Meeting, b=Meeting))])
    reports = await probe_all_async(plugins=plugins)
    assert [(r.probe, r.available) for r in reports] == [("a", True), ("b", True)]
    assert len(threads) == 2 and loop_thread not in threads


async def test_probe_all_async_reports_a_probe_that_hangs() -> None:
    release = threading.Event()

    class Hang:
        def __init__(self, options: object = None) -> None:
            pass

        def probe(self) -> ProbeReport:
            release.wait(10)
            return ProbeReport(probe="hang", available=True)

    class Quick:
        # Answers at once (not the real CPU probe, which on a loaded 2-core machine could
        # itself miss a short deadline): the test is that the hang does not hide it.
        def __init__(self, options: object = None) -> None:
            pass

        def probe(self) -> ProbeReport:
            return ProbeReport(probe="quick", available=True)

    plugins = load_plugins(entry_points=False, extra=[("mine", _Plugin(hang=Hang, quick=Quick))])
    try:
        reports = {r.probe: r for r in await probe_all_async(plugins=plugins, timeout_s=1.0)}
    finally:
        release.set()  # let the worker thread end before the loop closes its executor
    assert reports["hang"].reason == "probe did not answer within 1 s"
    assert reports["quick"].available
    await asyncio.sleep(0)


def test_hardware_snapshot_is_json(nvml: types.ModuleType) -> None:
    plugins = load_plugins(entry_points=False, extra=[("mine", _Plugin(nvidia=NvidiaProbe, cpu=CpuProbe))])
    snapshot = hardware_snapshot(plugins=plugins)
    decoded = json.loads(json.dumps(snapshot))
    assert decoded["host"] and isinstance(decoded["time"], float)
    nv = next(p for p in decoded["probes"] if p["probe"] == "nvidia")
    assert nv["devices"][0]["memory_total_bytes"] == H100_TOTAL
    # It round-trips into the typed report.
    assert msgspec.convert(nv, ProbeReport).devices[0].uuid == UUID0


# --------------------------------------------------------------------------- shuniu hardware


@pytest.fixture
def no_accelerators(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setenv("PATH", str(tmp_path))


@pytest.mark.usefixtures("no_accelerators")
def test_cli_hardware_json() -> None:
    result = CliRunner().invoke(build_cli(), ["hardware", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    probes = {p["probe"]: p for p in data["probes"]}
    assert {"nvidia", "ascend", "cpu"} <= probes.keys()
    assert probes["nvidia"]["reason"] == MISSING_REASON
    assert probes["cpu"]["devices"][0]["memory_total_bytes"] > 0


@pytest.mark.usefixtures("no_accelerators")
def test_cli_hardware_table_says_why_a_probe_is_unavailable() -> None:
    result = CliRunner().invoke(build_cli(), ["hardware"])
    assert result.exit_code == 0, result.output
    # The reason's "[nvidia]" must survive rich's markup.
    assert "nvidia: unavailable: nvidia-ml-py not installed (pip install 'shuniu[nvidia]')" in result.output
    assert "ascend: unavailable: no Ascend NPU tooling found" in result.output
    assert "cpu (procfs)" in result.output


def test_cli_hardware_table_shows_gpus(nvml: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    result = CliRunner().invoke(build_cli(), ["hardware", "--probe", "nvidia"])
    assert result.exit_code == 0, result.output
    assert "nvidia (nvml, driver 550.54.15, CUDA 12.4)" in result.output
    rows = [line for line in result.output.splitlines() if "H100" in line]
    assert len(rows) == 2
    assert "hidden" in rows[0] and "59.6 / 79.6" in rows[1] and "cuda:0" in rows[1]
    assert "77%" in rows[1] and "62 °C" in rows[1] and "513 / 700 W" in rows[1]


def test_cli_hardware_unknown_probe() -> None:
    result = CliRunner().invoke(build_cli(), ["hardware", "--probe", "tpu"])
    assert result.exit_code == 2
    assert "unknown hardware probe(s): tpu; available: " in result.output


def test_shuniu_hardware_command_line(tmp_path: Path) -> None:
    """The installed console script, in a fresh process."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{tmp_path}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run(
        ["shuniu", "hardware", "--json"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    probes = {p["probe"]: p for p in json.loads(done.stdout)["probes"]}
    assert {"nvidia", "ascend", "cpu"} <= probes.keys()
    assert probes["cpu"]["available"]
    # The probes themselves are quick; the rest of the run is Python and plugin start-up.
    assert all(p["duration_ms"] < 500 for p in probes.values())
