"""Prompt evaluation in batches at fixed cuts: the KV cache is reused without changing a greedy reply.

llama.cpp's numbers for a position can depend on the batch it was computed in (its kernels change
with the batch shape, most of all on a GPU), so reusing cached positions that were computed in
other batches than a fresh evaluation would use can change the logits, and with them the greedy
text. Here every prompt is evaluated in the batches of its *plan*: cut at every multiple of
:data:`BLOCK` positions and at the prompt's *marks* (where each message's text begins, see
``prompt_marks``), which are a function of the prompt alone. The cache remembers where its batches
ended; a new prompt keeps the cache up to the last cut where both agree on every batch so far and
on every token, so each kept position was computed exactly as a fresh evaluation of the new prompt
would compute it. Generated tokens (one batch each) are never kept.

The marks let a shared system prompt be reused up to the new question's text, its role header
included; the block grid bounds what is evaluated again when the marks do not help (a raw prompt,
a long message that changed near its end) and is large enough that a long prompt is not slowed
(see bench/bench_ttft.py for the measurement).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np

#: Prompt batches are cut at multiples of this many positions (and at the prompt's marks).
BLOCK = 32


def plan(length: int, marks: Iterable[int] = ()) -> list[int]:
    """Where the batches that evaluate a prompt of ``length`` positions end: the block grid, the marks, the end."""
    cuts = set(range(BLOCK, length, BLOCK))
    cuts.update(mark for mark in marks if 0 < mark < length)
    if length > 0:
        cuts.add(length)
    return sorted(cuts)


def reusable_prefix(
    cached: np.ndarray, cached_ends: Sequence[int], tokens: Sequence[int], ends: Sequence[int], stop: int | None
) -> int:
    """How many leading positions of ``tokens`` may be kept from the cache: a cut both plans share.

    ``cached`` holds the token ids in the cache and ``cached_ends`` where its batches ended; ``ends``
    is the new prompt's :func:`plan`. The kept prefix ends at a cut where the two lists agree on
    every cut so far, and the tokens agree up to it. ``stop`` is where the prompt's first image
    begins (nothing from there on is reused). The last prompt token is always evaluated again: its
    logits choose the first reply token.
    """
    limit = min(len(cached), len(tokens) - 1)
    if stop is not None:
        limit = min(limit, stop)
    if limit <= 0:
        return 0
    differs = np.flatnonzero(cached[:limit] != np.asarray(tokens[:limit], dtype=cached.dtype))
    same = int(differs[0]) if differs.size else limit
    kept = 0
    for mine, theirs in zip(cached_ends, ends, strict=False):
        if mine != theirs or mine > same:
            break
        kept = mine
    return kept


def batches(ends: Sequence[int], start: int, end: int) -> Iterator[tuple[int, int]]:
    """The batches of a plan that evaluate positions ``start``..``end``, each cut at the plan's cuts."""
    position = start
    for cut in ends:
        if cut <= position:
            continue
        stop = min(cut, end)
        yield position, stop
        position = stop
        if position >= end:
            return
    if position < end:
        yield position, end
