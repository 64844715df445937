"""A layer's routed experts on the CPU: each chosen expert's FFN on the tokens that chose it, on a few threads;
and the dense products, a large matrix's rows split over the same threads.

numpy releases the GIL in the conversions and BLAS products of
:func:`~anyformer_diskformer.compute.quant_product.expert_ffn`, so experts computed on ``threads`` threads run
in parallel, and the compute thread reads the experts the cache misses while the workers compute
those already held (:meth:`~anyformer_diskformer.cache.expert_cache.ExpertCache.fetch_each` hands the
held ones first; on one thread the prefetcher's reader threads read the next misses meanwhile). Each
worker has its own scratch. The weighted sum is added in expert order on the calling thread, so the result
does not depend on which thread finished first.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from anyformer_diskformer.cache.expert_cache import ExpertCache
from anyformer_diskformer.cache.expert_reader import ExpertSlices
from anyformer_diskformer.compute.quant_product import BAND_ELEMENTS, QuantProduct, expert_ffn, swiglu

#: A matrix is split over the threads in parts of at least this many weights: with the compiled products a part
#: of 2**19 Q4_K weights takes ~50-80 µs, about what handing it to a worker and collecting it cost (the H200
#: machine's 16 threads spent more in the pool than in the products when every large matrix went in 16 parts).
PARALLEL_ELEMENTS = 2**19


class ExpertRunner:
    """Runs routed experts on ``threads`` worker threads (1: on the calling thread); each expert's gate goes
    through ``activation`` (SiLU when None)."""

    def __init__(
        self, threads: int, n_embd: int, n_ff: int, activation: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self.threads = threads
        self.n_embd = n_embd
        self.n_ff = n_ff
        self.activation = activation
        self._local = threading.local()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = (
            concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="diskformer-expert")
            if threads > 1
            else None
        )

    def _kernels(self) -> QuantProduct:
        kernels: QuantProduct | None = getattr(self._local, "kernels", None)
        if kernels is None:
            kernels = self._local.kernels = QuantProduct()
        return kernels

    def product(
        self, x: np.ndarray, raw: np.ndarray, ggml_type: int, rows: int, cols: int, band_elements: int = BAND_ELEMENTS
    ) -> np.ndarray:
        """``x @ W.T`` as :meth:`QuantProduct.product`, a large matrix's rows split over the threads (the dense
        products: attention, router, output)."""
        pool = self._pool
        parts = min(self.threads, rows * cols // PARALLEL_ELEMENTS, rows // 2)
        if pool is None or parts < 2:
            return self._kernels().product(x, raw, ggml_type, rows, cols, band_elements)
        blocks = np.asarray(raw).reshape(rows, -1)
        bounds = [rows * i // parts for i in range(parts + 1)]
        futures = [
            pool.submit(self._part, x, blocks[start:stop], ggml_type, stop - start, cols, band_elements)
            for start, stop in itertools.pairwise(bounds)
        ]
        return np.concatenate([future.result() for future in futures], axis=-1)

    def _part(
        self, x: np.ndarray, blocks: np.ndarray, ggml_type: int, rows: int, cols: int, band_elements: int
    ) -> np.ndarray:
        return self._kernels().product(x, blocks, ggml_type, rows, cols, band_elements)

    def _one(self, expert: ExpertSlices, x: np.ndarray) -> np.ndarray:
        return expert_ffn(self._kernels(), expert, x, self.n_embd, self.n_ff, self.activation)

    def run(
        self,
        cache: ExpertCache[ExpertSlices],
        layer: int,
        x: np.ndarray,
        chosen: np.ndarray,
        weights: np.ndarray,
        scales: np.ndarray | None = None,
    ) -> np.ndarray:
        """The weighted sum of the chosen experts' outputs for ``x`` (tokens, n_embd); ``chosen`` and ``weights``
        are (tokens, k): each token's experts and their weights; ``scales``, where given, one factor per expert
        on its output (Gemma 4's ``ffn_down_exps.scale``)."""
        out = np.zeros_like(x)
        unique = [int(e) for e in np.unique(chosen)]
        k = max(1, chosen.shape[1])
        # A prompt's tokens may route to more experts than the cache holds: they go k at a time, so at most k
        # slabs are referenced here beyond what the cache holds (a slab evicted while in use stays valid).
        for begin in range(0, len(unique), k):
            results: dict[int, np.ndarray | concurrent.futures.Future[np.ndarray]] = {}
            batch = cache.fetch_each(
                layer,
                unique[begin : begin + k],
                pin=False,
                last=begin + k >= len(unique),
                read_ahead=self._pool is None,  # one thread gets every expert first: read its misses side by side
            )
            if self._pool is None:
                # On one thread every expert is got first: the next layer's read-ahead, which starts when the
                # lookups end, then overlaps this layer's compute.
                for expert, entry in list(batch):
                    results[expert] = self._one(entry, x[np.nonzero(chosen == expert)[0]])
            else:
                for expert, entry in batch:
                    results[expert] = self._pool.submit(self._one, entry, x[np.nonzero(chosen == expert)[0]])
            for expert in sorted(results):
                done = results[expert]
                y = done.result() if isinstance(done, concurrent.futures.Future) else done
                if scales is not None:
                    y = y * scales[expert]
                rows, slot = np.nonzero(chosen == expert)
                out[rows] += weights[rows, slot][:, None] * y
        return out

    def weighted_sum(
        self, load: Callable[[int], ExpertSlices], experts: list[int], weights: list[float], x: np.ndarray
    ) -> tuple[np.ndarray, list[ExpertSlices]]:
        """sum_i weights[i] * FFN_i(x) over ``experts`` for one token's ``x`` (n_embd), each expert's slabs got by
        ``load(expert)`` on the worker that computes it (reads in parallel, each overlapping the others' products);
        the terms are added in the order given, so the sum does not depend on which worker finished first.
        Returns the sum and the slabs loaded (in that order)."""

        def one(expert: int) -> tuple[np.ndarray, ExpertSlices]:
            slices = load(expert)
            return self._one(slices, x[None, :])[0], slices

        pool = self._pool
        parts = self.threads // max(1, len(experts))
        if pool is not None and parts >= 2:
            outputs, loaded = self._split(pool, load, experts, x[None, :], parts)
        else:
            done = (
                [one(e) for e in experts]
                if pool is None
                else [f.result() for f in [pool.submit(one, e) for e in experts]]
            )
            outputs, loaded = [y for y, _ in done], [slices for _, slices in done]
        out = np.zeros(self.n_embd, dtype=np.float32)
        for y, w in zip(outputs, weights, strict=True):
            out += np.float32(w) * y
        return out, loaded

    def _split(
        self,
        pool: concurrent.futures.ThreadPoolExecutor,
        load: Callable[[int], ExpertSlices],
        experts: list[int],
        x: np.ndarray,
        parts: int,
    ) -> tuple[list[np.ndarray], list[ExpertSlices]]:
        """:meth:`weighted_sum`'s expert outputs where the threads outnumber the experts: each matrix's rows in
        ``parts`` parts, every expert's gate and up parts at once, then every down part (each row's product is
        the whole row's, as :func:`expert_ffn` computes it, so the outputs do not depend on the split)."""
        loaded = [f.result() for f in [pool.submit(load, e) for e in experts]]
        n_ff, n_embd = self.n_ff, self.n_embd

        def submit(h: np.ndarray, raw: np.ndarray, ggml_type: int, rows: int, cols: int) -> list[Any]:
            blocks = np.asarray(raw).reshape(rows, -1)
            bounds = [rows * i // parts for i in range(parts + 1)]
            return [
                pool.submit(self._part, h, blocks[a:b], ggml_type, b - a, cols, BAND_ELEMENTS)
                for a, b in itertools.pairwise(bounds)
                if b > a
            ]

        def gather(futures: list[Any]) -> np.ndarray:
            return np.concatenate([f.result() for f in futures], axis=-1)

        gate_up = [
            (submit(x, s.gate, s.types[0], n_ff, n_embd), submit(x, s.up, s.types[1], n_ff, n_embd)) for s in loaded
        ]
        downs = []
        for s, (gate_parts, up_parts) in zip(loaded, gate_up, strict=True):
            gate, up = gather(gate_parts), gather(up_parts)
            downs.append(submit(swiglu(gate, up, self.activation), s.down, s.types[2], n_embd, n_ff))
        return [gather(d)[0] for d in downs], loaded

    def close(self) -> None:
        """Stop the worker threads; safe to call twice."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
