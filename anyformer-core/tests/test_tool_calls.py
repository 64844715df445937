"""Tool calls read back from replies in each template family's syntax, streamed and whole."""

from __future__ import annotations

import json
from typing import Any

import pytest

from anyformer import AnyformerError, GenerateOptions
from anyformer.contract._tool_calls import parse_tool_calls
from anyformer.contract._tool_stream import ToolCallStream
from anyformer.contract._tool_syntaxes import gemma_arguments_json, python_calls

NAMES = ["get_weather", "get_time"]
ARGS = {"city": "Paris"}

#: One reply per syntax read: (id, reply, the text before the calls).
FAMILY_REPLIES = [
    (
        "hermes-qwen",
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "Let me look.",
    ),
    ("llama3-python-tag", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>', ""),
    ("llama3-json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', ""),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', ""),
    ("mistral-v11-args", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', ""),
    ("arguments-as-string", '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', ""),
    ("granite3", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]', ""),
    ("phi4-mini-functools", 'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]', ""),
    (
        "phi4-tool-call-token",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>',
        "",
    ),
    ("gemma4", 'Sure. <|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>', "Sure."),
    ("gemma3-tool-code", 'I will check.\n```tool_code\nget_weather(city="Paris")\n```', "I will check."),
    ("gemma3-json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', ""),
    ("pythonic", '[get_weather(city="Paris")]', ""),
]


@pytest.mark.parametrize(("reply", "before"), [r[1:] for r in FAMILY_REPLIES], ids=[r[0] for r in FAMILY_REPLIES])
def test_each_family_syntax_is_read_as_a_call(reply: str, before: str) -> None:
    text, calls = parse_tool_calls(reply, NAMES)
    assert text == before
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", ARGS)]
    assert calls[0].id.startswith("call_")


@pytest.mark.parametrize(
    "reply",
    [
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]',
        'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}',
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {}}',
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_call>call:get_time{}<tool_call|>',
        '```tool_code\nget_weather(city="Paris")\nget_time()\n```',
        '[get_weather(city="Paris"), get_time()]',
    ],
    ids=["hermes", "granite", "phi", "mistral-v11", "python-tag", "gemma4", "tool-code", "pythonic"],
)
def test_several_calls_in_one_reply_are_each_read(reply: str) -> None:
    calls = parse_tool_calls(reply, NAMES)[1]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", ARGS), ("get_time", {})]


@pytest.mark.parametrize(
    "reply",
    [
        '{"name": "delete_everything", "arguments": {}}',  # not one of the tools
        '{"name": "get_weather", "arguments": [1]}',  # arguments not an object
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call> and then some prose',
        "Paris is sunny.",
        "import functools; functools.cache is handy",
        '[os.system("rm -rf /")]',  # an attribute call is no tool call, and nothing is ever run
        '[get_weather(city=open("/etc/passwd").read())]',  # arguments are literals only
        '<|tool_call>call:get_weather{city:<|"|>Paris}<tool_call|>',  # a quote never closed
        '{"answer": 42}',
    ],
)
def test_anything_else_stays_text(reply: str) -> None:
    assert parse_tool_calls(reply, NAMES) == (reply, [])


def test_the_arguments_are_the_json_text_the_model_wrote() -> None:
    reply = '<tool_call>{"name": "get_weather", "arguments": {"city":"Paris",  "days": [1, 2]}}</tool_call>'
    assert parse_tool_calls(reply, NAMES)[1][0].arguments == '{"city":"Paris",  "days": [1, 2]}'


def test_gemma4_values_and_python_literals_become_json() -> None:
    assert json.loads(gemma_arguments_json('{a:<|"|>x, "y"<|"|>,n:3,f:true,xs:[1,2],o:{k:null}}') or "") == {
        "a": 'x, "y"',
        "n": 3,
        "f": True,
        "xs": [1, 2],
        "o": {"k": None},
    }
    assert python_calls('print(get_time(zone="UTC", offsets=[1, -2], exact=True))') == [
        ("get_time", '{"zone": "UTC", "offsets": [1, -2], "exact": true}')
    ]
    assert python_calls("get_time(1)") is None  # positional arguments have no names to give


def _streamed(reply: str, cut: int, names: list[str] = NAMES) -> tuple[str, list[dict[str, Any]], list[Any]]:
    """Feed ``reply`` ``cut`` characters at a time; the content sent, each call as a client adds it up, the calls."""
    stream = ToolCallStream(names)
    content = ""
    entries: list[dict[str, Any]] = []
    for start in range(0, len(reply), cut):
        text, more = stream.feed(reply[start : start + cut])
        content += text
        entries += more
    rest, more, calls = stream.finish()
    content += rest
    entries += more
    added: dict[int, dict[str, Any]] = {}
    for entry in entries:
        call = added.setdefault(entry["index"], {"arguments": "", "entries": 0})
        if "id" in entry:
            assert "name" not in call, "a call's header is sent once"
            call.update(id=entry["id"], type=entry["type"], name=entry["function"]["name"])
        else:
            assert set(entry) == {"index", "function"} and set(entry["function"]) == {"arguments"}
        call["arguments"] += entry["function"]["arguments"]
        call["entries"] += 1
    return content, [added[i] for i in sorted(added)], calls


@pytest.mark.parametrize("cut", [1, 2, 3, 7])
@pytest.mark.parametrize(("reply", "before"), [r[1:] for r in FAMILY_REPLIES], ids=[r[0] for r in FAMILY_REPLIES])
def test_a_streamed_call_adds_up_to_the_call_read_whole(reply: str, before: str, cut: int) -> None:
    """Markup cut at every place (one character at a time, and more) never leaks into the content."""
    content, added, calls = _streamed(reply, cut)
    whole = parse_tool_calls(reply, NAMES)[1]
    assert content.strip() == before
    assert [(c["name"], c["arguments"]) for c in added] == [(c.name, c.arguments) for c in whole]
    assert [c.id for c in calls] == [c["id"] for c in added] and added[0]["type"] == "function"


def test_json_arguments_stream_in_fragments_as_they_are_decoded() -> None:
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    stream = ToolCallStream(NAMES)
    seen = []
    for start in range(0, len(reply), 4):
        _, entries = stream.feed(reply[start : start + 4])
        seen += entries
    header = seen[0]
    assert header["function"]["name"] == "get_weather" and header["id"].startswith("call_")
    fragments = [e["function"]["arguments"] for e in seen[1:]]
    assert len(fragments) >= 5  # not one delta with every argument at the end
    assert header["function"]["arguments"] + "".join(fragments) == '{"city": "Paris", "days": 3}'


def test_several_streamed_calls_keep_their_order_and_indexes() -> None:
    reply = (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]'
    )
    content, added, _ = _streamed(reply, 3)
    assert content == "" and [(c["name"], json.loads(c["arguments"])) for c in added] == [
        ("get_weather", ARGS),
        ("get_time", {}),
    ]


@pytest.mark.parametrize("cut", [1, 3, 8])
def test_text_that_is_no_call_streams_as_content(cut: int) -> None:
    for text in (
        "No call <tool here, {braces} too.",
        "I like functools and [TOOL_ and ```python\nx = 1\n```.",
        '{"answer": 42}',
        "[1, 2, 3]",
    ):
        content, added, calls = _streamed(text, cut)
        assert (content, added, calls) == (text, [], [])


def test_a_marker_in_prose_is_let_go_at_once_not_held_to_the_end() -> None:
    stream = ToolCallStream(NAMES)
    out = "".join(stream.feed(piece)[0] for piece in ["Use ", "functools", " to ", "cache ", "things."])
    assert out == "Use functools to cache things."


def test_an_unknown_function_is_never_streamed_as_a_call() -> None:
    content, added, calls = _streamed('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', 2)
    assert added == [] and calls == [] and "rm_rf" in content


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


def test_a_call_that_breaks_after_its_name_ends_as_text_as_the_whole_reply_reads() -> None:
    reply = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}} but then prose'
    content, added, calls = _streamed(reply, 4)
    assert parse_tool_calls(reply, NAMES) == (reply, []) and (content, calls) == (reply, [])
    assert [c["name"] for c in added] == ["get_weather"]  # the header had gone out: the one trace left


def test_python_and_gemma4_calls_are_sent_whole_once_their_text_ends() -> None:
    for reply in ('[get_weather(city="Paris")', '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}'):
        content, added, calls = _streamed(reply, 2)  # never closed: nothing was sent as a call
        assert (content, added, calls) == (reply, [], [])
