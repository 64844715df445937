"""Structured output in the transformers backend's own KV loop: the core's token mask over the tokenizer's
vocabulary, applied after the repetition penalty. The tiny models' weights are random: a reply that parses and
validates is the mask's doing."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode

MESSAGES = [{"role": "user", "content": "Hello there"}]
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}, "deep": {"type": "boolean"}},
    "required": ["colour", "deep"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(tiny_model_dir: dict[str, Path], request: pytest.FixtureRequest) -> Iterator[anyformer.Loaded]:
    with anyformer.load(tiny_model_dir[request.param], backend="transformers", isolate=False) as loaded:
        yield loaded


def test_a_json_schema_reply_parses_and_validates(model: anyformer.Loaded) -> None:
    last = model.complete(MESSAGES, max_new_tokens=48, constraint={"type": "json_schema", "schema": SCHEMA})
    value = json.loads(last.text)
    assert value["colour"] in ("red", "green", "blue") and isinstance(value["deep"], bool), last.text
    assert last.finish_reason == "stop"


@pytest.mark.parametrize("seed", [1, 2])
def test_a_sampled_reply_holds_to_its_regex(model: anyformer.Loaded, seed: int) -> None:
    pattern = r"(yes|no), [0-9]{2}"
    constraint = {"type": "regex", "regex": pattern}
    last = model.complete(MESSAGES, max_new_tokens=32, temperature=1.0, seed=seed, constraint=constraint)
    assert re.fullmatch(pattern, last.text) and last.finish_reason == "stop", last.text


def test_a_penalised_constrained_reply_still_holds(model: anyformer.Loaded) -> None:
    pattern = r"(ab){4}"
    last = model.complete(
        MESSAGES, max_new_tokens=16, repetition_penalty=1.5, constraint={"type": "regex", "regex": pattern}
    )
    assert re.fullmatch(pattern, last.text), last.text


def test_the_unconstrained_reply_is_not_that_json(model: anyformer.Loaded) -> None:
    """The control: the random model's free reply does not happen to be the value the tests above read."""
    with pytest.raises(ValueError):
        json.loads(model.complete(MESSAGES, max_new_tokens=24).text)


def test_a_constraint_that_does_not_compile_is_refused_before_any_chunk(model: anyformer.Loaded) -> None:
    with pytest.raises(AnyformerError) as caught:
        model.complete(MESSAGES, constraint={"type": "lark", "lark": "start: nope"})
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
def llama(tiny_model_dir: dict[str, Path]) -> Iterator[anyformer.Loaded]:
    """The tiny llama at its 512 positions: the tool prompt of a template without tools is ~370 characters."""
    with anyformer.load(tiny_model_dir["llama"], backend="transformers", isolate=False, context=512) as loaded:
        yield loaded


def test_a_named_tool_choice_yields_a_call_whose_arguments_validate(llama: anyformer.Loaded) -> None:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    _check_weather_call(llama.complete(messages, max_new_tokens=96, tools=[WEATHER], tool_choice=NAMED))


def test_tool_choice_required_streams_a_valid_call(llama: anyformer.Loaded) -> None:
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    chunks = list(llama.generate(messages, max_new_tokens=96, tools=[WEATHER], tool_choice="required"))
    _check_weather_call(chunks[-1])
