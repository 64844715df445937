"""The raw-text path of the contract: ``generate(prompt=...)`` reaches only backends that declare it."""

from __future__ import annotations

from typing import Any

import pytest

from anyformer import AnyformerError, Chunk, ErrorCode, TokenLogprob
from anyformer.plugin import Features

#: A handle that continues raw text, and one that also scores the prompt's own tokens.
RAW = Features(raw_text=True)
RAW_AND_SCORES = Features(raw_text=True, prompt_logprobs=True)


def test_a_backend_without_raw_text_refuses_a_raw_prompt_before_any_work(load_scripted: Any) -> None:
    loaded, backend = load_scripted([Chunk(delta="x", tokens=1)])
    assert not loaded.raw_text
    with pytest.raises(AnyformerError) as caught:
        loaded.complete(prompt="Once upon a time")
    assert caught.value.code == ErrorCode.BAD_REQUEST
    assert "raw text" in caught.value.message
    assert backend.started == 0


def test_a_backend_with_raw_text_gets_the_prompt_and_no_messages(load_scripted: Any) -> None:
    loaded, backend = load_scripted([Chunk(delta=" there", tokens=1)], features=RAW)
    assert loaded.raw_text
    assert loaded.complete(prompt="Once upon a time").text == " there"
    assert backend.last_messages == []
    assert backend.last_options.prompt == "Once upon a time"


def test_messages_and_a_prompt_together_are_refused(load_scripted: Any) -> None:
    loaded, _ = load_scripted(features=RAW)
    with pytest.raises(AnyformerError) as caught:
        loaded.complete("hi", prompt="hi")
    assert caught.value.code == ErrorCode.BAD_REQUEST


@pytest.mark.parametrize("prompt", [b"bytes", 3, ["a"]])
def test_a_prompt_that_is_not_a_string_is_refused(load_scripted: Any, prompt: Any) -> None:
    loaded, _ = load_scripted(features=RAW)
    with pytest.raises(AnyformerError) as caught:
        loaded.complete(prompt=prompt)
    assert caught.value.code == ErrorCode.BAD_REQUEST


def test_no_messages_and_no_prompt_is_refused(load_scripted: Any) -> None:
    loaded, _ = load_scripted()
    with pytest.raises(AnyformerError) as caught:
        loaded.complete()
    assert caught.value.code == ErrorCode.BAD_REQUEST


def _with_logprobs(*pieces: str) -> list[Chunk]:
    return [
        Chunk(delta=piece, tokens=i + 1, logprobs=(TokenLogprob(piece, -float(i + 1), ((piece, -float(i + 1)),)),))
        for i, piece in enumerate(pieces)
    ]


def test_logprobs_ride_with_the_chunk_their_text_begins_in(load_scripted: Any) -> None:
    loaded, _ = load_scripted(_with_logprobs("ab", "c", "de"), features=RAW)
    chunks = list(loaded.generate(prompt="x", logprobs=1, stop="e!"))  # "e" is held back until the end
    entries = [(e.token, e.offset) for c in chunks for e in c.logprobs]
    assert entries == [("ab", 0), ("c", 2), ("de", 3)]
    for chunk in chunks:
        for entry in chunk.logprobs:
            assert chunk.text[entry.offset :].startswith(entry.token[: len(chunk.text) - entry.offset])


def test_logprobs_of_tokens_past_a_stop_string_are_dropped(load_scripted: Any) -> None:
    loaded, _ = load_scripted(_with_logprobs("ab", "c", "de", "f"), features=RAW)
    chunks = list(loaded.generate(prompt="x", logprobs=0, stop="c"))
    assert chunks[-1].text == "ab"
    assert [e.token for c in chunks for e in c.logprobs] == ["ab"]


def test_logprobs_and_suffix_need_a_raw_prompt(load_scripted: Any) -> None:
    loaded, _ = load_scripted(features=RAW)
    for call in (
        lambda: loaded.complete("hi", logprobs=1),
        lambda: loaded.complete(prompt="hi", logprobs=99),
        lambda: loaded.complete("hi", suffix="there"),
        lambda: loaded.complete(prompt="hi", suffix=3),
    ):
        with pytest.raises(AnyformerError) as caught:
            call()
        assert caught.value.code == ErrorCode.BAD_REQUEST


def test_malformed_logprobs_from_a_backend_are_a_plugin_error(load_scripted: Any) -> None:
    malformed = [Chunk(delta="a", tokens=1, logprobs=[("a", 0.0)])]  # type: ignore[arg-type]
    loaded, _ = load_scripted(malformed, features=RAW)
    with pytest.raises(AnyformerError) as caught:
        loaded.complete(prompt="x", logprobs=0)
    assert caught.value.code == ErrorCode.PLUGIN_ERROR


def _scored_prompt() -> tuple[TokenLogprob, ...]:
    return (TokenLogprob("Once", None), TokenLogprob(" upon", -1.5, ((" upon", -1.5),)), TokenLogprob(" a", -0.25))


def test_prompt_logprobs_need_a_backend_that_declares_them(load_scripted: Any) -> None:
    loaded, backend = load_scripted([Chunk(delta=" time", tokens=1)], features=RAW)
    assert not loaded.prompt_logprobs
    with pytest.raises(AnyformerError) as caught:
        loaded.complete(prompt="Once upon a", logprobs=1, prompt_logprobs=True)
    assert caught.value.code == ErrorCode.BAD_REQUEST
    assert "prompt's log-probabilities" in caught.value.message
    assert backend.started == 0


def test_prompt_logprobs_ride_on_the_first_chunk_placed_in_the_prompt(load_scripted: Any) -> None:
    loaded, backend = load_scripted(
        [Chunk(tokens=0, prompt_logprobs=_scored_prompt()), *_with_logprobs(" time")], features=RAW_AND_SCORES
    )
    chunks = list(loaded.generate(prompt="Once upon a", logprobs=1, prompt_logprobs=True))
    assert backend.last_options.prompt_logprobs is True
    assert [(e.token, e.logprob, e.offset) for e in chunks[0].prompt_logprobs] == [
        ("Once", None, 0),
        (" upon", -1.5, 4),
        (" a", -0.25, 9),
    ]
    assert all(not c.prompt_logprobs for c in chunks[1:])
    assert chunks[-1].text == " time"


def test_max_new_tokens_zero_scores_the_prompt_alone(load_scripted: Any) -> None:
    loaded, _ = load_scripted(
        [Chunk(tokens=0, prompt_logprobs=_scored_prompt()), *_with_logprobs(" time")], features=RAW_AND_SCORES
    )
    chunks = list(loaded.generate(prompt="Once upon a", max_new_tokens=0, logprobs=0, prompt_logprobs=True))
    assert len(chunks) == 1
    assert chunks[0].text == "" and chunks[0].tokens == 0 and chunks[0].finish_reason == "length"
    assert len(chunks[0].prompt_logprobs) == 3
    with pytest.raises(AnyformerError) as caught:
        loaded.complete(prompt="Once upon a", max_new_tokens=0, logprobs=0)
    assert caught.value.code == ErrorCode.BAD_REQUEST
