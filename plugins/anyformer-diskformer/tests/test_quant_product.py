"""Products with stored matrices (no dequantised copy) against numpy's product with the dequantised matrix."""

from __future__ import annotations

import numpy as np
import pytest

from anyformer_diskformer.cache.expert_reader import ExpertSlices
from anyformer_diskformer.compute import native_products
from anyformer_diskformer.compute.quant_product import GROUPED_MAX_ROWS, QuantProduct, expert_ffn
from anyformer_gguf_gpu.quants import FORMATS, dequantize
from anyformer_gguf_gpu.testing import random_blocks

NAMES = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "F32", "BF16"]


def fmt_named(name: str):
    return next(f for f in FORMATS.values() if f.name == name)


def reference(x: np.ndarray, raw: np.ndarray, ggml_type: int, rows: int, cols: int) -> np.ndarray:
    """``x @ W.T`` in float64 from the whole dequantised matrix."""
    w = dequantize(raw, ggml_type).reshape(rows, cols).astype(np.float64)
    return x.astype(np.float64) @ w.T


@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("tokens", [1, 3, GROUPED_MAX_ROWS + 2])
def test_product_equals_the_dequantised_product(name, tokens, native):
    fmt = fmt_named(name)
    rng = np.random.default_rng(len(name) * 7 + tokens)
    rows, cols = 24, 512
    raw = random_blocks(fmt, rows * cols, rng)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    want = reference(x, raw, fmt.ggml_type, rows, cols)
    kernels = QuantProduct(native=native)
    assert kernels.native is native
    # Bands of 5 rows (the last one shorter), so rows are assembled from several bands with the scratch reused.
    got = kernels.product(x, raw, fmt.ggml_type, rows, cols, band_elements=5 * cols)
    assert got.dtype == np.float32 and got.shape == (tokens, rows)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    # A second product through the same scratch gives the same values (no state leaks between calls).
    np.testing.assert_array_equal(kernels.product(x, raw, fmt.ggml_type, rows, cols, band_elements=5 * cols), got)


def test_leading_shape_is_kept():
    fmt = fmt_named("Q4_K")
    rng = np.random.default_rng(3)
    raw = random_blocks(fmt, 8 * 256, rng)
    x = rng.standard_normal((2, 1, 256)).astype(np.float32)
    got = QuantProduct().product(x, raw, fmt.ggml_type, 8, 256)
    assert got.shape == (2, 1, 8)
    np.testing.assert_allclose(got[:, 0], reference(x[:, 0], raw, fmt.ggml_type, 8, 256), rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q8_0", "Q6_K"])
def test_expert_ffn_is_the_swiglu_of_the_dequantised_expert(name, native):
    fmt = fmt_named(name)
    rng = np.random.default_rng(11)
    n_embd, n_ff = 256, 512
    # Small scales keep the gate's activations where SiLU is not saturated.
    gate, up = (random_blocks(fmt, n_ff * n_embd, rng, scale=0.002) for _ in range(2))
    down = random_blocks(fmt, n_embd * n_ff, rng, scale=0.002)
    expert = ExpertSlices(gate, up, down, (fmt.ggml_type,) * 3)
    x = rng.standard_normal((2, n_embd)).astype(np.float32)
    g, u = reference(x, gate, fmt.ggml_type, n_ff, n_embd), reference(x, up, fmt.ggml_type, n_ff, n_embd)
    want = reference(g / (1 + np.exp(-g)) * u, down, fmt.ggml_type, n_embd, n_ff)
    got = expert_ffn(QuantProduct(native=native), expert, x, n_embd, n_ff)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_decoding_products_never_dequantise_the_matrix(name, monkeypatch):
    # The speed of the CPU engine rests on this: a few rows of x go group by group, with no float32 weights.
    from anyformer_diskformer.compute import quant_product

    def refuse(*args, **kwargs):
        raise AssertionError("dequantize was called for a decoding product")

    monkeypatch.setattr(quant_product, "dequantize", refuse)
    fmt = fmt_named(name)
    rng = np.random.default_rng(5)
    raw = random_blocks(fmt, 16 * 512, rng)
    x = rng.standard_normal((GROUPED_MAX_ROWS, 512)).astype(np.float32)
    for native in (True, False):
        QuantProduct(native=native).product(x, raw, fmt.ggml_type, 16, 512)
        with pytest.raises(AssertionError, match="dequantize"):  # a prompt's many rows share a dequantised band
            QuantProduct(native=native).product(np.vstack([x, x]), raw, fmt.ggml_type, 16, 512)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_decoding_products_run_the_compiled_kernel(name, monkeypatch):
    """A few rows go to the native kernel (not the numpy groups), on a writable and on a read-only matrix (the
    expert cache's slots and the memory-mapped file), and give the numpy path's values within float32 rounding."""
    fmt = fmt_named(name)
    rng = np.random.default_rng(9)
    rows, cols = 40, 768  # K-quants: three super-blocks a row; the others 24 blocks
    raw = random_blocks(fmt, rows * cols, rng)
    x = rng.standard_normal((2, cols)).astype(np.float32)
    numpy_values = QuantProduct(native=False).product(x, raw, fmt.ggml_type, rows, cols)
    calls = []
    real = native_products.product

    def counted(*args):
        calls.append(args[2])
        real(*args)

    monkeypatch.setattr(native_products, "product", counted)
    for writable in (True, False):
        blocks = raw.copy()
        blocks.setflags(write=writable)
        got = QuantProduct().product(x, blocks, fmt.ggml_type, rows, cols)
        np.testing.assert_allclose(got, numpy_values, rtol=1e-5, atol=1e-5 * np.abs(numpy_values).max())
    assert calls == [fmt.ggml_type, fmt.ggml_type]


def test_compile_for_compiles_the_block_types_only():
    types = [fmt_named(n).ggml_type for n in ("Q4_K", "Q6_K", "F32", "F16", "BF16")]
    assert native_products.compile_for(types) == sorted(types[:2])
    assert not native_products.supports(fmt_named("F16").ggml_type)


def test_a_kernel_compiles_without_a_writable_cache(monkeypatch):
    """numba refuses ``cache=True`` where it finds nowhere to write (a read-only install, no home): the kernels are
    then compiled for the run instead of the import failing."""
    import numba

    real = numba.njit

    def no_cache_dir(*args, **kwargs):
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function: no locator available")
        return real(*args, **kwargs)

    monkeypatch.setattr(numba, "njit", no_cache_dir)

    def twice(x):
        return 2 * x

    assert native_products._jit(twice)(21) == 42
