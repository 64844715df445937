"""Dense weights held as stored: the same values as whole float32 tensors, a fraction of their bytes."""

from __future__ import annotations

import numpy as np
import pytest

from anyformer_diskformer.arch.moe_config import is_expert_tensor
from anyformer_diskformer.compute import dense_weights
from anyformer_diskformer.compute.dense_weights import DenseWeights
from anyformer_diskformer.plan import plan_from_header
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.quants import dequantize


def whole(gguf: GGUFFile, name: str) -> np.ndarray:
    """The tensor dequantised at once, shaped (rows, cols)."""
    t = gguf.tensor(name)
    return dequantize(gguf.raw(name), t.ggml_type).reshape(tuple(reversed(t.dims)))


@pytest.mark.parametrize("fixture", ["moe_folder", "moe_top4"])
def test_products_and_rows_are_those_of_the_whole_float32_tensors(request, fixture, monkeypatch):
    value = request.getfixturevalue(fixture)
    path = str(next(value.glob("*.gguf"))) if hasattr(value, "glob") else value
    # Bands of a few rows, so every product is assembled from several dequantised bands.
    monkeypatch.setattr(dense_weights, "BAND_ELEMENTS", 200)
    gguf = GGUFFile(path)
    try:
        weights = DenseWeights(gguf)
        x = np.random.default_rng(0).standard_normal((3, gguf.tensor("token_embd.weight").dims[0])).astype(np.float32)
        for name in ("blk.0.attn_q.weight", "blk.1.ffn_gate_inp.weight", "token_embd.weight"):
            want = whole(gguf, name)
            np.testing.assert_allclose(weights.product(x, name), x @ want.T, rtol=1e-5, atol=1e-6)
        embeddings = whole(gguf, "token_embd.weight")
        np.testing.assert_array_equal(weights.rows("token_embd.weight", [5, 1, 5]), embeddings[[5, 1, 5]])
        np.testing.assert_array_equal(weights.vector("output_norm.weight"), whole(gguf, "output_norm.weight"))
        assert weights.optional_vector("blk.0.attn_q.bias") is None
    finally:
        gguf.close()


def test_quantised_weights_take_their_stored_bytes_as_the_plan_says(moe_folder):
    path = str(next(moe_folder.glob("*.gguf")))
    gguf = GGUFFile(path)
    try:
        weights = DenseWeights(gguf)
        as_f32 = sum(4 * t.n_elements for t in gguf.header.tensors if not is_expert_tensor(t.name))
        plan = plan_from_header(gguf.header, 64)
    finally:
        gguf.close()
    assert weights.nbytes == plan.dense_bytes
    assert weights.nbytes < as_f32 / 3  # Q8_0: 34 bytes a block of 32 against 128
