"""The decode-speed model: its terms against hand arithmetic, and the adapter figures timed once and kept."""

from __future__ import annotations

import json

import pytest

from anyformer_gguf_gpu import adapter_speed as adapter_speed_module
from anyformer_gguf_gpu.adapter_speed import AdapterSpeed, adapter_speed, measure
from anyformer_gguf_gpu.decode_speed import DISPATCHES_PER_LAYER, DISPATCHES_PER_STEP, decode_speed, formats_read

SUMMARY = {
    "block_count": 30,
    "embedding_length": 576,
    "head_count": 9,
    "head_count_kv": 3,
    "decode_bytes_by_type": {"Q4_1": 60_000_000, "Q8_0": 30_000_000},
}
HARDWARE = AdapterSpeed("gpu", False, 10e-6, 4e-6, {"Q4_1": 1e12, "Q8_0": 2e12, "F16": 1e12})


def test_a_hardware_step_is_the_longer_of_gpu_and_host_time() -> None:
    found = decode_speed(SUMMARY, HARDWARE, keys=100)
    assert found is not None
    dispatches = DISPATCHES_PER_LAYER * 30 + DISPATCHES_PER_STEP
    kv = 2 * 30 * 100 * 3 * 64 * 4
    gpu = dispatches * 10e-6 + 60e6 / 1e12 + 30e6 / 2e12 + kv / 1e12
    assert found.dispatches == dispatches
    assert found.gpu_s == pytest.approx(gpu)
    assert found.host_s == pytest.approx(dispatches * 4e-6)
    assert found.tok_per_sec == pytest.approx(1 / max(gpu, dispatches * 4e-6))


def test_a_software_adapter_adds_host_and_device_time_and_long_contexts_split() -> None:
    software = AdapterSpeed("cpu", True, 10e-6, 4e-6, {"Q4_1": 1e9, "Q8_0": 2e9, "F16": 1e9})
    short = decode_speed(SUMMARY, software, keys=100)
    long = decode_speed(SUMMARY, software, keys=4000)
    assert short is not None and long is not None
    assert short.tok_per_sec == pytest.approx(1 / (short.gpu_s + short.host_s))
    assert long.dispatches == short.dispatches + 30  # the combine dispatch of split attention
    assert long.tok_per_sec < short.tok_per_sec


def test_missing_facts_give_no_figure_and_untimed_formats_take_the_slowest_rate() -> None:
    assert decode_speed({**SUMMARY, "block_count": None}, HARDWARE) is None
    assert decode_speed(SUMMARY, AdapterSpeed("gpu", False, 1e-6, 1e-6, {})) is None
    q6 = {**SUMMARY, "decode_bytes_by_type": {"Q6_K": 90_000_000}}
    slow = decode_speed(q6, HARDWARE, keys=1)
    assert slow is not None and slow.gpu_s == pytest.approx(153 * 10e-6 + 90e6 / 1e12 + 2 * 30 * 3 * 64 * 4 / 1e12)
    assert formats_read(SUMMARY) == ("F16", "Q4_1", "Q8_0")
    # A summary kept before the per-type bytes existed: the data bytes in the file's main type.
    old = {"block_count": 2, "head_count": 1, "embedding_length": 8, "file_type": 2, "data_bytes": 1000}
    assert formats_read(old) == ("F16", "Q4_0")


def test_figures_are_kept_per_key_and_only_missing_formats_are_timed(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path))
    monkeypatch.setattr(adapter_speed_module, "_FOUND", {})
    monkeypatch.setattr(adapter_speed_module, "_FAILED", {})
    monkeypatch.setattr(adapter_speed_module, "_key", lambda software: f"key-{software}")
    asked: list[tuple[str, ...]] = []

    def fake_child(software: bool, formats: tuple[str, ...]) -> AdapterSpeed:
        asked.append(formats)
        return AdapterSpeed("gpu", False, 1e-6, 1e-6, {f: 1e9 for f in formats})

    monkeypatch.setattr(adapter_speed_module, "_time_in_child", fake_child)
    first = adapter_speed(False, ("Q4_0", "F16", "F32"))
    assert asked == [("F16", "Q4_0")] and set(first.bytes_per_s) == {"F16", "Q4_0"}
    monkeypatch.setattr(adapter_speed_module, "_FOUND", {})  # a new process: the kept file answers
    assert adapter_speed(False, ("Q4_0",)) == first and len(asked) == 1
    both = adapter_speed(False, ("Q4_0", "Q8_0"))
    assert asked[-1] == ("Q8_0",) and set(both.bytes_per_s) == {"F16", "Q4_0", "Q8_0"}
    kept = json.loads((tmp_path / "gguf-gpu" / "adapter-speed.json").read_text())
    assert kept["key"] == "key-False" and set(kept["speed"]["bytes_per_s"]) == {"F16", "Q4_0", "Q8_0"}
    adapter_speed(True, ("Q4_0",))  # another key (a software adapter allowed): timed again
    assert asked[-1] == ("Q4_0",)


def test_a_failed_timing_is_not_retried_in_the_same_process(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path))
    monkeypatch.setattr(adapter_speed_module, "_FOUND", {})
    monkeypatch.setattr(adapter_speed_module, "_FAILED", {})
    calls = []

    def failing(software: bool, formats: tuple[str, ...]) -> AdapterSpeed:
        calls.append(formats)
        raise RuntimeError("no adapter")

    monkeypatch.setattr(adapter_speed_module, "_time_in_child", failing)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="no adapter"):
            adapter_speed(False, ("Q4_0",))
    assert len(calls) == 1


def test_the_adapter_is_timed_with_the_engines_kernels(gpu) -> None:
    """On this machine's adapter (lavapipe in CI): positive figures, a larger product slower than a tiny one."""
    found = measure(gpu, ("Q4_0", "F16"))
    assert found.adapter == gpu.name
    assert set(found.bytes_per_s) == {"Q4_0", "F16"}
    assert all(rate > 0 for rate in found.bytes_per_s.values())
    assert found.floor_s > 0 and found.encode_s > 0 and found.roundtrip_s > 0 and found.upload_bytes_per_s > 0
    assert AdapterSpeed.from_dict(json.loads(json.dumps(found.to_dict()))) == found
