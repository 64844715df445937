"""Writes tiny random-weight GGUF models that llama.cpp loads: a 2-layer llama with a byte vocabulary.

The vocabulary is the printable ASCII characters in GPT-2's byte encoding plus ChatML's special
tokens, so every text round-trips exactly and replies compare character for character.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: A ChatML template that honours ``enable_thinking`` the way Qwen3's does.
CHATML_WITH_THINKING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
#: Fill-in-the-middle tokens (Qwen2.5-Coder's names) and the GGUF keys that name them.
FIM_TOKENS = {
    "<|fim_prefix|>": "FIM_PRE_ID",
    "<|fim_suffix|>": "FIM_SUF_ID",
    "<|fim_middle|>": "FIM_MID_ID",
    "<|repo_name|>": "FIM_REP_ID",
    "<|file_sep|>": "FIM_SEP_ID",
}


def _byte_tokens() -> list[str]:
    # GPT-2's byte-to-unicode map: printable ASCII stands for itself, space is Ġ, newline Ċ.
    return ["Ġ", "Ċ", *(chr(c) for c in range(33, 127))]


def write_tiny_llama(
    path: Path,
    *,
    seed: int = 0,
    layers: int = 2,
    embedding: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    context: int = 512,
    chat_template: str | None = CHATML_WITH_THINKING,
    overrides: dict[str, int] | None = None,
    quant: str = "F32",
    split_max_tensors: int = 0,
    add_bos: bool = False,
    fim: bool = False,
    extra_specials: tuple[str, ...] = (),
) -> Path:
    """Write a random 2-layer llama GGUF that llama.cpp loads and chats with; returns ``path``.

    With ``split_max_tensors``, gguf's writer makes a split set (``path`` gains ``-0000N-of-0000M``).
    With ``fim``, the vocabulary gains fill-in-the-middle tokens, named in the header's FIM keys;
    ``extra_specials`` are more control tokens (a tokenizer's tool-call markup, say).
    """
    import gguf

    rng = np.random.default_rng(seed)
    specials = [*SPECIALS, *(FIM_TOKENS if fim else ()), *extra_specials]
    tokens = [*_byte_tokens(), "Ġt", *specials]
    n_vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    writer.add_name("tiny-llama")
    numbers = {
        "context_length": context,
        "embedding_length": embedding,
        "block_count": layers,
        "feed_forward_length": embedding * 2,
        "attention.head_count": heads,
        "attention.head_count_kv": kv_heads,
        "rope.dimension_count": embedding // heads,
    }
    numbers.update(overrides or {})  # a header that claims other numbers than its tensors have
    for key, value in numbers.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if quant == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    types = [gguf.TokenType.NORMAL] * (n_vocab - len(specials)) + [gguf.TokenType.CONTROL] * len(specials)
    writer.add_token_types(types)
    writer.add_token_merges(["Ġ t"])  # llama.cpp refuses a gpt2 vocabulary without merges
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(add_bos)
    if fim:
        for text, key in FIM_TOKENS.items():
            writer.add_uint32(getattr(gguf.Keys.Tokenizer, key), tokens.index(text))
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    def tensor(name: str, *shape: int, scale: float = 0.5) -> None:
        data = (rng.standard_normal(shape) * scale).astype(np.float32)
        if quant == "Q8_0" and len(shape) == 2 and shape[-1] % 32 == 0:
            raw = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data)

    head_dim = embedding // heads
    tensor("token_embd.weight", n_vocab, embedding)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", embedding, scale=0.0)
        tensor(f"blk.{i}.attn_q.weight", heads * head_dim, embedding)
        tensor(f"blk.{i}.attn_k.weight", kv_heads * head_dim, embedding)
        tensor(f"blk.{i}.attn_v.weight", kv_heads * head_dim, embedding)
        tensor(f"blk.{i}.attn_output.weight", embedding, heads * head_dim)
        tensor(f"blk.{i}.ffn_norm.weight", embedding, scale=0.0)
        tensor(f"blk.{i}.ffn_gate.weight", embedding * 2, embedding)
        tensor(f"blk.{i}.ffn_up.weight", embedding * 2, embedding)
        tensor(f"blk.{i}.ffn_down.weight", embedding, embedding * 2)
    tensor("output_norm.weight", embedding, scale=0.0)
    tensor("output.weight", n_vocab, embedding)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    shards = sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf")) if split_max_tensors else [path]
    for shard in shards:
        _set_norms_to_one(shard)
    return path


def _set_norms_to_one(path: Path) -> None:
    """Norm weights of 0 silence the network; rewrite them as 1 in place (they are F32 vectors)."""
    import gguf

    reader = gguf.GGUFReader(str(path), "r+")
    for tensor in reader.tensors:
        if tensor.name.endswith("norm.weight"):
            tensor.data[...] = 1.0
    del reader
