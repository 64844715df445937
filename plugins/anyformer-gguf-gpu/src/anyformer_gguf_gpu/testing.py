"""Random test data in the ggml formats: raw blocks with finite scales (for kernel and engine tests, benches)."""

from __future__ import annotations

import numpy as np

from anyformer_gguf_gpu.quants import BF16, F16, F32, QuantFormat

# Byte offsets of each block format's f16 scale fields (ggml-common.h).
_F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(fmt: QuantFormat, n_elements: int, rng: np.random.Generator, scale: float = 0.05) -> np.ndarray:
    """Random raw bytes of ``n_elements`` in ``fmt``: random quants, f16 scales drawn in ±``scale``."""
    if fmt in (F32, F16, BF16):
        values = rng.standard_normal(n_elements).astype(np.float32)
        if fmt is F32:
            return values.view(np.uint8).copy()
        if fmt is F16:
            return values.astype("<f2").view(np.uint8).copy()
        return (values.view(np.uint32) >> 16).astype("<u2").view(np.uint8).copy()
    if n_elements % fmt.block_size:
        raise ValueError(f"{n_elements} is not a multiple of {fmt.name}'s block of {fmt.block_size}")
    blocks = rng.integers(0, 256, size=(n_elements // fmt.block_size, fmt.type_size), dtype=np.uint8)
    for offset in _F16_FIELDS[fmt.name]:
        scales = np.asarray(rng.uniform(-scale, scale, size=blocks.shape[0])).astype("<f2")
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)
