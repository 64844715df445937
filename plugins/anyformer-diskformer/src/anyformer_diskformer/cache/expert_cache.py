"""Routed experts read from the GGUF on demand into a cache of a fixed number of bytes (LRU or LRFU).

The cache decides what is held (its policy names the victims, its byte budget bounds the total);
a *store* holds it: :class:`HostStore` keeps the raw slabs in host memory (the CPU engine), the
GPU engine's store uploads them into GPU buffer slots. Keys in use by the layer being computed are
pinned (:meth:`ExpertCache.fetch`), so filling the rest of a layer never evicts one of them. A
prefetcher (:mod:`anyformer_diskformer.cache.prefetch`) may hand over experts it read ahead of need.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader, format_size
from anyformer_diskformer.arch.moe_config import EXPERT_TENSORS
from anyformer_diskformer.cache.expert_reader import ExpertReader, ExpertSlices, expert_spans
from anyformer_diskformer.cache.policies import LRU, EvictionPolicy
from anyformer_diskformer.cache.prefetch import Prefetcher
from anyformer_diskformer.cache.stats import CacheStats, Key
from anyformer_gguf_gpu.gguf_file import GGUFFile

__all__ = ["CacheStats", "ExpertCache", "ExpertStore", "HostStore", "Key", "attach_prefetcher"]

Entry = TypeVar("Entry")


class ExpertStore(Protocol[Entry]):
    """Where cached experts live: ``put`` keeps one (returning what a lookup hands back), ``drop`` frees it."""

    def cost(self, slices: ExpertSlices) -> int:
        """Bytes one expert takes in this store."""

    def put(self, key: Key, slices: ExpertSlices) -> Entry:
        """Keep ``slices`` under ``key``; the result is what lookups of ``key`` return."""

    def drop(self, key: Key, entry: Entry) -> None:
        """``key`` was evicted; free what it held."""


class HostStore:
    """Experts kept as their raw slabs in host memory."""

    def cost(self, slices: ExpertSlices) -> int:
        """The slabs' bytes."""
        return slices.nbytes

    def put(self, key: Key, slices: ExpertSlices) -> ExpertSlices:
        """The slabs themselves."""
        return slices

    def drop(self, key: Key, entry: ExpertSlices) -> None:
        """Nothing to free beyond the reference."""


class ExpertCache(Generic[Entry]):
    """A byte-budgeted cache of experts keyed by (layer, expert), filled from the file; LRU unless told.

    ``capacity_bytes`` must hold at least one expert: a smaller cache could not hand out even one
    expert without reading it again, which is ``BUDGET_TOO_SMALL`` with the bytes one expert needs.
    """

    def __init__(
        self,
        path: str,
        header: GGUFHeader | GGUFFile,
        n_layer: int,
        n_expert: int,
        capacity_bytes: int,
        policy: EvictionPolicy | None = None,
        store: ExpertStore[Entry] | None = None,
        reader: ExpertReader | None = None,
    ) -> None:
        self.path = path
        self.n_layer = n_layer
        self.n_expert = n_expert
        if reader is None:
            # An open GGUFFile (a split set must be one) reads each expert from the shard holding it.
            files = header.paths if isinstance(header, GGUFFile) else path
            reader = ExpertReader(files, expert_spans(header, n_layer, n_expert))
        self.reader = reader
        spans = self.reader.spans
        #: Bytes of one expert (all three slabs), the largest over the layers (quant mixes differ by layer).
        layers = {layer for layer, _ in spans}  # the MoE layers (dense ones have no experts)
        self.expert_bytes = max(sum(spans[layer, k].length for k in EXPERT_TENSORS) for layer in layers)
        if capacity_bytes < self.expert_bytes:
            self.reader.close()
            raise AnyformerError(
                ErrorCode.BUDGET_TOO_SMALL,
                f"an expert cache of {format_size(capacity_bytes)} cannot hold one expert "
                f"({format_size(self.expert_bytes)})",
                need=self.expert_bytes,
            )
        self.capacity_bytes = capacity_bytes
        self.stats = CacheStats()
        self.policy: EvictionPolicy = policy if policy is not None else LRU()
        self.store: ExpertStore[Entry] = store if store is not None else HostStore()  # type: ignore[assignment]
        #: Set by the engine when it prefetches; lookups that miss ask it first.
        self.prefetcher: Prefetcher | None = None
        self._entries: dict[Key, tuple[Entry, int]] = {}
        self._held = 0
        self._pinned: set[Key] = set()
        self._open = True
        #: Every (layer, expert) asked for since the last :meth:`take_accesses`, when recording.
        self.accesses: list[Key] | None = None

    @property
    def held_bytes(self) -> int:
        """Bytes the cached experts take now (never above ``capacity_bytes``)."""
        return self._held

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, layer: int, expert: int) -> Entry:
        """Expert ``expert`` of ``layer`` from the cache (a hit) or the file (a miss, evicting as the policy says)."""
        key = (layer, expert)
        if self.accesses is not None:
            self.accesses.append(key)
        found = self._entries.get(key)
        if found is not None:
            self.policy.touch(key)
            self.stats.hits += 1
            return found[0]
        if not self._open:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the expert cache was closed")
        if not (0 <= layer < self.n_layer and 0 <= expert < self.n_expert):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"no expert {expert} in layer {layer}")
        demanded = self.prefetcher is not None and self.prefetcher.demanded(key)
        slices = self.prefetcher.take(key) if self.prefetcher is not None else None
        if slices is None:
            slices = self.reader.read(layer, expert)
            self.stats.misses += 1
            self.stats.bytes_read += slices.nbytes
        elif demanded:
            self.stats.misses += 1  # a miss read ahead of its turn (fetch_each); its bytes were counted when taken
        else:
            self.stats.prefetched += 1  # its bytes were counted when the prefetcher read them
        cost = self.store.cost(slices)
        while self._entries and self._held + cost > self.capacity_bytes:
            victim = self.policy.victim(self._pinned)
            entry, victim_cost = self._entries.pop(victim)
            self._held -= victim_cost
            self.store.drop(victim, entry)
            self.policy.evicted(victim)
            self.stats.evictions += 1
        entry = self.store.put(key, slices)
        self._entries[key] = (entry, cost)
        self.policy.touch(key)
        self._held += cost
        return entry

    def fetch(self, layer: int, experts: Sequence[int]) -> list[Entry]:
        """Every one of ``experts`` of ``layer``, all held at once: none evicts another of the same call.

        The capacity must hold ``len(experts)`` experts (the smallest working cache is one layer's top-k).
        """
        return [entry for _, entry in self.fetch_each(layer, experts, held_first=False)]

    def fetch_each(
        self,
        layer: int,
        experts: Sequence[int],
        held_first: bool = True,
        pin: bool = True,
        last: bool = True,
        read_ahead: bool = False,
    ) -> Iterator[tuple[int, Entry]]:
        """``(expert, entry)`` for each of ``experts`` of ``layer`` as it is got, those held (or prefetched) first
        when ``held_first``, so the caller computes with them while the rest are read. When ``last`` (the layer's
        final lookups) and the iteration ends, the prefetcher starts reading the next layer's guess.

        With ``pin`` none evicts another of the same call until the iteration ends (the capacity must hold
        ``len(experts)`` experts): a store that reuses an evicted entry's memory (GPU slots) needs that. Host
        slabs stay valid while referenced, so the CPU engine does not pin, and the cache evicts exactly as a
        replay of its accesses does.

        With ``read_ahead`` (and a prefetcher), while this thread reads a miss the prefetcher's threads read the
        next ones: the CPU engine on one thread, which gets every expert of a layer before computing, asks for it
        (on two threads, where the workers compute while this thread reads, it measured slower on 2 cores).
        """
        order = list(experts)
        if held_first:
            order.sort(key=lambda e: (layer, e) not in self._entries and not self._prefetched(layer, e))
        self._pinned.clear()
        prefetcher = self.prefetcher if read_ahead else None
        # The misses, in the order they will be read: while this thread reads one, the reader threads read the
        # next few (as many as there are of them), so the disk has several requests at once.
        misses = [
            e
            for e in order
            if (layer, e) not in self._entries and (prefetcher is None or not prefetcher.reading((layer, e)))
        ]
        try:
            for expert in order:
                if prefetcher is not None and misses and expert == misses[0]:
                    misses.pop(0)
                    prefetcher.read_ahead(layer, misses[: prefetcher.threads], self._entries)
                entry = self.get(layer, expert)
                if pin:
                    self._pinned.add((layer, expert))
                yield expert, entry
        finally:
            self._pinned.clear()
        if last and self.prefetcher is not None:
            self.prefetcher.start(layer)

    def ready(self, layer: int, expert: int) -> bool:
        """Whether a lookup of ``expert`` of ``layer`` now needs no demand read (held, or prefetched and waiting)."""
        return (layer, expert) in self._entries or self._prefetched(layer, expert)

    def bypass(self, layer: int, experts: Sequence[int]) -> None:
        """Count ``experts`` of ``layer`` as misses their caller reads itself, past the cache (the GPU engine's
        ``cpu_experts``): recorded as accesses, never stored, nothing evicted or touched."""
        for expert in experts:
            if not (0 <= layer < self.n_layer and 0 <= expert < self.n_expert):
                raise AnyformerError(ErrorCode.BAD_REQUEST, f"no expert {expert} in layer {layer}")
            if self.accesses is not None:
                self.accesses.append((layer, expert))
        self.stats.misses += len(experts)
        self.stats.cpu_computed += len(experts)

    def room_for(self, count: int) -> bool:
        """Whether ``count`` more experts fit beside those held, with nothing evicted."""
        return self._held + count * self.expert_bytes <= self.capacity_bytes

    def admit(self, layer: int, expert: int, slices: ExpertSlices) -> bool:
        """Store ``slices`` (read by the caller, see :meth:`bypass`) where they fit beside those held with nothing
        evicted; False (nothing stored) where they do not fit or are held already."""
        key = (layer, expert)
        if not self._open or key in self._entries:
            return False
        cost = self.store.cost(slices)
        if self._held + cost > self.capacity_bytes:
            return False
        self._entries[key] = (self.store.put(key, slices), cost)
        self.policy.touch(key)
        self._held += cost
        return True

    def _prefetched(self, layer: int, expert: int) -> bool:
        return self.prefetcher is not None and self.prefetcher.ready((layer, expert))

    def expect(self, layer: int, experts: Sequence[int]) -> None:
        """Tell the policy which experts of ``layer`` its router predicts (before the prefetcher reads them)."""
        self.policy.expect([(layer, e) for e in experts])

    def take_accesses(self) -> list[Key]:
        """The accesses recorded since the last call (recording starts with the first call)."""
        taken, self.accesses = self.accesses or [], []
        return taken

    def close(self) -> None:
        """Stop the prefetcher, close the file and drop every cached expert; safe to call twice."""
        self._open = False
        if self.prefetcher is not None:
            self.prefetcher.close()
        for key, (entry, _) in list(self._entries.items()):
            self.store.drop(key, entry)
        self._entries.clear()
        self._held = 0
        self.reader.close()

    def __enter__(self) -> ExpertCache[Entry]:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def attach_prefetcher(cache: ExpertCache[Any], width: int, threads: int, min_cache: int) -> None:
    """Give ``cache`` a prefetcher of ``width`` experts a layer on ``threads`` threads, its read-ahead bytes taken
    from the cache's budget.

    Where the budget cannot spare them and still hold one layer's top-k, there is no prefetcher
    (``prefetch_width`` 0 on the model says so).
    """
    staging = width * cache.expert_bytes
    if width == 0 or threads == 0 or cache.capacity_bytes - staging < min_cache:
        return
    cache.capacity_bytes -= staging
    cache.prefetcher = Prefetcher(cache.reader, cache.stats, width, threads)
