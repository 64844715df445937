"""Tiny random MoE GGUFs (qwen3moe, qwen2moe) written with gguf's writer, which llama.cpp and the engine both read.

For tests and benchmarks; gguf is imported only when a file is written.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from anyformer_gguf_gpu.testing import (
    add_attention_keys,
    add_layer_attention,
    add_tiny_tokenizer,
    finish_gguf,
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
    #: Type of the dense matrices and of the experts (F32, F16 or Q8_0).
    quant: str = "F16"
    scale: float = 0.08


def write_tiny_moe(path: str, spec: TinyMoE, seed: int = 0) -> None:
    """Write a random MoE of ``spec``'s shape with a small byte-level BPE vocabulary."""
    import gguf

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
    add_attention_keys(w, spec.n_head, spec.n_kv, spec.head_dim, 10000.0, 1e-6)
    add_tiny_tokenizer(w, tokens, "qwen2")
    qtype = gguf.GGMLQuantizationType[spec.quant]

    def weight(name: str, *shape: int) -> None:
        values = (rng.standard_normal(shape) * spec.scale).astype(np.float32)
        if spec.quant == "F32":
            w.add_tensor(name, values)
        else:
            w.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    def vector(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    q_dim, kv_dim = spec.n_head * spec.head_dim, spec.n_kv * spec.head_dim
    weight("token_embd.weight", len(tokens), spec.n_embd)
    for i in range(spec.n_layer):
        p = f"blk.{i}."

        def norms_or_biases(p: str = p) -> None:
            if arch == "qwen3moe":
                vector(p + "attn_q_norm.weight", spec.head_dim)
                vector(p + "attn_k_norm.weight", spec.head_dim)
            else:
                for name, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                    w.add_tensor(p + f"attn_{name}.bias", (0.1 * rng.standard_normal(n)).astype(np.float32))

        add_layer_attention(p, spec.n_embd, q_dim, kv_dim, weight, vector, norms_or_biases)
        # The router in f32, as converters write it; a larger scale spreads the experts' probabilities.
        w.add_tensor(
            p + "ffn_gate_inp.weight", (rng.standard_normal((spec.n_expert, spec.n_embd)) * 0.5).astype(np.float32)
        )
        weight(p + "ffn_gate_exps.weight", spec.n_expert, spec.n_ff_exp, spec.n_embd)
        weight(p + "ffn_up_exps.weight", spec.n_expert, spec.n_ff_exp, spec.n_embd)
        weight(p + "ffn_down_exps.weight", spec.n_expert, spec.n_embd, spec.n_ff_exp)
        if arch == "qwen2moe":
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", (rng.standard_normal(spec.n_embd) * 0.2).astype(np.float32))
            weight(p + "ffn_gate_shexp.weight", spec.n_ff_shexp, spec.n_embd)
            weight(p + "ffn_up_shexp.weight", spec.n_ff_shexp, spec.n_embd)
            weight(p + "ffn_down_shexp.weight", spec.n_embd, spec.n_ff_shexp)
    vector("output_norm.weight", spec.n_embd)
    weight("output.weight", len(tokens), spec.n_embd)
    finish_gguf(w)
