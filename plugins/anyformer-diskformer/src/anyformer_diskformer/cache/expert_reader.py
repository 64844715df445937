"""Reading one routed expert's three slabs from the GGUF: ``os.pread`` and ``POSIX_FADV_DONTNEED``.

A layer's experts live in three 3-D tensors (``ffn_{gate,up,down}_exps``, ggml dims cols × rows ×
experts): expert ``e`` is the ``e``-th contiguous slab of each, so one expert is three reads of
known offset and length. Files that fuse gate and up in one tensor (``ffn_gate_up_exps``, rows
``2 * n_ff``: gate's rows first, then up's, as llama.cpp splits it; every Gemma 4 GGUF, Qwen3.5's
when converted so) give each expert one slab whose halves are its gate and up slabs. The slabs are
kept as stored (quantised blocks, never a dequantised copy) and the page cache is told to drop what
was read, so the budget, not the kernel's cache, bounds the memory experts take. ``os.pread`` on
one descriptor is safe from several threads (the prefetcher's). In a split set a layer's expert
tensors may lie in another shard than its dense weights: each span names its shard, and a reader
keeps one descriptor (or mapping) per shard.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader
from anyformer_diskformer.arch.moe_config import EXPERT_TENSORS, GATE_UP_EXPS
from anyformer_gguf_gpu.gguf_file import GGUFFile


@dataclasses.dataclass(frozen=True)
class ExpertSlices:
    """One expert's three weight slabs as stored in the file (raw ggml blocks), and their ggml types."""

    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    types: tuple[int, int, int]

    @property
    def nbytes(self) -> int:
        """Bytes the three slabs take."""
        return self.gate.nbytes + self.up.nbytes + self.down.nbytes


@dataclasses.dataclass(frozen=True)
class Span:
    """Where expert 0's slab of one layer's expert matrix starts in its file, the bytes from one expert's slab to
    the next (``stride``), the slab's bytes (``length``: the stride, or half of it for a half of a fused gate/up
    tensor), its ggml type and which file of a split set holds it (``shard``, 0-based; 0 for a file not split)."""

    offset: int
    stride: int
    ggml_type: int
    length: int
    shard: int = 0


def expert_spans(source: GGUFHeader | GGUFFile, n_layer: int, n_expert: int) -> dict[tuple[int, str], Span]:
    """Every MoE layer's three expert matrices as spans; ``BAD_MODEL`` when a tensor is not one of ``n_expert`` slabs.

    ``source`` is one file's header, or an open :class:`GGUFFile` (which a split set must be: its tensors lie in
    several files). A fused ``ffn_gate_up_exps`` gives the gate and up spans, each half of an expert's slab. A layer
    with no expert tensor is a dense layer (Ling 2.0's leading ones, Gemma 4's without a router) and has no spans;
    a file with no expert at all is ``BAD_MODEL``.
    """
    header = source.header if isinstance(source, GGUFFile) else source
    shards = header.kv.get("split.count")
    if not isinstance(source, GGUFFile) and isinstance(shards, int) and shards > 1:
        # One shard's header holds offsets into several files: only the set's GGUFFile knows which.
        raise AnyformerError(ErrorCode.BAD_MODEL, "a split set's experts are addressed through its GGUFFile")
    tensors = {t.name: t for t in header.tensors}
    spans: dict[tuple[int, str], Span] = {}

    def start(name: str) -> tuple[int, int]:
        """The tensor's shard and absolute offset in it."""
        if isinstance(source, GGUFFile):
            where = source.place(name)
            return where.shard, where.offset
        return 0, header.data_offset + tensors[name].offset

    def slabs(layer: int, kind: str) -> Span:
        name = f"blk.{layer}.{kind}.weight"
        info = tensors.get(name)
        if info is None or len(info.dims) != 3 or info.dims[2] != n_expert or info.nbytes % n_expert:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{name} is not a tensor of {n_expert} experts")
        stride = info.nbytes // n_expert
        shard, offset = start(name)
        return Span(offset, stride, info.ggml_type, stride, shard)

    for layer in range(n_layer):
        names = [f"blk.{layer}.{kind}.weight" for kind in (*EXPERT_TENSORS, GATE_UP_EXPS)]
        if not any(name in tensors for name in names):
            continue
        gate, up, down = EXPERT_TENSORS
        if names[3] in tensors:
            if names[0] in tensors or names[1] in tensors:
                raise AnyformerError(ErrorCode.BAD_MODEL, f"layer {layer} has gate and up experts both fused and apart")
            fused = slabs(layer, GATE_UP_EXPS)
            if tensors[names[3]].dims[1] % 2 or fused.stride % 2:
                raise AnyformerError(ErrorCode.BAD_MODEL, f"{names[3]} does not split into gate and up halves")
            half = fused.stride // 2  # rows are whole blocks, so n_ff rows are half the bytes
            spans[layer, gate] = dataclasses.replace(fused, length=half)
            spans[layer, up] = dataclasses.replace(fused, offset=fused.offset + half, length=half)
        else:
            spans[layer, gate] = slabs(layer, gate)
            spans[layer, up] = slabs(layer, up)
        spans[layer, down] = slabs(layer, down)
    if not spans:
        raise AnyformerError(
            ErrorCode.BAD_MODEL,
            "no layer has routed experts (ffn_gate_exps, ffn_up_exps, ffn_down_exps or ffn_gate_up_exps)",
        )
    return spans


def _paths(path: str | Sequence[str]) -> tuple[str, ...]:
    """A reader's files: one path, or a split set's paths in shard order."""
    return (path,) if isinstance(path, str) else tuple(path)


class ExpertReader:
    """Reads experts from one GGUF (or each shard of a set) through its own descriptors: pread, then drop the
    kernel's copy."""

    #: How reads bypass the page cache, for reports ("pread+fadvise" here; O_DIRECT readers say so).
    method = "pread+fadvise"
    #: Flags the descriptors are opened with.
    _flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)

    def __init__(self, path: str | Sequence[str], spans: dict[tuple[int, str], Span]) -> None:
        #: The files read, in shard order (:attr:`Span.shard` indexes them); :attr:`path` is the first.
        self.paths = _paths(path)
        self.path = self.paths[0]
        self.spans = spans
        #: Why the reader is not the O_DIRECT one, when that was asked for and refused (else "").
        self.note = ""
        #: Whether the page cache is told to drop what was read (False where the page cache is the experts' home:
        #: the GPU engine's ``cpu_experts`` with ``direct_io`` off).
        self.drop_pages = True
        fds: list[int] = []
        try:
            for shard_path in self.paths:
                fds.append(os.open(shard_path, self._flags))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        self._fds: tuple[int, ...] | None = tuple(fds)

    def _slab(self, fd: int, start: int, length: int) -> np.ndarray:
        data = os.pread(fd, length, start)
        if len(data) != length:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{self.path} ended inside an expert at byte {start}")
        if self.drop_pages and hasattr(os, "posix_fadvise"):
            # The bytes are ours now; the kernel's copy would only double what the budget allows.
            os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)
        return np.frombuffer(data, dtype=np.uint8)

    def read(self, layer: int, expert: int) -> ExpertSlices:
        """Expert ``expert`` of ``layer`` as stored (``BAD_REQUEST`` once closed)."""
        fds = self._fds
        if fds is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the expert cache was closed")
        parts = []
        for kind in EXPERT_TENSORS:
            span = self.spans[layer, kind]
            parts.append(self._slab(fds[span.shard], span.offset + expert * span.stride, span.length))
        t = tuple(self.spans[layer, k].ggml_type for k in EXPERT_TENSORS)
        return ExpertSlices(parts[0], parts[1], parts[2], (t[0], t[1], t[2]))

    def close(self) -> None:
        """Close the descriptors; safe to call twice."""
        fds, self._fds = self._fds, None
        for fd in fds or ():
            os.close(fd)


#: Alignment of O_DIRECT offsets, lengths and buffers: 4 KiB covers 512-byte and 4 KiB logical blocks.
DIRECT_ALIGN = 4096


class DirectExpertReader(ExpertReader):
    """Reads experts with ``O_DIRECT``: no page cache at all, so the budget alone decides what is in memory.

    Each slab is read whole into a page-aligned anonymous mapping (offset rounded down and length up
    to :data:`DIRECT_ALIGN`), and the slab is a view of it: no copy. :func:`open_reader` falls back to
    :class:`ExpertReader` where the platform or the file system refuses ``O_DIRECT``, and says why.
    """

    method = "O_DIRECT"
    _flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0) | getattr(os, "O_CLOEXEC", 0)

    def _slab(self, fd: int, start: int, length: int) -> np.ndarray:
        import mmap

        first = start - start % DIRECT_ALIGN
        span = -(-(start + length - first) // DIRECT_ALIGN) * DIRECT_ALIGN
        buffer = mmap.mmap(-1, span)
        got = os.preadv(fd, [buffer], first)
        if got < start + length - first:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{self.path} ended inside an expert at byte {start}")
        return np.frombuffer(buffer, dtype=np.uint8, count=length, offset=start - first)


def open_reader(path: str | Sequence[str], spans: dict[tuple[int, str], Span], direct: bool = True) -> ExpertReader:
    """An ``O_DIRECT`` reader where ``direct`` and the platform and file system allow one (checked by reading
    the first expert), else the pread + fadvise reader with :attr:`ExpertReader.note` saying why."""
    if not direct:
        return ExpertReader(path, spans)
    if not hasattr(os, "O_DIRECT") or not hasattr(os, "preadv"):
        reason = "this platform has no O_DIRECT"
    else:
        try:
            reader = DirectExpertReader(path, spans)
        except OSError as exc:
            reason = f"the file system refused O_DIRECT ({exc.strerror})"
        else:
            try:
                reader.read(min(spans)[0], 0)  # the file system may accept the flag and refuse the read
                return reader
            except OSError as exc:
                reader.close()
                reason = f"an O_DIRECT read failed ({exc.strerror})"
    plain = ExpertReader(path, spans)
    plain.note = f"pread+fadvise: {reason}"
    return plain


class MappedExperts:
    """Experts as views of the file mapped read-only: the slabs are the page cache's own pages (no copy, nothing
    dropped), for computing experts on the CPU where they lie in host memory (the GPU engine's ``cpu_experts``
    with ``direct_io`` off, as llama.cpp's mmap does). Safe from several threads."""

    method = "mmap"

    def __init__(self, path: str | Sequence[str], spans: dict[tuple[int, str], Span]) -> None:
        import mmap

        self.spans = spans
        self._maps: list[mmap.mmap] | None = []
        for shard_path in _paths(path):
            with open(shard_path, "rb") as f:
                self._maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        self._bytes: list[np.ndarray] | None = [np.frombuffer(m, dtype=np.uint8) for m in self._maps]

    def read(self, layer: int, expert: int) -> ExpertSlices:
        """Expert ``expert`` of ``layer`` as views of the mapping (``BAD_REQUEST`` once closed)."""
        shards = self._bytes
        if shards is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the expert cache was closed")
        parts = []
        for kind in EXPERT_TENSORS:
            span = self.spans[layer, kind]
            data = shards[span.shard]
            start = span.offset + expert * span.stride
            if start + span.length > len(data):
                raise AnyformerError(ErrorCode.BAD_MODEL, f"the file ended inside an expert at byte {start}")
            parts.append(data[start : start + span.length])
        t = tuple(self.spans[layer, k].ggml_type for k in EXPERT_TENSORS)
        return ExpertSlices(parts[0], parts[1], parts[2], (t[0], t[1], t[2]))

    def close(self) -> None:
        """Drop the mappings; safe to call twice (views still held keep them alive until they go)."""
        maps, self._maps, self._bytes = self._maps, None, None
        for mapping in maps or []:
            try:
                mapping.close()
            except BufferError:
                pass  # a slab view is still referenced: the mapping goes with the last of them
