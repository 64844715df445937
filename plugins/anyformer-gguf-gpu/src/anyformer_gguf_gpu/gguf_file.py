"""Tensor bytes of a GGUF file (or a split set of them) over read-only mmaps, after the core's validated headers.

The header is parsed and checked by :func:`anyformer.plugin.read_gguf_header` (bounded counts,
offsets inside the file, sizes that match the types); this module only hands out views of the
bytes it already proved are there. Nothing is copied until a caller uploads a tensor.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from collections.abc import Iterator, Mapping
from types import TracebackType

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader, GGUFTensor, check_split_set, read_gguf_header
from anyformer_gguf_gpu.split_set import set_paths


@dataclasses.dataclass(frozen=True)
class TensorPlace:
    """Where one tensor's bytes lie: the file holding them (a shard of a set, or the one file), the shard's index
    in the set (0 for a file that is not split) and the absolute offset in that file."""

    path: str
    shard: int
    offset: int
    nbytes: int


class GGUFFile:
    """An open GGUF: its validated header and zero-copy views of each tensor's raw bytes.

    A split set (``x-00001-of-00003.gguf`` ...) opens by its first shard's path and reads as one model, as
    llama.cpp reads it: the siblings are found by name beside it, checked as one set (``split.*`` keys, each
    tensor in one shard) and mapped each; :attr:`header` is the whole model's (the first shard's metadata,
    every shard's tensors). A tensor's :attr:`GGUFTensor.offset` counts from its own shard's data, so readers
    address bytes through :meth:`place`, never through ``header.data_offset``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        paths, headers = read_shard_headers(self.path)
        #: The set's files in shard order (one path for a file that is not split).
        self.paths: tuple[str, ...] = tuple(paths)
        #: Each shard's own header, in shard order.
        self.shard_headers: tuple[GGUFHeader, ...] = tuple(headers)
        self.header: GGUFHeader = whole_model_header(headers)
        self._shard_of = {t.name: i for i, h in enumerate(headers) for t in h.tensors}
        self._by_name = {t.name: t for t in self.header.tensors}
        self._maps: list[mmap.mmap] | None = []
        try:
            for shard_path, header in zip(self.paths, headers, strict=True):
                self._maps.append(_map(shard_path, header))
        except BaseException:
            self.close()
            raise

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

    def place(self, name: str) -> TensorPlace:
        """Which file holds tensor ``name`` and where; a missing tensor is ``BAD_MODEL``."""
        info = self.tensor(name)
        shard = self._shard_of[name]
        start = self.shard_headers[shard].data_offset + info.offset
        return TensorPlace(self.paths[shard], shard, start, info.nbytes)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only ``uint8`` view of the mapped file holding it (no copy)."""
        if self._maps is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the GGUF file was closed")
        where = self.place(name)
        return np.frombuffer(self._maps[where.shard], dtype=np.uint8, count=where.nbytes, offset=where.offset)

    def close(self) -> None:
        """Unmap the files; safe to call twice. Views handed out before must not be used after."""
        maps, self._maps = self._maps, None
        for mapped in maps or []:
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


def read_shard_headers(path: str) -> tuple[list[str], list[GGUFHeader]]:
    """The files of the model whose first file is ``path`` and their validated headers, in shard order; a split
    set is checked as one (``BAD_MODEL`` naming a missing or inconsistent shard)."""
    first = read_gguf_header(path)
    paths = set_paths(path, first)
    headers = [first] + [read_gguf_header(p) for p in paths[1:]]
    if len(paths) > 1 or "split.count" in first.kv:
        check_split_set([(os.path.basename(p), h) for p, h in zip(paths, headers, strict=True)])
    return paths, headers


def read_model_header(path: str) -> GGUFHeader:
    """The whole model's header from its first file: :func:`whole_model_header` of :func:`read_shard_headers`."""
    return whole_model_header(read_shard_headers(path)[1])


def _map(path: str, header: GGUFHeader) -> mmap.mmap:
    """``path`` mapped read-only, after checking it is still the size its header was read at."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size != header.file_size:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{path}: the file changed size while it was read")
        # Read-only: a bug here can never write to a user's model file.
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def whole_model_header(headers: list[GGUFHeader]) -> GGUFHeader:
    """A checked set's headers as the one model's: the first shard's metadata, every shard's tensors (each offset
    still its own shard's), the data and file sizes of all shards together; a single file's header as it is."""
    first = headers[0]
    if len(headers) == 1:
        return first
    return dataclasses.replace(
        first,
        tensors=[t for h in headers for t in h.tensors],
        data_bytes=sum(h.data_bytes for h in headers),
        file_size=sum(h.file_size for h in headers),
    )


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
