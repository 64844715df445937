"""Tool definitions and extra chat template variables, checked before a backend renders them."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode

#: The most tools one generation may define.
MAX_TOOLS = 128
#: The largest tool list or variables, as JSON characters.
MAX_TOOLS_CHARS = 256 * 1024
#: A function name OpenAI accepts: letters, digits, ``_`` and ``-``, at most 64.
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Names the renderer itself sets: a variable may not replace them.
RESERVED_VARIABLES = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "enable_thinking", "raise_exception"}
)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def _bad(why: str) -> AnyformerError:
    return AnyformerError(ErrorCode.BAD_REQUEST, why)


def _json_size(value: Any, what: str) -> None:
    try:
        size = len(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise _bad(f"{what} must be JSON data ({exc})") from None
    if size > MAX_TOOLS_CHARS:
        raise _bad(f"{what} is {size:,} characters of JSON; at most {MAX_TOOLS_CHARS:,}")


def check_tools(tools: Any) -> tuple[dict[str, Any], ...]:
    """Tool definitions as ``{"type": "function", "function": {"name", "description", "parameters"}}``.

    A bare ``{"name", "parameters"}`` (as some clients send) is taken as the function itself.
    ``BAD_REQUEST`` names the first malformed tool.
    """
    if tools is None:
        return ()
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise _bad("tools must be a list of {'type': 'function', 'function': {...}} objects")
    if len(tools) > MAX_TOOLS:
        raise _bad(f"tools lists {len(tools)} tools; at most {MAX_TOOLS}")
    out = []
    names: set[str] = set()
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise _bad(f"tools[{index}] must be an object")
        function = tool.get("function", tool) if tool.get("type", "function") == "function" else None
        if not isinstance(function, Mapping):
            raise _bad(f"tools[{index}]: only type 'function' tools are supported, got {tool.get('type')!r:.40}")
        name = function.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
            raise _bad(f"tools[{index}]: the function needs a 'name' of 1-64 letters, digits, '_' or '-'")
        if name in names:
            raise _bad(f"tools[{index}]: a second function named {name!r}")
        names.add(name)
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, Mapping):
            raise _bad(f"tools[{index}] ({name}): 'parameters' must be a JSON schema object")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise _bad(f"tools[{index}] ({name}): 'description' must be a string")
        checked: dict[str, Any] = {"name": name, "parameters": dict(parameters)}
        if description is not None:
            checked["description"] = description
        out.append({"type": "function", "function": checked})
    _json_size(out, "tools")
    return tuple(out)


def check_variables(variables: Any) -> dict[str, Any]:
    """Extra chat template variables: identifiers to JSON data, none of :data:`RESERVED_VARIABLES`."""
    if variables is None:
        return {}
    if not isinstance(variables, Mapping):
        raise _bad("template_variables must be an object of names to values")
    for name in variables:
        if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
            raise _bad(f"template variable {name!r:.40} is not a name (letters, digits and '_')")
        if name in RESERVED_VARIABLES:
            raise _bad(f"template variable {name!r} is set by anyformer itself (thinking=, tools=, messages)")
    _json_size(dict(variables), "template_variables")
    return dict(variables)


def function_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """The function names of checked tool definitions, in order."""
    return [tool["function"]["name"] for tool in tools]
