"""Tool calls: ``tool_choice``, the constraint that forces a valid call, and the calls read back from a reply.

Replies are read in the syntaxes chat templates teach (whichever the reply uses, so no template
needs recognising): Qwen/Hermes ``<tool_call>{"name", "arguments"}</tool_call>`` (one block a call),
Llama 3.x ``<|python_tag|>{"name", "parameters"}`` or a reply that is that JSON object alone
(``;``-separated for several), Mistral ``[TOOL_CALLS][{"name", "arguments"}, ...]``. A call counts
only when it names one of the request's tools and its arguments are a JSON object; otherwise the
reply stays text. ``tool_choice="required"`` or a named function constrains decoding to
``{"name": ..., "arguments": {...}}`` valid against the function's parameters
(:func:`call_constraint`), which the last rule reads back.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from anyformer.contract._constraint import Constraint
from anyformer.contract._errors import AnyformerError, ErrorCode

#: Where a tool call begins in each syntax read (a reply that opens with ``{`` is the fourth).
MARKERS = ("<tool_call>", "<|python_tag|>", "[TOOL_CALLS]")
_HERMES_END = "</tool_call>"


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


def _json_values(text: str) -> list[Any] | None:
    """Every JSON value in ``text`` one after another (``;``, ``,`` or whitespace between), or None."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    position = 0
    while True:
        while position < len(text) and text[position] in " \t\r\n;,":
            position += 1
        if position == len(text):
            return values
        try:
            value, position = decoder.raw_decode(text, position)
        except (ValueError, RecursionError):
            return None
        values.append(value)


def _call_of(value: Any, names: Sequence[str]) -> ToolCall | None:
    if not isinstance(value, Mapping) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, Mapping):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _calls_of(values: list[Any] | None, names: Sequence[str]) -> list[ToolCall] | None:
    if not values:
        return None
    flat = [item for value in values for item in (value if isinstance(value, list) else [value])]
    calls = [_call_of(item, names) for item in flat]
    return None if not calls or any(call is None for call in calls) else [c for c in calls if c is not None]


def parse_tool_calls(text: str, names: Sequence[str]) -> tuple[str, list[ToolCall]]:
    """The text before the calls and the calls a reply makes; ``(text, [])`` when it makes none."""
    start = text.find("<tool_call>")
    if start >= 0:
        blocks = text[start:].split("<tool_call>")[1:]
        values: list[Any] = []
        for block in blocks:
            body = block.split(_HERMES_END, 1)[0]
            found = _json_values(body)
            if found is None:
                return text, []
            values.extend(found)
        calls = _calls_of(values, names)
        return (text[:start].rstrip(), calls) if calls else (text, [])
    for marker in ("<|python_tag|>", "[TOOL_CALLS]"):
        start = text.find(marker)
        if start >= 0:
            calls = _calls_of(_json_values(text[start + len(marker) :].replace("<|eom_id|>", "")), names)
            return (text[:start].rstrip(), calls) if calls else (text, [])
    if text.lstrip().startswith(("{", "[")):
        calls = _calls_of(_json_values(text.strip()), names)
        if calls:
            return "", calls
    return text, []


class ToolCallStream:
    """Streams a reply's text while holding back what may be a tool call, then gives the calls at the end.

    Text before a marker goes out as it comes; from a marker (or a reply that opens with ``{`` or
    ``[``) on, everything waits for :meth:`finish`, which reads the calls or, when there are none,
    returns the held text as text.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self._names = list(names)
        self._held = ""
        self._sent_any = False
        self._holding = False

    def feed(self, delta: str) -> str:
        """The text that can go out now."""
        text = self._held + delta
        if self._holding:
            self._held = text
            return ""
        if not self._sent_any and text.lstrip().startswith(("{", "[")):
            self._holding, self._held = True, text
            return ""
        if not self._sent_any and not text.strip():
            self._held = text  # leading whitespace: what follows decides
            return ""
        cut = min((i for i in (text.find(m) for m in MARKERS) if i >= 0), default=-1)
        if cut >= 0:
            self._holding, self._held = True, text[cut:]
            out = text[:cut]
        else:
            keep = max((_partial(text, marker) for marker in MARKERS), default=0)
            out, self._held = text[: len(text) - keep], text[len(text) - keep :]
        self._sent_any = self._sent_any or bool(out.strip())
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The rest of the text and the calls; the calls are empty when the held text was no call."""
        held, self._held = self._held, ""
        rest, calls = parse_tool_calls(held, self._names)
        return (rest, calls) if calls else (held, [])


def _partial(text: str, marker: str) -> int:
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
