"""The sequences of a batched llama.cpp context: one KV region per slot, and which slot a new prompt takes.

A context made with ``n_seq_max = N`` and ``kv_unified = false`` keeps N separate KV regions, one
per sequence id, each filled from its own cell 0 in position order. A slot is one of them, with
the token ids it holds, so that a new prompt goes to the free slot that already holds the longest
part of it: its own earlier turns, or a system prompt another request left there. The cache is
reused up to the last full prompt block they share, as the one-stream engine does
(``prompt_blocks``), so the logits of a reused prefix are those a fresh evaluation computes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from anyformer_llamacpp.prompt_blocks import BLOCK, plan, reusable_prefix


@dataclasses.dataclass(eq=False)
class Slot:
    """One sequence of the context: the token ids its KV region holds, and where their full blocks end."""

    seq_id: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    full_blocks_end: int = 0
    #: When it was last given a prompt (a step count): the least recently used free slot is reused first.
    last_used: int = -1
    busy: bool = False

    def shared_prefix(self, prompt: Sequence[int]) -> int:
        """How many leading positions of ``prompt`` this slot's cache may keep (a multiple of the block)."""
        if not self.tokens:
            return 0
        # A slot's prompts are evaluated on the block grid alone (no message marks), so its batches
        # ended at every multiple of the block up to its full blocks' end.
        cached_ends = list(range(BLOCK, self.full_blocks_end + 1, BLOCK))
        cached = np.asarray(self.tokens, dtype=np.int64)
        return reusable_prefix(cached, cached_ends, prompt, plan(len(prompt)), None)

    def cut_back(self, prefix: int) -> None:
        """Forget what the cache holds past ``prefix`` (the caller removes those cells from the context)."""
        del self.tokens[prefix:]
        self.full_blocks_end = min(self.full_blocks_end, prefix)


def choose_slot(slots: Sequence[Slot], prompt: Sequence[int]) -> tuple[Slot, int] | None:
    """The free slot for ``prompt`` and the prefix it keeps: the longest reuse, else the least recently used.

    None when every slot is busy.
    """
    free = [slot for slot in slots if not slot.busy]
    if not free:
        return None
    best = max(free, key=lambda slot: (slot.shared_prefix(prompt), -slot.last_used))
    return best, best.shared_prefix(prompt)
