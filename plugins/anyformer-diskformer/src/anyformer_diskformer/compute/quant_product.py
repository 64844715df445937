"""``x @ W.T`` for a matrix kept as stored (ggml blocks), on the CPU, without a dequantised copy of W.

A few rows of ``x`` times a block format go to the compiled kernels of
:mod:`anyformer_diskformer.compute.native_products` when numba is installed (a dependency: 3-7× these numpy
products); the numpy products below are the fallback and the reference those kernels are tested against.

For a few rows of ``x`` (decoding), a block format whose value is ``a * q - b`` within each group of
``gs`` elements (``q`` a small integer code, ``a`` and ``b`` one scale and offset a group: Q4_0,
Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) is multiplied group by group::

    y[r] = sum_g a[r, g] * (q[r, g, :] . x[g, :])  -  sum_g b[r, g] * sum(x[g, :])

so the full-size work is only the codes' conversion to float32 (into a reused scratch buffer, laid
out group-major so that ``q[:, g, :] . x[g, :]`` for every group is one batched BLAS product) and
that product; the scales touch one value per group. Rows are processed in bands, so the scratch
stays a few MiB whatever the matrix. Other types, and many rows of ``x`` (a prompt, where one
dequantised band shared by every row is cheaper), dequantise a band at a time with
:func:`anyformer_gguf_gpu.quants.dequantize`.

The grouped sum adds in another order than dequantise-then-multiply: results agree to float32
rounding (about 1e-6 relative), not bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from anyformer_diskformer.cache.expert_reader import ExpertSlices
from anyformer_diskformer.compute import native_products
from anyformer_gguf_gpu.quants import Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0, dequantize, format_of

#: The most rows of ``x`` the grouped product takes; more share one dequantised band instead.
GROUPED_MAX_ROWS = 8
#: The most weight elements one band converts at once (float32 scratch of 4 MiB).
BAND_ELEMENTS = 2**20


def _f16_words(raw: np.ndarray, start: int, width: int) -> np.ndarray:
    """Little-endian f16 fields at byte ``start`` (even) of every block of ``raw`` (blocks, block bytes: even, rows
    contiguous) as float32, read through a view of the blocks (a strided copy of a few bytes a block is slow)."""
    return raw.view("<f2")[:, start // 2 : start // 2 + width].astype(np.float32)


class Products(Protocol):
    """What computes ``x @ W.T`` for stored matrices: a :class:`QuantProduct`, or one that spreads it over threads."""

    def product(
        self, x: np.ndarray, raw: np.ndarray, ggml_type: int, rows: int, cols: int, band_elements: int = ...
    ) -> np.ndarray:
        """``x @ W.T`` for ``W`` of ``rows`` × ``cols`` stored in ``raw``."""


class QuantProduct:
    """Products of float32 activations with stored matrices; holds the scratch buffers it reuses.

    One instance is used from one thread at a time: each of the engine's threads has its own.
    ``native=False`` keeps every product in numpy (the reference the compiled kernels are checked against).
    """

    def __init__(self, native: bool = True) -> None:
        self.native = native and native_products.AVAILABLE
        self._float = np.empty(0, dtype=np.float32)
        self._low = np.empty(0, dtype=np.uint8)
        self._high = np.empty(0, dtype=np.uint8)
        self._codes = np.empty(0, dtype=np.uint8)

    def _scratch(self, name: str, size: int, dtype: type) -> np.ndarray:
        buffer: np.ndarray = getattr(self, name)
        if buffer.size < size:
            buffer = np.empty(size, dtype=dtype)
            setattr(self, name, buffer)
        return buffer[:size]

    def product(
        self, x: np.ndarray, raw: np.ndarray, ggml_type: int, rows: int, cols: int, band_elements: int = BAND_ELEMENTS
    ) -> np.ndarray:
        """``x @ W.T`` (float32, x's leading shape by ``rows``) for ``W`` of ``rows`` × ``cols`` stored in ``raw``,
        converting at most ``band_elements`` weights at a time."""
        fmt = format_of(ggml_type)
        flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, cols)
        blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, -1)
        out = np.empty((flat.shape[0], rows), dtype=np.float32)
        grouped = fmt in (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) and flat.shape[0] <= GROUPED_MAX_ROWS
        if grouped and self.native and native_products.supports(fmt.ggml_type):
            native_products.product(flat, blocks, fmt.ggml_type, out)
            return out.reshape(*x.shape[:-1], rows)
        band = max(1, band_elements // cols)
        for start in range(0, rows, band):
            stop = min(rows, start + band)
            if grouped:
                out[:, start:stop] = self._grouped(flat, blocks[start:stop], fmt.ggml_type, cols)
            else:
                w = dequantize(blocks[start:stop], ggml_type).reshape(stop - start, cols)
                out[:, start:stop] = flat @ w.T
        return out.reshape(*x.shape[:-1], rows)

    def _grouped(self, x: np.ndarray, blocks: np.ndarray, ggml_type: int, cols: int) -> np.ndarray:
        """The grouped product of ``x`` (n, cols) with a band of rows (rows, bytes a row) of a block format."""
        rows = blocks.shape[0]
        codes: np.ndarray
        b: np.ndarray | None
        if ggml_type == Q4_K.ggml_type:
            codes, a, b, gs = self._q4_k(blocks, cols)
        elif ggml_type == Q5_K.ggml_type:
            codes, a, b, gs = self._q5_k(blocks, cols)
        elif ggml_type == Q4_1.ggml_type:
            codes, a, b, gs = self._q4_1(blocks, cols)
        elif ggml_type == Q6_K.ggml_type:
            codes, a, b, gs = self._q6_k(blocks, cols)
        elif ggml_type == Q8_0.ggml_type:
            codes, a, b, gs = self._q8_0(blocks, cols)
        else:
            codes, a, b, gs = self._q4_0(blocks, cols)
        groups = cols // gs
        xg = x.reshape(-1, groups, gs)
        # (groups, rows, gs) @ (groups, gs, n): every group's codes times its slice of x, one BLAS call a group.
        dots = np.matmul(codes.reshape(groups, rows, gs), xg.transpose(1, 2, 0))
        y = np.einsum("rg,grn->nr", a, dots)
        if b is not None:
            y = y - xg.sum(axis=2) @ b.T
        return y

    # Each decoder returns (codes as float32 laid out (groups, rows, gs), a (rows, groups), b (rows, groups) or
    # None, gs): the band's element (r, g * gs + i) is a[r, g] * codes[g, r, i] - b[r, g]. The scales stay in the
    # blocks' own (row-major) order: transposing small arrays costs numpy more than the einsum that reads them.

    def _nibbles(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every byte's low and high nibble, over the whole band at once (contiguous, so numpy vectorises)."""
        flat = np.ascontiguousarray(blocks).reshape(-1)
        low = self._scratch("_low", flat.size, np.uint8)
        high = self._scratch("_high", flat.size, np.uint8)
        np.bitwise_and(flat, 0x0F, out=low)
        np.right_shift(flat, 4, out=high)
        return low.reshape(blocks.shape), high.reshape(blocks.shape)

    def _q4_0(self, blocks: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        rows, groups = blocks.shape[0], cols // 32
        raw = np.ascontiguousarray(blocks).reshape(rows * groups, 18)
        d = _f16_words(raw, 0, 1).reshape(rows, groups)
        low, high = self._nibbles(raw)
        codes = self._scratch("_float", rows * cols, np.float32).reshape(groups, rows, 2, 16)
        # Byte i of a block holds element i (low nibble) and element i + 16 (high nibble).
        np.copyto(codes[:, :, 0], low[:, 2:].reshape(rows, groups, 16).transpose(1, 0, 2), casting="unsafe")
        np.copyto(codes[:, :, 1], high[:, 2:].reshape(rows, groups, 16).transpose(1, 0, 2), casting="unsafe")
        return codes.reshape(groups, rows, 32), d, 8.0 * d, 32

    def _q4_1(self, blocks: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        rows, groups = blocks.shape[0], cols // 32
        raw = np.ascontiguousarray(blocks).reshape(rows * groups, 20)
        dm = _f16_words(raw, 0, 2)  # (blocks, 2): d, m; an element is d * q + m
        low, high = self._nibbles(raw)
        codes = self._scratch("_float", rows * cols, np.float32).reshape(groups, rows, 2, 16)
        # Byte i of a block holds element i (low nibble) and element i + 16 (high nibble), as in Q4_0.
        np.copyto(codes[:, :, 0], low[:, 4:].reshape(rows, groups, 16).transpose(1, 0, 2), casting="unsafe")
        np.copyto(codes[:, :, 1], high[:, 4:].reshape(rows, groups, 16).transpose(1, 0, 2), casting="unsafe")
        return codes.reshape(groups, rows, 32), dm[:, 0].reshape(rows, groups), -dm[:, 1].reshape(rows, groups), 32

    def _q8_0(self, blocks: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray, None, int]:
        rows, groups = blocks.shape[0], cols // 32
        raw = np.ascontiguousarray(blocks).reshape(rows, groups, 34)
        d = _f16_words(raw.reshape(-1, 34), 0, 1).reshape(rows, groups)
        codes = self._scratch("_float", rows * cols, np.float32).reshape(groups, rows, 32)
        np.copyto(codes, raw[:, :, 2:].view(np.int8).transpose(1, 0, 2), casting="unsafe")
        return codes, d, None, 32

    def _q4_k(self, blocks: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        rows, nb = blocks.shape[0], cols // 256
        raw = np.ascontiguousarray(blocks).reshape(rows * nb, 144)
        a, b = self._k_scales(raw, rows, nb)
        low, high = self._nibbles(raw)
        codes = self._scratch("_float", rows * cols, np.float32).reshape(nb, 4, 2, rows, 32)
        # Bytes 32j..32j+31 of the quants hold sub-block 2j (low nibbles) and 2j + 1 (high nibbles).
        np.copyto(codes[:, :, 0], low[:, 16:].reshape(rows, nb, 4, 32).transpose(1, 2, 0, 3), casting="unsafe")
        np.copyto(codes[:, :, 1], high[:, 16:].reshape(rows, nb, 4, 32).transpose(1, 2, 0, 3), casting="unsafe")
        return codes.reshape(nb * 8, rows, 32), a, b, 32

    def _k_scales(self, raw: np.ndarray, rows: int, nb: int) -> tuple[np.ndarray, np.ndarray]:
        """Q4_K/Q5_K's per-sub-block (a, b), each (rows, nb * 8): a = d * scale, b = dmin * min."""
        dm = _f16_words(raw, 0, 2)  # (blocks, 2): d, dmin
        # The 12 scale bytes as three little-endian words: 6-bit scales and mins of sub-blocks 0-3 in the low six
        # bits of bytes 0-3 / 4-7, those of 4-7 in bytes 8-11's nibbles with two high bits from bytes 0-7's tops.
        w = raw.view("<u4")[:, 1:4]
        lo_sc, lo_mn = w[:, 0] & 0x3F3F3F3F, w[:, 1] & 0x3F3F3F3F
        hi_sc = (w[:, 2] & 0x0F0F0F0F) | (((w[:, 0] >> 6) & 0x03030303) << 4)
        hi_mn = ((w[:, 2] >> 4) & 0x0F0F0F0F) | (((w[:, 1] >> 6) & 0x03030303) << 4)
        sc = np.stack([lo_sc, hi_sc], axis=1).view(np.uint8).astype(np.float32)  # (blocks, 8)
        mn = np.stack([lo_mn, hi_mn], axis=1).view(np.uint8).astype(np.float32)
        return (dm[:, :1] * sc).reshape(rows, nb * 8), (dm[:, 1:] * mn).reshape(rows, nb * 8)

    def _q5_k(self, blocks: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        rows, nb = blocks.shape[0], cols // 256
        raw = np.ascontiguousarray(blocks).reshape(rows * nb, 176)
        a, b = self._k_scales(raw, rows, nb)
        low, high = self._nibbles(raw)
        # The 5-bit codes assembled as bytes first (one conversion to float32 after): the low four bits as in
        # Q4_K (bytes 32j..32j+31 of the quants: sub-block 2j low nibbles, 2j + 1 high), the fifth is bit s
        # of qh[l] for element l of sub-block s.
        u8 = self._scratch("_codes", rows * cols, np.uint8).reshape(nb, 4, 2, rows, 32)
        np.copyto(u8[:, :, 0], low[:, 48:].reshape(rows, nb, 4, 32).transpose(1, 2, 0, 3))
        np.copyto(u8[:, :, 1], high[:, 48:].reshape(rows, nb, 4, 32).transpose(1, 2, 0, 3))
        qh = raw[:, 16:48].reshape(rows, nb, 32).transpose(1, 0, 2)  # (nb, rows, 32)
        for sub in range(8):
            u8[:, sub // 2, sub % 2] |= ((qh >> sub) & 1) << 4
        codes = self._scratch("_float", rows * cols, np.float32).reshape(nb * 8, rows, 32)
        np.copyto(codes, u8.reshape(nb * 8, rows, 32), casting="unsafe")
        return codes, a, b, 32

    def _q6_k(self, blocks: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        rows, nb = blocks.shape[0], cols // 256
        raw = np.ascontiguousarray(blocks).reshape(rows * nb, 210)
        d = _f16_words(raw, 208, 1)  # (blocks, 1)
        scales = raw[:, 192:208].view(np.int8).astype(np.float32)  # (blocks, 16): one per 16 elements
        a = (d * scales).reshape(rows, nb * 16)
        ql = raw[:, 0:128].reshape(-1, 2, 2, 32)  # (blocks, half, 32-byte run, l)
        qh = raw[:, 128:192].reshape(-1, 2, 32)  # (blocks, half, l)
        codes = self._scratch("_float", rows * cols, np.float32).reshape(nb, 2, 4, 2, rows, 16)
        # Within a half of 128: quarter k (elements 32k..32k+31) is ql[l + 32 (k & 1)]'s nibble k >> 1 with
        # qh[l]'s bits 2k, 2k + 1 above it; a quarter is two groups of 16 (one scale each).
        for k in range(4):
            nibble = ql[:, :, k & 1, :] >> 4 if k >> 1 else ql[:, :, k & 1, :] & 0x0F
            q = nibble | (((qh >> (2 * k)) & 3) << 4)  # (blocks, half, 32)
            np.copyto(codes[:, :, k], q.reshape(rows, nb, 2, 2, 16).transpose(1, 2, 3, 0, 4), casting="unsafe")
        return codes.reshape(nb * 16, rows, 16), a, 32.0 * a, 16


def expert_ffn(
    kernels: QuantProduct,
    expert: ExpertSlices,
    x: np.ndarray,
    n_embd: int,
    n_ff: int,
    activation: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """One routed expert's gated FFN on ``x`` (tokens, n_embd), straight from its stored slabs:
    ``down(act(gate(x)) * up(x))``, ``act`` SiLU unless ``activation`` is given (Gemma 4: GELU)."""
    gate = kernels.product(x, expert.gate, expert.types[0], n_ff, n_embd)
    up = kernels.product(x, expert.up, expert.types[1], n_ff, n_embd)
    return kernels.product(swiglu(gate, up, activation), expert.down, expert.types[2], n_embd, n_ff)


def swiglu(
    gate: np.ndarray, up: np.ndarray, activation: Callable[[np.ndarray], np.ndarray] | None = None
) -> np.ndarray:
    """``act(gate) * up`` in f32, ``act`` SiLU unless ``activation`` is given: an expert's hidden activation."""
    if activation is not None:
        return activation(gate).astype(np.float32) * up
    with np.errstate(over="ignore"):  # exp(-gate) overflows to inf for very negative gates: SiLU's limit, 0
        return (gate / (1.0 + np.exp(-gate))).astype(np.float32) * up
