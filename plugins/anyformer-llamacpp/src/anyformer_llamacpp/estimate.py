"""What a GGUF will take: weights, the KV cache at the context, and how many layers go on the GPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

#: Context length a model loads with when the request names none (capped by the model's own).
DEFAULT_CONTEXT = 4096
#: Tokens llama.cpp evaluates per batch (``n_batch``, capped by the context).
BATCH = 512

# llama.cpp's compute buffers and the runtime itself, measured on SmolLM2-135M at 4096 tokens
# (RSS minus mapped weights minus KV ≈ 60 MB); scaled up a little for larger vocabularies.
_COMPUTE_OVERHEAD = 96 * 10**6
# Where the header does not tell the KV cache shape (a description without metadata).
_UNKNOWN_KV_SHARE = 0.1

# Decode speeds measured through anyformer (tok/s), by (architecture, file bytes): where the model
# is known, the estimate says how fast it goes. CPU: bench/bench_decode.py on the 2-core development
# machine, 2 threads. CUDA: the same bench on an H200 with every layer offloaded, on random weights
# in SmolLM2-135M's shapes (bench/results/h200-cuda-full-offload.txt; speed does not depend on the
# values).
MEASURED_TOK_PER_SEC: dict[tuple[str, int], dict[str, float]] = {
    ("llama", 98362432): {"cpu": 78.0, "cuda": 630.0},  # SmolLM2-135M-Instruct Q4_1
}


@dataclasses.dataclass(frozen=True)
class Footprint:
    """The bytes a load will take and where they go."""

    context: int
    weights_bytes: int
    kv_bytes: int
    layers: int | None
    gpu_layers: int
    gpu_bytes: int
    ram_bytes: int

    @property
    def full_offload(self) -> bool:
        """True when every layer goes on the GPU."""
        return self.layers is not None and self.gpu_layers >= self.layers


def _int(facts: Mapping[str, Any], key: str) -> int | None:
    value = facts.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def context_for(facts: Mapping[str, Any], requested: int | None) -> int:
    """The context a load uses: the request's, else the default capped by what the model was trained on."""
    if requested:
        return requested
    trained = _int(facts, "context_length")
    return min(DEFAULT_CONTEXT, trained) if trained else DEFAULT_CONTEXT


def kv_cache_bytes(facts: Mapping[str, Any], context: int, weights_bytes: int) -> int:
    """Bytes of an f16 KV cache at ``context`` tokens, from the header's layer and head counts."""
    layers = _int(facts, "block_count")
    heads = _int(facts, "head_count")
    kv_heads = _int(facts, "head_count_kv") or heads
    embedding = _int(facts, "embedding_length")
    key_length = _int(facts, "key_length") or (embedding // heads if embedding and heads else None)
    value_length = _int(facts, "value_length") or key_length
    if not (layers and kv_heads and key_length and value_length):
        return int(weights_bytes * _UNKNOWN_KV_SHARE)
    return 2 * layers * context * kv_heads * (key_length + value_length)


def footprint(
    facts: Mapping[str, Any], weights_bytes: int, *, context: int, budget: int, gpu_offload: bool
) -> Footprint:
    """Split the model between GPU and host: all layers when they fit ``budget``, as many as fit otherwise.

    Each repeating layer is taken to weigh the same (weights and KV cache shared out evenly), as
    Ollama's partial offload does; the output layer stays with the last.
    """
    kv = kv_cache_bytes(facts, context, weights_bytes)
    layers = _int(facts, "block_count")
    total = weights_bytes + kv
    gpu_layers = 0
    gpu_bytes = 0
    if gpu_offload and budget > 0:
        if total + _COMPUTE_OVERHEAD <= budget:
            gpu_layers, gpu_bytes = (layers or 1), total + _COMPUTE_OVERHEAD
        elif layers:
            per_layer = total / layers
            gpu_layers = max(0, min(layers, int((budget - _COMPUTE_OVERHEAD) // per_layer)))
            gpu_bytes = int(gpu_layers * per_layer) + (_COMPUTE_OVERHEAD if gpu_layers else 0)
    ram = total - (gpu_bytes - _COMPUTE_OVERHEAD if gpu_layers else 0) + _COMPUTE_OVERHEAD
    return Footprint(
        context=context,
        weights_bytes=weights_bytes,
        kv_bytes=kv,
        layers=layers,
        gpu_layers=gpu_layers,
        gpu_bytes=gpu_bytes,
        ram_bytes=max(ram, _COMPUTE_OVERHEAD),
    )


def measured_speed(architecture: str | None, weights_bytes: int, device: str) -> float | None:
    """The decode speed measured for this exact model file on ``device`` (``cpu``/``cuda``), or None."""
    return MEASURED_TOK_PER_SEC.get((architecture or "", weights_bytes), {}).get(device)
