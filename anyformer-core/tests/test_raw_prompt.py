"""The raw-text path of the contract: ``generate(prompt=...)`` reaches only backends that declare it."""

from __future__ import annotations

from typing import Any

import pytest

from anyformer import AnyformerError, Chunk, ErrorCode


def test_a_backend_without_raw_text_refuses_a_raw_prompt_before_any_work(load_scripted: Any) -> None:
    loaded, backend = load_scripted([Chunk(delta="x", tokens=1)])
    assert not loaded.raw_text
    with pytest.raises(AnyformerError) as caught:
        loaded.complete(prompt="Once upon a time")
    assert caught.value.code == ErrorCode.BAD_REQUEST
    assert "raw text" in caught.value.message
    assert backend.started == 0


def test_a_backend_with_raw_text_gets_the_prompt_and_no_messages(load_scripted: Any) -> None:
    loaded, backend = load_scripted([Chunk(delta=" there", tokens=1)])
    loaded.handle.raw_text = True  # type: ignore[attr-defined]
    assert loaded.raw_text
    assert loaded.complete(prompt="Once upon a time").text == " there"
    assert backend.last_messages == []
    assert backend.last_options.prompt == "Once upon a time"


def test_messages_and_a_prompt_together_are_refused(load_scripted: Any) -> None:
    loaded, _ = load_scripted()
    loaded.handle.raw_text = True  # type: ignore[attr-defined]
    with pytest.raises(AnyformerError) as caught:
        loaded.complete("hi", prompt="hi")
    assert caught.value.code == ErrorCode.BAD_REQUEST


@pytest.mark.parametrize("prompt", [b"bytes", 3, ["a"]])
def test_a_prompt_that_is_not_a_string_is_refused(load_scripted: Any, prompt: Any) -> None:
    loaded, _ = load_scripted()
    loaded.handle.raw_text = True  # type: ignore[attr-defined]
    with pytest.raises(AnyformerError) as caught:
        loaded.complete(prompt=prompt)
    assert caught.value.code == ErrorCode.BAD_REQUEST


def test_no_messages_and_no_prompt_is_refused(load_scripted: Any) -> None:
    loaded, _ = load_scripted()
    with pytest.raises(AnyformerError) as caught:
        loaded.complete()
    assert caught.value.code == ErrorCode.BAD_REQUEST
