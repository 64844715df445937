"""The numpy dequantisers against gguf-py's (``gguf.quants``), on data gguf quantises or random blocks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_gguf_gpu.quants import FORMATS, Q4_K, dequantize, format_of
from anyformer_gguf_gpu.testing import random_blocks

# Types gguf-py can quantise (the others are checked on random blocks with finite scales).
_GGUF_QUANTISES = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0"}


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.name)
def test_dequantize_matches_gguf_py(fmt, rng):
    qtype = gguf.GGMLQuantizationType(fmt.ggml_type)
    n = 3 * 512
    if fmt.name in _GGUF_QUANTISES:
        values = rng.standard_normal((3, 512)).astype(np.float32)
        raw = np.ascontiguousarray(gguf.quants.quantize(values, qtype)).view(np.uint8).reshape(-1)
    else:
        raw = random_blocks(fmt, n, rng)
    assert raw.size == n // fmt.block_size * fmt.type_size
    expected = gguf.quants.dequantize(raw, qtype).reshape(-1)
    ours = dequantize(raw, fmt.ggml_type)
    assert ours.shape == (n,)
    np.testing.assert_array_equal(ours, expected)


def test_quantised_values_round_trip_close(rng):
    """Q8_0 of a smooth signal comes back within its step: the layout is read in the right order."""
    values = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    raw = np.ascontiguousarray(gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)).view(np.uint8)
    assert np.abs(dequantize(raw, 8) - values.reshape(-1)).max() < 1 / 127 + 1e-6


def test_unsupported_type_is_a_bad_model_naming_it():
    with pytest.raises(AnyformerError) as info:
        format_of(10, "blk.0.ffn_up.weight")
    assert info.value.code is ErrorCode.BAD_MODEL
    assert "Q2_K" in str(info.value) and "blk.0.ffn_up.weight" in str(info.value)


def test_partial_block_is_refused(rng):
    raw = random_blocks(Q4_K, 256, rng)
    with pytest.raises(ValueError):
        dequantize(raw[:-1], Q4_K.ggml_type)
