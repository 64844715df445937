"""Which slot a prompt takes and what of its cache it keeps (``_slots``), without a model."""

from __future__ import annotations

from anyformer_llamacpp._slots import Slot, choose_slot
from anyformer_llamacpp.prompt_blocks import BLOCK, plan


def _holding(seq_id: int, prompt: list[int], ends: list[int], generated: int = 0, last_used: int = 0) -> Slot:
    """A free slot whose cache holds ``prompt`` (evaluated in the batches ``ends``) and some generated tokens."""
    return Slot(seq_id, tokens=[*prompt, *range(900, 900 + generated)], ends=list(ends), last_used=last_used)


def test_a_prompt_keeps_the_cache_up_to_the_last_cut_both_plans_share() -> None:
    header, first, second = list(range(10)), [50, 51, 52], [60, 61, 62, 63]
    cached = header + first
    slot = _holding(0, cached, plan(len(cached), [10]), generated=5)
    new = header + second
    assert slot.shared_prefix(new, plan(len(new), [10])) == 10  # up to where the question's text begins
    assert slot.shared_prefix(new, plan(len(new))) == 0  # no mark there: no cut both plans share


def test_generated_tokens_and_a_cut_the_new_plan_lacks_are_never_kept() -> None:
    prompt = list(range(BLOCK + 8))
    slot = _holding(0, prompt, plan(len(prompt)), generated=4)
    longer = [*prompt, 900, 901, 902, 7]  # the reply so far, then more: the old prompt's end is no cut of this plan
    assert slot.shared_prefix(longer, plan(len(longer))) == BLOCK
    assert slot.shared_prefix(longer, plan(len(longer), [len(prompt)])) == len(prompt)


def test_cut_back_forgets_the_cuts_past_the_prefix() -> None:
    prompt = list(range(2 * BLOCK + 5))
    slot = _holding(0, prompt, plan(len(prompt), [7]), generated=3)
    slot.cut_back(BLOCK)
    assert slot.tokens == prompt[:BLOCK]
    assert slot.ends == [7, BLOCK]


def test_the_slot_with_the_longest_reuse_is_chosen_else_the_least_recently_used() -> None:
    header = list(range(10))
    reusing = _holding(1, [*header, 50], plan(11, [10]), last_used=5)
    older = _holding(2, [70, 71], plan(2), last_used=1)
    busy = _holding(0, [*header, 50], plan(11, [10]))
    busy.busy = True
    prompt = [*header, 60, 61]
    assert choose_slot([busy, reusing, older], prompt, plan(len(prompt), [10])) == (reusing, 10)
    assert choose_slot([busy, reusing, older], [5, 6, 7], plan(3)) == (older, 0)
    reusing.busy = older.busy = True
    assert choose_slot([busy, reusing, older], prompt, plan(len(prompt))) is None
