"""Structured output in diskformer: its sampler masks the host logits with the core's token mask over the GGUF's
byte-level vocabulary. The tiny MoE's weights are random: a reply that parses and validates is the mask's doing."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from diskformer_reference import open_or_skip

import anyformer
from anyformer import AnyformerError, ErrorCode, GenerateOptions
from anyformer.plugin import Constraint
from anyformer_diskformer.testing import TinyMoE, write_tiny_moe

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
        model.generate(MESSAGES, GenerateOptions(max_new_tokens=48, constraint=Constraint.build(constraint), **options))
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
    chunks = list(model.generate(MESSAGES, GenerateOptions(max_new_tokens=24)))
    with pytest.raises(ValueError):
        json.loads("".join(c.delta for c in chunks))


def test_a_constraint_that_does_not_compile_is_refused_before_any_chunk(model: Any) -> None:
    with pytest.raises(AnyformerError) as caught:
        model.generate(MESSAGES, GenerateOptions(constraint=Constraint.build({"type": "lark", "lark": "start: nope"})))
    assert caught.value.code is ErrorCode.BAD_REQUEST


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _check_weather_call(last: anyformer.Chunk) -> None:
    assert last.finish_reason == "tool_calls", last.text
    (call,) = last.tool_calls
    arguments = json.loads(call.arguments)
    assert call.name == "get_weather" and set(arguments) == {"city"} and isinstance(arguments["city"], str)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[anyformer.Loaded]:
    """The tiny MoE with room for the tool prompt of a template without tools (~340 ids)."""
    path = str(tmp_path_factory.mktemp("moe") / "tiny-qwen3moe-ctx1024.gguf")
    write_tiny_moe(path, TinyMoE(quant="F32", n_ctx=1024))
    with anyformer.load(path, backend="diskformer", context=1024) as handle:
        yield handle


def test_a_named_tool_choice_yields_a_call_whose_arguments_validate(loaded: anyformer.Loaded) -> None:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    _check_weather_call(loaded.complete(messages, max_new_tokens=96, tools=[WEATHER], tool_choice=NAMED))


def test_tool_choice_required_streams_a_valid_call(loaded: anyformer.Loaded) -> None:
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    chunks = list(loaded.generate(messages, max_new_tokens=96, tools=[WEATHER], tool_choice="required"))
    _check_weather_call(chunks[-1])
