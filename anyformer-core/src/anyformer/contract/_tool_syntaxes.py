"""The tool-call syntaxes chat templates teach, each read from a reply's text as far as it has come.

Every syntax begins at a marker (:attr:`ToolSyntax.begin`) and its reader turns the text after it
into :class:`CallDraft` records: a call's name once its text is whole, its arguments' text as it
grows, and whether the call is complete. The same reader serves a whole reply and a stream that
is still arriving, so a streamed call adds up to exactly the call read whole. The syntaxes:

==================  ===================================================================================
``hermes``          ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block a call (Qwen
                    2.5/3, Hermes, Granite 4, SmolLM3)
``tool_call_token`` ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`` (Granite 3.x; Phi-4's
                    ``<|tool_call|>...<|/tool_call|>``)
``functools``       ``functools[{"name": ..., "arguments": {...}}, ...]`` (Phi-4-mini)
``mistral``         ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``, or ``[TOOL_CALLS]name[ARGS]{...}``
                    (Mistral's v11 tokenizers: Mistral Small 3.2, Magistral, Devstral)
``python_tag``      ``<|python_tag|>{"name": ..., "parameters": {...}}`` (Llama 3.1-3.3), ``;`` between calls
``gemma4``          ``<|tool_call>call:name{key:<|"|>text<|"|>,n:3}<tool_call|>`` (Gemma 4)
``tool_code``       a ```` ```tool_code ```` block of Python calls ``name(key="value")`` (Gemma 3's convention)
``json``            a reply that is only ``{"name": ..., "arguments"|"parameters": {...}}`` or a list of them
                    (Llama 3.x's JSON calls, Gemma 3's JSON convention, any forced call)
``pythonic``        a reply that is only ``[name(key="value"), ...]`` (Llama 3.2/4's pythonic calls,
                    Gemma 3's Python convention)
==================  ===================================================================================

Python-style arguments are read with :mod:`ast` (literals only: nothing is evaluated).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

#: The longest call text read as Python (a parse of more is refused: ``ast`` on huge input is slow).
MAX_PYTHON_CHARS = 64 * 1024


@dataclasses.dataclass
class CallDraft:
    """One call as far as its text has come.

    ``name`` is set once the name's text is whole; ``arguments`` is the arguments' JSON text so far
    (only ever growing: a stream sends what is new); ``complete`` once the call's text has ended.
    Where the syntax writes the arguments other than as JSON (Python, Gemma 4) the name and the
    arguments are set together when the call is complete; ``valid`` is False when they do not read.
    """

    name: str | None = None
    arguments: str = ""
    complete: bool = False
    valid: bool = True


@dataclasses.dataclass(frozen=True)
class ToolSyntax:
    """A syntax: where it begins in a reply and how the text after that is read."""

    name: str
    #: The marker the calls begin with; empty for a reply that is the calls alone (``json``, ``pythonic``).
    begin: str
    #: The text after ``begin`` as calls so far; None when it cannot be this syntax's calls.
    read: Callable[[str], list[CallDraft] | None]


# ---- JSON calls -----------------------------------------------------------------------------------

_ARGUMENT_KEYS = ("arguments", "parameters")
_WHITESPACE = " \t\r\n"
#: What may stand between two calls written as JSON (Llama 3.x writes ``;``).
_SEPARATORS = ",;"


class _JsonCalls:
    """Reads a run of JSON call objects (``{...}``, or ``[{...}, ...]``) and where it stops.

    Only the call objects' own keys are looked at (``name`` and ``arguments``/``parameters``); their
    values are kept as text spans, so the arguments' text is the model's, byte for byte.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.drafts: list[CallDraft] = []
        self.end = 0  # where the run of JSON stopped (what follows is not part of it)
        self.ok = True

    def read(self) -> _JsonCalls:
        text, i = self.text, 0
        stack: list[str] = []
        call_level = 0  # how many brackets hold a call object's keys: 1 for {...}, 2 for [{...}]
        key: str | None = None
        key_start = value_start = -1
        spans: dict[str, tuple[int, int]] = {}
        in_string = escaped = False
        while i < len(text):
            char = text[i]
            if in_string:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == '"':
                    in_string = False
                    if len(stack) == call_level and stack[-1] == "{" and key_start >= 0 and value_start < 0:
                        key = _string(text[key_start : i + 1])
                i += 1
                continue
            if char == '"':
                if not stack:
                    self.end = i
                    return self  # a bare string is no call: the JSON run ends before it
                in_string = True
                if len(stack) == call_level and key is None and value_start < 0:
                    key_start = i
            elif char in "{[":
                if not stack:
                    call_level = 1 if char == "{" else 2
                elif len(stack) == 1 and call_level == 2 and char != "{":
                    self.ok = False  # a list of something other than call objects
                    return self
                stack.append(char)
                if len(stack) == call_level and char == "{":
                    self.drafts.append(CallDraft())
                    key, key_start, value_start, spans = None, -1, -1, {}
            elif char in "}]":
                if not stack or {"}": "{", "]": "["}[char] != stack[-1]:
                    self.ok = False
                    return self
                if len(stack) == call_level and key is not None and value_start >= 0:
                    spans[key] = (value_start, i)
                stack.pop()
                if len(stack) == call_level - 1 and char == "}":
                    self._fill(spans, complete=True)
                if not stack:
                    self.end = i + 1
            elif char == ":" and len(stack) == call_level and key is not None and value_start < 0:
                value_start = i + 1
            elif char == "," and len(stack) == call_level and stack[-1] == "{":
                if key is not None and value_start >= 0:
                    spans[key] = (value_start, i)
                key, key_start, value_start = None, -1, -1
            elif not stack and char not in _WHITESPACE and char not in _SEPARATORS:
                self.end = i
                return self  # the JSON ended: what follows is something else
            i += 1
        self.end = len(text)
        if len(stack) >= call_level and self.drafts:  # a call still open: what it has so far
            open_value = {key: (value_start, -1)} if key is not None and value_start >= 0 else {}
            self._fill({**spans, **open_value}, complete=False)
        return self

    def _fill(self, spans: dict[str, tuple[int, int]], complete: bool) -> None:
        draft = self.drafts[-1]
        if draft.complete:
            return
        name_span = spans.get("name")
        if name_span is not None and name_span[1] >= 0:
            name = _string(self.text[name_span[0] : name_span[1]].strip())
            draft.name = name if isinstance(name, str) else None
            draft.valid = draft.valid and isinstance(name, str)
        found = next((spans[k] for k in _ARGUMENT_KEYS if k in spans), None)
        if found is not None:
            start, stop = found
            raw = self.text[start : stop if stop >= 0 else len(self.text)].strip()
            if raw.startswith('"'):  # arguments written as a JSON string: decoded once whole
                if stop >= 0 or complete:
                    decoded = _string(raw)
                    draft.arguments = decoded if isinstance(decoded, str) else ""
            else:
                draft.arguments = raw
        if complete:
            draft.complete = True
            draft.arguments = draft.arguments or "{}"


def _string(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _json_run(body: str) -> list[CallDraft] | None:
    """Calls that are JSON objects one after another (``;`` or ``,`` between), to the text's end."""
    run = _JsonCalls(body).read()
    if not run.ok or body[run.end :].strip():
        return None
    return run.drafts


def _json_then(closing: str) -> Callable[[str], list[CallDraft] | None]:
    """Calls as JSON, then ``closing`` (or the end of the reply, for a closing the model may leave out)."""

    def read(body: str) -> list[CallDraft] | None:
        run = _JsonCalls(body).read()
        rest = body[run.end :].strip()
        if not run.ok or not (rest == closing or closing.startswith(rest)):
            return None
        return run.drafts

    return read


def _hermes(body: str) -> list[CallDraft] | None:
    """``<tool_call>`` blocks: each block's JSON, then ``</tool_call>`` and perhaps the next block."""
    drafts: list[CallDraft] = []
    for block in body.split("<tool_call>"):
        inner, closed, after = block.partition("</tool_call>")
        found = _json_run(inner)
        if found is None or (closed and after.strip()) or (not closed and after):
            return None
        drafts.extend(found)
    return drafts


def _python_tag(body: str) -> list[CallDraft] | None:
    return _json_run(body.replace("<|eom_id|>", " "))


def _mistral(body: str) -> list[CallDraft] | None:
    """``[{...}, ...]``, or v11's ``name[ARGS]{...}`` with ``[TOOL_CALLS]`` before each further call."""
    if body.lstrip().startswith("[") or not body.strip():
        return _json_run(body)
    drafts: list[CallDraft] = []
    for part in body.split("[TOOL_CALLS]"):
        name, marked, arguments = part.partition("[ARGS]")
        draft = CallDraft(name=name.strip() if marked else None)
        if not marked:  # the name so far, perhaps with the start of its [ARGS]
            head, bracket, tail = name.strip().partition("[")
            if not _NAME_PREFIX.fullmatch(head) or (bracket and not "[ARGS]".startswith(bracket + tail)):
                return None
        else:
            run = _JsonCalls(arguments).read()
            if not run.ok or arguments[run.end :].strip():
                return None
            draft.arguments = arguments.strip()
            draft.complete = run.end > 0 and arguments[: run.end].strip().endswith("}")
        drafts.append(draft)
    return drafts


_NAME_PREFIX = re.compile(r"[A-Za-z0-9_-]{0,64}")


# ---- Gemma 4's own value syntax -------------------------------------------------------------------

_GEMMA_QUOTE = '<|"|>'
_GEMMA_CALL = re.compile(r"call:([A-Za-z0-9_-]{1,64})\{")
_BARE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def gemma_arguments_json(text: str) -> str | None:
    """Gemma 4's ``{key:<|"|>text<|"|>,n:3,xs:[1,2]}`` as JSON text, or None when it does not read."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith(_GEMMA_QUOTE, i):
            end = text.find(_GEMMA_QUOTE, i + len(_GEMMA_QUOTE))
            if end < 0:
                return None
            out.append(json.dumps(text[i + len(_GEMMA_QUOTE) : end], ensure_ascii=False))
            i = end + len(_GEMMA_QUOTE)
            continue
        char = text[i]
        if char == '"':  # a JSON string, as some Gemma 4 replies write them
            run = re.compile(r'"(?:[^"\\]|\\.)*"').match(text, i)
            if run is None:
                return None
            out.append(run.group())
            i = run.end()
            continue
        key = _BARE_KEY.match(text, i)
        if key is not None and text[key.end() : key.end() + 1] == ":" and out and out[-1].rstrip()[-1:] in "{,":
            out.append(json.dumps(key.group()))
            i = key.end()
            continue
        out.append(char)
        i += 1
    converted = "".join(out)
    value = _string(converted)
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None


def _gemma4(body: str) -> list[CallDraft] | None:
    """``call:name{...}<tool_call|>``, each further call after its own ``<|tool_call>``."""
    drafts: list[CallDraft] = []
    for block in body.split("<|tool_call>"):
        inner, closed, after = block.partition("<tool_call|>")
        if (closed and after.strip()) or (not closed and after):
            return None
        found = _GEMMA_CALL.match(inner)
        if found is None:
            if not "call:".startswith(inner[:5]) or len(inner) > 5 + 64:
                return None
            drafts.append(CallDraft())
            continue
        draft = CallDraft()  # the name waits for the whole call, as its arguments do (they are made JSON then)
        if closed:
            arguments = gemma_arguments_json(inner[found.end() - 1 :])
            draft.name, draft.complete = found.group(1), True
            draft.valid, draft.arguments = arguments is not None, arguments or ""
        drafts.append(draft)
    return drafts


# ---- Python calls ---------------------------------------------------------------------------------

_PYTHON_NAME = re.compile(r"\s*(?:print\()?\s*([A-Za-z_][A-Za-z0-9_-]{0,63})\(")


def python_calls(source: str) -> list[tuple[str, str]] | None:
    """``name(key=value, ...)`` calls (one a line, or a ``[...]`` list) as (name, JSON arguments); literals only."""
    if len(source) > MAX_PYTHON_CHARS:
        return None
    try:
        tree = ast.parse(source.strip(), mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    calls: list[ast.expr] = []
    for statement in tree.body:
        if not isinstance(statement, ast.Expr):
            return None
        value = statement.value
        calls.extend(value.elts if isinstance(value, ast.List) else [value])
    out = []
    for call in calls:
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print":
            call = call.args[0] if len(call.args) == 1 and not call.keywords else call  # print(f(x=1))
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args:
            return None
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
            text = json.dumps(arguments, ensure_ascii=False)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        out.append((call.func.id, text))
    return out or None


def _python_drafts(source: str, complete: bool) -> list[CallDraft] | None:
    if complete:
        calls = python_calls(source)
        if calls is None:
            return None
        return [CallDraft(name=name, arguments=arguments, complete=True) for name, arguments in calls]
    # The name waits for the whole call (the arguments come whole then too): a call that never closes sends nothing.
    if _PYTHON_NAME.match(source.lstrip("[")) is None and re.search(r"[^\sA-Za-z0-9_\-(\[]", source):
        return None
    return [CallDraft()]


def _tool_code(body: str) -> list[CallDraft] | None:
    """A ```` ```tool_code ```` block's calls (the marker taken, up to the closing fence)."""
    inner, closed, after = body.partition("```")
    if closed and after.strip():
        return None
    return _python_drafts(inner, complete=bool(closed))


def _pythonic(body: str) -> list[CallDraft] | None:
    """A reply that is ``[name(key=value), ...]``: complete once its brackets close."""
    stripped = body.strip()
    if not stripped.startswith("["):
        return None
    if stripped.endswith(")]") and python_calls(stripped) is not None:
        return _python_drafts(stripped, complete=True)
    return _python_drafts(stripped, complete=False)


#: Every syntax read, in the order a reply is tried (markers first; a reply that is calls alone last).
SYNTAXES: tuple[ToolSyntax, ...] = (
    ToolSyntax("hermes", "<tool_call>", _hermes),
    ToolSyntax("tool_call_token", "<|tool_call|>", _json_then("<|/tool_call|>")),
    ToolSyntax("functools", "functools", _json_run),
    ToolSyntax("mistral", "[TOOL_CALLS]", _mistral),
    ToolSyntax("python_tag", "<|python_tag|>", _python_tag),
    ToolSyntax("gemma4", "<|tool_call>", _gemma4),
    ToolSyntax("tool_code", "```tool_code", _tool_code),
    ToolSyntax("json", "", _json_run),
    ToolSyntax("pythonic", "", _pythonic),
)

#: The markers calls begin with (a reply that opens with ``{`` or ``[`` may be calls too).
MARKERS = tuple(syntax.begin for syntax in SYNTAXES if syntax.begin)

#: Every piece of tool-call markup the syntaxes read, as a tokenizer may hold it in one special token: an engine
#: that drops special tokens from its text keeps these (the calls are read from the text).
TOOL_MARKUP = frozenset({*MARKERS, "</tool_call>", "<|/tool_call|>", "[ARGS]", "<tool_call|>", _GEMMA_QUOTE})
