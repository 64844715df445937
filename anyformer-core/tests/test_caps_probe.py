"""The real capability probe: wgpu's adapter in a child process, software adapters, overrides.

``bash scripts/test`` installs wgpu and Mesa's Vulkan drivers (lavapipe), so the probe finds a
software adapter here: it must not count as a GPU unless ANYFORMER_SOFTWARE_GPU=1. Without any
Vulkan adapter these tests fail in one line naming the packages to install.
"""

from __future__ import annotations

from typing import Any

import pytest

import anyformer
from anyformer.machine import _probe

SOFTWARE_NAMES = ("llvmpipe", "lavapipe", "swiftshader")


@pytest.fixture
def fresh_probe(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("ANYFORMER_SOFTWARE_GPU", raising=False)
    yield lambda: anyformer.probe(refresh=True)
    anyformer.probe(refresh=True)


@pytest.fixture(scope="module")
def adapter() -> dict[str, Any]:
    """What wgpu's adapter request answers on this machine (name, backend, features), probed once."""
    return _probe._probe_wgpu()


@pytest.fixture
def software_adapter(fresh_probe, adapter: dict[str, Any]):  # type: ignore[no-untyped-def]
    """The probe, on a machine whose adapter is a software Vulkan one; one clear line when there is none.

    Without Mesa's Vulkan drivers wgpu may still find llvmpipe through OpenGL, which has neither
    shader-f16 nor subgroups: that is the missing package, not a probe bug, and is said so.
    """
    name = str(adapter.get("name", ""))
    software = any(known in name.lower() for known in SOFTWARE_NAMES)
    if name and not software:
        pytest.skip(f"wgpu picks the hardware adapter {name}; these checks need a machine without one")
    if not software or adapter.get("backend") != "Vulkan":
        found = f"{name} through {adapter.get('backend')}" if name else adapter.get("error", "nothing")
        pytest.fail(
            f"wgpu found no software Vulkan adapter (it found {found}): install mesa-vulkan-drivers and "
            "libvulkan1 (`bash scripts/test` installs them when run as root)",
            pytrace=False,
        )
    return fresh_probe


def test_a_software_adapter_is_found_but_is_not_a_gpu(software_adapter) -> None:  # type: ignore[no-untyped-def]
    caps = software_adapter()
    assert caps.gpu_name and any(name in caps.gpu_name.lower() for name in SOFTWARE_NAMES), caps.gpu_note
    assert caps.gpu is False and caps.f16 is False and caps.subgroups is False
    assert "ANYFORMER_SOFTWARE_GPU=1" in caps.gpu_note
    assert caps.gpu_limits.get("max-storage-buffer-binding-size", 0) > 0


def test_software_gpu_counts_with_the_opt_in(software_adapter, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ANYFORMER_SOFTWARE_GPU", "1")
    caps = software_adapter()
    assert caps.gpu is True
    assert caps.f16 is True and caps.subgroups is True  # lavapipe has shader-f16 and subgroups
    assert caps.gpu_bytes == caps.ram_bytes  # a CPU adapter allocates host memory


def test_host_fields_are_read(fresh_probe) -> None:  # type: ignore[no-untyped-def]
    caps = fresh_probe()
    assert caps.ram_bytes > 0 and caps.cpu_count >= 1
    assert caps.store is True and caps.disk_free_bytes and caps.disk_free_bytes > 0


def test_every_field_can_be_overridden_for_a_what_if() -> None:
    caps = anyformer.probe(gpu=False)
    asked = anyformer.probe(gpu=False, ram_bytes=16 * 10**9, f16=True, gpu_bytes=8 * 10**9)
    assert (asked.ram_bytes, asked.f16, asked.gpu_bytes) == (16 * 10**9, True, 8 * 10**9)
    assert caps.with_flags(["gpu", "subgroups"]).gpu and not caps.with_flags(["gpu"]).f16


def test_a_probe_without_wgpu_explains_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_probe.importlib.util, "find_spec", lambda name: None)
    assert "wgpu is not installed" in _probe._probe_wgpu()["error"]
