"""Every refusal code of the llama.cpp backend, from descriptions, and where the estimate puts the layers."""

from __future__ import annotations

import re
from pathlib import Path
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


@pytest.fixture(scope="module")
def llama_cpp_kv_bytes_at_2048(smollm2_path: Path) -> int:
    """The KV cache llama.cpp itself allocates for SmolLM2 at 2048 tokens, read from its load log."""
    import llama_cpp

    logged: list[str] = []
    # llama-cpp-python's log callback prints llama.cpp's log lines to sys.stderr when verbose.
    from llama_cpp import _logger

    def keep(level: int, text: bytes, user_data: object) -> None:
        logged.append(text.decode("utf-8", "replace"))

    callback = llama_cpp.llama_log_callback(keep)
    llama_cpp.llama_log_set(callback, None)
    try:
        llm = llama_cpp.Llama(str(smollm2_path), n_ctx=2048, n_gpu_layers=0, verbose=True)
        llm.close()
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, None)  # llama-cpp-python's own again
    match = re.search(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*2048 cells", "".join(logged))
    assert match, "llama.cpp no longer logs its KV cache size; read it another way"
    return round(float(match.group(1)) * 2**20)


def test_the_kv_cache_estimate_is_what_llama_cpp_allocates(smollm2_path: Path, llama_cpp_kv_bytes_at_2048: int) -> None:
    facts = anyformer.describe(smollm2_path).metadata["gguf"]
    predicted = estimate.kv_cache_bytes(facts, 2048, SMOL_BYTES)
    # llama.cpp logs MiB with two decimals: agree within that rounding.
    assert abs(predicted - llama_cpp_kv_bytes_at_2048) <= 0.005 * 2**20


def test_ok_estimate_on_a_cpu_build_counts_weights_and_kv_cache(
    monkeypatch: pytest.MonkeyPatch, llama_cpp_kv_bytes_at_2048: int
) -> None:
    monkeypatch.setattr(plugin, "gpu_offload_library", lambda: None)
    model = _model(
        [("SmolLM2-135M-Instruct.Q4_1.gguf", SMOL_BYTES)], architecture="llama", metadata={"gguf": GGUF_FACTS}
    )
    verdict = plugin.can_run(model, _caps(gpu_bytes=80 * 10**9), Request(context=2048))
    assert verdict.ok and verdict.estimate is not None
    assert verdict.estimate.ram_bytes >= SMOL_BYTES + llama_cpp_kv_bytes_at_2048
    assert verdict.estimate.gpu_bytes == 0
    assert verdict.estimate.rank is Rank.FALLBACK
    assert verdict.estimate.details["gpu_layers"] == 0


def test_a_measured_model_gets_its_speed_for_where_it_runs_and_an_unmeasured_one_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    smol = _model(
        [("SmolLM2-135M-Instruct.Q4_1.gguf", SMOL_BYTES)], architecture="llama", metadata={"gguf": GGUF_FACTS}
    )
    monkeypatch.setattr(plugin, "gpu_offload_library", lambda: None)
    on_cpu = plugin.can_run(smol, _caps(), Request(context=2048)).estimate
    monkeypatch.setattr(plugin, "gpu_offload_library", lambda: "cuda")
    on_gpu = plugin.can_run(smol, _caps(), Request(context=2048, budget=10**9)).estimate
    part = plugin.can_run(smol, _caps(), Request(context=2048, budget=150 * 10**6)).estimate
    other = plugin.can_run(_model([("x-Q4_0.gguf", SMOL_BYTES + 1)], architecture="llama"), _caps(), Request())
    assert on_cpu is not None and on_gpu is not None and part is not None and other.estimate is not None
    assert on_cpu.tok_per_sec is not None and on_cpu.tok_per_sec > 0
    assert on_gpu.details["gpu_layers"] == 30 and on_gpu.tok_per_sec is not None
    assert on_gpu.tok_per_sec > on_cpu.tok_per_sec, "a full CUDA offload must rank faster than the CPU"
    assert 0 < part.details["gpu_layers"] < 30 and part.tok_per_sec == on_cpu.tok_per_sec  # partial: CPU-bound
    assert other.estimate.tok_per_sec is None, "an unmeasured file must not borrow another's speed"


def test_the_projector_counts_in_the_host_memory_check_as_in_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "gpu_offload_library", lambda: None)
    projector = 600 * 10**6
    text_only = _model([("x-Q4_0.gguf", 10**9)], metadata={"gguf": GGUF_FACTS})
    with_projector = _model([("x-Q4_0.gguf", 10**9), ("mmproj-x-f16.gguf", projector)], metadata={"gguf": GGUF_FACTS})
    model_only = plugin.can_run(text_only, _caps(), Request()).estimate.ram_bytes
    refused = plugin.can_run(with_projector, _caps(ram=model_only), Request())
    assert refused.code is Refusal.MEMORY and refused.need == model_only + projector
    assert "projector" in refused.reason
    accepted = plugin.can_run(with_projector, _caps(ram=model_only + projector), Request())
    assert accepted.ok and accepted.estimate.ram_bytes == model_only + projector
    embedding = plugin.can_run(with_projector, _caps(ram=model_only), Request(task="feature-extraction"))
    assert embedding.ok, "embeddings load no projector, so it must not count"


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def _hub_model(size: int) -> Model:
    return _model([("x-Q4_0.gguf", size)], source="hub", revision="main", metadata={"gguf": GGUF_FACTS})


@pytest.mark.parametrize(
    ("caps", "reason_part"),
    [
        (Caps(ram_bytes=16 * 10**9, store=False, store_path="/ro/hub"), "the model store (/ro/hub) is not writable"),
        (Caps(ram_bytes=16 * 10**9, store=True, disk_free_bytes=10**8), "the store's disk has 100 MB free"),
    ],
    ids=["read-only-store", "no-room"],
)
def test_store_when_hub_files_must_be_downloaded_and_the_store_cannot_take_them(
    hub_cache: Path, caps: Caps, reason_part: str
) -> None:
    # The core's store check, from the files the estimate names (the backend has no copy of it).
    verdict = _through_the_core(_hub_model(10**9), caps)
    assert verdict.code is Refusal.STORE and verdict.need is None
    assert "x-Q4_0.gguf (1 GB) must be downloaded" in verdict.reason and reason_part in verdict.reason
    assert _through_the_core(_hub_model(10**9), caps.replace(store=True, disk_free_bytes=2 * 10**9)).ok


def _through_the_core(model: Model, caps: Caps) -> anyformer.Verdict:
    manager = anyformer.PluginManager()
    manager.register(plugin, "llamacpp")
    (verdict,) = manager.can_run(model, caps, Request())
    return verdict


def test_files_already_in_the_hub_cache_need_no_store(hub_cache: Path) -> None:
    commit = "a" * 40
    repo = hub_cache / "models--org--x"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "x-Q4_0.gguf").write_bytes(b"\0" * 1000)
    verdict = _through_the_core(_hub_model(1000), Caps(ram_bytes=16 * 10**9, store=False, disk_free_bytes=0))
    assert verdict.ok


@pytest.mark.parametrize("version", ["0.3.35", "0.4.0", "1.0.0", "not-a-version"])
def test_runtime_naming_an_installed_llama_cpp_python_whose_internals_differ(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    monkeypatch.setattr(plugin, "llama_cpp_version", lambda: version)
    verdict = plugin.can_run(_model([("x-Q4_0.gguf", 100)]), _caps(), Request())
    assert verdict.code is Refusal.RUNTIME
    assert f"llama-cpp-python {version} is installed" in verdict.reason
    assert runtime.SUPPORTED_SPEC in verdict.reason


@pytest.mark.parametrize("version", ["0.3.36", "0.3.99", "0.3.40.dev1"])
def test_llama_cpp_python_versions_in_the_supported_range_are_accepted(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    monkeypatch.setattr(plugin, "llama_cpp_version", lambda: version)
    assert plugin.can_run(_model([("x-Q4_0.gguf", 100)]), _caps(), Request()).ok


def test_the_installed_llama_cpp_python_is_in_the_supported_range() -> None:
    version = runtime.llama_cpp_version()
    assert version is not None and runtime.unsupported_version_reason(version) is None, version


def test_the_version_read_beside_the_package_is_what_the_metadata_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.metadata

    installed = importlib.metadata.version("llama-cpp-python")
    assert runtime.llama_cpp_version() == installed
    monkeypatch.setattr(runtime, "llama_cpp_folder", lambda: tmp_path / "llama_cpp")
    assert runtime.llama_cpp_version() == installed  # no dist-info beside it: the metadata is asked
    (tmp_path / "llama_cpp_python-9.9.9.dist-info").mkdir()
    assert runtime.llama_cpp_version() == "9.9.9"


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


def test_the_preferred_file_gives_way_to_the_next_smaller_one_that_fits_host_memory() -> None:
    files = [
        ("x-BF16.gguf", 8 * 10**9),
        ("x-Q4_K_M.gguf", 3 * 10**9),
        ("x-Q8_0.gguf", 5 * 10**9),
        ("x-IQ2_M.gguf", 10**9),
    ]
    fits = plugin.can_run(_model(files, architecture="llama"), _caps(ram=16 * 10**9), Request())
    assert fits.ok and fits.estimate.details["file"] == "x-Q4_K_M.gguf" and fits.estimate.files == ("x-Q4_K_M.gguf",)
    smaller = plugin.can_run(_model(files, architecture="llama"), _caps(ram=2 * 10**9), Request())
    assert smaller.ok and smaller.estimate.details["file"] == "x-IQ2_M.gguf"
    none = plugin.can_run(_model(files, architecture="llama"), _caps(ram=5 * 10**8), Request())
    assert none.code is Refusal.MEMORY and "x-IQ2_M.gguf" in none.reason and "smallest of 2 files tried" in none.reason
    named = plugin.can_run(_model(files, architecture="llama"), _caps(), Request(options={"file": "x-Q8_0.gguf"}))
    assert named.ok and named.estimate.details["file"] == "x-Q8_0.gguf"


# ---- a GPU the installed build cannot use ---------------------------------------------------------

SMOL = [("SmolLM2-135M-Instruct.Q4_1.gguf", SMOL_BYTES)]


@pytest.mark.parametrize(
    ("source", "backend"),
    [("nvml", "cuda"), ("nvidia-smi", "cuda"), ("rocm-smi", "hip"), ("amd-smi", "hip"), ("metal", "metal"),
     ("vulkan", "vulkan")],
)  # fmt: skip
def test_a_gpu_and_a_cpu_build_say_so_with_the_rebuild_command_for_its_vendor(
    monkeypatch: pytest.MonkeyPatch, source: str, backend: str
) -> None:
    monkeypatch.setattr(plugin, "gpu_offload_library", lambda: None)
    monkeypatch.setattr(runtime, "llama_cpp_version", lambda: "0.3.36")
    caps = Caps(ram_bytes=16 * 10**9, gpu_bytes=80 * 10**9, gpu_memory_source=source, gpu_name="The GPU", store=True)
    verdict = plugin.can_run(_model(SMOL, metadata={"gguf": GGUF_FACTS}), caps, Request())
    assert verdict.ok and verdict.estimate is not None
    details = verdict.estimate.details
    assert (details["offload"], details["build"], details["gpu_layers"]) == ("cpu", "cpu", 0)
    note = details["note"]
    assert "The GPU is here but llama-cpp-python was built for the CPU only" in note
    assert runtime.GPU_BUILD_FLAGS[backend] in note and "-DGGML_RPC=ON" in note
    assert "llama-cpp-python==0.3.36" in note and "--force-reinstall" in note


def test_no_gpu_or_a_software_adapter_or_a_gpu_build_adds_no_note(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(SMOL, metadata={"gguf": GGUF_FACTS})
    monkeypatch.setattr(plugin, "gpu_offload_library", lambda: None)
    software = Caps(ram_bytes=16 * 10**9, gpu=True, gpu_type="CPU", gpu_memory_source="host", store=True)
    for caps in (_caps(), software):
        estimate = plugin.can_run(model, caps, Request()).estimate
        assert estimate is not None and "note" not in estimate.details
    monkeypatch.setattr(plugin, "gpu_offload_library", lambda: "cuda")
    nvidia = Caps(ram_bytes=16 * 10**9, gpu_bytes=80 * 10**9, gpu_memory_source="nvml", store=True)
    estimate = plugin.can_run(model, nvidia, Request()).estimate
    assert estimate is not None and "note" not in estimate.details
    assert (estimate.details["offload"], estimate.details["build"]) == ("cuda", "cuda")
    assert estimate.details["placement"] == "30 of 30 layers on cuda"


def test_a_gpu_build_with_no_layer_offloaded_says_the_cpu_runs_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "gpu_offload_library", lambda: "cuda")
    estimate = plugin.can_run(_model(SMOL, metadata={"gguf": GGUF_FACTS}), _caps(), Request(budget=0)).estimate
    assert estimate is not None
    assert (estimate.details["offload"], estimate.details["build"], estimate.details["placement"]) == (
        "cpu",
        "cuda",
        "on the CPU",
    )
