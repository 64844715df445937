"""Template families: recognised from their templates, given their tools, held to a forced call in their syntax;
a prompt that opens ``<think>`` is noted, so the reply's reasoning is split out (issue 30)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import FakeHandle, ScriptedBackend

import anyformer
from anyformer import AnyformerError, Chunk, GenerateOptions
from anyformer._chat_template import render_chat
from anyformer._tool_families import (
    GEMMA3,
    GEMMA4,
    GRANITE,
    HERMES,
    JSON,
    LLAMA3,
    MISTRAL,
    MISTRAL_ARGS,
    PHI,
    chat_constraint,
    tool_family,
    tool_inputs,
)
from anyformer.contract._caps import Caps
from anyformer.plugin import Features
from anyformer.server._chat_reply import ChatReply

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]

#: The markers each family's real template carries (a line of each, as their chat templates write them).
TEMPLATES = {
    "qwen2.5": "{%- if tools %}<tools>{{ tools }}</tools> <tool_call>\\n{{ name }}</tool_call>{%- endif %}",
    "granite3": "<|start_of_role|>available_tools<|end_of_role|>{{ tools | tojson }}<|tool_call|>",
    "phi4-mini": "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message %}"
    "<|system|>{{ message['content'] }}<|tool|>{{ message['tools'] }}<|/tool|><|end|>{% endif %}{% endfor %}",
    "mistral": "[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS][TOOL_CALLS]{{ tool_calls|tojson }}",
    "mistral-v11": "[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS][TOOL_CALLS]{{ name }}[ARGS]{{ args }}",
    "llama3.1": "<|start_header_id|>ipython<|end_header_id|>{% if tools %}{{ tools }}{% endif %}<|python_tag|>",
    "llama3.2": "<|start_header_id|>system<|end_header_id|>{% if tools is not none %}{{ tools }}{% endif %}",
    "gemma4": "{%- if tools %}<|tool>declaration:{{ tools }}<tool|>{% endif %}<|tool_call>call:{{ name }}<tool_call|>",
    "gemma3": "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\\n{{ m.content }}<end_of_turn>"
    "{% endfor %}",
    "chatml": "{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>{% endfor %}",
}


@pytest.mark.parametrize(
    ("template", "family"),
    [
        ("qwen2.5", HERMES),
        ("granite3", GRANITE),
        ("phi4-mini", PHI),
        ("mistral", MISTRAL),
        ("mistral-v11", MISTRAL_ARGS),
        ("llama3.1", LLAMA3),
        ("llama3.2", LLAMA3),
        ("gemma4", GEMMA4),
        ("gemma3", GEMMA3),
        ("chatml", JSON),
    ],
)
def test_each_family_is_recognised_from_its_template(template: str, family: Any) -> None:
    assert tool_family(TEMPLATES[template]) is family


@pytest.mark.parametrize(
    ("template", "begins", "ends"),
    [
        ("qwen2.5", '"<tool_call>\\n"', '"\\n</tool_call>"'),
        ("granite3", '"<|tool_call|>["', '"]"'),
        ("phi4-mini", '"functools["', '"]"'),
        ("mistral", '"[TOOL_CALLS]["', '"]"'),
        ("mistral-v11", '"[TOOL_CALLS]"', '"get_weather[ARGS]"'),
        ("llama3.1", "start: call", '"parameters"'),
        ("gemma3", "start: call", '"parameters"'),
    ],
)
def test_a_forced_call_is_constrained_in_the_family_syntax(template: str, begins: str, ends: str) -> None:
    options = GenerateOptions.build(tools=[WEATHER], tool_choice=NAMED)
    constraint = chat_constraint(options, TEMPLATES[template])
    assert constraint is not None and constraint.kind == "lark"
    assert begins in constraint.source and ends in constraint.source
    assert '"const": "get_weather"' in constraint.source or '"get_weather[ARGS]"' in constraint.source


def test_gemma4_is_held_to_its_own_values_where_the_schema_allows() -> None:
    options = GenerateOptions.build(tools=[WEATHER], tool_choice="required")
    constraint = chat_constraint(options, TEMPLATES["gemma4"])
    assert constraint is not None and constraint.kind == "lark"
    assert constraint.source.startswith('start: "<|tool_call>" call "<tool_call|>"')
    assert '"call:get_weather"' in constraint.source and '"city:"' in constraint.source
    # A schema word the grammar is not made for (a range): the forced call is plain JSON instead.
    ranged = {**WEATHER, "function": {**WEATHER["function"], "parameters": {"type": "integer", "minimum": 1}}}
    fallback = GenerateOptions.build(tools=[ranged], tool_choice="required")
    assert chat_constraint(fallback, TEMPLATES["gemma4"]) == fallback.constraint


def test_plain_json_stays_the_constraint_where_the_family_writes_no_json_frame() -> None:
    options = GenerateOptions.build(tools=[WEATHER], tool_choice="required")
    for template in (TEMPLATES["chatml"], None):
        assert chat_constraint(options, template) == options.constraint
    free = GenerateOptions.build(tools=[WEATHER])
    assert chat_constraint(free, TEMPLATES["qwen2.5"]) is None  # auto: the model chooses, nothing is forced
    schema = GenerateOptions.build(constraint={"type": "json_object"})
    assert chat_constraint(schema, TEMPLATES["qwen2.5"]) == schema.constraint


def test_tools_reach_each_template_as_it_reads_them() -> None:
    auto = GenerateOptions.build(tools=[WEATHER])
    messages, variables = tool_inputs(TEMPLATES["qwen2.5"], list(ASK), auto)
    assert messages == ASK and variables["tools"][0]["function"]["name"] == "get_weather"
    # Phi-4-mini reads them from the system message's ``tools`` field, as JSON text.
    messages, variables = tool_inputs(TEMPLATES["phi4-mini"], list(ASK), auto)
    assert messages[0]["role"] == "system" and json.loads(messages[0]["tools"])[0]["name"] == "get_weather"
    rendered = render_chat(TEMPLATES["phi4-mini"], messages, **variables)  # type: ignore[arg-type]
    assert '<|system|><|tool|>[{"name": "get_weather"' in rendered
    # A template without tools: a forced call lists them in the system text; auto is refused, saying why.
    forced = GenerateOptions.build(tools=[WEATHER], tool_choice="required")
    messages, variables = tool_inputs(TEMPLATES["chatml"], list(ASK), forced)
    assert variables == {} and "get_weather" in messages[0]["content"]
    with pytest.raises(AnyformerError, match="does not render tools") as caught:
        tool_inputs(TEMPLATES["chatml"], list(ASK), auto, "tiny")
    assert caught.value.code is anyformer.ErrorCode.BAD_REQUEST and "tiny" in caught.value.message


def test_gemma3_gets_its_tools_calls_and_results_by_google_s_convention() -> None:
    history = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "24 C"},
    ]
    messages, variables = tool_inputs(TEMPLATES["gemma3"], history, GenerateOptions.build(tools=[WEATHER]))  # type: ignore[arg-type]
    assert variables == {} and [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert '"parameters"' in messages[0]["content"] and '"get_weather"' in messages[0]["content"]
    assert json.loads(messages[2]["content"].splitlines()[1]) == {"name": "get_weather", "parameters": {"city": "Rome"}}
    assert messages[3]["content"] == "```tool_output\n18 C\n```\n```tool_output\n24 C\n```"


# ---- through the Python API ---------------------------------------------------------------------

THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)


class ToolHandle(FakeHandle):
    """A handle that honours tools (the script renders the template, as a backend would, at its first token)."""

    features = Features(honours=frozenset({"tools", "constraint"}))


@pytest.fixture
def load_tool_backend(model_description: dict[str, Any]) -> Callable[..., anyformer.Loaded]:
    def load(script: Callable[[Any], Iterator[Chunk]]) -> anyformer.Loaded:
        backend = ScriptedBackend("fake", script, handle=ToolHandle)
        manager = anyformer.PluginManager()
        manager.register(backend, "fake")
        return anyformer.load(model_description, caps=Caps(ram_bytes=16 * 2**30), plugins=manager)

    return load


def _reply(*pieces: str) -> Callable[[Any], Iterator[Chunk]]:
    def script(options: Any) -> Iterator[Chunk]:
        render_chat(THINKING_TEMPLATE, ASK, enable_thinking=options.thinking)  # type: ignore[arg-type]
        for tokens, piece in enumerate(pieces, 1):
            yield Chunk(delta=piece, tokens=tokens)

    return script


def test_the_python_api_takes_tools_and_gives_the_calls_on_the_last_chunk(load_tool_backend: Any) -> None:
    loaded = load_tool_backend(_reply("<|tool_call|>[", '{"name": "get_weather", ', '"arguments": {"city": "Rome"}}]'))
    chunks = list(loaded.generate(ASK, tools=[WEATHER]))
    last = chunks[-1]
    assert last.finish_reason == "tool_calls" and [(c.name, c.arguments) for c in last.tool_calls] == [
        ("get_weather", '{"city": "Rome"}')
    ]
    assert all(chunk.tool_calls == () for chunk in chunks[:-1])
    assert last.thinking_opened is False


def test_a_prompt_that_opens_think_is_noted_and_the_calls_read_after_the_reasoning(load_tool_backend: Any) -> None:
    pieces = ("The user wants", ' <tool_call>{"name": "nope"} weather.</think>', "<tool_call>")
    loaded = load_tool_backend(_reply(*pieces, '{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'))
    chunks = list(loaded.generate(ASK, tools=[WEATHER], thinking=True))
    assert all(chunk.thinking_opened for chunk in chunks)
    assert chunks[-1].finish_reason == "tool_calls" and chunks[-1].tool_calls[0].name == "get_weather"
    unclosed = load_tool_backend(_reply('Thinking <tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'))
    assert list(unclosed.generate(ASK, tools=[WEATHER], thinking=True))[-1].tool_calls == ()  # all reasoning
    off = list(loaded.generate(ASK, thinking=False))  # the same template with thinking off opens nothing
    assert not any(chunk.thinking_opened for chunk in off)


def test_the_server_splits_a_reply_that_began_inside_its_reasoning_streamed_and_whole() -> None:
    call = '{"name": "get_weather", "arguments": {"city": "Rome"}}'
    reply = f"I should call the tool.\n</think>\n\nOn it.<tool_call>\n{call}\n</tool_call>"
    options = {"tools": [WEATHER]}
    message, finish = ChatReply(options).message(reply, "stop", opened=True)
    assert finish == "tool_calls" and message["reasoning_content"] == "I should call the tool.\n"
    assert message["content"] == "On it." and message["tool_calls"][0]["function"]["arguments"] == '{"city": "Rome"}'
    streamed = ChatReply(options)
    reasoning, content, entries, finishes = "", "", [], []
    for start in range(0, len(reply), 3):
        end = start + 3 >= len(reply)
        for delta, done, _ in streamed.deltas(reply[start : start + 3], "stop" if end else None, (), opened=True):
            reasoning += delta.get("reasoning_content", "")
            content += delta.get("content", "")
            entries += delta.get("tool_calls", [])
            finishes.append(done)
    assert (reasoning, content) == (message["reasoning_content"], message["content"])
    assert entries[0]["function"]["name"] == "get_weather" and len(entries) > 2
    assert "".join(e["function"]["arguments"] for e in entries) == message["tool_calls"][0]["function"]["arguments"]
    assert [f for f in finishes if f] == ["tool_calls"] and finishes[-1] == "tool_calls"
