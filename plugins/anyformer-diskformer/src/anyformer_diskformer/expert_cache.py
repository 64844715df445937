"""Routed experts read from the GGUF on demand into a cache of a fixed number of bytes (LRU or LRFU).

A layer's experts live in three 3-D tensors (``ffn_{gate,up,down}_exps``, ggml dims cols × rows ×
experts): expert ``e`` is the ``e``-th contiguous slab of each, so one expert is three ``os.pread``
calls of known offset and length. The slabs are kept as stored (quantised blocks, never a
dequantised copy) and the page cache is told to drop what was read (``POSIX_FADV_DONTNEED``), so
the budget, not the kernel's cache, bounds the memory experts take.
"""

from __future__ import annotations

import dataclasses
import os
from types import TracebackType

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader, format_size
from anyformer_diskformer.moe_config import EXPERT_TENSORS
from anyformer_diskformer.policies import LRU, EvictionPolicy


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


@dataclasses.dataclass
class CacheStats:
    """What the cache did: lookups answered from memory, reads from disk, bytes read, entries evicted."""

    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        """Hits over lookups (0 before the first lookup)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


@dataclasses.dataclass(frozen=True)
class _Span:
    """Where one layer's expert tensor starts in the file, each expert's bytes, and its ggml type."""

    offset: int
    stride: int
    ggml_type: int


class ExpertCache:
    """A byte-budgeted cache of experts keyed by (layer, expert), filled by ``os.pread``; LRU unless told.

    ``capacity_bytes`` must hold at least one expert: a smaller cache could not hand out even one
    expert without reading it again, which is ``BUDGET_TOO_SMALL`` with the bytes one expert needs.
    """

    def __init__(
        self,
        path: str,
        header: GGUFHeader,
        n_layer: int,
        n_expert: int,
        capacity_bytes: int,
        policy: EvictionPolicy | None = None,
    ) -> None:
        self.path = path
        self.n_layer = n_layer
        self.n_expert = n_expert
        tensors = {t.name: t for t in header.tensors}
        self._spans: dict[tuple[int, str], _Span] = {}
        for layer in range(n_layer):
            for kind in EXPERT_TENSORS:
                info = tensors.get(f"blk.{layer}.{kind}.weight")
                if info is None or len(info.dims) != 3 or info.dims[2] != n_expert or info.nbytes % n_expert:
                    raise AnyformerError(
                        ErrorCode.BAD_MODEL, f"blk.{layer}.{kind}.weight is not a tensor of {n_expert} experts"
                    )
                self._spans[layer, kind] = _Span(
                    header.data_offset + info.offset, info.nbytes // n_expert, info.ggml_type
                )
        #: Bytes of one expert (all three slabs); the same for every layer of the models read.
        self.expert_bytes = max(sum(self._spans[layer, k].stride for k in EXPERT_TENSORS) for layer in range(n_layer))
        if capacity_bytes < self.expert_bytes:
            raise AnyformerError(
                ErrorCode.BUDGET_TOO_SMALL,
                f"an expert cache of {format_size(capacity_bytes)} cannot hold one expert "
                f"({format_size(self.expert_bytes)})",
                need=self.expert_bytes,
            )
        self.capacity_bytes = capacity_bytes
        self.stats = CacheStats()
        self.policy: EvictionPolicy = policy if policy is not None else LRU()
        self._entries: dict[tuple[int, int], ExpertSlices] = {}
        self._held = 0
        #: Every (layer, expert) asked for since the last :meth:`take_accesses`, when recording.
        self.accesses: list[tuple[int, int]] | None = None
        self._fd: int | None = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    @property
    def held_bytes(self) -> int:
        """Bytes the cached experts take now (never above ``capacity_bytes``)."""
        return self._held

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self._entries

    def get(self, layer: int, expert: int) -> ExpertSlices:
        """Expert ``expert`` of ``layer`` from the cache (a hit) or the file (a miss, evicting as the policy says)."""
        key = (layer, expert)
        if self.accesses is not None:
            self.accesses.append(key)
        found = self._entries.get(key)
        if found is not None:
            self.policy.touch(key)
            self.stats.hits += 1
            return found
        if not (0 <= layer < self.n_layer and 0 <= expert < self.n_expert):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"no expert {expert} in layer {layer}")
        slices = self._read(layer, expert)
        self.stats.misses += 1
        self.stats.bytes_read += slices.nbytes
        while self._entries and self._held + slices.nbytes > self.capacity_bytes:
            victim = self.policy.victim()
            self._held -= self._entries.pop(victim).nbytes
            self.policy.evicted(victim)
            self.stats.evictions += 1
        self._entries[key] = slices
        self.policy.touch(key)
        self._held += slices.nbytes
        return slices

    def take_accesses(self) -> list[tuple[int, int]]:
        """The accesses recorded since the last call (recording starts with the first call)."""
        taken, self.accesses = self.accesses or [], []
        return taken

    def _read(self, layer: int, expert: int) -> ExpertSlices:
        fd = self._fd
        if fd is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the expert cache was closed")
        parts = []
        for kind in EXPERT_TENSORS:
            span = self._spans[layer, kind]
            start = span.offset + expert * span.stride
            data = os.pread(fd, span.stride, start)
            if len(data) != span.stride:
                raise AnyformerError(ErrorCode.BAD_MODEL, f"{self.path} ended inside expert {expert} of layer {layer}")
            if hasattr(os, "posix_fadvise"):
                # The bytes are ours now; the kernel's copy would only double what the budget allows.
                os.posix_fadvise(fd, start, span.stride, os.POSIX_FADV_DONTNEED)
            parts.append(np.frombuffer(data, dtype=np.uint8))
        types = tuple(self._spans[layer, k].ggml_type for k in EXPERT_TENSORS)
        return ExpertSlices(parts[0], parts[1], parts[2], (types[0], types[1], types[2]))

    def close(self) -> None:
        """Close the file and drop every cached expert; safe to call twice."""
        fd, self._fd = self._fd, None
        self._entries.clear()
        self._held = 0
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> ExpertCache:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
