"""Tiny random causal LMs saved as a Hub repo holds them: config.json, model.safetensors, tokenizer files.

Each builder seeds torch, builds a 2-layer model over a character vocabulary with a ChatML
template, and saves it with ``save_pretrained`` (safetensors). They take well under a second.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: The id of ``<|im_end|>``, the end of every reply.
EOS_ID = 2


def write_char_tokenizer(folder: Path) -> int:
    """A character-level fast tokenizer (printable ASCII, newline, ChatML specials); returns its vocabulary size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    chars = ["\n", *(chr(c) for c in range(32, 127))]
    vocab = {token: i for i, token in enumerate(specials + chars)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "unk_token": "<unk>",
        "pad_token": "<|im_end|>",
        "chat_template": CHATML,
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return len(vocab)


def _save(model: Any, folder: Path) -> Path:
    model.save_pretrained(str(folder), safe_serialization=True)
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": EOS_ID, "pad_token_id": EOS_ID}), encoding="utf-8"
    )
    return folder


#: The tiny llama's shape; ``build_llama`` takes others (the benchmark's SmolLM2-135M shapes).
TINY_LLAMA_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


def build_llama(folder: Path, **shape: Any) -> Path:
    """A random llama (grouped-query attention), 2 layers unless ``shape`` says otherwise."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    vocab = write_char_tokenizer(folder)
    config = LlamaConfig(
        vocab_size=vocab, bos_token_id=None, eos_token_id=EOS_ID, pad_token_id=EOS_ID, **(shape or TINY_LLAMA_SHAPE)
    )
    return _save(LlamaForCausalLM(config).eval(), folder)


def build_qwen3(folder: Path) -> Path:
    """A random 2-layer Qwen3 (per-head q/k norms, head_dim not hidden/heads), its norms made to count."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(2)
    vocab = write_char_tokenizer(folder)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        bos_token_id=None,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        tie_word_embeddings=False,
        initializer_range=0.1,
    )
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.uniform_(0.5, 1.5)
    return _save(model, folder)


BUILDERS: dict[str, Callable[[Path], Path]] = {"llama": build_llama, "qwen3": build_qwen3}


def reference_reply(folder: Path, messages: list[dict[str, str]], tokens: int) -> str:
    """transformers' own greedy reply: its tokenizer's chat template and ``model.generate(do_sample=False)``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=tokens, do_sample=False, eos_token_id=EOS_ID, pad_token_id=EOS_ID)
    new = out[0, prompt["input_ids"].shape[1] :]
    return str(tokenizer.decode(new, skip_special_tokens=True))
