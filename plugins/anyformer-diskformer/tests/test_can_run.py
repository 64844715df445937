"""can_run decides from the description, with exact sizes when the GGUF is on disk and estimates otherwise."""

from __future__ import annotations

import re

import gguf
import pytest
from descriptions import QWEN3_30B_A3B, moe_model

import anyformer
from anyformer import Caps, Model, Rank, Refusal, Request
from anyformer.plugin import read_gguf_header
from anyformer_diskformer import plugin
from anyformer_diskformer.plan import RAM_OVERHEAD, plan_from_header, plan_from_summary

CAPS = Caps(ram_bytes=64 * 2**30, store=True)


def verdict(description: dict | Model, caps: Caps = CAPS, **request):
    model = description if isinstance(description, Model) else Model.from_dict(description)
    return plugin.can_run(model, caps, Request(**request))


def test_qwen3_30b_a3b_is_accepted_as_a_specialist_holding_every_expert_when_memory_allows():
    v = verdict(moe_model())
    assert v.ok, v.reason
    e = v.estimate
    assert e.rank is Rank.SPECIALIST and e.gpu_bytes == 0 and e.details["estimated"] is True
    d = e.details
    # The experts are most of the file; one expert of 3 × 2048 × 768 weights at ~4.5-5 bits is ~2.7-3 MB.
    assert 0.8 * QWEN3_30B_A3B["data_bytes"] < d["experts_total"] < QWEN3_30B_A3B["data_bytes"]
    assert 2.5e6 < d["experts_total"] / (48 * 128) < 3.3e6
    assert d["expert_cache"] == d["experts_total"]
    assert e.ram_bytes == d["dense_bytes"] + d["kv_cache"] + RAM_OVERHEAD + d["experts_total"]
    # f32 K and V of 4 heads × 128 for 48 layers at the default 4096 tokens.
    assert d["kv_cache"] == 2 * 48 * 4096 * 4 * 128 * 4


def test_memory_between_need_and_everything_sizes_the_cache():
    plan = plan_from_summary(QWEN3_30B_A3B, 4096)
    ram = plan.need + 10 * plan.min_cache_bytes
    v = verdict(moe_model(), CAPS.replace(ram_bytes=ram))
    assert v.ok, v.reason
    assert v.estimate.ram_bytes == ram
    assert v.estimate.details["expert_cache"] == ram - plan.fixed_bytes


def test_pool_bytes_sizes_the_cache_below_what_memory_allows():
    plan = plan_from_summary(QWEN3_30B_A3B, 4096)
    v = verdict(moe_model(), options={"pool_bytes": 3 * plan.min_cache_bytes})
    assert v.ok and v.estimate.details["expert_cache"] == 3 * plan.min_cache_bytes
    assert v.estimate.ram_bytes == plan.fixed_bytes + 3 * plan.min_cache_bytes


def test_one_byte_below_need_is_a_memory_refusal_with_the_need_and_the_estimate_said():
    plan = plan_from_summary(QWEN3_30B_A3B, 4096)
    v = verdict(moe_model(), CAPS.replace(ram_bytes=plan.need - 1))
    assert not v.ok and v.code is Refusal.MEMORY and v.need == plan.need
    assert "estimated from the architecture and the file size" in v.reason
    assert "top-8 experts" in v.reason
    assert verdict(moe_model(), CAPS.replace(ram_bytes=plan.need)).ok


def test_an_accelerator_budget_does_not_bound_the_cpu_engine():
    assert verdict(moe_model(), budget=0).ok


@pytest.mark.parametrize(
    ("description", "caps", "request_", "code", "words"),
    [
        ({"repo": "o/r", "files": [{"name": "model.safetensors", "size": 10}]}, {}, {}, Refusal.FORMAT, "no GGUF"),
        (moe_model(), {}, {"task": "feature-extraction"}, Refusal.TASK, "feature-extraction"),
        (moe_model(architecture="llama", expert_count=None), {}, {}, Refusal.MODEL, "'llama'"),
        (moe_model(architecture="deepseek2"), {}, {}, Refusal.MODEL, "'deepseek2'"),
        (moe_model(architecture="qwen3next"), {}, {}, Refusal.MODEL, "'qwen3next'"),
        (moe_model(tensor_types={"F32": 1, "IQ4_XS": 9}), {}, {}, Refusal.MODEL, "IQ4_XS"),
        (moe_model(tokenizer_model="llama"), {}, {}, Refusal.MODEL, "tokenizer model 'llama'"),
        (moe_model(tokenizer_pre="deepseek-llm"), {}, {}, Refusal.MODEL, "deepseek-llm"),
        (moe_model(rope_scaling="yarn"), {}, {}, Refusal.MODEL, "yarn"),
        (moe_model(split={"no": 0, "count": 2}), {}, {}, Refusal.MODEL, "split"),
        ({**moe_model(), "metadata": {}}, {}, {}, Refusal.MODEL, "header was not read"),
        ({**moe_model(), "source": "hub"}, {"store": False}, {}, Refusal.STORE, "not writable"),
        (moe_model(), {"ram_bytes": 10**9}, {}, Refusal.MEMORY, "available"),
    ],
)
def test_refusals(description, caps, request_, code, words):
    v = verdict(description, CAPS.replace(**caps), **request_)
    assert not v.ok and v.code is code, v
    assert words in v.reason
    assert (v.need is not None) == (code in (Refusal.BUDGET, Refusal.MEMORY))


def test_a_file_on_disk_gives_need_from_its_tensor_sizes(moe_folder):
    model = anyformer.describe(moe_folder)
    path = model.files_of("gguf")[0].path
    # Counted independently with gguf's own reader: experts and other matrices as stored, vectors as f32.
    reader = gguf.GGUFReader(path)
    experts = sum(int(t.n_bytes) for t in reader.tensors if re.search(r"_exps\.weight$", t.name))
    dense = sum(
        int(t.n_bytes) if len(t.shape) > 1 else 4 * int(t.n_elements)
        for t in reader.tensors
        if not re.search(r"_exps\.weight$", t.name)
    )
    assert dense < sum(4 * int(t.n_elements) for t in reader.tensors if not re.search(r"_exps\.weight$", t.name))
    kv = 2 * 2 * 256 * (2 * 16) * 4  # layers, the file's context of 256, two KV heads of 16, f32
    one_layer_top2 = experts // (2 * 8) * 2
    need = dense + kv + RAM_OVERHEAD + one_layer_top2
    low = verdict(model, CAPS.replace(ram_bytes=need - 1))
    assert not low.ok and low.code is Refusal.MEMORY and low.need == need
    assert "estimated" not in low.reason
    ok = verdict(model, CAPS.replace(ram_bytes=need))
    assert ok.ok and ok.estimate.details["expert_cache"] == one_layer_top2
    assert ok.estimate.details["estimated"] is False
    assert verdict(model).estimate.details["expert_cache"] == experts


def test_a_qwen2moe_file_is_accepted_with_its_shared_expert_counted_as_dense(qwen2moe_f32):
    model = anyformer.describe(qwen2moe_f32)
    v = verdict(model)
    assert v.ok, v.reason
    reader = gguf.GGUFReader(qwen2moe_f32)
    shared = sum(4 * int(t.n_elements) for t in reader.tensors if "_shexp" in t.name)
    routed = sum(int(t.n_bytes) for t in reader.tensors if t.name.endswith("_exps.weight"))
    assert shared > 0 and v.estimate.details["experts_total"] == routed
    assert v.estimate.details["dense_bytes"] == sum(
        4 * int(t.n_elements) for t in reader.tensors if not t.name.endswith("_exps.weight")
    )


def test_tok_per_sec_is_modelled_from_the_timed_disk_and_a_smaller_cache_is_slower(moe_folder):
    model = anyformer.describe(moe_folder)
    roomy = verdict(model)
    assert roomy.ok and roomy.estimate.tok_per_sec is not None and roomy.estimate.tok_per_sec > 0
    assert "MB/s" in roomy.estimate.details["tok_per_sec_model"]
    plan = plan_from_header(read_gguf_header(str(moe_folder / "tiny-qwen3moe-q8_0.gguf")), 256)
    tight = verdict(model, options={"pool_bytes": plan.min_cache_bytes})
    assert tight.ok and tight.estimate.tok_per_sec is not None
    assert tight.estimate.tok_per_sec < roomy.estimate.tok_per_sec


def test_the_speed_model_opens_no_model_file_and_keeps_its_timing(moe_folder, tmp_path, monkeypatch):
    from anyformer_conformance.io_spy import IOSpy
    from anyformer_diskformer import speed

    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path / "home"))
    speed.measure.cache_clear()
    model = anyformer.describe(moe_folder)
    spy = IOSpy()
    with spy.watching():
        v = verdict(model)
    assert v.ok and v.estimate.tok_per_sec is not None and v.estimate.tok_per_sec > 0
    assert spy.opened_under(moe_folder) == [], "can_run read the model's file to model its speed"
    assert (tmp_path / "home" / "diskformer" / "speed.json").is_file()
    speed.measure.cache_clear()  # a fresh process: the kept figures, nothing timed again
    fresh = IOSpy()
    with fresh.watching():
        again = verdict(model)
    assert again.estimate.tok_per_sec == v.estimate.tok_per_sec
    assert any(path.endswith("disk-probe.bin") for path in spy.opened)
    assert not any(path.endswith("disk-probe.bin") for path in fresh.opened)
    speed.measure.cache_clear()


def test_tok_per_sec_is_none_with_the_reason_without_a_file():
    v = verdict(moe_model())
    assert v.ok and v.estimate.tok_per_sec is None
    assert "no file on disk" in v.estimate.details["tok_per_sec_model"]
    gpu = verdict(moe_model(), CAPS.replace(gpu=True, gpu_bytes=80 * 2**30))
    assert gpu.ok and gpu.estimate.details["device"] == "gpu"
    assert gpu.estimate.tok_per_sec is None and "no file on disk" in gpu.estimate.details["tok_per_sec_model"]


def test_the_gpu_engines_speed_is_modelled_from_the_adapters_timed_costs(moe_folder, monkeypatch):
    """Read-backs a layer, dispatches, weight bytes and missed experts; a smaller cache is slower."""
    from anyformer_gguf_gpu import adapter_speed as adapter_speed_module
    from anyformer_gguf_gpu.adapter_speed import AdapterSpeed

    timed = AdapterSpeed("test GPU", False, 10e-6, 4e-6, {"Q8_0": 1e12, "F32": 1e12, "F16": 1e12}, 50e-6, 10e9)
    monkeypatch.setattr(adapter_speed_module, "adapter_speed", lambda software, formats: timed)
    model = anyformer.describe(moe_folder)
    caps = CAPS.replace(gpu=True, gpu_bytes=80 * 2**30)
    roomy = verdict(model, caps)
    assert roomy.ok and roomy.estimate.details["device"] == "gpu", roomy
    assert roomy.estimate.tok_per_sec is not None and roomy.estimate.tok_per_sec > 0
    assert "read-backs" in roomy.estimate.details["tok_per_sec_model"]
    plan = plan_from_header(read_gguf_header(str(moe_folder / "tiny-qwen3moe-q8_0.gguf")), 256)
    tight = verdict(model, caps, options={"pool_bytes": plan.min_cache_bytes})
    assert tight.estimate.tok_per_sec is not None and tight.estimate.tok_per_sec < roomy.estimate.tok_per_sec


def test_on_a_gpu_the_budget_bounds_dense_kv_and_the_cache_in_gpu_memory():
    caps = CAPS.replace(gpu=True, gpu_bytes=80 * 2**30)
    ok = verdict(moe_model(), caps)
    assert ok.ok and ok.estimate.details["device"] == "gpu"
    assert ok.estimate.gpu_bytes > ok.estimate.details["experts_total"] and ok.estimate.ram_bytes < 2**30
    plan = plan_from_summary(QWEN3_30B_A3B, 4096, "gpu")
    refused = verdict(moe_model(), caps, budget=plan.need - 1)
    assert not refused.ok and refused.code is Refusal.BUDGET and refused.need == plan.need
    tight = verdict(moe_model(), caps, budget=plan.need)
    assert tight.ok and tight.estimate.gpu_bytes == plan.need
    assert verdict(moe_model(), caps, options={"device": "cpu"}).estimate.details["device"] == "cpu"


def test_a_bailingmoe2_file_counts_neither_its_dense_layer_nor_its_prediction_layer_as_experts(bailingmoe2_f32):
    model = anyformer.describe(bailingmoe2_f32)
    v = verdict(model)
    assert v.ok, v.reason
    reader = gguf.GGUFReader(bailingmoe2_f32)
    # Layers 1 and 2 route; layer 0 is dense and layer 3 predicts the next token (nextn): never loaded.
    routed = sum(int(t.n_bytes) for t in reader.tensors if re.match(r"blk\.[12]\.ffn_.*_exps\.weight$", t.name))
    assert routed > 0 and v.estimate.details["experts_total"] == routed
    dense = sum(
        int(t.n_bytes) if len(t.shape) > 1 else 4 * int(t.n_elements)
        for t in reader.tensors
        if not t.name.endswith("_exps.weight") and not t.name.startswith("blk.3.")
    )
    assert v.estimate.details["dense_bytes"] == dense


def test_a_fused_gate_up_tensor_counts_as_experts_and_one_expert_is_its_share(gemma4_dense_layer):
    """Gemma 4's ``ffn_gate_up_exps`` is streamed, not resident: its bytes are the experts' and one expert's
    slab (a cache slot) is 1/16 of its layer's three expert matrices; the file is accepted, not BAD_MODEL."""
    v = verdict(anyformer.describe(gemma4_dense_layer))
    assert v.ok, v.reason
    reader = gguf.GGUFReader(gemma4_dense_layer)
    routed = [t for t in reader.tensors if t.name.endswith("_exps.weight")]
    assert {t.name.split(".")[2] for t in routed} == {"ffn_gate_up_exps", "ffn_down_exps"}
    assert v.estimate.details["experts_total"] == sum(int(t.n_bytes) for t in routed)
    plan = plan_from_header(read_gguf_header(gemma4_dense_layer), 256)
    one_layer = sum(int(t.n_bytes) for t in routed if t.name.startswith("blk.0."))
    assert plan.one_expert_bytes == one_layer // 16


@pytest.mark.parametrize("options", [{}, {"device": "gpu"}], ids=["auto", "gpu"])
def test_a_qwen35moe_file_runs_on_the_gpu_and_counts_its_delta_net_states(qwen35moe_f32, options):
    from anyformer_diskformer.arch.registry import read_moe_config

    model = anyformer.describe(qwen35moe_f32)
    gpu = CAPS.replace(gpu=True, gpu_bytes=80 * 2**30)
    v = verdict(model, gpu, context=64, options=options)
    assert v.ok, v.reason
    assert v.estimate.details["device"] == "gpu" and v.estimate.gpu_bytes > 0
    c = read_moe_config(read_gguf_header(qwen35moe_f32))
    # f32 K and V rows for the one attention layer only, and for each of the three delta-net layers its last
    # three inputs of 2 × 32 + 64 channels and 4 value heads' 16 × 16 states.
    assert sum(c.recurrent) == 3
    assert v.estimate.details["kv_cache"] == 2 * 1 * 64 * 32 * 4 + 4 * 3 * (3 * 128 + 4 * 16 * 16)
    on_cpu = verdict(model, CAPS, context=64)
    assert on_cpu.ok and on_cpu.estimate.details["device"] == "cpu"
    assert on_cpu.estimate.details["kv_cache"] == v.estimate.details["kv_cache"]


@pytest.mark.parametrize("options", [{}, {"device": "gpu"}], ids=["auto", "gpu"])
def test_a_gemma4_file_runs_on_the_gpu_with_each_layers_kv_in_its_own_width(gemma4_f32, options):
    model = anyformer.describe(gemma4_f32)
    gpu = CAPS.replace(gpu=True, gpu_bytes=80 * 2**30)
    v = verdict(model, gpu, context=64, options=options)
    assert v.ok, v.reason
    assert v.estimate.details["device"] == "gpu" and v.estimate.gpu_bytes > 0
    # Three sliding layers of 2 KV heads of 16, each a ring of its window's 4 rows plus a prompt step's 31 more (a GPU
    # step stores its keys before it attends), and one full layer of 1 KV head of 32 over the 64 positions, f32 K, V.
    assert v.estimate.details["kv_cache"] == 2 * 4 * (3 * (4 + 31) * 2 * 16 + 64 * 1 * 32)
    on_cpu = verdict(model, CAPS, context=64)
    assert on_cpu.ok and on_cpu.estimate.details["device"] == "cpu"
    # The CPU engine's rings are the window's rows (it reads a ring before a step stores into it).
    assert on_cpu.estimate.details["kv_cache"] == 2 * 4 * (3 * 4 * 2 * 16 + 64 * 1 * 32)


def test_a_gemma4_description_with_its_own_tokenizer_model_is_accepted_on_the_cpu():
    v = verdict(moe_model(architecture="gemma4", tokenizer_model="gemma4", tokenizer_pre=None))
    assert v.ok, v.reason
    assert v.estimate.details["device"] == "cpu" and v.estimate.details["estimated"] is True
