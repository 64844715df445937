"""can_run decides from the description alone, in the documented order, with the numbers in the reason."""

from __future__ import annotations

import pytest
from descriptions import LFM2_350M, SMOLLM2, gguf_model, lfm2_model

import anyformer
from anyformer import Caps, Model, Rank, Refusal, Request
from anyformer_gguf_gpu.config import READABLE_TYPES, footprint
from anyformer_gguf_gpu.engines import open_engine
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.gpu import GPU
from anyformer_gguf_gpu.testing import RandomModel, write_random_gguf
from anyformer_gguf_gpu.testing_lfm2 import RandomLfm2, write_random_lfm2_gguf
from anyformer_gguf_gpu.transformer import TransformerEngine
from anyformer_localmind import plugin
from anyformer_localmind.estimate import DEFAULT_CONTEXT, MAX_BATCH

GPU_CAPS = Caps(gpu=True, gpu_name="test GPU", gpu_bytes=8 * 2**30, ram_bytes=8 * 2**30, store=True)


def verdict(description: dict, caps: Caps = GPU_CAPS, **request):
    """The verdict as the core gives it: options parsed, the store checked (the backend has no copy of it)."""
    manager = anyformer.PluginManager()
    manager.register(plugin, "localmind")
    (answer,) = manager.can_run(Model.from_dict(description), caps, Request(**request))
    return answer


def test_smollm2_is_accepted_as_a_specialist_with_its_footprint():
    v = verdict(gguf_model())
    assert v.ok, v.reason
    assert v.estimate.rank is Rank.SPECIALIST
    plan = footprint(SMOLLM2, DEFAULT_CONTEXT, MAX_BATCH)
    assert v.estimate.gpu_bytes == plan.gpu_bytes > SMOLLM2["data_bytes"]
    assert v.estimate.details["context"] == DEFAULT_CONTEXT
    assert v.estimate.files == ("model.gguf",)


@pytest.mark.parametrize(
    ("description", "caps", "request_", "code", "words"),
    [
        ({"repo": "o/r", "files": [{"name": "model.safetensors", "size": 10}]}, {}, {}, Refusal.FORMAT, "no GGUF"),
        (gguf_model(), {}, {"task": "feature-extraction"}, Refusal.TASK, "feature-extraction"),
        (gguf_model(architecture="mamba"), {}, {}, Refusal.MODEL, "'mamba'"),
        (gguf_model(tensor_types={"F32": 1, "IQ4_XS": 9}), {}, {}, Refusal.MODEL, "IQ4_XS"),
        (gguf_model(tokenizer_model="llama"), {}, {}, Refusal.MODEL, "tokenizer model 'llama'"),
        (gguf_model(tokenizer_pre="deepseek-llm"), {}, {}, Refusal.MODEL, "deepseek-llm"),
        (gguf_model(rope_scaling="yarn"), {}, {}, Refusal.MODEL, "yarn"),
        (gguf_model(expert_count=8), {}, {}, Refusal.MODEL, "mixture-of-experts"),
        (gguf_model(split={"no": 0, "count": 2}), {}, {}, Refusal.MODEL, "split"),
        (gguf_model(), {"gpu": False, "gpu_note": "software adapter"}, {}, Refusal.GPU, "software adapter"),
        ({**gguf_model(), "source": "hub"}, {"store": False}, {}, Refusal.STORE, "not writable"),
        (gguf_model(), {}, {"budget": 10**8}, Refusal.BUDGET, "KV cache"),
        (gguf_model(), {"gpu_bytes": 10**8}, {}, Refusal.BUDGET, "budget is"),
        (gguf_model(), {"ram_bytes": 10**6}, {}, Refusal.MEMORY, "host memory"),
    ],
)
def test_refusals(description, caps, request_, code, words):
    v = verdict(description, GPU_CAPS.replace(**caps), **request_)
    assert not v.ok and v.code is code, v
    assert words in v.reason
    assert (v.need is not None) == (code in (Refusal.BUDGET, Refusal.MEMORY))


def test_budget_need_is_the_footprint_and_a_larger_budget_is_accepted():
    refused = verdict(gguf_model(), budget=10**8)
    assert refused.need == footprint(SMOLLM2, DEFAULT_CONTEXT, MAX_BATCH).gpu_bytes
    assert verdict(gguf_model(), budget=refused.need).ok


def test_a_smaller_context_needs_less():
    small = verdict(gguf_model(), context=512)
    assert small.ok and small.estimate.gpu_bytes < verdict(gguf_model()).estimate.gpu_bytes
    assert small.estimate.details["context"] == 512


def test_an_f16_adapter_halves_the_kv_cache():
    f32 = verdict(gguf_model()).estimate
    f16 = verdict(gguf_model(), GPU_CAPS.replace(f16=True)).estimate
    assert f16.details["kv_cache"] * 2 == f32.details["kv_cache"]
    assert f32.gpu_bytes - f16.gpu_bytes == f16.details["kv_cache"]


def test_unknown_gpu_memory_is_not_a_budget_refusal():
    assert verdict(gguf_model(), GPU_CAPS.replace(gpu_bytes=None)).ok


def test_the_estimate_is_what_the_engine_holds(tmp_path):
    path = tmp_path / "m.gguf"
    write_random_gguf(str(path), RandomModel(tied=False))
    model = anyformer.describe(path)
    gpu = GPU(allow_software=True)
    v = plugin.can_run(model, GPU_CAPS.replace(f16=gpu.has_f16), Request(context=128))
    assert v.ok
    with GGUFFile(path) as gguf:
        engine = TransformerEngine(gpu, gguf, ctx=128, max_batch=MAX_BATCH)
    assert engine.gpu_bytes == v.estimate.gpu_bytes
    engine.release()


@pytest.mark.parametrize("weights", sorted(READABLE_TYPES))
def test_lfm2_is_accepted_with_every_weight_type_the_kernels_read(weights):
    v = verdict(lfm2_model(tensor_types={"F32": 71, weights: 77}))
    assert v.ok, v.reason
    assert v.estimate.rank is Rank.SPECIALIST and v.estimate.details["architecture"] == "lfm2"


@pytest.mark.parametrize("weights", ["IQ4_XS", "Q2_K", "TQ1_0"])
def test_lfm2_with_a_weight_type_no_kernel_reads_is_a_model_refusal(weights):
    v = verdict(lfm2_model(tensor_types={"F32": 71, "Q8_0": 70, weights: 7}))
    assert not v.ok and v.code is Refusal.MODEL and weights in v.reason


def test_lfm2_with_experts_is_a_model_refusal():
    v = verdict(lfm2_model(expert_count=32))
    assert not v.ok and v.code is Refusal.MODEL and "mixture-of-experts" in v.reason


def test_lfm2_counts_a_kv_cache_only_for_its_attention_layers():
    """6 of LFM2-350M's 16 layers attend: its KV cache is theirs alone (8 KV heads of 64, f32 here)."""
    estimate = verdict(lfm2_model(), context=1024).estimate
    assert estimate.details["kv_cache"] == 2 * 6 * 1024 * 8 * 64 * 4
    assert estimate.gpu_bytes > LFM2_350M["data_bytes"] + estimate.details["kv_cache"]


def test_the_lfm2_estimate_is_what_the_engine_holds(tmp_path):
    path = tmp_path / "lfm2.gguf"
    write_random_lfm2_gguf(str(path), RandomLfm2(tied=False))
    model = anyformer.describe(path)
    gpu = GPU(allow_software=True)
    v = plugin.can_run(model, GPU_CAPS.replace(f16=gpu.has_f16), Request(context=128))
    assert v.ok, v.reason
    with GGUFFile(path) as gguf:
        engine = open_engine(gpu, gguf, ctx=128, max_batch=MAX_BATCH)
    assert engine.gpu_bytes == v.estimate.gpu_bytes
    engine.release()


def test_the_estimate_carries_the_modelled_decode_speed_of_this_adapter(monkeypatch):
    """tok/s from the header's bytes and the adapter's timed costs; a what-if about another adapter gets none."""
    from anyformer_gguf_gpu import adapter_speed as adapter_speed_module
    from anyformer_gguf_gpu.adapter_speed import AdapterSpeed

    timed = AdapterSpeed("test GPU", False, 10e-6, 4e-6, {"Q4_1": 1e12, "Q8_0": 1e12, "F16": 1e12})
    monkeypatch.setattr(adapter_speed_module, "adapter_speed", lambda software, formats: timed)
    fast = verdict(gguf_model())
    assert fast.ok and fast.estimate.tok_per_sec is not None
    assert 400 < fast.estimate.tok_per_sec < 1000  # ~153 dispatches at 10 µs: the H200's regime
    assert "dispatches" in fast.estimate.details["tok_per_sec_model"]
    slow_timed = AdapterSpeed("test GPU", False, 10e-6, 4e-6, {"Q4_1": 1e9, "Q8_0": 1e9, "F16": 1e9})
    monkeypatch.setattr(adapter_speed_module, "adapter_speed", lambda software, formats: slow_timed)
    slow = verdict(gguf_model())
    assert slow.estimate.tok_per_sec < fast.estimate.tok_per_sec / 10  # 98 MB at 1 GB/s: bandwidth-bound
    other = verdict(gguf_model(), GPU_CAPS.replace(gpu_name="another GPU"))
    assert other.ok and other.estimate.tok_per_sec is None
    assert "not another GPU" in other.estimate.details["tok_per_sec_model"]


def test_a_real_check_times_this_machines_adapter_once(tmp_path, monkeypatch):
    """The real SmolLM2 file on this machine's adapter (lavapipe in CI): a positive tok/s, kept for the next check."""
    from anyformer_gguf_gpu import adapter_speed as adapter_speed_module

    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path))
    monkeypatch.setattr(adapter_speed_module, "_FOUND", {})
    model = anyformer.describe(str(anyformer.default_model_path()))
    caps = GPU_CAPS.replace(gpu_name=None)
    v = plugin.can_run(model, caps, Request())
    assert v.ok and v.estimate.tok_per_sec is not None and v.estimate.tok_per_sec > 0, v.estimate.details
    assert (tmp_path / "gguf-gpu" / "adapter-speed.json").is_file()
    monkeypatch.setattr(adapter_speed_module, "_FOUND", {})
    monkeypatch.setattr(adapter_speed_module, "_time_in_child", lambda *a: pytest.fail("timed twice"))
    again = plugin.can_run(model, caps, Request())
    assert again.estimate.tok_per_sec == v.estimate.tok_per_sec


def test_a_file_whose_header_was_not_read_gets_no_modelled_speed(monkeypatch):
    """Its summary is rebuilt from the file size and config.json: no figure, and nothing is timed for it."""
    from anyformer_gguf_gpu import adapter_speed as adapter_speed_module
    from anyformer_localmind.estimate import modelled_speed

    monkeypatch.setattr(adapter_speed_module, "adapter_speed", lambda *a: pytest.fail("timed for a guess"))
    speed, why = modelled_speed(SMOLLM2, GPU_CAPS, estimated=True)
    assert speed is None and "no header read" in why
