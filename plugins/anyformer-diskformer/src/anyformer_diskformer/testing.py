"""Tiny random MoE GGUFs (qwen3moe, qwen2moe) written with gguf's writer, which llama.cpp and the engine both read.

For tests and benchmarks; gguf is imported only when a file is written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from anyformer_gguf_gpu.quants import FORMATS
from anyformer_gguf_gpu.testing import (
    add_attention_keys,
    add_layer_attention,
    add_tiny_tokenizer,
    finish_gguf,
    random_blocks,
    tiny_vocabulary,
)


@dataclasses.dataclass(frozen=True)
class TinyMoE:
    """The shape of a random MoE test model (qwen3moe, or qwen2moe with its biases and shared expert)."""

    architecture: str = "qwen3moe"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_kv: int = 2
    head_dim: int = 16
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_ctx: int = 256
    #: Width of qwen2moe's shared expert.
    n_ff_shexp: int = 48
    #: bailingmoe: shared experts (each n_ff_exp wide, one FFN together), the routing weights' scale
    #: and whether they are renormalised.
    n_shared: int = 2
    weights_scale: float = 1.5
    weights_norm: bool = True
    #: Type of the dense matrices and of the experts (F32, F16, Q8_0, or a K type: random blocks).
    quant: str = "F16"
    scale: float = 0.08
    #: Type of the routed experts when it differs from ``quant`` (a K type gives random blocks, fast to make).
    expert_quant: str | None = None
    #: Gate and up experts in one ``ffn_gate_up_exps`` tensor (Gemma 4's converter, Qwen3.5's when converted so).
    fused_gate_up: bool = False
    #: bailingmoe2 (Ling 2.0): rotary width (None: the head's), leading dense layers of ``n_ff_dense``,
    #: llama.cpp's gating function (1 softmax, 2 sigmoid), expert groups, a selection bias, and
    #: multi-token-prediction layers after the model's own.
    n_rot: int | None = None
    n_dense_lead: int = 0
    n_ff_dense: int = 96
    gating: int = 1
    n_group: int = 0
    n_group_used: int = 0
    probs_bias: bool = False
    nextn: int = 0
    #: qwen35moe (Qwen3.5/3.6): every ``attention_interval``-th layer is full attention, the others gated delta
    #: nets of ``ssm_k_heads`` key and ``ssm_v_heads`` value heads of ``ssm_head`` and a ``ssm_conv``-tap
    #: convolution; interleaved multi-section rotary of ``rope_sections`` pairs.
    attention_interval: int = 4
    ssm_conv: int = 4
    ssm_k_heads: int = 2
    ssm_v_heads: int = 4
    ssm_head: int = 16
    rope_sections: tuple[int, ...] = (1, 2, 1, 0)
    #: gemma4: which layers slide (window ``n_swa``), the full layers' head width and KV heads, and its
    #: extras: a layer without a v projection, one without a router, the final soft-cap.
    swa_pattern: tuple[bool, ...] = (True, True, False, True)
    n_swa: int = 4
    full_head_dim: int = 32
    full_kv: int = 1
    no_v_layer: int = 1
    dense_layer: int = -1
    softcap: float = 3.0


def write_tiny_moe(path: str, spec: TinyMoE, seed: int = 0) -> None:
    """Write a random MoE of ``spec``'s shape with a small byte-level BPE vocabulary."""
    import gguf

    if spec.architecture == "bailingmoe2":
        _write_bailingmoe2(path, spec, seed)
        return
    if spec.architecture == "qwen35moe":
        _write_qwen35moe(path, spec, seed)
        return
    if spec.architecture == "gemma4":
        _write_gemma4(path, spec, seed)
        return
    rng = np.random.default_rng(seed)
    tokens = tiny_vocabulary()
    arch = spec.architecture
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff_exp)
    w.add_expert_feed_forward_length(spec.n_ff_exp)
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(spec.n_ff_shexp)
    if arch == "bailingmoe":
        w.add_leading_dense_block_count(0)
        w.add_expert_shared_count(spec.n_shared)
        w.add_expert_weights_scale(spec.weights_scale)
        w.add_expert_weights_norm(spec.weights_norm)
    add_attention_keys(w, spec.n_head, spec.n_kv, spec.head_dim, 10000.0, 1e-6)
    add_tiny_tokenizer(w, tokens, "qwen2")

    weight, vector = _tensor_writers(w, spec, rng)
    experts = spec.expert_quant or spec.quant

    q_dim, kv_dim = spec.n_head * spec.head_dim, spec.n_kv * spec.head_dim
    weight("token_embd.weight", len(tokens), spec.n_embd)
    for i in range(spec.n_layer):
        p = f"blk.{i}."

        def norms_or_biases(p: str = p) -> None:
            if arch == "qwen3moe":
                vector(p + "attn_q_norm.weight", spec.head_dim)
                vector(p + "attn_k_norm.weight", spec.head_dim)
            elif arch == "qwen2moe":
                for name, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                    w.add_tensor(p + f"attn_{name}.bias", (0.1 * rng.standard_normal(n)).astype(np.float32))

        add_layer_attention(p, spec.n_embd, q_dim, kv_dim, weight, vector, norms_or_biases)
        # The router in f32, as converters write it; a larger scale spreads the experts' probabilities.
        w.add_tensor(
            p + "ffn_gate_inp.weight", (rng.standard_normal((spec.n_expert, spec.n_embd)) * 0.5).astype(np.float32)
        )
        _gate_up_experts(weight, p, spec, experts)
        weight(p + "ffn_down_exps.weight", spec.n_expert, spec.n_embd, spec.n_ff_exp, quant=experts)
        if arch == "qwen2moe":
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", (rng.standard_normal(spec.n_embd) * 0.2).astype(np.float32))
            weight(p + "ffn_gate_shexp.weight", spec.n_ff_shexp, spec.n_embd)
            weight(p + "ffn_up_shexp.weight", spec.n_ff_shexp, spec.n_embd)
            weight(p + "ffn_down_shexp.weight", spec.n_embd, spec.n_ff_shexp)
        if arch == "bailingmoe":
            # The shared experts are one ungated FFN of n_shared × n_ff_exp.
            shared = spec.n_shared * spec.n_ff_exp
            weight(p + "ffn_gate_shexp.weight", shared, spec.n_embd)
            weight(p + "ffn_up_shexp.weight", shared, spec.n_embd)
            weight(p + "ffn_down_shexp.weight", spec.n_embd, shared)
    vector("output_norm.weight", spec.n_embd)
    weight("output.weight", len(tokens), spec.n_embd)
    finish_gguf(w)


def _gate_up_experts(weight: Callable[..., None], p: str, spec: TinyMoE, quant: str) -> None:
    """A layer's gate and up experts: two tensors, or one ``ffn_gate_up_exps`` (gate's rows first) when
    ``spec.fused_gate_up``, as Gemma 4's converter writes them."""
    if spec.fused_gate_up:
        weight(p + "ffn_gate_up_exps.weight", spec.n_expert, 2 * spec.n_ff_exp, spec.n_embd, quant=quant)
    else:
        weight(p + "ffn_gate_exps.weight", spec.n_expert, spec.n_ff_exp, spec.n_embd, quant=quant)
        weight(p + "ffn_up_exps.weight", spec.n_expert, spec.n_ff_exp, spec.n_embd, quant=quant)


def _tensor_writers(
    w: Any, spec: TinyMoE, rng: np.random.Generator
) -> tuple[Callable[..., None], Callable[[str, int], None]]:
    """(matrix, vector) writers of random tensors: a matrix of ``spec.quant`` (or ``quant=``) given rows
    first, and a norm vector near 1."""
    import gguf

    def weight(name: str, *shape: int, quant: str = spec.quant) -> None:
        kind = gguf.GGMLQuantizationType[quant]
        if quant in ("Q4_K", "Q5_K", "Q6_K"):
            # Random raw blocks (gguf-py does not quantise K types); small f16 scales, as their 6-bit
            # sub-scales multiply them.
            fmt = next(f for f in FORMATS.values() if f.name == quant)
            raw = random_blocks(fmt, int(np.prod(shape)), rng, scale=0.0005)
            w.add_tensor(name, raw.reshape(*shape[:-1], shape[-1] // fmt.block_size * fmt.type_size), raw_dtype=kind)
            return
        values = (rng.standard_normal(shape) * spec.scale).astype(np.float32)
        if quant == "F32":
            w.add_tensor(name, values)
        else:
            w.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)

    def vector(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    return weight, vector


def _write_bailingmoe2(path: str, spec: TinyMoE, seed: int) -> None:
    """A random Ling 2.0 (bailingmoe2): fused q/k/v, q/k norms, partial NEOX rotary, leading dense layers,
    routed experts with the spec's gating, groups and selection bias, ungated shared experts, and
    ``spec.nextn`` multi-token-prediction layers after the model's own (written, never run)."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens = tiny_vocabulary()
    arch = "bailingmoe2"
    w = gguf.GGUFWriter(path, arch)
    layers = spec.n_layer + spec.nextn
    w.add_block_count(layers)
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff_dense)
    w.add_expert_feed_forward_length(spec.n_ff_exp)
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)
    w.add_leading_dense_block_count(spec.n_dense_lead)
    w.add_expert_shared_count(spec.n_shared)
    w.add_expert_weights_scale(spec.weights_scale)
    w.add_expert_weights_norm(spec.weights_norm)
    w.add_uint32(f"{arch}.expert_gating_func", spec.gating)  # raw: the tests write values gguf-py has no name for
    if spec.n_group:
        w.add_expert_group_count(spec.n_group)
        w.add_expert_group_used_count(spec.n_group_used)
    if spec.nextn:
        w.add_nextn_predict_layers(spec.nextn)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_dimension_count(spec.n_rot or spec.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    add_tiny_tokenizer(w, tokens, "qwen2")
    weight, vector = _tensor_writers(w, spec, rng)
    experts = spec.expert_quant or spec.quant
    q_dim, kv_dim = spec.n_head * spec.head_dim, spec.n_kv * spec.head_dim
    shared = spec.n_shared * spec.n_ff_exp
    weight("token_embd.weight", len(tokens), spec.n_embd)
    for i in range(layers):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", spec.n_embd)
        weight(p + "attn_qkv.weight", q_dim + 2 * kv_dim, spec.n_embd)
        weight(p + "attn_output.weight", spec.n_embd, q_dim)
        vector(p + "attn_q_norm.weight", spec.head_dim)
        vector(p + "attn_k_norm.weight", spec.head_dim)
        vector(p + "ffn_norm.weight", spec.n_embd)
        if i < spec.n_dense_lead:
            weight(p + "ffn_gate.weight", spec.n_ff_dense, spec.n_embd)
            weight(p + "ffn_up.weight", spec.n_ff_dense, spec.n_embd)
            weight(p + "ffn_down.weight", spec.n_embd, spec.n_ff_dense)
        else:
            # A sigmoid router saturates (and ties) on large logits: a smaller scale keeps them apart.
            router_scale = 0.5 if spec.gating == 1 else 0.15
            router = rng.standard_normal((spec.n_expert, spec.n_embd)) * router_scale
            w.add_tensor(p + "ffn_gate_inp.weight", router.astype(np.float32))
            if spec.probs_bias:
                w.add_tensor(p + "exp_probs_b.bias", (0.1 * rng.standard_normal(spec.n_expert)).astype(np.float32))
            _gate_up_experts(weight, p, spec, experts)
            weight(p + "ffn_down_exps.weight", spec.n_expert, spec.n_embd, spec.n_ff_exp, quant=experts)
            weight(p + "ffn_gate_shexp.weight", shared, spec.n_embd)
            weight(p + "ffn_up_shexp.weight", shared, spec.n_embd)
            weight(p + "ffn_down_shexp.weight", spec.n_embd, shared)
        if i >= spec.n_layer:
            # A multi-token-prediction layer's own tensors (llama.cpp loads and skips them, as the engine does).
            weight(p + "nextn.eh_proj.weight", spec.n_embd, 2 * spec.n_embd)
            vector(p + "nextn.enorm.weight", spec.n_embd)
            vector(p + "nextn.hnorm.weight", spec.n_embd)
            vector(p + "layer_output_norm.weight", spec.n_embd)
    vector("output_norm.weight", spec.n_embd)
    weight("output.weight", len(tokens), spec.n_embd)
    finish_gguf(w)


def _write_qwen35moe(path: str, spec: TinyMoE, seed: int) -> None:
    """A random Qwen3.5 MoE: gated delta-net layers and, every ``spec.attention_interval``-th, a gated
    full-attention layer (q/k norms, partial interleaved multi-section rotary), each followed by routed
    experts (softmax, renormalised) and a sigmoid-gated shared expert."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens = tiny_vocabulary()
    arch = "qwen35moe"
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff_shexp)
    w.add_expert_feed_forward_length(spec.n_ff_exp)
    w.add_expert_shared_feed_forward_length(spec.n_ff_shexp)
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_dimension_count(spec.n_rot or spec.head_dim)
    w.add_rope_dimension_sections(list(spec.rope_sections))
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_ssm_conv_kernel(spec.ssm_conv)
    w.add_ssm_state_size(spec.ssm_head)
    w.add_ssm_group_count(spec.ssm_k_heads)
    w.add_ssm_time_step_rank(spec.ssm_v_heads)
    w.add_ssm_inner_size(spec.ssm_v_heads * spec.ssm_head)
    w.add_full_attention_interval(spec.attention_interval)
    add_tiny_tokenizer(w, tokens, "qwen2")
    weight, vector = _tensor_writers(w, spec, rng)
    experts = spec.expert_quant or spec.quant
    q_dim, kv_dim = spec.n_head * spec.head_dim, spec.n_kv * spec.head_dim
    keys, values = spec.ssm_k_heads * spec.ssm_head, spec.ssm_v_heads * spec.ssm_head

    def f32(name: str, values: np.ndarray) -> None:
        w.add_tensor(name, values.astype(np.float32))

    weight("token_embd.weight", len(tokens), spec.n_embd)
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", spec.n_embd)
        if (i + 1) % spec.attention_interval:
            weight(p + "attn_qkv.weight", 2 * keys + values, spec.n_embd)
            weight(p + "attn_gate.weight", values, spec.n_embd)
            f32(p + "ssm_conv1d.weight", rng.standard_normal((2 * keys + values, spec.ssm_conv)) * 0.3)
            f32(p + "ssm_dt.bias", rng.standard_normal(spec.ssm_v_heads) * 0.5)
            f32(p + "ssm_a", -np.exp(rng.standard_normal(spec.ssm_v_heads) * 0.5))  # -exp(A_log), as converted
            weight(p + "ssm_beta.weight", spec.ssm_v_heads, spec.n_embd)
            weight(p + "ssm_alpha.weight", spec.ssm_v_heads, spec.n_embd)
            vector(p + "ssm_norm.weight", spec.ssm_head)
            weight(p + "ssm_out.weight", spec.n_embd, values)
        else:
            weight(p + "attn_q.weight", 2 * q_dim, spec.n_embd)  # each head's query, then its gate
            weight(p + "attn_k.weight", kv_dim, spec.n_embd)
            weight(p + "attn_v.weight", kv_dim, spec.n_embd)
            weight(p + "attn_output.weight", spec.n_embd, q_dim)
            vector(p + "attn_q_norm.weight", spec.head_dim)
            vector(p + "attn_k_norm.weight", spec.head_dim)
        vector(p + "post_attention_norm.weight", spec.n_embd)
        f32(p + "ffn_gate_inp.weight", rng.standard_normal((spec.n_expert, spec.n_embd)) * 0.5)
        _gate_up_experts(weight, p, spec, experts)
        weight(p + "ffn_down_exps.weight", spec.n_expert, spec.n_embd, spec.n_ff_exp, quant=experts)
        f32(p + "ffn_gate_inp_shexp.weight", rng.standard_normal(spec.n_embd) * 0.2)
        weight(p + "ffn_gate_shexp.weight", spec.n_ff_shexp, spec.n_embd)
        weight(p + "ffn_up_shexp.weight", spec.n_ff_shexp, spec.n_embd)
        weight(p + "ffn_down_shexp.weight", spec.n_embd, spec.n_ff_shexp)
    vector("output_norm.weight", spec.n_embd)
    weight("output.weight", len(tokens), spec.n_embd)
    finish_gguf(w)


def _write_gemma4(path: str, spec: TinyMoE, seed: int) -> None:
    """A random Gemma 4 MoE: sliding and full layers of different head widths and KV heads, proportional
    rotary factors on the full layers, a dense GELU MLP beside routed GELU experts with per-expert scales,
    the norms around each, layer output scales and a soft-capped head."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens = tiny_vocabulary()
    arch = "gemma4"
    swa = list(spec.swa_pattern[: spec.n_layer])
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_embedding_length_per_layer_input(0)
    w.add_shared_kv_layers(0)
    w.add_feed_forward_length(spec.n_ff_shexp)
    w.add_expert_feed_forward_length(spec.n_ff_exp)
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv([spec.n_kv if s else spec.full_kv for s in swa])
    w.add_key_length(spec.full_head_dim)
    w.add_value_length(spec.full_head_dim)
    w.add_key_length_swa(spec.head_dim)
    w.add_value_length_swa(spec.head_dim)
    w.add_rope_dimension_count(spec.full_head_dim)
    w.add_rope_dimension_count_swa(spec.n_rot or spec.head_dim)
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(10000.0)
    w.add_sliding_window(spec.n_swa)
    w.add_sliding_window_pattern(swa)
    w.add_layer_norm_rms_eps(1e-6)
    if spec.softcap:
        w.add_final_logit_softcapping(spec.softcap)
    add_tiny_tokenizer(w, tokens, "qwen2")
    weight, vector = _tensor_writers(w, spec, rng)
    experts = spec.expert_quant or spec.quant

    def f32(name: str, values: np.ndarray) -> None:
        w.add_tensor(name, values.astype(np.float32))

    weight("token_embd.weight", len(tokens), spec.n_embd)
    # Proportional rotary on the full layers: a quarter of the pairs turn, the rest have factors of 1e30.
    turning = spec.full_head_dim // 8
    f32("rope_freqs.weight", np.array([1.0] * turning + [1e30] * (spec.full_head_dim // 2 - turning)))
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        d = spec.head_dim if swa[i] else spec.full_head_dim
        q_dim, kv_dim = spec.n_head * d, (spec.n_kv if swa[i] else spec.full_kv) * d
        vector(p + "attn_norm.weight", spec.n_embd)
        weight(p + "attn_q.weight", q_dim, spec.n_embd)
        weight(p + "attn_k.weight", kv_dim, spec.n_embd)
        if i != spec.no_v_layer:
            weight(p + "attn_v.weight", kv_dim, spec.n_embd)
        weight(p + "attn_output.weight", spec.n_embd, q_dim)
        vector(p + "attn_q_norm.weight", d)
        vector(p + "attn_k_norm.weight", d)
        vector(p + "post_attention_norm.weight", spec.n_embd)
        vector(p + "ffn_norm.weight", spec.n_embd)
        weight(p + "ffn_gate.weight", spec.n_ff_shexp, spec.n_embd)
        weight(p + "ffn_up.weight", spec.n_ff_shexp, spec.n_embd)
        weight(p + "ffn_down.weight", spec.n_embd, spec.n_ff_shexp)
        vector(p + "post_ffw_norm.weight", spec.n_embd)
        f32(p + "layer_output_scale.weight", np.array([0.9 + 0.2 * rng.random()]))
        if i == spec.dense_layer:
            continue
        f32(p + "ffn_gate_inp.weight", rng.standard_normal((spec.n_expert, spec.n_embd)) * 4.0)
        vector(p + "ffn_gate_inp.scale", spec.n_embd)
        vector(p + "pre_ffw_norm_2.weight", spec.n_embd)
        vector(p + "post_ffw_norm_1.weight", spec.n_embd)
        vector(p + "post_ffw_norm_2.weight", spec.n_embd)
        _gate_up_experts(weight, p, spec, experts)
        weight(p + "ffn_down_exps.weight", spec.n_expert, spec.n_embd, spec.n_ff_exp, quant=experts)
        f32(p + "ffn_down_exps.scale", 0.5 + rng.random(spec.n_expert))
    vector("output_norm.weight", spec.n_embd)
    weight("output.weight", len(tokens), spec.n_embd)
    finish_gguf(w)
