"""Tensor bytes of a GGUF file over a read-only mmap, after the core's validated header.

The header is parsed and checked by :func:`anyformer.plugin.read_gguf_header` (bounded counts,
offsets inside the file, sizes that match the types); this module only hands out views of the
bytes it already proved are there. Nothing is copied until a caller uploads a tensor.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator, Mapping
from types import TracebackType

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader, GGUFTensor, read_gguf_header


class GGUFFile:
    """An open GGUF: its validated header and zero-copy views of each tensor's raw bytes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.header: GGUFHeader = read_gguf_header(self.path)
        self._by_name = {t.name: t for t in self.header.tensors}
        with open(self.path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size != self.header.file_size:
                raise AnyformerError(ErrorCode.BAD_MODEL, f"{self.path}: the file changed size while it was read")
            # Read-only: a bug here can never write to a user's model file.
            self._map: mmap.mmap | None = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)

    @property
    def kv(self) -> Mapping[str, object]:
        """The header's metadata by key, long arrays (vocabulary, merges) decoded into lists on access."""
        return _DecodedMetadata(self.header)

    def has(self, name: str) -> bool:
        """Whether a tensor of this name is in the file."""
        return name in self._by_name

    def tensor(self, name: str) -> GGUFTensor:
        """The tensor info of ``name``; a missing tensor is ``BAD_MODEL``."""
        info = self._by_name.get(name)
        if info is None:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{os.path.basename(self.path)}: no tensor {name}")
        return info

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only ``uint8`` view of the mapped file (no copy)."""
        if self._map is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the GGUF file was closed")
        info = self.tensor(name)
        start = self.header.data_offset + info.offset
        return np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=start)

    def close(self) -> None:
        """Unmap the file; safe to call twice. Views handed out before must not be used after."""
        mapped, self._map = self._map, None
        if mapped is not None:
            try:
                mapped.close()
            except BufferError:
                # A numpy view is still alive: the map is freed when the last view goes.
                pass

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _DecodedMetadata(Mapping[str, object]):
    """The header's metadata as plain values: the core keeps long arrays as checked bytes until asked."""

    def __init__(self, header: GGUFHeader) -> None:
        self._header = header

    def __getitem__(self, key: str) -> object:
        if key not in self._header.kv:
            raise KeyError(key)
        return self._header.get(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._header.kv)

    def __len__(self) -> int:
        return len(self._header.kv)
