"""``x @ W.T`` for a few rows of ``x`` and a matrix kept in ggml blocks, compiled to native code by numba.

The numpy products of :mod:`anyformer_diskformer.compute.quant_product` convert every code to float32 in a
scratch buffer before one BLAS call: on the CPU engine that conversion was most of a decode step
(a profile put 92 % of a step in the products, two thirds of it in conversions and bit work). Here
each row's blocks are read once, the codes widened in registers and multiplied with ``x`` in SIMD
loops the compiler vectorises (``fastmath`` lets it reorder the sums), so a product streams the
stored bytes instead of writing and re-reading four bytes a weight: 3-5× the numpy product on one
core (``bench/bench_products.py``).

Every kernel computes, a group of ``gs`` codes at a time, ``a * (q . x) - b * sum(x)`` as the numpy
path does; sums are reordered, so results agree with it (and with dequantise-then-multiply) to
float32 rounding, not bit for bit. Kernels release the GIL: the engine's expert threads run them
side by side.

numba compiles a kernel on its first call (about a second each) and keeps the machine code in its
on-disk cache; :func:`compile_for` compiles the types a model uses while it loads, so the first
token does not pay for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

import numpy as np

from anyformer_gguf_gpu.quants import Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0, format_of

try:  # numba is a dependency; a platform without its wheels still runs, on the numpy products
    import numba

    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised only where numba does not install
    numba = None  # type: ignore[assignment]
    AVAILABLE = False

#: float32 value of every f16 bit pattern: a scale is one table read instead of bit work in the loop.
_F16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


_Function = TypeVar("_Function", bound=Callable[..., Any])


def _jit(function: _Function) -> _Function:
    """``function`` compiled on first call: no GIL held, sums reordered freely, machine code cached on disk."""
    if numba is None:  # pragma: no cover
        return function
    try:
        return cast(_Function, numba.njit(nogil=True, fastmath=True, cache=True)(function))
    except RuntimeError:  # no writable cache (a read-only install and no home): compile on each run instead
        return cast(_Function, numba.njit(nogil=True, fastmath=True)(function))


def _f16_at(blocks: np.ndarray, row: int, at: int, f16: np.ndarray) -> np.float32:
    return f16[np.int32(blocks[row, at]) | (np.int32(blocks[row, at + 1]) << 8)]


def _group_sums(x: np.ndarray, gs: int) -> np.ndarray:
    n, cols = x.shape
    sums = np.empty((n, cols // gs), dtype=np.float32)
    for t in range(n):
        for g in range(cols // gs):
            sums[t, g] = x[t, g * gs : (g + 1) * gs].sum()
    return sums


def _k_scale(blocks: np.ndarray, row: int, at: int, j: int) -> tuple[Any, Any]:
    """Q4_K/Q5_K's 6-bit scale and min of sub-block ``j`` from the 12 bytes at ``at``."""
    if j < 4:
        return np.int32(blocks[row, at + j]) & 63, np.int32(blocks[row, at + 4 + j]) & 63
    low = np.int32(blocks[row, at + 4 + j])
    scale = (low & 15) | ((np.int32(blocks[row, at + j - 4]) >> 6) << 4)
    minimum = (low >> 4) | ((np.int32(blocks[row, at + j]) >> 6) << 4)
    return scale, minimum


# Each kernel keeps one vector of partial sums (``lanes``) a row and token: every group adds its scale times its
# codes times x into it lane by lane, and the lanes are summed once at the end of the row. (Summing each group's dot
# product on its own cost a horizontal reduction a group; this form measured 1.3-1.5x faster.) The offsets of the
# codes (Q4_0's 8, Q6_K's 32) and the mins (Q4_1, Q4_K, Q5_K) are added per group from x's group sums.


def _q4_blocks(x: np.ndarray, blocks: np.ndarray, f16: np.ndarray, out: np.ndarray, with_min: bool) -> None:
    """Q4_0 (18-byte blocks of 32: d, then 16 code bytes; a value is d (q - 8)) or, ``with_min``, Q4_1 (20 bytes: d
    and m, then the codes; a value is d q + m). Byte i holds element i (low nibble) and element i + 16 (high)."""
    n, cols = x.shape
    sums = _group_sums(x, 32)
    lanes = np.empty(32, dtype=np.float32)
    size, codes_at = (20, 4) if with_min else (18, 2)
    for r in range(blocks.shape[0]):
        for t in range(n):
            lanes[:] = 0.0
            offset = np.float32(0.0)
            for g in range(cols // 32):
                at = g * size
                d = _f16_at(blocks, r, at, f16)
                offset += (_f16_at(blocks, r, at + 2, f16) if with_min else np.float32(-8.0) * d) * sums[t, g]
                for i in range(16):
                    v = np.int32(blocks[r, at + codes_at + i])
                    lanes[i] += d * np.float32(v & 15) * x[t, g * 32 + i]
                    lanes[16 + i] += d * np.float32(v >> 4) * x[t, g * 32 + 16 + i]
            out[t, r] = lanes.sum() + offset


def _q4_0(x: np.ndarray, blocks: np.ndarray, f16: np.ndarray, out: np.ndarray) -> None:
    _q4_blocks(x, blocks, f16, out, False)


def _q4_1(x: np.ndarray, blocks: np.ndarray, f16: np.ndarray, out: np.ndarray) -> None:
    _q4_blocks(x, blocks, f16, out, True)


def _q8_0(x: np.ndarray, blocks: np.ndarray, f16: np.ndarray, out: np.ndarray) -> None:
    n, cols = x.shape
    codes = blocks.view(np.int8)
    lanes = np.empty(32, dtype=np.float32)
    for r in range(blocks.shape[0]):
        for t in range(n):
            lanes[:] = 0.0
            for g in range(cols // 32):
                at = g * 34
                d = _f16_at(blocks, r, at, f16)
                for i in range(32):
                    lanes[i] += d * np.float32(np.int32(codes[r, at + 2 + i])) * x[t, g * 32 + i]
            out[t, r] = lanes.sum()


def _k_quant(x: np.ndarray, blocks: np.ndarray, f16: np.ndarray, out: np.ndarray, five_bits: bool) -> None:
    """Q4_K (144-byte blocks) or, with ``five_bits``, Q5_K (176: a fifth bit a code from ``qh``, the 32 bytes at
    16): d and dmin, 8 six-bit scales and mins (12 bytes at 4), then the codes, 32 bytes a pair of sub-blocks."""
    n, cols = x.shape
    sums = _group_sums(x, 32)
    lanes = np.empty(32, dtype=np.float32)
    size, codes_at = (176, 48) if five_bits else (144, 16)
    for r in range(blocks.shape[0]):
        for t in range(n):
            lanes[:] = 0.0
            offset = np.float32(0.0)
            for b in range(cols // 256):
                at = b * size
                d = _f16_at(blocks, r, at, f16)
                dmin = _f16_at(blocks, r, at + 2, f16)
                for j in range(4):
                    # Bytes 32j..32j+31 of the codes: sub-block 2j in the low nibbles, 2j + 1 in the high ones.
                    s0, m0 = _k_scale(blocks, r, at + 4, 2 * j)
                    s1, m1 = _k_scale(blocks, r, at + 4, 2 * j + 1)
                    a0 = d * np.float32(s0)
                    a1 = d * np.float32(s1)
                    g = b * 8 + 2 * j
                    offset += dmin * (np.float32(m0) * sums[t, g] + np.float32(m1) * sums[t, g + 1])
                    base = b * 256 + 64 * j
                    code = at + codes_at + 32 * j
                    for i in range(32):
                        v = np.int32(blocks[r, code + i])
                        low = v & 15
                        high = v >> 4
                        if five_bits:  # the fifth bit of element i of sub-block s is bit s of qh[i]
                            h = np.int32(blocks[r, at + 16 + i])
                            low |= ((h >> (2 * j)) & 1) << 4
                            high |= ((h >> (2 * j + 1)) & 1) << 4
                        lanes[i] += a0 * np.float32(low) * x[t, base + i]
                        lanes[i] += a1 * np.float32(high) * x[t, base + 32 + i]
            out[t, r] = lanes.sum() - offset


def _q4_k(x: np.ndarray, blocks: np.ndarray, f16: np.ndarray, out: np.ndarray) -> None:
    _k_quant(x, blocks, f16, out, False)


def _q5_k(x: np.ndarray, blocks: np.ndarray, f16: np.ndarray, out: np.ndarray) -> None:
    _k_quant(x, blocks, f16, out, True)


def _q6_k(x: np.ndarray, blocks: np.ndarray, f16: np.ndarray, out: np.ndarray) -> None:
    n, cols = x.shape
    sums = _group_sums(x, 16)
    codes = blocks.view(np.int8)
    lanes = np.empty(32, dtype=np.float32)
    for r in range(blocks.shape[0]):
        for t in range(n):
            lanes[:] = 0.0
            offset = np.float32(0.0)
            for b in range(cols // 256):
                at = b * 210
                d = _f16_at(blocks, r, at + 208, f16)
                for half in range(2):
                    # Element i (0-31) of quarter k (elements 32k..32k+31 of the half) is ql[i + 32 (k & 1)]'s
                    # nibble k >> 1 (ql: the half's 64 bytes at 64 half) with qh[i]'s bits 2k, 2k + 1 above it (qh:
                    # its 32 bytes at 128 + 32 half), codes 0-63 standing for -32..31; elements 0-15 and 16-31 of a
                    # quarter have a scale each (scales: int8, the half's 8 at 192 + 8 half). One pass over i reads
                    # each code byte once for all four quarters.
                    s = at + 192 + 8 * half
                    base = b * 256 + 128 * half
                    for g in range(8):
                        offset += np.float32(32.0) * d * np.float32(codes[r, s + g]) * sums[t, base // 16 + g]
                    ql = at + 64 * half
                    qh = at + 128 + 32 * half
                    for part in range(2):
                        a0 = d * np.float32(codes[r, s + part])
                        a1 = d * np.float32(codes[r, s + 2 + part])
                        a2 = d * np.float32(codes[r, s + 4 + part])
                        a3 = d * np.float32(codes[r, s + 6 + part])
                        for i in range(16 * part, 16 * part + 16):
                            low = np.int32(blocks[r, ql + i])
                            high = np.int32(blocks[r, ql + 32 + i])
                            h = np.int32(blocks[r, qh + i])
                            lanes[i] += (
                                a0 * np.float32((low & 15) | ((h & 3) << 4)) * x[t, base + i]
                                + a1 * np.float32((high & 15) | (((h >> 2) & 3) << 4)) * x[t, base + 32 + i]
                                + a2 * np.float32((low >> 4) | (((h >> 4) & 3) << 4)) * x[t, base + 64 + i]
                                + a3 * np.float32((high >> 4) | (((h >> 6) & 3) << 4)) * x[t, base + 96 + i]
                            )
            out[t, r] = lanes.sum() - offset


_SOURCES: dict[int, Callable[..., None]] = {
    Q4_0.ggml_type: _q4_0,
    Q4_1.ggml_type: _q4_1,
    Q8_0.ggml_type: _q8_0,
    Q4_K.ggml_type: _q4_k,
    Q5_K.ggml_type: _q5_k,
    Q6_K.ggml_type: _q6_k,
}

# The helpers are compiled first so the kernels see jitted functions (numba inlines them into each kernel).
if AVAILABLE:
    _f16_at = _jit(_f16_at)
    _group_sums = _jit(_group_sums)
    _k_scale = _jit(_k_scale)
    _k_quant = _jit(_k_quant)
    _q4_blocks = _jit(_q4_blocks)
    _KERNELS: dict[int, Callable[..., None]] = {t: _jit(f) for t, f in _SOURCES.items()}
else:  # pragma: no cover
    _KERNELS = {}

_compile_lock = threading.Lock()


def supports(ggml_type: int) -> bool:
    """Whether a native kernel multiplies matrices of this ggml type (numba installed and the type a block one)."""
    return ggml_type in _KERNELS


def product(x: np.ndarray, blocks: np.ndarray, ggml_type: int, out: np.ndarray) -> None:
    """``out[:] = x @ W.T`` for ``x`` (n, cols) float32 C-contiguous and ``W`` stored as ``blocks`` (rows, bytes a
    row) uint8 C-contiguous, writable or not; ``out`` (n, rows) float32. The type must be one :func:`supports`
    names."""
    _KERNELS[ggml_type](x, blocks, _F16, out)


def compile_for(ggml_types: Iterable[int]) -> list[int]:
    """Compile (or load from numba's cache) the kernels of these types now, for blocks in writable buffers (the
    expert cache) and read-only ones (the memory-mapped file): numba specialises on both. Returns the types."""
    done = []
    with _compile_lock:
        for ggml_type in sorted(set(ggml_types)):
            if not supports(ggml_type):
                continue
            cols = 256
            x = np.zeros((1, cols), dtype=np.float32)
            blocks = np.zeros((1, format_of(ggml_type).row_bytes(cols)), dtype=np.uint8)
            product(x, blocks, ggml_type, np.empty((1, 1), dtype=np.float32))
            blocks.setflags(write=False)
            product(x, blocks, ggml_type, np.empty((1, 1), dtype=np.float32))
            done.append(ggml_type)
    return done
