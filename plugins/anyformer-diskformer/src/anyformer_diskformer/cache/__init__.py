"""The expert cache: reading experts from disk, prefetching them, the eviction policies and the counters."""
