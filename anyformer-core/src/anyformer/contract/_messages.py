"""Chat message validation: every backend receives well-formed messages or none (docs/contract.md, "Streaming")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode

#: The roles a chat message may have.
ROLES = frozenset({"system", "user", "assistant", "tool"})

#: A validated message: ``{"role": str, "content": str | list[block]}``, and on an assistant message
#: ``tool_calls`` (``[{"id", "type": "function", "function": {"name", "arguments": dict}}]``), on a
#: tool message ``tool_call_id`` and ``name``, as transformers' chat templates read them.
Message = dict[str, Any]


def _bad(index: int, why: str) -> AnyformerError:
    return AnyformerError(ErrorCode.BAD_REQUEST, f"messages[{index}]: {why}")


def _check_block(index: int, position: int, block: Any) -> dict[str, Any]:
    if not isinstance(block, Mapping):
        raise _bad(index, f"content[{position}] must be an object with a 'type'")
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        if not isinstance(text, str):
            raise _bad(index, f"content[{position}] is a text block without a string 'text'")
        return {"type": "text", "text": text}
    if kind == "image":
        image = block.get("image")
        if not (isinstance(image, (str, bytes, bytearray, memoryview)) or _is_array(image)):
            raise _bad(index, f"content[{position}] is an image block whose 'image' is not a path, bytes or array")
        if isinstance(image, (str, bytes, bytearray)) and not image:
            raise _bad(index, f"content[{position}] is an image block with an empty 'image'")
        return {"type": "image", "image": image}
    if kind == "audio":
        return {"type": "audio", "audio": _check_audio(index, position, block.get("audio"))}
    raise _bad(index, f"content[{position}] has unknown type {kind!r} (text, image or audio)")


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "__array__")


def _check_audio(index: int, position: int, audio: Any) -> Any:
    """An audio block's ``audio``: a path, a file's bytes, an array of samples, or ``{"raw", "sampling_rate"}``."""
    if isinstance(audio, Mapping):
        samples = audio.get("raw", audio.get("array"))
        rate = audio.get("sampling_rate")
        if not (_is_array(samples) or isinstance(samples, list)) or isinstance(rate, bool) or not isinstance(rate, int):
            why = "is an audio block whose dict needs 'raw' samples and an int 'sampling_rate'"
            raise _bad(index, f"content[{position}] {why}")
        return {"raw": samples, "sampling_rate": rate}
    if not (isinstance(audio, (str, bytes, bytearray, memoryview)) or _is_array(audio)):
        raise _bad(index, f"content[{position}] is an audio block whose 'audio' is not a path, bytes, array or dict")
    if isinstance(audio, (str, bytes, bytearray)) and not audio:
        raise _bad(index, f"content[{position}] is an audio block with an empty 'audio'")
    return audio


def _tool_calls(index: int, calls: Any) -> list[dict[str, Any]]:
    """An assistant's ``tool_calls``, with each call's ``arguments`` as a dict (a JSON string is decoded)."""
    import json

    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        raise _bad(index, "tool_calls must be a list of {'id', 'type': 'function', 'function'} objects")
    out = []
    for position, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise _bad(index, f"tool_calls[{position}] needs a 'function' with a string 'name'")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError):
                raise _bad(index, f"tool_calls[{position}]: 'arguments' is not JSON") from None
        if not isinstance(arguments, Mapping):
            raise _bad(index, f"tool_calls[{position}]: 'arguments' must be a JSON object")
        checked: dict[str, Any] = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
        if isinstance(call.get("id"), str):
            checked["id"] = call["id"]
        out.append(checked)
    return out


def _tool_fields(index: int, role: str, message: Mapping[str, Any]) -> dict[str, Any]:
    """The tool fields a message carries: ``tool_calls`` on an assistant's, ``tool_call_id``/``name`` on a tool's."""
    fields: dict[str, Any] = {}
    if message.get("tool_calls") is not None:
        if role != "assistant":
            raise _bad(index, "only an assistant message has tool_calls")
        fields["tool_calls"] = _tool_calls(index, message["tool_calls"])
    for name in ("tool_call_id", "name"):
        value = message.get(name)
        if value is not None:
            if role != "tool" or not isinstance(value, str):
                raise _bad(index, f"'{name}' is a string on a tool message only")
            fields[name] = value
    return fields


def validate_messages(messages: Any) -> list[Message]:
    """Check chat messages and return a normalised copy; anything malformed raises ``BAD_REQUEST``.

    A plain string is taken as one user message, as the CLI and simple callers send it.
    """
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not isinstance(messages, Sequence) or isinstance(messages, (bytes, bytearray)):
        raise AnyformerError(ErrorCode.BAD_REQUEST, "messages must be a list of {'role', 'content'} objects")
    if not messages:
        raise AnyformerError(ErrorCode.BAD_REQUEST, "messages is empty: send at least one message")
    out: list[Message] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise _bad(index, f"must be an object with 'role' and 'content', got {type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise _bad(index, f"role must be one of {', '.join(sorted(ROLES))}, got {role!r}")
        fields = _tool_fields(index, role, message)
        if "content" not in message and not fields.get("tool_calls"):
            raise _bad(index, "has no 'content'")
        content = message.get("content")
        if content is None and fields.get("tool_calls"):
            content = ""  # an assistant turn that only calls tools
        if isinstance(content, str):
            out.append({"role": role, "content": content, **fields})
        elif isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
            if not content:
                raise _bad(index, "content is an empty list of blocks")
            out.append({"role": role, "content": [_check_block(index, i, b) for i, b in enumerate(content)], **fields})
        else:
            raise _bad(index, f"content must be a string or a list of blocks, got {type(content).__name__}")
    return out


def has_images(messages: Sequence[Message]) -> bool:
    """True when any message carries an image block."""
    return any(isinstance(m["content"], list) and any(b["type"] == "image" for b in m["content"]) for m in messages)


def has_audio(messages: Sequence[Message]) -> bool:
    """True when any message carries an audio block."""
    return any(isinstance(m["content"], list) and any(b["type"] == "audio" for b in m["content"]) for m in messages)


def text_of(content: str | list[dict[str, Any]]) -> str:
    """The text of a message's content: the string itself, or its text blocks joined by newlines."""
    if isinstance(content, str):
        return content
    return "\n".join(b["text"] for b in content if b["type"] == "text")
