"""What an ONNX model will take in memory: weights, the KV cache of a decoder, onnxruntime itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Context a decoder is sized for when the request names none (capped by the model's own).
DEFAULT_CONTEXT = 4096
# onnxruntime's arenas, the tokenizer and Python around them: measured RSS of a loaded MiniLM
# minus its weights was ~60 MB; rounded up.
RUNTIME_OVERHEAD = 96 * 10**6
# onnxruntime pre-packs MatMul weights for its CPU kernels, a second copy of part of them.
PREPACK_SHARE = 0.25


def _int(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def context_for(config: Mapping[str, Any], requested: int | None) -> int:
    """The context a decoder is sized for: the request's, else the default capped by the model's maximum."""
    if requested:
        return requested
    trained = _int(config, "max_position_embeddings")
    return min(DEFAULT_CONTEXT, trained) if trained else DEFAULT_CONTEXT


def kv_cache_bytes(config: Mapping[str, Any], context: int, element_bytes: int) -> int:
    """Bytes of the KV cache at ``context`` tokens from config.json's shapes; 0 when it does not say.

    Only the layers that keep keys and values count: where ``layer_types`` names them, the attention
    layers (not Qwen3.5's ``linear_attention`` nor LFM2's ``conv`` layers, whose small states are not
    counted); not the last ``num_kv_shared_layers`` (Gemma 3n / 4 reuse earlier layers' KV there). A
    ``full_attention`` layer of a model with a ``global_head_dim`` (Gemma 4) has heads that wide.
    """
    layers = _int(config, "num_hidden_layers")
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads") or heads
    hidden = _int(config, "hidden_size")
    head_dim = _int(config, "head_dim") or (hidden // heads if hidden and heads else None)
    if not (layers and kv_heads and head_dim):
        return 0
    types = config.get("layer_types")
    if not isinstance(types, list) or len(types) < layers:
        types = ["attention"] * layers
    holding = layers - min(layers, _int(config, "num_kv_shared_layers") or 0)
    widths = [
        (_int(config, "global_head_dim") or head_dim) if kind == "full_attention" else head_dim
        for kind in types[:holding]
        if isinstance(kind, str) and kind.endswith("attention") and not kind.startswith("linear")
    ]
    return 2 * kv_heads * sum(widths) * context * element_bytes


def memory_need(weights_bytes: int, kv_bytes: int) -> int:
    """Bytes a session takes: the weights, what onnxruntime pre-packs, the KV cache and the runtime."""
    return int(weights_bytes * (1 + PREPACK_SHARE)) + kv_bytes + RUNTIME_OVERHEAD
