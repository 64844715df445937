"""Tiny random MoE GGUFs (qwen3moe, qwen2moe) written with gguf's writer, which llama.cpp and the engine both read.

For tests and benchmarks; gguf is imported only when a file is written.
"""

from __future__ import annotations

import dataclasses

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
    if arch == "bailingmoe":
        w.add_leading_dense_block_count(0)
        w.add_expert_shared_count(spec.n_shared)
        w.add_expert_weights_scale(spec.weights_scale)
        w.add_expert_weights_norm(spec.weights_norm)
    add_attention_keys(w, spec.n_head, spec.n_kv, spec.head_dim, 10000.0, 1e-6)
    add_tiny_tokenizer(w, tokens, "qwen2")

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

    experts = spec.expert_quant or spec.quant

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
            elif arch == "qwen2moe":
                for name, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                    w.add_tensor(p + f"attn_{name}.bias", (0.1 * rng.standard_normal(n)).astype(np.float32))

        add_layer_attention(p, spec.n_embd, q_dim, kv_dim, weight, vector, norms_or_biases)
        # The router in f32, as converters write it; a larger scale spreads the experts' probabilities.
        w.add_tensor(
            p + "ffn_gate_inp.weight", (rng.standard_normal((spec.n_expert, spec.n_embd)) * 0.5).astype(np.float32)
        )
        weight(p + "ffn_gate_exps.weight", spec.n_expert, spec.n_ff_exp, spec.n_embd, quant=experts)
        weight(p + "ffn_up_exps.weight", spec.n_expert, spec.n_ff_exp, spec.n_embd, quant=experts)
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
