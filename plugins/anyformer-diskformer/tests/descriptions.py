"""Model descriptions with GGUF header facts, for can_run tests: no file behind them."""

from __future__ import annotations

from typing import Any

#: Header facts shaped like Qwen3-30B-A3B at Q4_K_M (dims from its config; counts and bytes rounded).
QWEN3_30B_A3B: dict[str, Any] = {
    "architecture": "qwen3moe",
    "block_count": 48,
    "context_length": 40960,
    "embedding_length": 2048,
    "feed_forward_length": 6144,
    "head_count": 32,
    "head_count_kv": 4,
    "key_length": 128,
    "value_length": 128,
    "expert_count": 128,
    "expert_used_count": 8,
    "vocab_size": 151936,
    "tensor_types": {"F32": 241, "Q4_K": 289, "Q6_K": 49},
    "tokenizer_model": "gpt2",
    "tokenizer_pre": "qwen2",
    "rope_scaling": None,
    "parameter_count": 30_532_122_624,
    "data_bytes": 18_556_686_336,
    "split": None,
}


def moe_model(repo: str = "org/moe", name: str = "model.gguf", **facts: Any) -> dict[str, Any]:
    """A one-GGUF repo description whose header facts are Qwen3-30B-A3B's with ``facts`` changed."""
    return {
        "repo": repo,
        "files": [{"name": name, "size": 18_600_000_000}],
        "metadata": {"gguf": {**QWEN3_30B_A3B, **facts}, "gguf_file": name},
    }
