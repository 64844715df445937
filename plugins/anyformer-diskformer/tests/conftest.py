"""Fixtures: tiny random qwen3moe GGUFs, written once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from anyformer_diskformer.testing import TinyMoE, write_tiny_moe

# The wgpu path's tests run on lavapipe where there is no GPU (CI installs mesa-vulkan-drivers).
os.environ.setdefault("ANYFORMER_SOFTWARE_GPU", "1")


@pytest.fixture(scope="session")
def moe_f32(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer qwen3moe, 8 experts, top-2, every weight F32."""
    path = str(tmp_path_factory.mktemp("moe") / "tiny-qwen3moe-f32.gguf")
    write_tiny_moe(path, TinyMoE(quant="F32"))
    return path


@pytest.fixture(scope="session")
def moe_top4(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 3-layer qwen3moe, 16 experts, top-4, F16 weights."""
    path = str(tmp_path_factory.mktemp("moe") / "tiny-qwen3moe-top4.gguf")
    write_tiny_moe(path, TinyMoE(n_layer=3, n_expert=16, n_expert_used=4, quant="F16"), seed=1)
    return path


@pytest.fixture(scope="session")
def moe_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding one tiny qwen3moe GGUF (Q8_0), described like any local model."""
    folder = tmp_path_factory.mktemp("moe-folder")
    write_tiny_moe(str(folder / "tiny-qwen3moe-q8_0.gguf"), TinyMoE(quant="Q8_0"), seed=2)
    return folder


@pytest.fixture(scope="session")
def qwen2moe_f32(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer qwen2moe, 8 experts, top-4, q/k/v biases and a shared expert, every weight F32."""
    path = str(tmp_path_factory.mktemp("moe") / "tiny-qwen2moe-f32.gguf")
    write_tiny_moe(path, TinyMoE(architecture="qwen2moe", n_expert_used=4, quant="F32"), seed=4)
    return path


@pytest.fixture(scope="session")
def bailingmoe_f32(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer bailingmoe (Ling), 8 experts, top-4, two ungated shared experts, weights renormalised and scaled."""
    path = str(tmp_path_factory.mktemp("moe") / "tiny-bailingmoe-f32.gguf")
    write_tiny_moe(path, TinyMoE(architecture="bailingmoe", n_expert_used=4, quant="F32"), seed=5)
    return path


@pytest.fixture(scope="session")
def bailingmoe2_f32(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 3-layer bailingmoe2 (Ling 2.0), the first layer dense, 16 experts, top-4 of 2 of 4 groups by sigmoid
    probabilities plus a selection bias, renormalised and scaled by 2.5, one shared expert, rotary on half of
    each head, and one multi-token-prediction layer after the three (never run); every weight F32."""
    path = str(tmp_path_factory.mktemp("moe") / "tiny-bailingmoe2-f32.gguf")
    spec = TinyMoE(
        architecture="bailingmoe2",
        n_layer=3,
        n_expert=16,
        n_expert_used=4,
        quant="F32",
        n_rot=8,
        n_dense_lead=1,
        gating=2,
        n_group=4,
        n_group_used=2,
        probs_bias=True,
        n_shared=1,
        weights_scale=2.5,
        nextn=1,
    )
    write_tiny_moe(path, spec, seed=7)
    return path


@pytest.fixture(scope="session")
def bailingmoe2_f16(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer bailingmoe2, 8 experts, top-2 by softmax, weights neither renormalised nor scaled, two shared
    experts, F16 weights."""
    path = str(tmp_path_factory.mktemp("moe") / "tiny-bailingmoe2-f16.gguf")
    spec = TinyMoE(architecture="bailingmoe2", quant="F16", n_shared=2, weights_norm=False, weights_scale=1.0)
    write_tiny_moe(path, spec, seed=8)
    return path


@pytest.fixture(scope="session")
def qwen35moe_f32(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 4-layer qwen35moe (Qwen3.5 MoE): three gated delta-net layers of 2 key and 4 value heads, then a gated
    attention layer with rotary on half of each head in sections (1, 2, 1, 0) (the last pair does not turn);
    8 experts, top-4, a gated shared expert; every weight F32."""
    path = str(tmp_path_factory.mktemp("moe") / "tiny-qwen35moe-f32.gguf")
    spec = TinyMoE(architecture="qwen35moe", n_layer=4, n_expert_used=4, quant="F32", n_rot=8)
    write_tiny_moe(path, spec, seed=9)
    return path


@pytest.fixture(scope="session")
def qwen35moe_alternating(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 4-layer qwen35moe alternating delta-net and attention layers, 4 key and 4 value heads, 16 experts,
    top-2, gate and up experts fused in one ``ffn_gate_up_exps`` tensor (as Qwen3.5's converter may write them),
    every weight F32.

    Not F16: llama.cpp rounds activations to f16 before F16 products and the delta nets' states carry
    that rounding on from token to token (measured up to 6.5e-3 on these logits, and one near-tie of the
    router chosen the other way), so F32 weights are what tells the graph apart from its arithmetic.
    """
    path = str(tmp_path_factory.mktemp("moe") / "tiny-qwen35moe-alternating.gguf")
    spec = TinyMoE(
        architecture="qwen35moe",
        n_layer=4,
        n_expert=16,
        quant="F32",
        n_rot=8,
        attention_interval=2,
        ssm_k_heads=4,
        rope_sections=(2, 1, 1, 0),
        fused_gate_up=True,
    )
    write_tiny_moe(path, spec, seed=10)
    return path


@pytest.fixture(scope="session")
def gemma4_f32(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 4-layer gemma4: sliding layers (window 4, heads of 16, 2 KV heads) around a full layer (heads of 32, one
    KV head, a quarter of its pairs turning), a layer whose keys serve as values, 8 experts, top-2, per-expert
    output scales, layer output scales, logits soft-capped at 3; every weight F32."""
    path = str(tmp_path_factory.mktemp("moe") / "tiny-gemma4-f32.gguf")
    write_tiny_moe(path, TinyMoE(architecture="gemma4", n_layer=4, quant="F32"), seed=11)
    return path


@pytest.fixture(scope="session")
def gemma4_dense_layer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 4-layer gemma4 whose full layer has no router (its dense MLP alone), window 6, 16 experts, top-4, gate and
    up experts in one ``ffn_gate_up_exps`` tensor as Gemma 4's converter always writes them, F32."""
    path = str(tmp_path_factory.mktemp("moe") / "tiny-gemma4-dense-layer.gguf")
    spec = TinyMoE(
        architecture="gemma4",
        n_layer=4,
        quant="F32",
        n_swa=6,
        dense_layer=2,
        n_expert=16,
        n_expert_used=4,
        fused_gate_up=True,
    )
    write_tiny_moe(path, spec, seed=11)
    return path


@pytest.fixture(scope="module")
def gpu():
    """The wgpu adapter (lavapipe with ANYFORMER_SOFTWARE_GPU=1); the test is skipped where there is none."""
    from anyformer.plugin import AnyformerError
    from anyformer_gguf_gpu.gpu import GPU

    try:
        return GPU()
    except AnyformerError as exc:
        pytest.skip(f"no GPU adapter for wgpu: {exc}")
