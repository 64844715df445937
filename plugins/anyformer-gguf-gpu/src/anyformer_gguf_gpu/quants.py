"""The ggml block formats the kernels read, and numpy reference dequantisers for each.

Layouts are facts from ggml's ``ggml-common.h`` (the ``block_q4_0`` ... ``block_q6_K`` structs) and
its reference ``dequantize_row_*`` functions; the code is ours. Every format is little-endian and
packed: a row of ``n`` elements is ``n / block_size`` blocks back to back. The WGSL kernels in
``wgsl/quant_*.wgsl`` decode the same bytes; these functions are what the tests hold them to.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode


@dataclasses.dataclass(frozen=True)
class QuantFormat:
    """A ggml type the kernels read: its id, name, elements per block and bytes per block."""

    ggml_type: int
    name: str
    block_size: int
    type_size: int

    def row_bytes(self, n: int) -> int:
        """Bytes one row of ``n`` elements takes."""
        return (n // self.block_size) * self.type_size


F32 = QuantFormat(0, "F32", 1, 4)
F16 = QuantFormat(1, "F16", 1, 2)
Q4_0 = QuantFormat(2, "Q4_0", 32, 18)
Q4_1 = QuantFormat(3, "Q4_1", 32, 20)
Q8_0 = QuantFormat(8, "Q8_0", 32, 34)
Q4_K = QuantFormat(12, "Q4_K", 256, 144)
Q5_K = QuantFormat(13, "Q5_K", 256, 176)
Q6_K = QuantFormat(14, "Q6_K", 256, 210)
BF16 = QuantFormat(30, "BF16", 1, 2)

#: Every type the kernels read, by ggml type id.
FORMATS: dict[int, QuantFormat] = {f.ggml_type: f for f in (F32, F16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16)}


def format_of(ggml_type: int, what: str = "a tensor") -> QuantFormat:
    """The format of ``ggml_type``; another type is a ``BAD_MODEL`` error naming it."""
    fmt = FORMATS.get(ggml_type)
    if fmt is None:
        from anyformer.plugin import GGML_TYPES

        name = GGML_TYPES[ggml_type].name if ggml_type in GGML_TYPES else f"type {ggml_type}"
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{what} is {name}, which the WGSL kernels do not read")
    return fmt


def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian f16 values from pairs of bytes (last axis 2) as float32."""
    return np.ascontiguousarray(raw).view("<f2")[..., 0].astype(np.float32)


def _blocks(raw: np.ndarray, fmt: QuantFormat) -> np.ndarray:
    data = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if data.size % fmt.type_size:
        raise ValueError(f"{data.size} bytes is not a whole number of {fmt.name} blocks")
    return data.reshape(-1, fmt.type_size)


def _q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2, None].reshape(-1, 1, 2))
    qs = b[:, 2:18]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8.0
    return d * q


def _q4_1(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2].reshape(-1, 1, 2))
    m = _f16(b[:, 2:4].reshape(-1, 1, 2))
    qs = b[:, 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    return d * q + m


def _q8_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2].reshape(-1, 1, 2))
    q = b[:, 2:34].view(np.int8).astype(np.float32)
    return d * q


def k_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit (scale, min) pairs packed in Q4_K/Q5_K's 12 ``scales`` bytes (ggml's get_scale_min_k4)."""
    s = scales.astype(np.uint16)
    sc = np.empty((s.shape[0], 8), dtype=np.uint16)
    mn = np.empty((s.shape[0], 8), dtype=np.uint16)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2].reshape(-1, 1, 2))
    dmin = _f16(b[:, 2:4].reshape(-1, 1, 2))
    sc, mn = k_scales_mins(b[:, 4:16])
    qs = b[:, 16:144].reshape(-1, 4, 32)
    # Sub-block 2j is the low nibbles of bytes 32j..32j+31, sub-block 2j+1 their high nibbles.
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)
    out = (d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]
    return out.reshape(-1, 256)


def _q5_k(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2].reshape(-1, 1, 2))
    dmin = _f16(b[:, 2:4].reshape(-1, 1, 2))
    sc, mn = k_scales_mins(b[:, 4:16])
    qh = b[:, 16:48]
    qs = b[:, 48:176].reshape(-1, 4, 32)
    low = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)
    # Bit s of qh[l] is the fifth bit of element l of sub-block s.
    high = ((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1).astype(np.float32) * 16.0
    out = (d * sc)[:, :, None] * (low + high) - (dmin * mn)[:, :, None]
    return out.reshape(-1, 256)


def _q6_k(b: np.ndarray) -> np.ndarray:
    ql = b[:, 0:128].reshape(-1, 2, 64)
    qh = b[:, 128:192].reshape(-1, 2, 32)
    scales = b[:, 192:208].view(np.int8).astype(np.float32).reshape(-1, 2, 8)
    d = _f16(b[:, 208:210].reshape(-1, 1, 2))[:, :, None]
    # Per half of 128: four quarters of 32; quarter k takes ql[l + 32*(k&1)]'s nibble k>>1 and qh[l]'s bits 2k.
    quarters = []
    for k in range(4):
        low = (ql[:, :, 32 * (k & 1) : 32 * (k & 1) + 32] >> (4 * (k >> 1))) & 0x0F
        high = (qh >> (2 * k)) & 3
        quarters.append((low | (high << 4)).astype(np.float32) - 32.0)
    q = np.stack(quarters, axis=2)  # (blocks, half, quarter, 32)
    # Scale index within a half: 2k + l // 16.
    sc = scales.reshape(-1, 2, 4, 2)[:, :, :, :, None].repeat(16, axis=4).reshape(-1, 2, 4, 32)
    return (d[:, :, :, None] * sc * q).reshape(-1, 256)


def dequantize(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    """All elements of ``raw`` (the bytes of whole blocks of ``ggml_type``) as a flat float32 array."""
    fmt = format_of(ggml_type)
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if fmt is F32:
        return data.view("<f4").astype(np.float32)
    if fmt is F16:
        return data.view("<f2").astype(np.float32)
    if fmt is BF16:
        return (data.view("<u2").astype(np.uint32) << 16).view(np.float32)
    decode = {Q4_0: _q4_0, Q4_1: _q4_1, Q8_0: _q8_0, Q4_K: _q4_k, Q5_K: _q5_k, Q6_K: _q6_k}[fmt]
    return decode(_blocks(data, fmt)).astype(np.float32).reshape(-1)
