"""The CPU engine's products with stored matrices: the compiled kernels against the numpy ones, in one process.

For each block type, a random matrix in one of Qwen3-30B-A3B's expert shapes (gate/up: 768 × 2048,
down: 2048 × 768) times one row of ``x`` (a decoding token), timed alternately (compiled, numpy,
compiled, ...) so load on a shared machine falls on both; the figure is the median of the repeats'
ratios, with each one's weight bytes a second. The compiled values are checked against the numpy
ones first.

Usage::

    nice -n -10 python plugins/anyformer-diskformer/bench/bench_products.py [--repeats 7] [--calls 50] [--rows 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from anyformer_diskformer.compute import native_products
from anyformer_diskformer.compute.quant_product import QuantProduct
from anyformer_gguf_gpu.quants import FORMATS
from anyformer_gguf_gpu.testing import random_blocks

TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
SHAPES = [(768, 2048), (2048, 768)]


def _seconds_a_call(kernels: QuantProduct, x: np.ndarray, raw: np.ndarray, ggml_type: int, calls: int) -> float:
    rows = raw.size // FORMATS[ggml_type].row_bytes(x.shape[1])
    start = time.perf_counter()
    for _ in range(calls):
        kernels.product(x, raw, ggml_type, rows, x.shape[1])
    return (time.perf_counter() - start) / calls


def main() -> None:
    """Print, per type and shape, µs a product and GB/s of weights for each path, and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rows", type=int, default=1, help="rows of x (tokens) a product")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; rows of x: {args.rows}")
    start = time.perf_counter()
    native_products.compile_for(f.ggml_type for f in FORMATS.values())
    print(f"compile_for (or numba's cache): {time.perf_counter() - start:.1f} s")
    compiled, numpy = QuantProduct(), QuantProduct(native=False)
    rng = np.random.default_rng(0)
    ratios_all = []
    for name in TYPES:
        fmt = next(f for f in FORMATS.values() if f.name == name)
        for rows, cols in SHAPES:
            raw = random_blocks(fmt, rows * cols, rng)
            x = rng.standard_normal((args.rows, cols)).astype(np.float32)
            want = numpy.product(x, raw, fmt.ggml_type, rows, cols)
            got = compiled.product(x, raw, fmt.ggml_type, rows, cols)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
            fast, slow = [], []
            for _ in range(args.repeats):
                fast.append(_seconds_a_call(compiled, x, raw, fmt.ggml_type, args.calls))
                slow.append(_seconds_a_call(numpy, x, raw, fmt.ggml_type, args.calls))
            ratio = statistics.median(s / f for f, s in zip(fast, slow, strict=True))
            ratios_all.append(ratio)
            f_med, s_med = statistics.median(fast), statistics.median(slow)
            print(
                f"{name:5} {rows:5} x {cols:5}  compiled {f_med * 1e6:7.0f} µs ({raw.nbytes / f_med / 1e9:5.2f} GB/s)"
                f"  numpy {s_med * 1e6:7.0f} µs ({raw.nbytes / s_med / 1e9:5.2f} GB/s)  ×{ratio:.2f}"
            )
    print(f"median ratio over types and shapes: ×{statistics.median(ratios_all):.2f}")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
