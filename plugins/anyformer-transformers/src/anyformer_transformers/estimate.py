"""``can_run``'s sums: the weights' bytes in the precision loaded, the KV cache, and the dtype chosen.

Everything comes from the description: file sizes from the listing, shapes from config.json. The
weights are held in float32 on the CPU when that copy fits in host memory (exact, and fast on every
CPU), else in bfloat16 (half the memory; a checkpoint saved in float32 stays float32). On a GPU the
dtype is ``placement.gpu_dtype``'s and ``placement.py`` decides where each byte goes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

#: Bytes per parameter of each dtype config.json names.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: The context a model is loaded with when the request names none, at most its own limit.
DEFAULT_CONTEXT = 4096
#: Host bytes torch and transformers take besides the weights and the cache (libraries, buffers).
RUNTIME_OVERHEAD = 512 * 2**20
#: The most texts an encoder runs in one forward pass, and the most padded tokens one pass holds
#: when its texts are long (a text longer than that runs alone). Here so that can_run imports no torch.
ENCODER_BATCH = 32
ENCODER_BATCH_TOKENS = 32 * 512
#: Activations per token of context, as a multiple of the hidden size in the dtype (attention scores,
#: MLP intermediates of one forward pass over the prompt): a margin, not an exact count.
ACTIVATION_FACTOR = 16


def stored_dtype(config: Mapping[str, Any]) -> str:
    """The dtype the checkpoint was saved in: config.json's ``dtype`` (``torch_dtype`` before 4.56), else float32."""
    value = config.get("dtype", config.get("torch_dtype"))
    return value if isinstance(value, str) and value in DTYPE_BYTES else "float32"


def _positive_int(config: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclasses.dataclass(frozen=True)
class Shape:
    """What sizes the KV cache: layers, key/value heads, head width, hidden size, the model's context limit.

    ``heads`` (the query heads) sizes an encoder's attention scores.
    """

    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    max_context: int | None
    heads: int = 1

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Shape | None:
        """The shape from config.json's usual keys, or None when they are missing."""
        layers = _positive_int(config, "num_hidden_layers", "n_layer", "num_layers")
        heads = _positive_int(config, "num_attention_heads", "n_head")
        hidden = _positive_int(config, "hidden_size", "n_embd", "d_model")
        if layers is None or heads is None or hidden is None:
            return None
        kv_heads = _positive_int(config, "num_key_value_heads") or heads
        head_dim = _positive_int(config, "head_dim") or max(hidden // heads, 1)
        max_context = _positive_int(config, "max_position_embeddings", "n_positions")
        return cls(layers, kv_heads, head_dim, hidden, max_context, heads)

    def context(self, asked: int | None) -> int:
        """The context loaded: the one asked for, else the default, never past the model's limit."""
        wanted = asked or DEFAULT_CONTEXT
        return min(wanted, self.max_context) if self.max_context else wanted

    def kv_bytes(self, context: int, dtype_bytes: int) -> int:
        """Keys and values of every layer for ``context`` positions."""
        return 2 * self.layers * self.kv_heads * self.head_dim * context * dtype_bytes


@dataclasses.dataclass(frozen=True)
class Plan:
    """The dtype the weights are held in, where they go, and the memory that takes.

    A plan from this module holds everything in host memory (``device`` ``cpu``); ``placement.py``
    turns one into a GPU plan (``gpu_bytes``, and ``max_memory`` for accelerate when the weights are
    split between the GPU and host memory).
    """

    dtype: str
    ram_bytes: int
    context: int
    #: The weights' bytes in ``dtype`` (the rest of the total is the cache, activations and runtime).
    weights: int = 0
    device: str = "cpu"
    gpu_bytes: int = 0
    #: accelerate's ``max_memory`` (device index or ``"cpu"`` → bytes of weights) for a split load, else None.
    max_memory: dict[int | str, int] | None = None

    def load_options(self) -> dict[str, Any]:
        """``from_pretrained``'s placement arguments: none on the CPU, the device, or accelerate's split."""
        if self.max_memory is not None:
            return {"device_map": "auto", "max_memory": dict(self.max_memory)}
        if self.device != "cpu":
            return {"device_map": self.device}
        return {}


#: The dtypes a model is held in on the CPU, preferred first: float32, else bfloat16.
CPU_DTYPES = ("float32", "bfloat16")


def _cpu_dtypes(stored: str) -> tuple[str, ...]:
    """float32, then bfloat16 unless the checkpoint itself is float32 (nothing smaller is made from it)."""
    return ("float32",) if stored == "float32" else CPU_DTYPES


def plans(
    config: Mapping[str, Any],
    weight_bytes: int,
    shape: Shape,
    context: int | None,
    dtypes: tuple[str, ...] | None = None,
) -> list[Plan]:
    """The ways to hold the model in host memory, preferred first (``dtypes``, else float32 then bfloat16)."""
    stored = stored_dtype(config)
    parameters = weight_bytes // DTYPE_BYTES[stored]
    loaded = shape.context(context)
    result = []
    for dtype in dtypes or _cpu_dtypes(stored):
        size = DTYPE_BYTES[dtype]
        activations = ACTIVATION_FACTOR * shape.hidden * loaded * size
        ram = parameters * size + shape.kv_bytes(loaded, size) + activations + RUNTIME_OVERHEAD
        result.append(Plan(dtype, ram, loaded, weights=parameters * size))
    return result


def encoder_plans(
    config: Mapping[str, Any], weight_bytes: int, shape: Shape, dtypes: tuple[str, ...] | None = None
) -> list[Plan]:
    """The ways to hold an encoder (embeddings, classification), preferred first: no KV cache, but one
    batch of texts at the longest the model reads, with one layer's attention scores (``heads × tokens``
    per token)."""
    stored = stored_dtype(config)
    parameters = weight_bytes // DTYPE_BYTES[stored]
    tokens = shape.context(None)
    batch_tokens = min(ENCODER_BATCH * tokens, max(ENCODER_BATCH_TOKENS, tokens))
    result = []
    for dtype in dtypes or _cpu_dtypes(stored):
        size = DTYPE_BYTES[dtype]
        per_token = ACTIVATION_FACTOR * shape.hidden + shape.heads * tokens
        ram = parameters * size + batch_tokens * per_token * size + RUNTIME_OVERHEAD
        result.append(Plan(dtype, ram, tokens, weights=parameters * size))
    return result


#: Host bytes one image or audio clip's forward pass takes besides the weights: a margin, not a count
#: (activations of a ViT-base at 224 px, or a Whisper encoder over 30 s, stay well below it).
MEDIA_ACTIVATIONS = 256 * 2**20


def media_plans(config: Mapping[str, Any], weight_bytes: int, dtypes: tuple[str, ...] | None = None) -> list[Plan]:
    """The ways to hold a vision or speech model, preferred first: its weights, one input's activations."""
    stored = stored_dtype(config)
    parameters = weight_bytes // DTYPE_BYTES[stored]
    return [
        Plan(
            dtype,
            parameters * DTYPE_BYTES[dtype] + MEDIA_ACTIVATIONS + RUNTIME_OVERHEAD,
            0,
            weights=parameters * DTYPE_BYTES[dtype],
        )
        for dtype in dtypes or _cpu_dtypes(stored)
    ]
