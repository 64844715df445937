"""Reading the next layer's likely experts while the current layer computes: a small pool of reader threads.

The guess is the next layer's router applied to the current hidden state (the residual stream
changes little from one layer to the next, so its top-k is usually most of the true top-k). The
engine asks for the guess before it computes the current layer's experts; the threads ``pread``
(the GIL is released while they wait on the disk) into host memory. When the next layer looks an
expert up, the cache takes it from here instead of reading it on demand. The engine guesses layer
``l + 1`` before it looks up layer ``l``'s experts (so the reads overlap that layer's compute): a new
guess keeps the previous layer's guesses, which are about to be taken, and drops older ones not
taken, their bytes counted as wasted. At most ``2 × width`` experts are held here at once, bytes the
load takes out of the expert cache's budget.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Container

import numpy as np

from anyformer_diskformer.expert_cache import CacheStats, Key
from anyformer_diskformer.expert_reader import ExpertReader, ExpertSlices


def likely_experts(router_logits: np.ndarray, k: int, width: int) -> list[int]:
    """The experts a layer will most likely use for these tokens' router logits (tokens × experts): each token's
    top-k, the most probable first, at most ``width`` of them."""
    z = router_logits - router_logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    top = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    score: dict[int, float] = {}
    for row, experts in enumerate(top):
        for e in experts:
            score[int(e)] = score.get(int(e), 0.0) + float(p[row, e])
    return sorted(score, key=lambda e: (-score[e], e))[:width]


class Prefetcher:
    """Reads guessed experts on ``threads`` threads; the cache takes them (:meth:`take`) when they are used."""

    def __init__(self, reader: ExpertReader, stats: CacheStats, width: int, threads: int = 2) -> None:
        if width < 1 or threads < 1:
            raise ValueError("a prefetcher needs a width and threads of at least 1")
        self.reader = reader
        self.stats = stats
        self.width = width
        self._pool: concurrent.futures.ThreadPoolExecutor | None = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="diskformer-prefetch"
        )
        self._pending: dict[Key, concurrent.futures.Future[ExpertSlices]] = {}

    def request(self, layer: int, experts: list[int], held: Container[Key]) -> None:
        """Drop the guesses not taken except those of ``layer - 1`` (the layer about to look its experts up), then
        start reading ``experts`` of ``layer`` not ``held`` (up to ``width``)."""
        self._drop(lambda key: key[0] != layer - 1)
        if self._pool is None:
            return
        for expert in experts[: self.width]:
            key = (layer, expert)
            if key not in held:
                self._pending[key] = self._pool.submit(self.reader.read, layer, expert)

    def ready(self, key: Key) -> bool:
        """Whether ``key`` was guessed and its read has finished (taking it will not wait)."""
        future = self._pending.get(key)
        return future is not None and future.done()

    def take(self, key: Key) -> ExpertSlices | None:
        """``key``'s slabs if they were guessed (waiting for the read if it is still running), else None."""
        future = self._pending.pop(key, None)
        if future is None:
            return None
        slices = future.result()  # a failed read raises here, as a demand read would
        self.stats.bytes_read += slices.nbytes
        return slices

    def _drop_all(self) -> None:
        self._drop(lambda key: True)

    def _drop(self, stale: Callable[[Key], bool]) -> None:
        for key in [key for key in self._pending if stale(key)]:
            future = self._pending.pop(key)
            if future.cancel():
                continue  # never started: nothing was read
            try:
                # Started: it finishes soon (one expert); its bytes were read for nothing.
                wasted = future.result().nbytes
            except Exception:  # a guess that failed to read costs nothing and reports nothing
                continue
            self.stats.bytes_read += wasted
            self.stats.prefetch_wasted += wasted

    def close(self) -> None:
        """Drop what is pending and stop the threads; safe to call twice."""
        pool, self._pool = self._pool, None
        self._drop_all()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
