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
from anyformer_llamacpp.prompt_blocks import BLOCK, blocks, reusable_prefix

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


def test_blocks_cut_at_every_multiple_of_the_block() -> None:
    assert list(blocks(0, 70)) == [(0, BLOCK), (BLOCK, 2 * BLOCK), (2 * BLOCK, 70)]
    assert list(blocks(BLOCK + 3, 2 * BLOCK + 1)) == [(BLOCK + 3, 2 * BLOCK), (2 * BLOCK, 2 * BLOCK + 1)]
    assert list(blocks(5, 5)) == []


def test_the_reusable_prefix_is_the_last_full_block_both_share() -> None:
    cached = np.arange(100, dtype=np.intc)
    tokens = list(range(90)) + [-5] * 10
    assert reusable_prefix(cached, 96, tokens, None) == 2 * BLOCK  # they share 90: cut back to 64
    assert reusable_prefix(cached, BLOCK, tokens, None) == BLOCK  # past the full blocks nothing is kept
    assert reusable_prefix(cached, 96, tokens, 40) == BLOCK  # nor from the first image on
    assert reusable_prefix(cached, 96, list(range(64)), None) == BLOCK  # the last token is evaluated again
    assert reusable_prefix(cached, 96, [7, *range(1, 99)], None) == 0


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
    if before != 2:  # all but the haiku share the system prompt: its full blocks came from the cache
        system = len(smollm2.handle.prompt_tokens([SYSTEM], False))
        assert system >= 2 * BLOCK
        assert evaluated <= prompt - (system // BLOCK) * BLOCK
    else:
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
    assert batches == [BLOCK] * 3  # the third batch ended the evaluation
    assert chunks[-1].finish_reason == "cancelled" and chunks[-1].tokens == 0
    # The full blocks evaluated stay (with what was reused before them): the next call evaluates the rest.
    kept = smollm2.handle._full_blocks_end
    assert kept >= 3 * BLOCK
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
    stream: Iterator[Chunk] = handle.stream(_long_prompt(2), GenerateOptions.build(max_new_tokens=8))
    chunks: list[Chunk] = []
    runner = threading.Thread(target=lambda: chunks.extend(stream))
    runner.start()
    try:
        assert inside.wait(30)
        handle.dispose()  # returns at once: the stream is inside llama.cpp with this model
        assert handle._llama is not None
        with pytest.raises(AnyformerError) as caught:
            handle.stream(_long_prompt(3), GenerateOptions.build(max_new_tokens=8))
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
