"""Prompt evaluation in blocks at fixed positions: the KV cache is reused without changing a greedy reply.

llama.cpp's numbers for a position can depend on the batch it was computed in (its kernels change
with the batch shape, most of all on a GPU), so reusing cached positions that were computed in
other batches than a fresh evaluation would use can change the logits, and with them the greedy
text. Here every prompt is evaluated in batches cut at multiples of :data:`BLOCK` positions, from
position 0 or from a cut-back point that is itself a multiple of :data:`BLOCK`. A *full* block
(``BLOCK`` positions, evaluated in one batch after only full blocks) is computed exactly as a fresh
evaluation of any prompt with the same tokens up to its end would compute it, so the cache may be
kept up to the last full block a new prompt shares with it, and nothing past it: a partial last
block and the generated tokens (one batch each) are evaluated again.

The block is small so that a short shared prefix (a 40-token system prompt) is still reused, and
large enough that a long prompt is not slowed (see bench/bench_ttft.py for the measurement).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

#: Prompt batches start and end at multiples of this many positions (the last may end short).
BLOCK = 32


def reusable_prefix(cached: np.ndarray, full_blocks_end: int, tokens: Sequence[int], stop: int | None) -> int:
    """How many leading positions of ``tokens`` may be kept from the cache: a multiple of :data:`BLOCK`.

    ``cached`` holds the token ids in the cache, ``full_blocks_end`` where its full blocks end;
    ``stop`` is where the prompt's first image begins (nothing from there on is reused). The last
    prompt token is always evaluated again: its logits choose the first reply token.
    """
    limit = min(len(cached), full_blocks_end, len(tokens) - 1)
    if stop is not None:
        limit = min(limit, stop)
    if limit <= 0:
        return 0
    differs = np.flatnonzero(cached[:limit] != np.asarray(tokens[:limit], dtype=cached.dtype))
    same = int(differs[0]) if differs.size else limit
    return same - same % BLOCK


def blocks(start: int, end: int) -> Iterator[tuple[int, int]]:
    """The batches that evaluate positions ``start``..``end``: cut at every multiple of :data:`BLOCK`."""
    position = start
    while position < end:
        cut = min(end, (position // BLOCK + 1) * BLOCK)
        yield position, cut
        position = cut
