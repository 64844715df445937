"""Reading the next layer's likely experts while the current layer computes: a small pool of reader threads.

The guess is the next layer's router applied to the current hidden state (the residual stream
changes little from one layer to the next, so its top-k is usually most of the true top-k). The
engine makes the guess for layer ``l + 1`` before layer ``l`` looks its experts up; the reads start
once layer ``l`` has got all its experts (:meth:`Prefetcher.start`, called by the cache), so they
never queue ahead of that layer's demand reads, and they overlap its compute. The threads ``pread``
(the GIL is released while they wait on the disk) into host memory. When the next layer looks an
expert up, the cache takes it from here instead of reading it on demand; what that layer did not
take is dropped when its lookups end, and the bytes are counted as wasted. At most ``width``
experts are held here at once, bytes the load takes out of the expert cache's budget.

The same threads also read a layer's misses early (:meth:`Prefetcher.read_ahead`, called by
:meth:`~anyformer_diskformer.cache.expert_cache.ExpertCache.fetch_each`): while the compute thread reads
one miss, they read the next ones (as many as there are threads), so the disk has several requests
at once. Those few slabs are held outside the cache until their lookup takes them.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Container

import numpy as np

from anyformer_diskformer.cache.expert_reader import ExpertReader, ExpertSlices
from anyformer_diskformer.cache.stats import CacheStats, Key


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
        #: Of the pending reads, those a lookup already asked for (:meth:`read_ahead`): misses, not guesses.
        self._demand: set[Key] = set()
        self.threads = threads
        #: The guess waiting for the layer before it to finish its lookups: (layer, experts, what is held).
        self._deferred: tuple[int, list[int], Container[Key]] | None = None

    def request(self, layer: int, experts: list[int], held: Container[Key]) -> None:
        """Guess ``experts`` of ``layer`` (up to ``width``): read, when :meth:`start` says the layer before it has
        got its experts, those not ``held`` then. A later request replaces one not started."""
        self._deferred = (layer, list(experts[: self.width]), held)

    def start(self, after_layer: int) -> None:
        """``after_layer`` has got its experts: drop the guesses it did not take (wasted), then start reading the
        requested guess if it is for a later layer (one for this layer or an earlier one is stale: dropped)."""
        self._drop_all()
        deferred, self._deferred = self._deferred, None
        if deferred is None or self._pool is None or deferred[0] <= after_layer:
            return
        layer, experts, held = deferred
        for expert in experts:
            key = (layer, expert)
            if key not in held:
                self._pending[key] = self._pool.submit(self.reader.read, layer, expert)

    def read_ahead(self, layer: int, experts: list[int], held: Container[Key]) -> None:
        """Start reading ``experts`` of ``layer`` that are neither ``held`` nor being read: a layer's misses, which
        its lookups will take next. The caller reads one itself meanwhile, so the disk serves several requests
        at once instead of one after another. They count as misses, not as prefetched, when taken."""
        if self._pool is None:
            return
        for expert in experts:
            key = (layer, expert)
            if key not in held and key not in self._pending:
                self._pending[key] = self._pool.submit(self.reader.read, layer, expert)
                self._demand.add(key)

    def reading(self, key: Key) -> bool:
        """Whether ``key`` is being (or has been) read here and not yet taken."""
        return key in self._pending

    def demanded(self, key: Key) -> bool:
        """Whether ``key``'s pending read was started by :meth:`read_ahead` (a miss read early) rather than guessed."""
        return key in self._demand

    def ready(self, key: Key) -> bool:
        """Whether ``key`` was guessed and its read has finished (taking it will not wait)."""
        future = self._pending.get(key)
        return future is not None and future.done()

    def take(self, key: Key) -> ExpertSlices | None:
        """``key``'s slabs if they were guessed (waiting for the read if it is still running), else None."""
        future = self._pending.pop(key, None)
        self._demand.discard(key)
        if future is None:
            return None
        slices = future.result()  # a failed read raises here, as a demand read would
        self.stats.bytes_read += slices.nbytes
        return slices

    def _drop_all(self) -> None:
        self._demand.clear()
        for key in list(self._pending):
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
