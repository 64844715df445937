"""Structured output on exported decoders: the core's token mask over tokenizer.json's vocabulary holds the reply.

The tiny llama has random weights and a character vocabulary, so what it writes unconstrained is noise:
a reply that parses and validates comes from the mask alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import anyformer

pytestmark = pytest.mark.slow

_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
_PROMPTS = ["Who are you?", "Describe a cat.", "Give me a number."]


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir: Path) -> Iterator[anyformer.Loaded]:
    with anyformer.load(str(tiny_llama_dir), backend="onnx") as loaded:
        yield loaded


@pytest.mark.parametrize("prompt", _PROMPTS)
def test_a_json_schema_reply_parses_and_validates(tiny: anyformer.Loaded, prompt: str) -> None:
    constraint = {"type": "json_schema", "schema": _SCHEMA}
    last = tiny.complete([{"role": "user", "content": prompt}], max_new_tokens=64, constraint=constraint)
    value = json.loads(last.text)
    assert set(value) == {"name", "age"} and isinstance(value["name"], str) and isinstance(value["age"], int)
    assert len(value["name"]) <= 12 and 0 <= value["age"] <= 120 and last.finish_reason == "stop"


def test_a_sampled_reply_holds_to_its_regex(tiny: anyformer.Loaded) -> None:
    pattern = r"(red|green|blue)-[0-9]{3}"
    for seed in range(3):
        last = tiny.complete(
            [{"role": "user", "content": "A colour?"}],
            max_new_tokens=32,
            temperature=1.0,
            seed=seed,
            constraint={"type": "regex", "regex": pattern},
        )
        assert re.fullmatch(pattern, last.text), last.text


def test_the_unconstrained_reply_is_not_json(tiny: anyformer.Loaded) -> None:
    """The control: without the constraint the random model's reply is not the JSON the tests above read."""
    last = tiny.complete([{"role": "user", "content": _PROMPTS[0]}], max_new_tokens=32)
    with pytest.raises(ValueError):
        json.loads(last.text)


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


def test_a_named_tool_choice_yields_a_call_whose_arguments_validate(tiny: anyformer.Loaded) -> None:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    _check_weather_call(tiny.complete(messages, max_new_tokens=96, tools=[WEATHER], tool_choice=NAMED))


def test_tool_choice_required_streams_a_valid_call(tiny: anyformer.Loaded) -> None:
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    chunks = list(tiny.generate(messages, max_new_tokens=96, tools=[WEATHER], tool_choice="required"))
    _check_weather_call(chunks[-1])
