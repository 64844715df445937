"""The sequences of a batched llama.cpp context: one KV region per slot, and which slot a new prompt takes.

A context made with ``n_seq_max = N`` and ``kv_unified = false`` keeps N separate KV regions, one
per sequence id, each filled from its own cell 0 in position order. A slot is one of them, with
the token ids it holds and where the batches that evaluated its prompt ended, so that a new prompt
goes to the free slot that already holds the longest part of it: its own earlier turns, or a
system prompt another request left there. The cache is reused up to the last cut both prompts'
plans share (the block grid and where each message's text begins), as the one-stream engine does
(``prompt_blocks``), so the logits of a reused prefix are those a fresh evaluation computes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from anyformer_llamacpp.prompt_blocks import reusable_prefix


@dataclasses.dataclass(eq=False)
class Slot:
    """One sequence of the context: the token ids its KV region holds, and where its prompt's batches ended."""

    seq_id: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    #: Where the batches that evaluated the prompt positions it holds ended (generated tokens' never count).
    ends: list[int] = dataclasses.field(default_factory=list)
    #: When it was last given a prompt (a step count): the least recently used free slot is reused first.
    last_used: int = -1
    busy: bool = False

    def shared_prefix(self, prompt: Sequence[int], ends: Sequence[int]) -> int:
        """How many leading positions of ``prompt`` (evaluated in the batches of its plan ``ends``) this
        slot's cache may keep: a cut both plans share."""
        if not self.tokens:
            return 0
        cached = np.asarray(self.tokens, dtype=np.int64)
        return reusable_prefix(cached, self.ends, prompt, ends, None)

    def cut_back(self, prefix: int) -> None:
        """Forget what the cache holds past ``prefix`` (the caller removes those cells from the context)."""
        del self.tokens[prefix:]
        self.ends = [end for end in self.ends if end <= prefix]


def choose_slot(slots: Sequence[Slot], prompt: Sequence[int], ends: Sequence[int]) -> tuple[Slot, int] | None:
    """The free slot for ``prompt`` (its plan ``ends``) and the prefix it keeps: the longest reuse, else the
    least recently used.

    None when every slot is busy.
    """
    free = [slot for slot in slots if not slot.busy]
    if not free:
        return None
    shared = {slot.seq_id: slot.shared_prefix(prompt, ends) for slot in free}
    best = max(free, key=lambda slot: (shared[slot.seq_id], -slot.last_used))
    return best, shared[best.seq_id]
