"""What the expert cache counts, and the key it holds experts by (shared by the cache and its prefetcher)."""

from __future__ import annotations

import dataclasses

#: An expert's key: (layer, expert).
Key = tuple[int, int]


@dataclasses.dataclass
class CacheStats:
    """What the cache did: lookups held, handed over by the prefetcher, read on demand; bytes read; evictions."""

    hits: int = 0
    misses: int = 0
    #: Lookups the prefetcher had already read (no demand read on the critical path).
    prefetched: int = 0
    #: Every byte read from the file (demand and prefetch reads).
    bytes_read: int = 0
    #: Bytes the prefetcher read that no lookup used.
    prefetch_wasted: int = 0
    evictions: int = 0
    #: Of the misses, those the GPU engine's ``cpu_experts`` computed on the CPU from a read that bypassed the cache.
    cpu_computed: int = 0

    @property
    def lookups(self) -> int:
        """Every expert asked for."""
        return self.hits + self.misses + self.prefetched

    @property
    def hit_rate(self) -> float:
        """Lookups answered without a demand read (held, or prefetched) over lookups (0 before the first)."""
        total = self.lookups
        return (self.hits + self.prefetched) / total if total else 0.0
