"""The KV cache reused across prompts: same greedy text as a fresh model, cancel and dispose mid-prompt."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anyformer
from anyformer import AnyformerError, Chunk, ErrorCode, GenerateOptions
from anyformer_llamacpp.prompt_blocks import BLOCK, batches, plan, reusable_prefix
from anyformer_llamacpp.prompt_marks import text_starts, token_marks

SYSTEM = {
    "role": "system",
    "content": (
        "You are a careful assistant for a museum of maritime history. Answer in one or two short "
        "sentences, name the ship or the port when you know it, and say plainly when you do not know. "
        "Visitors ask about lighthouses, harbours, sailing ships, navigation and the people who worked there."
    ),
}
TARGET = [SYSTEM, {"role": "user", "content": "What did a lighthouse keeper do at night?"}]
# What the model saw before TARGET: the same system prompt with other questions, earlier turns, or
# nothing in common; TARGET itself with a longer reply; TARGET as the start of a longer chat.
BEFORE = [
    [SYSTEM, {"role": "user", "content": "Which ships sailed from Lisbon in 1500?"}],
    [
        SYSTEM,
        {"role": "user", "content": "What is a sextant?"},
        {"role": "assistant", "content": "An instrument that measures the angle of a star above the horizon."},
        {"role": "user", "content": "Who used it?"},
    ],
    [{"role": "user", "content": "Write a haiku about rain."}],
    TARGET,
    [*TARGET, {"role": "assistant", "content": "He kept the lamp burning."}, {"role": "user", "content": "Why?"}],
]


def test_the_plan_cuts_on_the_block_grid_at_the_marks_and_at_the_end() -> None:
    assert plan(70) == [BLOCK, 2 * BLOCK, 70]
    assert plan(70, [5, BLOCK, 40, 0, 70, 99]) == [5, BLOCK, 40, 2 * BLOCK, 70]  # marks outside 1..69 ignored
    assert plan(0) == []


def test_batches_follow_the_plan_from_any_start() -> None:
    ends = plan(70, [5, 40])
    assert list(batches(ends, 0, 70)) == [(0, 5), (5, BLOCK), (BLOCK, 40), (40, 2 * BLOCK), (2 * BLOCK, 70)]
    assert list(batches(ends, 36, 70)) == [(36, 40), (40, 2 * BLOCK), (2 * BLOCK, 70)]
    assert list(batches(ends, 36, 50)) == [(36, 40), (40, 50)]  # a segment's end cuts too
    assert list(batches(ends, 70, 70)) == []


def test_the_reusable_prefix_is_the_last_cut_both_plans_and_the_tokens_share() -> None:
    cached = np.arange(100, dtype=np.intc)
    tokens = list(range(90)) + [-5] * 10
    grid = plan(100)
    assert reusable_prefix(cached, grid[:3], tokens, grid, None) == 2 * BLOCK  # they share 90: cut back to 64
    assert reusable_prefix(cached, grid[:1], tokens, grid, None) == BLOCK  # past the batches kept nothing is
    assert reusable_prefix(cached, grid[:3], tokens, grid, 40) == BLOCK  # nor from the first image on
    assert reusable_prefix(cached, grid[:2], list(range(64)), plan(64), None) == BLOCK  # the last token again
    assert reusable_prefix(cached, grid[:3], [7, *range(1, 99)], grid, None) == 0
    # A mark both share is kept; cuts that disagree before it keep nothing past the disagreement.
    assert reusable_prefix(cached, plan(100, [40]), tokens, plan(100, [40, 80]), None) == 2 * BLOCK
    assert reusable_prefix(cached, plan(100, [40]), tokens, plan(100, [41]), None) == BLOCK
    assert reusable_prefix(cached, plan(100, [10]), tokens, plan(100, [40]), None) == 0
    # Generated tokens (never a batch end in the cache) are not kept.
    assert reusable_prefix(cached, [BLOCK, 40], list(range(99)), plan(99, [40, 50]), None) == 40


def test_each_text_is_found_after_the_one_before() -> None:
    prompt = "<s>system\nBe brief.</s><s>user\nBe</s><s>assistant\n"
    messages: list[Any] = [
        {"role": "system", "content": " Be brief. "},
        {"role": "user", "content": "Be"},  # found after "Be brief.", not inside it
        {"role": "user", "content": ""},
        {"role": "user", "content": "never rendered"},
    ]
    assert text_starts(prompt, messages) == [prompt.index("Be"), prompt.index("Be</s>")]


def test_marks_fall_only_on_token_boundaries_that_spell_the_prompt() -> None:
    prompt = "ab|cd|é"
    pieces = {1: b"ab|", 2: b"c", 3: b"d|", 4: "é".encode(), 9: b"<bos>"}
    starts = [prompt.index("cd"), prompt.index("d|"), prompt.index("é"), 1]
    assert token_marks(prompt, [1, 2, 3, 4], pieces.__getitem__, starts) == [1, 2, 3]  # 1 is inside "ab|"
    assert token_marks(prompt, [9, 1, 2, 3, 4], pieces.__getitem__, starts, skip=1) == [2, 3, 4]
    assert token_marks(prompt, [1, 3, 4], pieces.__getitem__, starts) == []  # the pieces do not spell it


@pytest.fixture(scope="module")
def expected(smollm2_path: Path) -> tuple[str, int]:
    """TARGET's greedy reply from a model that saw nothing before, and the prompt's length."""
    with anyformer.load(smollm2_path, backend="llamacpp", context=2048) as fresh:
        chunk = fresh.complete(TARGET, max_new_tokens=16)
    assert chunk.tokens > 8 and chunk.prompt_tokens is not None
    return chunk.text, chunk.prompt_tokens


@pytest.mark.parametrize("before", range(len(BEFORE)))
def test_the_same_messages_give_the_same_greedy_text_whatever_came_before(smollm2, expected, before: int) -> None:  # type: ignore[no-untyped-def]
    smollm2.complete(BEFORE[before], max_new_tokens=24)
    text, prompt = expected
    assert smollm2.complete(TARGET, max_new_tokens=16).text == text
    evaluated = smollm2.handle.last_prompt_evaluated
    question = smollm2.handle.prompt_with_marks(TARGET, False)[1][-1]  # where the question's text begins
    assert question > 2 * BLOCK and question % BLOCK
    if before in (0, 1):  # the same system prompt and a user turn: all up to the question's text is kept
        assert evaluated == prompt - question
    elif before != 2:  # TARGET itself, or its start: at least as much
        assert evaluated <= prompt - question
    else:  # nothing in common (the template's default system prompt differs)
        assert evaluated == prompt


def _hook_eval(handle: Any, each: Any) -> Any:
    """Call ``each(tokens)`` before every ``Llama.eval`` of ``handle``; returns the undo."""
    llama = handle._llama
    real = llama.eval

    def hooked(tokens: list[int]) -> None:
        each(tokens)
        real(tokens)

    llama.eval = hooked
    return lambda: delattr(llama, "eval")


def _long_prompt(seed: int) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    words = " ".join(rng.choice(["harbour", "lamp", "tide", "keeper", "storm", "rope", "gull"], size=160))
    return [{"role": "user", "content": f"Summarise: {words}"}]


def test_a_cancel_during_a_long_prompt_stops_within_one_batch(smollm2) -> None:  # type: ignore[no-untyped-def]
    cancel = threading.Event()
    batches: list[int] = []

    def count(tokens: list[int]) -> None:
        batches.append(len(tokens))
        if len(batches) == 3:
            cancel.set()  # as if another thread cancelled while the third batch runs

    undo = _hook_eval(smollm2.handle, count)
    try:
        chunks = list(smollm2.generate(_long_prompt(1), max_new_tokens=8, cancel=cancel))
    finally:
        undo()
    prompt = chunks[-1].prompt_tokens
    assert prompt is not None and prompt > 5 * BLOCK
    tokens, marks = smollm2.handle.prompt_with_marks(_long_prompt(1), False)
    ends = plan(len(tokens), marks)
    assert smollm2.handle.last_prompt_evaluated == ends[2]  # nothing came from the cache
    assert batches == [ends[0], ends[1] - ends[0], ends[2] - ends[1]]  # the third batch ended the evaluation
    assert chunks[-1].finish_reason == "cancelled" and chunks[-1].tokens == 0
    # The batches evaluated stay: the next call evaluates the rest.
    kept = smollm2.handle._batch_ends[-1]
    assert kept == ends[2]
    warm = smollm2.complete(_long_prompt(1), max_new_tokens=4)
    assert smollm2.handle.last_prompt_evaluated == prompt - kept
    assert warm.text == smollm2.complete(_long_prompt(1), max_new_tokens=4).text


def test_dispose_during_a_prompt_lets_the_stream_stop_then_frees_the_model(smollm2_path: Path) -> None:
    loaded = anyformer.load(smollm2_path, backend="llamacpp", context=2048)
    handle = loaded.handle
    inside, release = threading.Event(), threading.Event()

    def hold(tokens: list[int]) -> None:
        if not inside.is_set():
            inside.set()
            release.wait(30)

    _hook_eval(handle, hold)
    stream: Iterator[Chunk] = handle.generate(_long_prompt(2), GenerateOptions.build(max_new_tokens=8))
    chunks: list[Chunk] = []
    runner = threading.Thread(target=lambda: chunks.extend(stream))
    runner.start()
    try:
        assert inside.wait(30)
        handle.dispose()  # returns at once: the stream is inside llama.cpp with this model
        assert handle._llama is not None
        with pytest.raises(AnyformerError) as caught:
            handle.generate(_long_prompt(3), GenerateOptions.build(max_new_tokens=8))
        assert caught.value.code is ErrorCode.BAD_REQUEST
    finally:
        release.set()
        runner.join(30)
    assert chunks[-1].finish_reason == "cancelled" and chunks[-1].tokens == 0
    assert handle._llama is None  # the stream freed it as it ended
    loaded.dispose()


def test_dispose_with_no_stream_frees_at_once(smollm2_path: Path) -> None:
    loaded = anyformer.load(smollm2_path, backend="llamacpp", context=2048)
    handle = loaded.handle
    assert loaded.complete("Hi", max_new_tokens=2).tokens > 0
    handle.dispose()
    assert handle._llama is None
    handle.dispose()
    loaded.dispose()
