"""Tiny random MoE GGUFs (qwen3moe, qwen2moe) written with gguf's writer, which llama.cpp and the engine both read.

For tests and benchmarks; gguf is imported only when a file is written.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from anyformer_gguf_gpu.testing import byte_level_alphabet


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
    merges = ["Ġ t", "h e", "Ġ a", "i n", "Ġt he", "e r", "o n", "Ġ s", "e s", "r e"]
    tokens = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        *byte_level_alphabet(),
        *(m.replace(" ", "") for m in merges),
    ]
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
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
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
        vector(p + "attn_norm.weight", spec.n_embd)
        weight(p + "attn_q.weight", q_dim, spec.n_embd)
        weight(p + "attn_k.weight", kv_dim, spec.n_embd)
        weight(p + "attn_v.weight", kv_dim, spec.n_embd)
        if arch == "qwen3moe":
            vector(p + "attn_q_norm.weight", spec.head_dim)
            vector(p + "attn_k_norm.weight", spec.head_dim)
        else:
            for name, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                w.add_tensor(p + f"attn_{name}.bias", (0.1 * rng.standard_normal(n)).astype(np.float32))
        weight(p + "attn_output.weight", spec.n_embd, q_dim)
        vector(p + "ffn_norm.weight", spec.n_embd)
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
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
