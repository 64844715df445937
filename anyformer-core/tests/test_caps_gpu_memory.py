"""GPU memory from every vendor's source, and the host facts from psutil and platformdirs.

No GPU here: each source is given the answer its library or tool gives (NVML through a fake
library object, the SMI tools through canned output, Metal through a fake message sender), and
the probe is given fake sources, so the order, the source's name and "unknown is None, never 0"
are what is tested. The Vulkan child runs for real against Mesa's lavapipe.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer.machine import _gpu_memory, _probe
from anyformer.machine._gpu_memory import GpuMemory

GIB = 2**30


class FakeNvml:
    """libnvidia-ml's functions as ctypes calls them: fill the out-arguments, return 0 (NVML_SUCCESS)."""

    def __init__(self, free: int, total: int, init_status: int = 0) -> None:
        self.free, self.total, self.init_status, self.shut = free, total, init_status, False

    def nvmlInit_v2(self) -> int:
        return self.init_status

    def nvmlDeviceGetHandleByIndex_v2(self, index: int, handle: Any) -> int:
        handle._obj.value = 1234
        return 0

    def nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> int:
        memory._obj.total, memory._obj.free, memory._obj.used = self.total, self.free, self.total - self.free
        return 0

    def nvmlDeviceGetName(self, handle: Any, name: Any, length: Any) -> int:
        ctypes.memmove(name, b"NVIDIA H200\0", 12)
        return 0

    def nvmlShutdown(self) -> int:
        self.shut = True
        return 0


def test_nvml_reports_free_and_total_and_the_device_and_shuts_down() -> None:
    nvml = FakeNvml(free=140 * GIB, total=143 * GIB)
    reading = _gpu_memory.from_nvml(lambda: nvml)
    assert reading == GpuMemory(140 * GIB, 143 * GIB, "nvml", "NVIDIA H200")
    assert nvml.shut


def test_no_nvml_library_or_a_driver_that_fails_to_start_is_no_answer() -> None:
    assert _gpu_memory.from_nvml(lambda: None) is None
    assert _gpu_memory.from_nvml(lambda: FakeNvml(1, 2, init_status=9)) is None  # NVML_ERROR_DRIVER_NOT_LOADED


def canned(outputs: dict[str, str]) -> Callable[[list[str]], str | None]:
    return lambda argv: outputs.get(argv[0])


def test_nvidia_smi_reports_mebibytes() -> None:
    reading = _gpu_memory.from_nvidia_smi(canned({"nvidia-smi": "143000, 143771, NVIDIA H200\n"}))
    assert reading == GpuMemory(143000 * 2**20, 143771 * 2**20, "nvidia-smi", "NVIDIA H200")


def test_amd_smi_reports_its_value_and_unit_pairs() -> None:
    answer = [{"gpu": 0, "mem_usage": {"total_vram": {"value": 24560, "unit": "MB"},
                                       "used_vram": {"value": 560, "unit": "MB"},
                                       "free_vram": {"value": 24000, "unit": "MB"}}}]  # fmt: skip
    reading = _gpu_memory.from_amd_smi(canned({"amd-smi": json.dumps(answer)}))
    assert reading == GpuMemory(24000 * 2**20, 24560 * 2**20, "amd-smi")


def test_rocm_smi_reports_bytes_and_free_is_total_less_used() -> None:
    answer = {"card0": {"VRAM Total Memory (B)": "25753026560", "VRAM Total Used Memory (B)": "753026560"}}
    reading = _gpu_memory.from_rocm_smi(canned({"rocm-smi": json.dumps(answer)}))
    assert reading == GpuMemory(25 * 10**9, 25753026560, "rocm-smi")


def test_metal_reports_the_recommended_working_set_less_what_is_allocated() -> None:
    answers = {
        "recommendedMaxWorkingSetSize": 48 * GIB,
        "currentAllocatedSize": 2 * GIB,
        "name": 77,
        "UTF8String": b"Apple M3 Max",
    }
    reading = _gpu_memory.from_metal(lambda: ("device", lambda receiver, selector, restype: answers[selector]))
    assert reading == GpuMemory(46 * GIB, 48 * GIB, "metal", "Apple M3 Max")


@pytest.mark.parametrize(
    "source",
    [
        lambda: _gpu_memory.from_nvidia_smi(canned({"nvidia-smi": "[N/A], [N/A], GPU\n"})),
        lambda: _gpu_memory.from_nvidia_smi(canned({"nvidia-smi": "0, 0, GPU\n"})),
        lambda: _gpu_memory.from_amd_smi(canned({"amd-smi": "not json"})),
        lambda: _gpu_memory.from_rocm_smi(canned({"rocm-smi": '{"card0": {}}'})),
        lambda: _gpu_memory.from_nvidia_smi(canned({})),
        lambda: _gpu_memory.from_nvml(lambda: FakeNvml(0, 0)),
    ],
    ids=["N/A", "zeros", "bad json", "no fields", "tool missing", "zero total"],
)
def test_a_source_that_knows_nothing_is_no_answer_never_zero_bytes(source: Callable[[], Any]) -> None:
    assert source() is None


def test_the_first_source_that_answers_wins_and_one_that_fails_is_passed_over() -> None:
    def broken() -> GpuMemory | None:
        raise OSError("libnvidia-ml.so.1: wrong ELF class")

    amd = GpuMemory(8 * GIB, 16 * GIB, "rocm-smi")
    later = GpuMemory(1, 2, "vulkan")
    assert _gpu_memory.gpu_memory((broken, lambda: None, lambda: amd, lambda: later)) == amd
    assert _gpu_memory.gpu_memory((lambda: None,)) is None


def test_caps_names_the_source_and_total_where_nvidia_smi_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    vulkan = GpuMemory(10 * GIB, 12 * GIB, "vulkan", "AMD Radeon RX 7900")
    monkeypatch.setattr(
        _probe, "_probe_wgpu", lambda **kw: {"name": "AMD Radeon RX 7900", "adapter_type": "DiscreteGPU"}
    )
    monkeypatch.setattr(_gpu_memory, "SOURCES", (lambda: None, lambda: vulkan))
    caps = anyformer.probe(refresh=True)
    try:
        assert (caps.gpu_bytes, caps.gpu_total_bytes, caps.gpu_memory_source) == (10 * GIB, 12 * GIB, "vulkan")
        assert caps.to_dict()["gpu_memory_source"] == "vulkan"
    finally:
        anyformer.probe(refresh=True)


def test_caps_leave_gpu_memory_unknown_where_no_source_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_probe, "_probe_wgpu", lambda **kw: {"error": "wgpu is not installed"})
    monkeypatch.setattr(_gpu_memory, "SOURCES", (lambda: None,))
    caps = anyformer.probe(refresh=True)
    anyformer.probe(refresh=True)
    assert (caps.gpu_bytes, caps.gpu_total_bytes, caps.gpu_memory_source) == (None, None, None)


def test_vulkan_is_not_asked_where_wgpu_saw_only_a_software_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANYFORMER_SOFTWARE_GPU", raising=False)
    monkeypatch.setattr(_probe, "_probe_wgpu", lambda **kw: {"name": "llvmpipe", "adapter_type": "CPU"})
    asked: list[str] = []

    def vulkan() -> GpuMemory | None:
        asked.append("vulkan")
        return GpuMemory(1, 2, "vulkan")

    monkeypatch.setattr(_gpu_memory, "SOURCES", (lambda: None, vulkan))
    monkeypatch.setattr(_gpu_memory, "from_vulkan", vulkan)
    caps = anyformer.probe(refresh=True)
    anyformer.probe(refresh=True)
    assert asked == [] and caps.gpu_bytes is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="lavapipe is the Linux test machines' Vulkan device")
def test_the_vulkan_child_skips_a_cpu_device_and_reads_its_heaps_when_told_to_count_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ANYFORMER_SOFTWARE_GPU", raising=False)
    if _gpu_memory.from_vulkan() is not None:
        pytest.skip("a hardware Vulkan device answers here")
    monkeypatch.setenv("ANYFORMER_SOFTWARE_GPU", "1")
    reading = _gpu_memory.from_vulkan()
    if reading is None:
        pytest.fail("no Vulkan device at all: install mesa-vulkan-drivers and libvulkan1", pytrace=False)
    # lavapipe has no VK_EXT_memory_budget: its heap size is known, what is free is not.
    assert reading.source == "vulkan" and reading.total_bytes and reading.total_bytes > 0
    assert reading.device and "llvmpipe" in reading.device


# ---- the host: psutil and platformdirs ----------------------------------------------------------


class FakeProcess:
    def __init__(self, affinity: list[int] | None) -> None:
        if affinity is not None:
            self.cpu_affinity = lambda: affinity


def test_host_memory_is_psutils_available_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    class Memory:
        available = 7 * GIB

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory())
    assert _probe.host_ram_available() == 7 * GIB


def test_cores_are_the_affinity_where_there_is_one_and_the_logical_count_on_macos(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import psutil

    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 12)
    monkeypatch.setattr(psutil, "Process", lambda: FakeProcess([0, 1, 2]))
    assert _probe.usable_cpu_count() == 3
    monkeypatch.setattr(psutil, "Process", lambda: FakeProcess(None))  # macOS: no cpu_affinity
    assert _probe.usable_cpu_count() == 12


def test_the_store_is_the_systems_user_cache_folder_unless_anyformer_home_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import platformdirs

    from anyformer.store._paths import anyformer_home

    monkeypatch.delenv("ANYFORMER_HOME", raising=False)
    mac = Path("/Users/ada/Library/Caches/anyformer")
    monkeypatch.setattr(platformdirs, "user_cache_path", lambda name, appauthor=None: mac)
    assert anyformer_home() == mac
    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path))
    assert anyformer_home() == tmp_path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the XDG layout is Linux's")
def test_on_linux_the_store_stays_where_it_was_before_platformdirs(monkeypatch: pytest.MonkeyPatch) -> None:
    from anyformer.store._paths import anyformer_home

    monkeypatch.delenv("ANYFORMER_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/tmp/xdg-cache")
    assert anyformer_home() == Path("/tmp/xdg-cache/anyformer")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert anyformer_home() == Path(os.path.expanduser("~")) / ".cache" / "anyformer"
