"""The llama.cpp boundary: a GGUF that passed the core's validator still gets sane architecture numbers.

ggml allocates from these numbers before it reads a weight; absurd ones (10,000 layers) make it
abort the whole process (SAFETY.md G17), so they are refused here as ``BAD_MODEL``. So is a
vocabulary with a token twice: llama.cpp 0.3.36 aborts on it (``GGML_ASSERT(id_to_token.size() ==
token_to_id.size())`` in llama-vocab.cpp) instead of refusing the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, LazyArray

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


def check_vocabulary(name: str, tokens: Any) -> None:
    """Raise ``BAD_MODEL`` when ``tokenizer.ggml.tokens`` holds a token twice (llama.cpp aborts on it).

    ``tokens`` is the header's value: a list, or a :class:`LazyArray` whose raw bytes are compared
    without decoding them (two valid UTF-8 strings are equal exactly when their bytes are).
    """
    items: list[Any]
    if isinstance(tokens, LazyArray):
        items = tokens.raw_strings() if tokens.is_strings else tokens.to_list()
    elif isinstance(tokens, list):
        items = tokens
    else:
        return
    if len(set(items)) == len(items):
        return
    first_index: dict[Any, int] = {}
    for index, token in enumerate(items):
        earlier = first_index.setdefault(token, index)
        if earlier != index:
            text = token.decode("utf-8", "replace") if isinstance(token, bytes) else token
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{name}: token {index} ({text!r:.40}) repeats token {earlier} of the vocabulary"
            )
