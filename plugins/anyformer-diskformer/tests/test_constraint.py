"""Structured output in diskformer: its sampler masks the host logits with the core's token mask over the GGUF's
byte-level vocabulary. The tiny MoE's weights are random: a reply that parses and validates is the mask's doing."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from diskformer_reference import open_or_skip

from anyformer import AnyformerError, ErrorCode, GenerateOptions
from anyformer.plugin import Constraint

MESSAGES = [{"role": "user", "content": "the sea is"}]
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}, "deep": {"type": "boolean"}},
    "required": ["colour", "deep"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def model(moe_f32: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    loaded = open_or_skip(moe_f32, 128, device=request.param)
    try:
        yield loaded
    finally:
        loaded.dispose()


def _reply(model: Any, constraint: dict[str, Any], **options: Any) -> tuple[str, str | None]:
    chunks = list(
        model.stream(MESSAGES, GenerateOptions(max_new_tokens=48, constraint=Constraint.build(constraint), **options))
    )
    return "".join(c.delta for c in chunks), chunks[-1].finish_reason


def test_a_json_schema_reply_parses_and_validates(model: Any) -> None:
    text, finish = _reply(model, {"type": "json_schema", "schema": SCHEMA})
    value = json.loads(text)
    assert value["colour"] in ("red", "green", "blue") and isinstance(value["deep"], bool), text
    assert finish == "stop"


@pytest.mark.parametrize("seed", [1, 2])
def test_a_sampled_reply_holds_to_its_regex(model: Any, seed: int) -> None:
    pattern = r"(yes|no), [0-9]{2}"
    text, finish = _reply(model, {"type": "regex", "regex": pattern}, temperature=1.0, seed=seed)
    assert re.fullmatch(pattern, text) and finish == "stop", text


def test_the_unconstrained_reply_is_not_that_json(model: Any) -> None:
    """The control: the random model's free reply does not happen to be the value the tests above read."""
    chunks = list(model.stream(MESSAGES, GenerateOptions(max_new_tokens=24)))
    with pytest.raises(ValueError):
        json.loads("".join(c.delta for c in chunks))


def test_a_constraint_that_does_not_compile_is_refused_before_any_chunk(model: Any) -> None:
    with pytest.raises(AnyformerError) as caught:
        model.stream(MESSAGES, GenerateOptions(constraint=Constraint.build({"type": "lark", "lark": "start: nope"})))
    assert caught.value.code is ErrorCode.BAD_REQUEST
