"""Model descriptions (the JSON of docs/contract.md) with GGUF header facts, for can_run tests: no file behind them."""

from __future__ import annotations

from typing import Any

#: SmolLM2-135M-Instruct Q4_1's header facts, as the core's describe reports them.
SMOLLM2: dict[str, Any] = {
    "architecture": "llama",
    "block_count": 30,
    "context_length": 8192,
    "embedding_length": 576,
    "feed_forward_length": 1536,
    "head_count": 9,
    "head_count_kv": 3,
    "key_length": None,
    "vocab_size": 49152,
    "tensor_types": {"F32": 61, "Q4_1": 210, "Q8_0": 1},
    "tokenizer_model": "gpt2",
    "tokenizer_pre": "smollm",
    "rope_scaling": None,
    "data_bytes": 96576768,
    "split": None,
}


def gguf_model(repo: str = "org/model", name: str = "model.gguf", **facts: Any) -> dict[str, Any]:
    """A one-GGUF repo description whose header facts are SmolLM2's with ``facts`` changed."""
    return {
        "repo": repo,
        "files": [{"name": name, "size": 98_362_432}],
        "metadata": {"gguf": {**SMOLLM2, **facts}, "gguf_file": name},
    }


#: The header facts of an LFM2-350M Q8_0 GGUF (the per-layer KV head counts mark its 6 attention layers).
LFM2_350M: dict[str, Any] = {
    "architecture": "lfm2",
    "block_count": 16,
    "context_length": 128000,
    "embedding_length": 1024,
    "feed_forward_length": 4608,
    "head_count": 16,
    "head_count_kv": [0, 0, 8, 0, 0, 8, 0, 0, 8, 0, 8, 0, 8, 0, 8, 0],
    "key_length": None,
    "vocab_size": 65536,
    "tensor_types": {"F32": 71, "Q8_0": 77},
    "tokenizer_model": "gpt2",
    "tokenizer_pre": "lfm2",
    "rope_scaling": None,
    "data_bytes": 379_000_000,
    "split": None,
}


def lfm2_model(**facts: Any) -> dict[str, Any]:
    """A one-GGUF repo description whose header facts are LFM2-350M's with ``facts`` changed."""
    return {
        "repo": "org/lfm2",
        "files": [{"name": "lfm2.gguf", "size": 380_000_000}],
        "metadata": {"gguf": {**LFM2_350M, **facts}, "gguf_file": "lfm2.gguf"},
    }
