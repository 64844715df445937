"""read_moe_config refuses a bailingmoe2 header the engines cannot run faithfully, with the reason."""

from __future__ import annotations

import pytest

from anyformer import AnyformerError, ErrorCode
from anyformer_diskformer.arch.registry import read_moe_config
from anyformer_diskformer.testing import TinyMoE, write_tiny_moe
from anyformer_gguf_gpu.gguf_file import GGUFFile


def test_the_bailingmoe2_fixture_reads_as_its_spec(bailingmoe2_f32):
    c = read_moe_config(GGUFFile(bailingmoe2_f32).header)
    assert (c.n_layer, c.n_dense_lead, c.n_ff, c.n_rot, c.head_dim) == (3, 1, 96, 8, 16)
    assert (c.gating, c.probs_bias, c.n_group, c.n_group_used, c.fused_qkv) == ("sigmoid", True, 4, 2, True)
    assert (c.norm_topk, c.weights_scale, c.n_ff_shexp, c.shexp_gated) == (True, 2.5, 32, False)
    assert [c.is_moe_layer(i) for i in range(3)] == [False, True, True]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"gating": 3}, "gating function 3"),
        ({"n_group": 3, "n_group_used": 1}, "8 experts in 3 groups"),
        ({"n_group": 4, "n_group_used": 4}, "of which 4 are used"),
        ({"n_layer": 2, "n_dense_lead": 2}, "2 layers of which 2 are dense"),
    ],
)
def test_a_bailingmoe2_the_engines_cannot_run_faithfully_is_a_bad_model(tmp_path, change, words):
    path = str(tmp_path / "bad.gguf")
    write_tiny_moe(path, TinyMoE(architecture="bailingmoe2", quant="F32", n_expert=8, **change))
    with pytest.raises(AnyformerError) as caught:
        read_moe_config(GGUFFile(path).header)
    assert caught.value.code is ErrorCode.BAD_MODEL and words in str(caught.value)


def test_the_qwen35moe_fixture_reads_as_its_spec(qwen35moe_f32):
    c = read_moe_config(GGUFFile(qwen35moe_f32).header)
    assert c.recurrent == (True, True, True, False)
    assert (c.ssm_conv, c.ssm_k_heads, c.ssm_v_heads, c.ssm_head) == (4, 2, 4, 16)
    assert (c.attn_gated, c.ffn_norm, c.rope_sections, c.n_rot) == (True, "post_attention_norm", (1, 2, 1, 0), 8)
    assert (c.norm_topk, c.n_ff_shexp, c.shexp_gated, c.qk_norm) == (True, 48, True, True)


def test_qwen35moe_value_heads_that_do_not_tile_its_key_heads_are_a_bad_model(tmp_path):
    path = str(tmp_path / "bad.gguf")
    write_tiny_moe(path, TinyMoE(architecture="qwen35moe", n_layer=4, quant="F32", n_rot=8, ssm_v_heads=3))
    with pytest.raises(AnyformerError) as caught:
        read_moe_config(GGUFFile(path).header)
    assert caught.value.code is ErrorCode.BAD_MODEL
    assert "3 delta-net value heads of 16 over 2 key heads" in str(caught.value)


def test_the_gemma4_fixture_reads_as_its_spec(gemma4_f32):
    c = read_moe_config(GGUFFile(gemma4_f32).header)
    assert c.swa == (True, True, False, True) and c.n_swa == 4
    assert c.head_dims == (16, 16, 32, 16) and c.kv_heads == (2, 2, 1, 2) and c.rots == (16, 16, 32, 16)
    assert c.has_v == (True, False, True, True) and all(c.moe) and all(c.expert_scale) and c.softcap == 3.0


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [("embedding_length_per_layer_input", 8, "per-layer embeddings"), ("attention.shared_kv_layers", 1, "KV shared")],
)
def test_gemma4_features_the_engine_does_not_run_are_a_bad_model(gemma4_f32, key, value, words):
    import dataclasses

    from anyformer.plugin import read_gguf_header

    original = read_gguf_header(gemma4_f32)
    header = dataclasses.replace(original, kv={**original.kv, f"gemma4.{key}": value})
    with pytest.raises(AnyformerError) as caught:
        read_moe_config(header)
    assert caught.value.code is ErrorCode.BAD_MODEL and words in str(caught.value)
