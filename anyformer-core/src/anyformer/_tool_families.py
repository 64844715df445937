"""Chat template families and tools: which syntax a template teaches, how it takes the tools, and a forced call.

A backend that renders a chat template calls :func:`tool_inputs` for the messages and variables to
render with, and :func:`chat_constraint` for the constraint to decode under. The family is read
from the template's text (its markers), as :func:`tool_family` says:

===========  ===============================================  ===========================================
family       recognised by                                    a forced call (``tool_choice`` required/named)
===========  ===============================================  ===========================================
hermes       ``<tool_call>`` (Qwen 2.5/3, Hermes, Granite 4)  ``<tool_call>\\n{"name", "arguments"}\\n</tool_call>``
granite      ``<|start_of_role|>`` and ``<|tool_call|>``      ``<|tool_call|>[{"name", "arguments"}]``
phi          ``<|tool|>`` or ``functools`` (Phi-4-mini)       ``functools[{"name", "arguments"}]``
mistral      ``[TOOL_CALLS]``                                 ``[TOOL_CALLS][{...}]``; a template with ``[ARGS]``:
                                                              ``[TOOL_CALLS]name[ARGS]{...}``
llama3       ``<|python_tag|>``, or Llama 3 headers + tools   ``{"name", "parameters"}`` (Llama 3.x's JSON calls)
gemma4       ``<|tool_call>``                                 ``<|tool_call>call:name{key:<|"|>text<|"|>}<tool_call|>``
                                                              (parameters of other schema words: plain JSON)
gemma3       ``<start_of_turn>``, no tools in the template    ``{"name", "parameters"}`` (Google's JSON convention)
json         anything else                                    ``{"name", "arguments"}``
===========  ===============================================  ===========================================

How the tools reach the model: a template that reads ``tools`` gets them as the variable (Phi-4-mini's
reads them from the system message's ``tools`` field, so they are put there too). Gemma 3's template
takes no tools: Google's convention is followed instead, the tools described in the system text (which
its template puts in the first user turn), earlier calls written back as the JSON the model was asked
for, and tool results as a user turn in a ```` ```tool_output ```` block. Any other template that takes
no tools lists them in the system text for a forced call only; ``auto`` there is a ``BAD_REQUEST``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from anyformer._chat_template import template_takes_tools
from anyformer.contract._chunk import GenerateOptions
from anyformer.contract._constraint import Constraint
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._messages import Message
from anyformer.contract._tool_calls import call_constraint, with_tool_prompt

#: JSON inside a forced call is written as the plain JSON constraint writes it (one space after ``,`` and ``:``).
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclasses.dataclass(frozen=True)
class ToolFamily:
    """A template family: its name, the key its calls put the arguments under, and a forced call's frame.

    ``before`` and ``after`` surround the call's JSON object in a forced call (``[`` ``]`` inside them
    for a family whose calls are a list); ``mistral_args`` marks Mistral's ``name[ARGS]{...}`` calls.
    """

    name: str
    arguments_key: str = "arguments"
    before: str = ""
    after: str = ""
    mistral_args: bool = False


HERMES = ToolFamily("hermes", before="<tool_call>\n", after="\n</tool_call>")
GRANITE = ToolFamily("granite", before="<|tool_call|>[", after="]")
PHI = ToolFamily("phi", before="functools[", after="]")
MISTRAL = ToolFamily("mistral", before="[TOOL_CALLS][", after="]")
MISTRAL_ARGS = ToolFamily("mistral", before="[TOOL_CALLS]", mistral_args=True)
LLAMA3 = ToolFamily("llama3", arguments_key="parameters")
GEMMA4 = ToolFamily("gemma4")
GEMMA3 = ToolFamily("gemma3", arguments_key="parameters")
JSON = ToolFamily("json")


def tool_family(template: str | None) -> ToolFamily:
    """The family a chat template belongs to, read from its markers (see the module's table)."""
    text = template or ""
    if "<|tool_call>" in text:
        return GEMMA4
    if "<|start_of_role|>" in text and "<|tool_call|>" in text:
        return GRANITE
    if "<|tool|>" in text or "functools" in text:
        return PHI
    if "<tool_call>" in text:
        return HERMES
    if "[TOOL_CALLS]" in text:
        return MISTRAL_ARGS if "[ARGS]" in text else MISTRAL
    if "<|python_tag|>" in text or ("<|start_header_id|>" in text and template_takes_tools(text)):
        return LLAMA3
    if "<start_of_turn>" in text:
        return GEMMA3
    return JSON


def _call_schema(tool: Mapping[str, Any], arguments_key: str) -> dict[str, Any]:
    function = tool["function"]
    return {
        "type": "object",
        "properties": {
            "name": {"const": function["name"]},
            arguments_key: function.get("parameters") or {"type": "object"},
        },
        "required": ["name", arguments_key],
        "additionalProperties": False,
        "x-guidance": _JSON_STYLE,
    }


def _lark_string(text: str) -> str:
    return json.dumps(text)


def family_constraint(family: ToolFamily, tools: Sequence[Mapping[str, Any]], choice: str) -> Constraint:
    """A forced call in ``family``'s syntax: one of the allowed functions, its arguments valid."""
    wanted = choice.removeprefix("function:") if choice.startswith("function:") else None
    allowed = [tool for tool in tools if wanted is None or tool["function"]["name"] == wanted]
    if family is GEMMA4:
        return gemma4_constraint(allowed) or call_constraint(allowed, choice)
    if family is JSON:
        return call_constraint(allowed, choice)
    rules = []
    if family.mistral_args:
        for index, tool in enumerate(allowed):
            parameters = {**(tool["function"].get("parameters") or {"type": "object"}), "x-guidance": _JSON_STYLE}
            name = _lark_string(f"{tool['function']['name']}[ARGS]")
            rules.append(f"call_{index}: {name} %json {json.dumps(parameters)}")
        alternatives = " | ".join(f"call_{index}" for index in range(len(allowed)))
    else:
        # One JSON grammar whose schema is any of the calls (its "name" const tells them apart).
        schemas = [_call_schema(tool, family.arguments_key) for tool in allowed]
        schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas, "x-guidance": _JSON_STYLE}
        rules.append(f"call_json: %json {json.dumps(schema)}")
        alternatives = "call_json"
    frame = " ".join(part for part in (_lark_string(family.before) if family.before else "", "call") if part)
    if family.after:
        frame += f" {_lark_string(family.after)}"
    grammar = "\n".join([f"start: {frame}", f"call: {alternatives}", *rules])
    return Constraint.build({"type": "lark", "lark": grammar})


# ---- Gemma 4's own values: call:name{key:<|"|>text<|"|>,n:3} -------------------------------------------

#: The schema words a Gemma 4 grammar is made for; a function whose parameters use others is forced as plain JSON.
_GEMMA_WORDS = frozenset({"type", "properties", "required", "additionalProperties", "enum", "items", "maxLength"})
_GEMMA_QUOTE = '"<|\\"|>"'
_BARE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_GEMMA_SCALARS = {
    "integer": "/-?(0|[1-9][0-9]{0,17})/",
    "number": "/-?(0|[1-9][0-9]{0,17})(\\.[0-9]{1,17})?/",
    "boolean": '"true" | "false"',
    "null": '"null"',
}


class _GemmaGrammar:
    """Lark rules for Gemma 4's value syntax from a JSON schema (the subset in :data:`_GEMMA_WORDS`), or None."""

    def __init__(self) -> None:
        self.rules: list[str] = []

    def rule(self, schema: Any) -> str | None:
        if not isinstance(schema, Mapping) or set(schema) - _GEMMA_WORDS - {"description", "title"}:
            return None
        name = f"g{len(self.rules)}"
        self.rules.append("")  # the slot is taken before its parts are made
        body = self._body(schema)
        if body is None:
            return None
        self.rules[int(name[1:])] = f"{name}: {body}"
        return name

    def _body(self, schema: Mapping[str, Any]) -> str | None:
        if "enum" in schema:
            values = schema["enum"]
            if not values or not all(isinstance(v, str) and "<|" not in v for v in values):
                return None
            return " | ".join(f"{_GEMMA_QUOTE} {json.dumps(v)} {_GEMMA_QUOTE}" for v in values)
        kind = schema.get("type")
        if kind == "string":
            longest = schema.get("maxLength")
            count = f"{{0,{int(longest)}}}" if isinstance(longest, int) and longest >= 0 else "*"
            return f"{_GEMMA_QUOTE} /[^<]{count}/ {_GEMMA_QUOTE}"
        if kind in _GEMMA_SCALARS:
            return _GEMMA_SCALARS[kind]
        if kind == "array":
            item = self.rule(schema.get("items", {"type": "string"}))
            return None if item is None else f'"[" ({item} ("," {item})*)? "]"'
        if kind == "object":
            properties = schema.get("properties") or {}
            if not isinstance(properties, Mapping):
                return None
            parts = []
            for key, value in properties.items():  # every property, in the schema's order: a valid object
                if not isinstance(key, str) or not _BARE_KEY.fullmatch(key):  # Gemma 4 writes keys bare
                    return None
                part = self.rule(value)
                if part is None:
                    return None
                parts.append(f"{json.dumps(key + ':')} {part}")
            return '"{" ' + ' "," '.join(parts) + ' "}"' if parts else '"{" "}"'
        return None


def gemma4_constraint(tools: Sequence[Mapping[str, Any]]) -> Constraint | None:
    """A forced call in Gemma 4's own syntax, or None when a function's parameters use words it is not made for."""
    grammar = _GemmaGrammar()
    calls = []
    for tool in tools:
        arguments = grammar.rule(tool["function"].get("parameters") or {"type": "object"})
        if arguments is None:
            return None
        calls.append(f"{json.dumps('call:' + tool['function']['name'])} {arguments}")
    lines = ['start: "<|tool_call>" call "<tool_call|>"', f"call: {' | '.join(calls)}", *grammar.rules]
    return Constraint.build({"type": "lark", "lark": "\n".join(lines)})


def chat_constraint(options: GenerateOptions, template: str | None) -> Constraint | None:
    """The constraint a chat decodes under: the request's, or a forced call in the template family's syntax."""
    if options.prompt is not None or options.tool_choice in (None, "auto") or not options.tools:
        return options.constraint
    return family_constraint(tool_family(template), options.tools, options.tool_choice)


# ---- the tools as the template takes them ---------------------------------------------------------


def _functions(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [dict(tool["function"]) for tool in tools]


def _with_system_tools(messages: Sequence[Message], tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Phi-4-mini's way: the tools as JSON text in the system message's ``tools`` field."""
    out: list[dict[str, Any]] = [dict(m) for m in messages]
    listed = json.dumps(_functions(tools), ensure_ascii=False)
    if out and out[0]["role"] == "system":
        out[0]["tools"] = listed
    else:
        out.insert(0, {"role": "system", "content": "", "tools": listed})
    return out


def gemma3_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system text that gives Gemma 3 its tools, in the JSON form of Google's function-calling convention."""
    listed = "\n".join(json.dumps(function, ensure_ascii=False) for function in _functions(tools))
    return (
        "You have access to functions. If you decide to invoke any of them, reply with only a JSON object "
        '{"name": <function name>, "parameters": <a dictionary of its arguments>} and no other text.\n'
        f"The functions, described as JSON:\n{listed}"
    )


def _gemma3_messages(messages: Sequence[Message], tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages for Gemma 3: tools in the system text, calls as their JSON, results as ```tool_output``` turns."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "assistant" and message.get("tool_calls"):
            calls = [
                json.dumps({"name": call["function"]["name"], "parameters": call["function"]["arguments"]})
                for call in message["tool_calls"]
            ]
            text = "\n".join(part for part in (_text(message), *calls) if part)
            out.append({"role": "assistant", "content": text})
        elif role == "tool":
            block = f"```tool_output\n{_text(message)}\n```"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool_output"):
                out[-1]["content"] += f"\n{block}"  # the results of several calls are one user turn
            else:
                out.append({"role": "user", "content": block, "_tool_output": True})
        else:
            out.append({key: value for key, value in message.items() if key not in ("tool_calls",)})
    for message in out:
        message.pop("_tool_output", None)
    prompt = gemma3_prompt(tools)
    if out and out[0]["role"] == "system" and isinstance(out[0]["content"], str):
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}" if out[0]["content"] else prompt}
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content or [] if isinstance(block, Mapping))


def tool_inputs(
    template: str | None, messages: list[Message], options: GenerateOptions, model: str = "the model"
) -> tuple[list[Message], dict[str, Any]]:
    """The messages and extra variables to render ``messages`` with, so the template's family sees the tools.

    ``BAD_REQUEST`` (naming ``model``) for tools with ``tool_choice`` auto on a template that cannot
    take them: the model would never see them.
    """
    tools = options.tools
    if not tools:
        return messages, {}
    family = tool_family(template)
    if template_takes_tools(template):
        variables: dict[str, Any] = {"tools": [dict(tool) for tool in tools]}
        if family is PHI:
            return _with_system_tools(messages, tools), variables  # type: ignore[return-value]
        return messages, variables
    if family is GEMMA3:
        return _gemma3_messages(messages, tools), {}  # type: ignore[return-value]
    if options.tool_choice == "auto":
        raise AnyformerError(
            ErrorCode.BAD_REQUEST,
            f"tools: the chat template of {model} does not render tools, so with tool_choice 'auto' "
            "the model would never see them; send tool_choice 'required' or a named function "
            "(the call is then constrained), or use a model whose template takes tools",
        )
    return with_tool_prompt(messages, tools), {}  # type: ignore[arg-type,return-value]
