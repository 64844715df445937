"""Tool calls read back from replies in each template family's syntax, streamed and whole."""

from __future__ import annotations

import json

import pytest

from anyformer import AnyformerError, GenerateOptions
from anyformer.contract._tool_calls import ToolCallStream, parse_tool_calls

NAMES = ["get_weather", "get_time"]
ARGS = {"city": "Paris"}


@pytest.mark.parametrize(
    ("reply", "before"),
    [
        (
            'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            "Let me look.",
        ),
        ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>', ""),
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', ""),
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', ""),
        ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', ""),
    ],
    ids=["hermes-qwen", "llama3-python-tag", "llama3-json", "mistral", "arguments-as-string"],
)
def test_each_family_syntax_is_read_as_a_call(reply: str, before: str) -> None:
    text, calls = parse_tool_calls(reply, NAMES)
    assert text == before
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", ARGS)]
    assert calls[0].id.startswith("call_")


def test_several_hermes_calls_are_each_read() -> None:
    reply = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    assert [c.name for c in parse_tool_calls(reply, NAMES)[1]] == ["get_weather", "get_time"]


@pytest.mark.parametrize(
    "reply",
    [
        '{"name": "delete_everything", "arguments": {}}',  # not one of the tools
        '{"name": "get_weather", "arguments": [1]}',  # arguments not an object
        "<tool_call>{not json}</tool_call>",
        "Paris is sunny.",
    ],
)
def test_anything_else_stays_text(reply: str) -> None:
    assert parse_tool_calls(reply, NAMES) == (reply, [])


@pytest.mark.parametrize("cut", [1, 3, 8])
def test_streamed_text_before_a_call_goes_out_and_the_call_waits(cut: int) -> None:
    reply = 'Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    stream = ToolCallStream(NAMES)
    sent = "".join(stream.feed(reply[i : i + cut]) for i in range(0, len(reply), cut))
    rest, calls = stream.finish()
    assert (sent + rest).strip() == "Let me look." and [c.name for c in calls] == ["get_weather"]
    plain = ToolCallStream(NAMES)
    text = "No call <tool here, {braces} too."
    sent = "".join(plain.feed(text[i : i + cut]) for i in range(0, len(text), cut))
    assert sent + plain.finish()[0] == text


def test_tool_choice_forces_a_call_through_a_constraint() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    forced = GenerateOptions.build(tools=tools, tool_choice="required")
    assert forced.constraint is not None and forced.constraint.schema["properties"]["name"] == {"const": "get_weather"}
    assert GenerateOptions.build(tools=tools).tool_choice == "auto"
    none = GenerateOptions.build(tools=tools, tool_choice="none")
    assert (none.tools, none.tool_choice, none.constraint) == ((), None, None)
    with pytest.raises(AnyformerError, match="not one of the tools"):
        GenerateOptions.build(tools=tools, tool_choice={"type": "function", "function": {"name": "other"}})
    with pytest.raises(AnyformerError, match="no constraint"):
        GenerateOptions.build(tools=tools, tool_choice="required", constraint={"type": "json_object"})
