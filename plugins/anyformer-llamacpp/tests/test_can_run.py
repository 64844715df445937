"""Every refusal code of the llama.cpp backend, from descriptions, and where the estimate puts the layers."""

from __future__ import annotations

from typing import Any

import pytest

import anyformer
from anyformer import Caps, Model, Rank, Refusal, Request
from anyformer_llamacpp import estimate, plugin, runtime

GGUF_FACTS = {
    "architecture": "llama",
    "block_count": 30,
    "context_length": 8192,
    "embedding_length": 576,
    "head_count": 9,
    "head_count_kv": 3,
}
SMOL_BYTES = 98362432


def _model(files: list[tuple[str, int]], **fields: Any) -> Model:
    data = {"repo": "org/x", "files": [{"name": n, "size": s} for n, s in files], **fields}
    return Model.from_dict(data)


def _caps(ram: int = 16 * 10**9, gpu_bytes: int | None = None) -> Caps:
    return Caps(ram_bytes=ram, gpu_bytes=gpu_bytes, cpu_count=2, store=True)


def test_format_when_the_repo_has_no_gguf() -> None:
    verdict = plugin.can_run(_model([("model.onnx", 100)]), _caps(), Request())
    assert (verdict.ok, verdict.code) == (False, Refusal.FORMAT)


def test_task_when_the_task_is_not_chat() -> None:
    verdict = plugin.can_run(_model([("x-Q4_0.gguf", 100)]), _caps(), Request(task="automatic-speech-recognition"))
    assert verdict.code is Refusal.TASK and "automatic-speech-recognition" in verdict.reason
    model_task = _model([("x-Q4_0.gguf", 100)], task="text-to-speech")
    assert plugin.can_run(model_task, _caps(), Request()).code is Refusal.TASK
    assert plugin.can_run(model_task, _caps(), Request(task="image-text-to-text")).ok


def test_feature_extraction_is_accepted_for_embeddings() -> None:
    model = _model([("x-Q4_0.gguf", 100)], task="feature-extraction")
    assert plugin.can_run(model, _caps(), Request()).ok
    assert plugin.can_run(_model([("x-Q4_0.gguf", 100)]), _caps(), Request(task="feature-extraction")).ok


def test_model_when_only_projectors_or_unreadable_quants() -> None:
    verdict = plugin.can_run(_model([("mmproj-f16.gguf", 100), ("x-PTQ1_0.gguf", 100)]), _caps(), Request())
    assert verdict.code is Refusal.MODEL


def test_runtime_when_llama_cpp_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "llama_cpp_folder", lambda: None)
    verdict = plugin.can_run(_model([("x-Q4_0.gguf", 100)]), _caps(), Request())
    assert verdict.code is Refusal.RUNTIME and "pip install llama-cpp-python" in verdict.reason


def test_memory_with_need_when_host_ram_is_too_small() -> None:
    model = _model([("x-Q4_0.gguf", 4 * 10**9)], metadata={"gguf": GGUF_FACTS})
    verdict = plugin.can_run(model, _caps(ram=2 * 10**9), Request())
    assert verdict.code is Refusal.MEMORY
    assert verdict.need is not None and verdict.need > 2 * 10**9
    assert plugin.can_run(model, _caps(ram=verdict.need), Request()).ok


def test_memory_counts_the_projector_an_accepted_estimate_fits_the_ram_offered() -> None:
    projector = 50 * 10**6
    model = _model([("x-Q4_0.gguf", 10**8), ("mmproj-f16.gguf", projector)], metadata={"gguf": GGUF_FACTS})
    accepted = plugin.can_run(model, _caps(), Request())
    assert accepted.ok and accepted.estimate is not None
    ram = accepted.estimate.ram_bytes
    short = plugin.can_run(model, _caps(ram=ram - 1), Request())  # the model alone would fit here
    assert (short.ok, short.code, short.need) == (False, Refusal.MEMORY, ram)
    assert "projector" in short.reason
    assert plugin.can_run(model, _caps(ram=ram), Request()).ok


def test_ok_estimate_on_a_cpu_build_counts_weights_and_kv_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "gpu_offload_library", lambda: None)
    model = _model(
        [("SmolLM2-135M-Instruct.Q4_1.gguf", SMOL_BYTES)], architecture="llama", metadata={"gguf": GGUF_FACTS}
    )
    verdict = plugin.can_run(model, _caps(gpu_bytes=80 * 10**9), Request(context=2048))
    assert verdict.ok and verdict.estimate is not None
    kv = 2 * 30 * 2048 * 3 * (64 + 64)
    assert verdict.estimate.ram_bytes >= SMOL_BYTES + kv
    assert verdict.estimate.gpu_bytes == 0
    assert verdict.estimate.rank is Rank.FALLBACK
    assert verdict.estimate.tok_per_sec == estimate.MEASURED_TOK_PER_SEC[("llama", SMOL_BYTES)]["cpu"]
    assert verdict.estimate.details["gpu_layers"] == 0


def test_gpu_build_offloads_every_layer_when_the_budget_holds_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "gpu_offload_library", lambda: "cuda")
    model = _model([("x-Q4_0.gguf", 2 * 10**9)], metadata={"gguf": GGUF_FACTS})
    verdict = plugin.can_run(model, _caps(), Request(budget=10 * 10**9))
    assert verdict.ok and verdict.estimate.details["gpu_layers"] == 30
    assert verdict.estimate.gpu_bytes > 2 * 10**9


def test_gpu_build_offloads_part_of_the_layers_when_the_budget_is_short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "gpu_offload_library", lambda: "cuda")
    model = _model([("x-Q4_0.gguf", 3 * 10**9)], metadata={"gguf": GGUF_FACTS})
    verdict = plugin.can_run(model, _caps(), Request(budget=10**9))
    layers = verdict.estimate.details["gpu_layers"]
    assert 0 < layers < 30
    assert verdict.estimate.gpu_bytes <= 10**9
    assert verdict.estimate.ram_bytes < 3 * 10**9


def test_budget_zero_on_a_gpu_build_runs_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "gpu_offload_library", lambda: "cuda")
    verdict = plugin.can_run(
        _model([("x-Q4_0.gguf", 10**9)], metadata={"gguf": GGUF_FACTS}), _caps(), Request(budget=0)
    )
    assert verdict.ok and verdict.estimate.gpu_bytes == 0


def test_runtime_library_detection_reads_the_installed_package() -> None:
    folder = runtime.llama_cpp_folder()
    assert folder is not None and (folder / "llama.py").is_file()


def test_check_through_the_installed_entry_point(smollm2_path) -> None:  # type: ignore[no-untyped-def]
    model, selection = anyformer.check(smollm2_path, caps=_caps())
    assert selection.chosen_backend == "llamacpp"
    assert model.architecture == "llama" and model.metadata["gguf"]["block_count"] == 30
