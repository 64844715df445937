"""Tool calls: ``tool_choice``, the constraint that forces a valid call, and the calls read back from a reply.

Replies are read in every syntax chat templates teach (:mod:`anyformer.contract._tool_syntaxes`:
Qwen/Hermes, Granite, Phi, Mistral, Llama 3.x, Gemma 3 and 4), whichever the reply uses, so
reading needs no template. A call counts only when it names one of the request's tools and its
arguments are a JSON object; otherwise the reply stays text. A call's ``arguments`` are the JSON
text the model wrote (checked to be an object), so a stream's fragments add up to them.

``tool_choice="required"`` or a named function constrains decoding to ``{"name": ...,
"arguments": {...}}`` valid against the function's parameters (:func:`call_constraint`); a backend
that knows its template asks :func:`anyformer.plugin.chat_constraint` for the call in its family's
syntax instead.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from anyformer.contract import _tool_syntaxes
from anyformer.contract._constraint import Constraint
from anyformer.contract._errors import AnyformerError, ErrorCode

#: Where a tool call begins in each syntax read (a reply that opens with ``{`` or ``[`` may be calls too).
MARKERS = _tool_syntaxes.MARKERS


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call a reply makes: its id (``call_…``), the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = dataclasses.field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        """The call as OpenAI writes it in ``message.tool_calls`` (with ``index`` in a stream delta)."""
        call: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


def check_tool_choice(choice: Any, names: Sequence[str]) -> str | None:
    """``tool_choice`` as ``"auto"``, ``"none"``, ``"required"`` or the one function's name (None: not given).

    ``{"type": "function", "function": {"name": ...}}`` names a function; the name must be one of
    ``names`` (the request's tools). ``BAD_REQUEST`` otherwise.
    """
    if choice is None:
        return None
    if choice in ("auto", "none", "required"):
        if choice == "required" and not names:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "tool_choice 'required' needs tools")
        return str(choice)
    function = choice.get("function") if isinstance(choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str):
        raise AnyformerError(
            ErrorCode.BAD_REQUEST,
            "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
        )
    if name not in names:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"tool_choice names {name!r}, which is not one of the tools")
    return f"function:{name}"


def call_constraint(tools: Sequence[Mapping[str, Any]], choice: str) -> Constraint:
    """The JSON schema a forced call must match: one of the allowed functions with valid arguments."""
    wanted = choice.removeprefix("function:") if choice.startswith("function:") else None
    schemas = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["function"]["name"]},
                "arguments": tool["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
        if wanted is None or tool["function"]["name"] == wanted
    ]
    return Constraint.json_schema(schemas[0] if len(schemas) == 1 else {"anyOf": schemas})


def tool_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system text that lists the tools for a template that cannot render them (forced calls only)."""
    listed = "\n".join(json.dumps(tool["function"], ensure_ascii=False) for tool in tools)
    return (
        "You can call these functions, described as JSON:\n"
        f"{listed}\n"
        'To call one, reply with only a JSON object: {"name": <function name>, "arguments": <its arguments>}.'
    )


def with_tool_prompt(messages: Sequence[dict[str, Any]], tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with :func:`tool_prompt` added to the system message (a new one first when there is none)."""
    text = tool_prompt(tools)
    out = [dict(m) for m in messages]
    if out and out[0]["role"] == "system" and isinstance(out[0]["content"], str):
        out[0]["content"] = f"{out[0]['content']}\n\n{text}"
    else:
        out.insert(0, {"role": "system", "content": text})
    return out


def finished_calls(drafts: Sequence[_tool_syntaxes.CallDraft] | None, names: Sequence[str]) -> list[ToolCall] | None:
    """The calls of complete drafts that each name one of ``names`` with a JSON object for arguments, else None."""
    if not drafts:
        return None
    calls = []
    for draft in drafts:
        if not draft.complete or not draft.valid or draft.name is None or draft.name not in names:
            return None
        try:
            arguments = json.loads(draft.arguments)
        except (ValueError, RecursionError):
            return None
        if not isinstance(arguments, Mapping):
            return None
        calls.append(ToolCall(draft.name, draft.arguments))
    return calls


def reading_order(text: str) -> list[tuple[int, _tool_syntaxes.ToolSyntax]]:
    """Where each syntax's calls could begin in ``text``, earliest first (a reply of calls alone at 0)."""
    found = []
    for syntax in _tool_syntaxes.SYNTAXES:
        if syntax.begin:
            start = text.find(syntax.begin)
            if start >= 0:
                found.append((start, syntax))
        elif text.lstrip().startswith(("{", "[")):
            found.append((len(text) - len(text.lstrip()), syntax))
    return sorted(found, key=lambda item: item[0])


def parse_tool_calls(text: str, names: Sequence[str]) -> tuple[str, list[ToolCall]]:
    """The text before the calls and the calls a reply makes; ``(text, [])`` when it makes none."""
    for start, syntax in reading_order(text):
        calls = finished_calls(syntax.read(text[start + len(syntax.begin) :]), names)
        if calls:
            return text[:start].rstrip(), calls
    return text, []
