"""The streaming layer on scripted denoising states: settled text in reading order, never taken back."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from kohra_fixtures import IM_END_ID, MASK_ID

from anyformer.plugin import GenerateOptions
from anyformer_kohra.options import parse_options
from anyformer_kohra.sampler import SamplerState
from anyformer_kohra.streaming import stream_states
from anyformer_kohra.text_codec import TextCodec, load_codec


@pytest.fixture(scope="module")
def codec(mdlm_repo: Path) -> TextCodec:
    return load_codec({n: mdlm_repo / n for n in ("tokenizer.json", "tokenizer_config.json", "config.json")})


def _states(codec: TextCodec, answer: str, order: list[int], *, block: int | None = None) -> list[SamplerState]:
    """States that unmask the answer's tokens one per step in ``order`` (MDLM), or block by block."""
    ids = np.array(codec.encode(answer))
    current = np.full(len(ids), MASK_ID)
    states = []
    for step, position in enumerate(order, start=1):
        current = current.copy()
        current[position] = ids[position]
        settled = 0
        if block is not None:
            done = [b for b in range(0, len(ids), block) if np.all(current[b : b + block] != MASK_ID)]
            settled = min(len(ids), (max(done) + block)) if done else 0
        states.append(SamplerState(step=step, ids=current, block=0, settled=settled, model_calls=step))
    return states


def _run(codec: TextCodec, states: list[SamplerState], *, blocks: bool = False, **options: object):  # type: ignore[no-untyped-def]
    generate = GenerateOptions.build(max_new_tokens=64, **options)  # type: ignore[arg-type]
    diffusion = parse_options(generate.extra, max_new_tokens=64, temperature=0.0, default_block=None)
    return list(stream_states(iter(states), codec, generate, diffusion, prompt_tokens=3, blocks=blocks))


def test_text_appears_when_it_and_everything_before_it_is_final(codec: TextCodec) -> None:
    # "abcdef": positions unmask as 2, 0, 1, 5, 3, 4.
    chunks = _run(codec, _states(codec, "abcdef", [2, 0, 1, 5, 3, 4]))
    assert chunks[0].prompt_tokens == 3
    deltas = [c.delta for c in chunks[1:]]
    assert deltas == ["", "a", "bc", "", "d", "ef"]
    assert [c.tokens for c in chunks[1:]] == [1, 2, 3, 4, 5, 6]
    assert chunks[-1].finish_reason == "length"


def test_an_end_token_in_the_settled_prefix_stops_the_answer(codec: TextCodec) -> None:
    ids = np.array([*codec.encode("hi"), IM_END_ID, *codec.encode("xyz")])
    current = np.full(len(ids), MASK_ID)
    states = []
    for step, position in enumerate([0, 5, 1, 2], start=1):
        current = current.copy()
        current[position] = ids[position]
        states.append(SamplerState(step=step, ids=current, block=0, settled=0, model_calls=step))
    chunks = _run(codec, states)
    assert [c.delta for c in chunks[1:]] == ["h", "", "i", ""]
    assert chunks[-1].finish_reason == "stop"


def test_blocks_stream_a_chunk_per_finished_block(codec: TextCodec) -> None:
    order = [1, 0, 3, 2, 5, 4, 7, 6]
    chunks = _run(codec, _states(codec, "abcdefgh", order, block=4), blocks=True)
    assert [(c.delta, c.tokens) for c in chunks if c.delta] == [("abcd", 4), ("efgh", 8)]
    assert [c.tokens for c in chunks[1:]] == [0, 0, 0, 4, 4, 4, 4, 8]
    assert chunks[-1].finish_reason == "length"


def test_a_held_back_tail_is_flushed_on_the_last_chunk(codec: TextCodec) -> None:
    """The core ends the stream when tokens reach max_new_tokens, so the last chunk must carry everything."""
    chunks = _run(codec, _states(codec, "ab <th", [0, 1, 2, 3, 4, 5]))
    assert [c.delta for c in chunks[-3:]] == ["", "", "<th"]
    assert "".join(c.delta for c in chunks) == "ab <th"


def test_reasoning_is_never_streamed(codec: TextCodec) -> None:
    text = "<think>x</think>\nok"
    chunks = _run(codec, _states(codec, text, list(range(len(codec.encode(text))))))
    assert "".join(c.delta for c in chunks) == "ok"


def test_cancel_is_checked_before_each_step(codec: TextCodec) -> None:
    cancel = threading.Event()
    seen: list[int] = []

    def on_step(step) -> None:  # type: ignore[no-untyped-def]
        seen.append(step.step)
        cancel.set()

    chunks = _run(codec, _states(codec, "abc", [0, 1, 2]), cancel=cancel, on_step=on_step)
    assert seen == [1]
    assert chunks[-1].finish_reason == "cancelled"


def test_every_step_carries_a_preview_with_its_masks(codec: TextCodec) -> None:
    ids = np.array([*codec.encode("ab"), IM_END_ID, *codec.encode("z")])
    states = []
    current = np.full(len(ids), MASK_ID)
    for step, position in enumerate([1, 2, 0], start=1):
        current = current.copy()
        current[position] = ids[position]
        states.append(SamplerState(step=step, ids=current, block=0, settled=0, model_calls=step))
    chunks = _run(codec, states)
    # The end token cuts the preview: what lies after it is never part of the answer.
    assert [c.preview for c in chunks[1:]] == ["\u2591b\u2591\u2591", "\u2591b", None]
    assert "".join(c.delta for c in chunks) == "ab" and chunks[-1].finish_reason == "stop"
