"""The adapter's facts are kept between commands, and asked anew whenever what decides them changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer.machine import _adapter_cache, _probe

FACTS = {"name": "Test GPU", "adapter_type": "DiscreteGPU", "backend": "Vulkan", "features": ["shader-f16"]}


@pytest.fixture
def asks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """Count the child processes that ask wgpu; each answers FACTS. The store is a fresh folder."""
    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ANYFORMER_PROBE_CACHE", raising=False)
    calls: list[int] = []

    def ask(timeout: float) -> tuple[dict[str, Any], bool]:
        calls.append(1)
        return dict(FACTS), True

    monkeypatch.setattr(_probe, "_ask_wgpu", ask)
    monkeypatch.setattr(_probe.importlib.util, "find_spec", lambda name: object())
    yield calls
    anyformer.probe(refresh=True, gpu=False)


def test_the_second_probe_answers_from_the_cache(asks: list[int]) -> None:
    assert _probe._probe_wgpu() == FACTS
    assert _probe._probe_wgpu() == FACTS
    assert len(asks) == 1


def test_a_changed_fingerprint_asks_again(asks: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    _probe._probe_wgpu()
    monkeypatch.setenv("VK_DRIVER_FILES", "/elsewhere/icd.json")  # another driver picked
    _probe._probe_wgpu()
    monkeypatch.setattr(_adapter_cache, "_boot_id", lambda: "another boot")
    _probe._probe_wgpu()
    assert len(asks) == 3


def test_refresh_asks_the_driver_and_rewrites_the_cache(asks: list[int]) -> None:
    anyformer.probe(refresh=True)
    anyformer.probe(refresh=True)
    assert len(asks) == 2
    anyformer.probe(refresh=False)  # the process cache holds the caps; nothing asks again
    assert len(asks) == 2


def test_a_corrupt_or_foreign_cache_file_is_ignored_and_replaced(asks: list[int]) -> None:
    path = Path(os.environ["ANYFORMER_HOME"]) / "probe" / "adapter.json"
    path.parent.mkdir(parents=True)
    for content in ("{not json", json.dumps(["a list"]), json.dumps({"fingerprint": "x", "facts": FACTS})):
        path.write_text(content)
        assert _probe._probe_wgpu() == FACTS
    assert len(asks) == 3
    assert json.loads(path.read_text())["fingerprint"] == _adapter_cache.fingerprint()


def test_a_failed_probe_is_not_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(_probe, "_ask_wgpu", lambda timeout: ({"error": "the GPU probe exited with -6"}, False))
    monkeypatch.setattr(_probe.importlib.util, "find_spec", lambda name: object())
    assert _probe._probe_wgpu()["error"].endswith("-6")
    assert not (tmp_path / "home" / "probe" / "adapter.json").exists()


def test_the_cache_can_be_turned_off(asks: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYFORMER_PROBE_CACHE", "0")
    _probe._probe_wgpu()
    _probe._probe_wgpu()
    assert len(asks) == 2
    assert not (Path(os.environ["ANYFORMER_HOME"]) / "probe").exists()


def test_an_unwritable_store_still_probes(asks: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ANYFORMER_HOME", str(blocker / "home"))
    assert _probe._probe_wgpu() == FACTS
    assert _probe._probe_wgpu() == FACTS
    assert len(asks) == 2


def test_a_real_second_process_reads_the_real_adapter_from_the_cache(tmp_path: Path) -> None:
    """Two processes, the real wgpu: the second answers the same facts without starting the child."""
    env = {**os.environ, "ANYFORMER_HOME": str(tmp_path / "home")}
    env.pop("ANYFORMER_PROBE_CACHE", None)
    script = (
        "import json, anyformer\n"
        "from anyformer.machine import _probe\n"
        "asked = []\n"
        "real = _probe._ask_wgpu\n"
        "_probe._ask_wgpu = lambda t: (asked.append(1), real(t))[1]\n"
        "facts = _probe._probe_wgpu()\n"
        "print(json.dumps({'asked': len(asked), 'facts': facts}))\n"
    )
    first, second = (
        json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
                   .stdout.splitlines()[-1])
        for _ in range(2)
    )  # fmt: skip
    assert (first["asked"], second["asked"]) == (1, 0)
    assert second["facts"] == first["facts"]


def test_the_wgpu_identity_follows_its_version_and_files_without_importlib_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    site = tmp_path / "site"
    (site / "wgpu").mkdir(parents=True)
    (site / "wgpu" / "__init__.py").write_text("")
    (site / "wgpu-1.0.0.dist-info").mkdir()
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    first = _adapter_cache._wgpu_identity()
    assert "wgpu-1.0.0.dist-info" in first and str(site) in first
    (site / "wgpu-1.0.0.dist-info").rename(site / "wgpu-1.1.0.dist-info")  # an upgrade
    upgraded = _adapter_cache._wgpu_identity()
    assert upgraded != first and "wgpu-1.1.0.dist-info" in upgraded
    (site / "wgpu" / "__init__.py").write_text("# rebuilt\n")  # a reinstall of the same version
    assert _adapter_cache._wgpu_identity() != upgraded


def test_the_fingerprint_is_the_same_through_another_name_of_the_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``anyformer`` (a ``python3`` shebang) and ``python -m anyformer`` share the cached facts."""
    import sys

    other = tmp_path / "python3"
    other.symlink_to(sys.executable)
    first = _adapter_cache.fingerprint()
    monkeypatch.setattr(sys, "executable", str(other))
    assert _adapter_cache.fingerprint() == first
