"""The llama.cpp boundary: a GGUF that passed the core's validator still gets sane architecture numbers.

ggml allocates from these numbers before it reads a weight; absurd ones (10,000 layers) make it
abort the whole process (SAFETY.md G17), so they are refused here as ``BAD_MODEL``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from anyformer import AnyformerError, ErrorCode

# Upper bounds far above any released model (the largest have ~128 layers, 128 heads, 32k width).
_LIMITS = {
    "block_count": 1024,
    "head_count": 4096,
    "head_count_kv": 4096,
    "embedding_length": 1 << 18,
    "feed_forward_length": 1 << 20,
    "context_length": 1 << 24,
    "expert_count": 4096,
    "key_length": 1 << 14,
    "value_length": 1 << 14,
}


def check_architecture_numbers(name: str, facts: Mapping[str, Any]) -> None:
    """Raise ``BAD_MODEL`` when a header's architecture numbers are beyond any real model."""
    for key, limit in _LIMITS.items():
        value = facts.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= limit:
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{name}: {key} = {value} is beyond any real model (limit {limit})"
            )
    if not facts.get("architecture"):
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{name}: the header names no general.architecture")
