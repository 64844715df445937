"""A model of the engines' decode speed from a GGUF's header facts and the adapter's timed kernel costs.

A decode step of :class:`~anyformer_gguf_gpu.transformer.TransformerEngine` (and of the LFM2 engine,
whose convolution layers have as many dispatches as its attention layers) encodes about
:data:`DISPATCHES_PER_LAYER` dispatches a layer (the q/k/v product, attention, the output product,
gate|up and down) and :data:`DISPATCHES_PER_STEP` more (embedding, head, sampler); attention past
``SPLIT_FROM`` keys adds a combine dispatch a layer. On the GPU a token then costs

    dispatches × floor + Σ_format matrix bytes / the format's product rate + KV bytes read / the F16 rate

while the host encodes the next steps (:mod:`anyformer_gguf_gpu.decode` keeps submissions ahead): a token
takes the longer of that and ``dispatches × encode``. On a software adapter both run on the same CPU,
so they add. The rates are the adapter's own (:mod:`anyformer_gguf_gpu.adapter_speed`); the matrix bytes
are the header's ``decode_bytes_by_type``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from anyformer_gguf_gpu.adapter_speed import AdapterSpeed

#: Dispatches a layer encodes in a decode step (see the module's docstring).
DISPATCHES_PER_LAYER = 5
#: Dispatches a step encodes besides its layers: the embedding lookup, the head and the sampler.
DISPATCHES_PER_STEP = 3
#: Keys above which attention splits along the sequence (one more dispatch a layer); the engine's SPLIT_FROM.
SPLIT_FROM = 384
#: The cache depth the modelled speed is for unless the caller names one: a short chat's reply.
DEFAULT_KEYS = 256
#: GGML type names by the header's ``file_type`` (the usual ones), for a summary without per-type bytes.
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 14: "Q4_K", 15: "Q4_K", 16: "Q5_K", 17: "Q5_K"}
_FILE_TYPES.update({18: "Q6_K", 32: "BF16"})


@dataclasses.dataclass(frozen=True)
class DecodeSpeed:
    """A modelled decode speed and the terms it came from (seconds a token)."""

    tok_per_sec: float
    dispatches: int
    gpu_s: float
    host_s: float
    weight_bytes: int

    def why(self) -> str:
        """One line on how the figure was reached."""
        return (
            f"{self.dispatches} dispatches and {self.weight_bytes / 1e6:.0f} MB of weights a token: "
            f"GPU {self.gpu_s * 1e3:.2f} ms, host encoding {self.host_s * 1e3:.2f} ms "
            "(this adapter's kernels, timed once)"
        )


def _int(summary: dict[str, Any], key: str) -> int:
    value = summary.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _bytes_by_type(summary: dict[str, Any]) -> dict[str, int]:
    """The matrix bytes a token reads by format: the header's split, else the whole data in the file's main type."""
    by_type = summary.get("decode_bytes_by_type")
    if isinstance(by_type, dict) and by_type:
        return {str(k): int(v) for k, v in by_type.items() if isinstance(v, int)}
    vectors = (
        summary.get("tensor_bytes", {}).get("dense_vectors", 0) if isinstance(summary.get("tensor_bytes"), dict) else 0
    )
    main = _FILE_TYPES.get(_int(summary, "file_type"), "Q8_0")
    return {main: max(0, _int(summary, "data_bytes") - int(vectors or 0))}


def formats_read(summary: dict[str, Any]) -> tuple[str, ...]:
    """The formats whose product rates :func:`decode_speed` needs for the summary's model (F16: the KV reads)."""
    return tuple(sorted({*_bytes_by_type(summary), "F16"}))


def _rate(speed: AdapterSpeed, fmt: str) -> float:
    """Bytes a second of ``fmt``'s product; a format not timed takes the slowest timed one (the cautious case)."""
    rate = speed.bytes_per_s.get(fmt)
    if rate:
        return rate
    return min(speed.bytes_per_s.values()) if speed.bytes_per_s else 0.0


def matrix_seconds(by_type: dict[str, int], speed: AdapterSpeed) -> float | None:
    """Seconds the adapter's products take to read ``by_type``'s bytes (format → bytes), or None without a rate."""
    seconds = 0.0
    for fmt, nbytes in by_type.items():
        rate = _rate(speed, fmt)
        if rate <= 0:
            return None
        seconds += nbytes / rate
    return seconds


def decode_speed(
    summary: dict[str, Any], speed: AdapterSpeed, *, keys: int = DEFAULT_KEYS, kv_f16: bool = False
) -> DecodeSpeed | None:
    """The modelled decode speed of the summary's model at ``keys`` cached tokens, or None when the summary
    lacks the layer count or the adapter's rates are missing."""
    layers = _int(summary, "block_count")
    if not layers or not speed.bytes_per_s:
        return None
    embd = _int(summary, "embedding_length")
    heads = _int(summary, "head_count")
    kv_heads = _int(summary, "head_count_kv") or heads
    head_dim = _int(summary, "key_length") or (embd // heads if heads else 0)
    dispatches = DISPATCHES_PER_LAYER * layers + DISPATCHES_PER_STEP + (layers if keys > SPLIT_FROM else 0)
    by_type = _bytes_by_type(summary)
    matrix_s = matrix_seconds(by_type, speed)
    if matrix_s is None:
        return None
    kv_bytes = 2 * layers * keys * kv_heads * head_dim * (2 if kv_f16 else 4)
    kv_s = kv_bytes / _rate(speed, "F16")
    gpu_s = dispatches * speed.floor_s + matrix_s + kv_s
    host_s = dispatches * speed.encode_s
    seconds = gpu_s + host_s if speed.software else max(gpu_s, host_s)
    if seconds <= 0:
        return None
    return DecodeSpeed(1.0 / seconds, dispatches, gpu_s, host_s, sum(by_type.values()))
