"""Structured output in LocalMind: logits read back to the host, masked with the core's token mask over the
GGUF's vocabulary, the id chosen there and written back (gguf-gpu's ``decode.constrained``). The tiny model's
weights are random: a reply that parses and validates is the mask's doing."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode
from anyformer_gguf_gpu.testing import RandomModel, write_random_gguf

MESSAGES = [{"role": "user", "content": "the sea is"}]
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}, "deep": {"type": "boolean"}},
    "required": ["colour", "deep"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[anyformer.Loaded]:
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_random_gguf(str(path), RandomModel(n_ctx=1024))  # the tool prompt of a template without tools: ~340 ids
    with anyformer.load(anyformer.describe(path), backend="localmind", context=1024) as loaded:
        yield loaded


def test_a_json_schema_reply_parses_and_validates(tiny: anyformer.Loaded) -> None:
    last = tiny.complete(MESSAGES, max_new_tokens=48, constraint={"type": "json_schema", "schema": SCHEMA})
    value = json.loads(last.text)
    assert value["colour"] in ("red", "green", "blue") and isinstance(value["deep"], bool), last.text
    assert last.finish_reason == "stop"


@pytest.mark.parametrize("seed", [1, 2])
def test_a_sampled_reply_holds_to_its_regex(tiny: anyformer.Loaded, seed: int) -> None:
    pattern = r"(yes|no), [0-9]{2}"
    constraint = {"type": "regex", "regex": pattern}
    last = tiny.complete(MESSAGES, max_new_tokens=32, temperature=1.0, seed=seed, constraint=constraint)
    assert re.fullmatch(pattern, last.text) and last.finish_reason == "stop", last.text


def test_the_same_seed_gives_the_same_constrained_reply(tiny: anyformer.Loaded) -> None:
    constraint = {"type": "regex", "regex": "[a-z]{8}"}
    replies = {tiny.complete(MESSAGES, temperature=1.0, seed=5, constraint=constraint).text for _ in range(2)}
    assert len(replies) == 1


def test_the_unconstrained_reply_is_not_that_json(tiny: anyformer.Loaded) -> None:
    """The control: the random model's free reply does not happen to be the value the tests above read."""
    with pytest.raises(ValueError):
        json.loads(tiny.complete(MESSAGES, max_new_tokens=24).text)


def test_a_constraint_that_does_not_compile_is_refused_before_any_chunk(tiny: anyformer.Loaded) -> None:
    with pytest.raises(AnyformerError) as caught:
        tiny.complete(MESSAGES, constraint={"type": "lark", "lark": "start: nope"})
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


def test_a_named_tool_choice_yields_a_call_whose_arguments_validate(tiny: anyformer.Loaded) -> None:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    _check_weather_call(tiny.complete(messages, max_new_tokens=96, tools=[WEATHER], tool_choice=NAMED))


def test_tool_choice_required_streams_a_valid_call(tiny: anyformer.Loaded) -> None:
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    chunks = list(tiny.generate(messages, max_new_tokens=96, tools=[WEATHER], tool_choice="required"))
    _check_weather_call(chunks[-1])


def test_tools_with_auto_on_a_template_without_tools_are_refused(tiny: anyformer.Loaded) -> None:
    with pytest.raises(AnyformerError) as caught:
        tiny.complete(MESSAGES, tools=[WEATHER])
    assert caught.value.code is ErrorCode.BAD_REQUEST and "does not render tools" in str(caught.value)
