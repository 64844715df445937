"""The CPU engine's dense tensors, held as stored in the GGUF and multiplied a band of rows at a time when used.

A quantised or F16 matrix is kept as its raw blocks (a copy of the file's bytes, so the file may
close), a row of blocks per output row; a product ``x @ W.T`` goes through
:class:`~anyformer_diskformer.compute.quant_product.QuantProduct` a band of rows at a time (at most
:data:`BAND_ELEMENTS` values, 4 MiB of float32 scratch, reused), so the float32 copy of a matrix
never exists whole. An embedding lookup dequantises only the rows asked for. Vectors
(norms, biases) and F32 matrices are kept as float32. Dequantising gives the same float32 values a
whole-tensor dequantisation gives; products agree with those of float32 weights to float32 rounding.
"""

from __future__ import annotations

import numpy as np

from anyformer_diskformer.arch.moe_config import is_expert_tensor, layer_of
from anyformer_diskformer.compute.quant_product import Products, QuantProduct
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.quants import F32, dequantize, format_of

#: The most weights one band of a product converts to float32 at once (4 MiB).
BAND_ELEMENTS = 2**20


class _Stored:
    """A matrix's raw blocks, one row of blocks per output row."""

    def __init__(self, raw: np.ndarray, ggml_type: int, rows: int, cols: int) -> None:
        self.blocks = raw.reshape(rows, -1)
        self.ggml_type = ggml_type
        self.rows = rows
        self.cols = cols

    def dequantize_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start..stop-1`` as a float32 (stop - start, cols) array."""
        return dequantize(self.blocks[start:stop], self.ggml_type).reshape(stop - start, self.cols)


class DenseWeights:
    """Every non-expert tensor of a GGUF: vectors and F32 matrices as float32, other matrices as stored."""

    def __init__(self, gguf: GGUFFile, n_layer: int | None = None) -> None:
        """Every non-expert tensor; with ``n_layer``, none of a layer at or past it (multi-token-prediction
        layers the engine does not run)."""
        self._plain: dict[str, np.ndarray] = {}
        self._stored: dict[str, _Stored] = {}
        #: What computes the stored-matrix products (with its scratch); the CPU engine puts its threads here.
        self.kernels: Products = QuantProduct()
        for t in gguf.header.tensors:
            if is_expert_tensor(t.name) or (n_layer is not None and layer_of(t.name) >= n_layer):
                continue
            raw = gguf.raw(t.name)
            if len(t.dims) == 1 or format_of(t.ggml_type) is F32:
                values = dequantize(raw, t.ggml_type)
                self._plain[t.name] = values.reshape(tuple(reversed(t.dims))) if len(t.dims) > 1 else values
            else:
                cols, rows = int(t.dims[0]), int(np.prod(t.dims[1:]))
                self._stored[t.name] = _Stored(np.array(raw), t.ggml_type, rows, cols)

    @property
    def nbytes(self) -> int:
        """Host bytes the weights take (raw blocks as stored, float32 where kept so)."""
        return sum(w.nbytes for w in self._plain.values()) + sum(s.blocks.nbytes for s in self._stored.values())

    def __contains__(self, name: object) -> bool:
        return name in self._plain or name in self._stored

    def vector(self, name: str) -> np.ndarray:
        """A one-dimensional tensor (a norm's weights, a bias) as float32."""
        return self._plain[name]

    def optional_vector(self, name: str) -> np.ndarray | None:
        """:meth:`vector`, or None where the model has no such tensor."""
        return self._plain.get(name)

    def rows(self, name: str, ids: list[int]) -> np.ndarray:
        """Rows ``ids`` of a matrix (an embedding lookup) as float32, dequantising only those rows."""
        plain = self._plain.get(name)
        if plain is not None:
            return plain[ids].astype(np.float32)
        stored = self._stored[name]
        return np.stack([stored.dequantize_rows(i, i + 1)[0] for i in ids])

    def product(self, x: np.ndarray, name: str) -> np.ndarray:
        """``x @ W.T`` for matrix ``name`` (rows, cols); a stored one is dequantised a band of rows at a time."""
        plain = self._plain.get(name)
        if plain is not None:
            return x @ plain.T
        stored = self._stored[name]
        return self.kernels.product(x, stored.blocks, stored.ggml_type, stored.rows, stored.cols, BAND_ELEMENTS)
