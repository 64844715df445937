"""Chat message validation: every backend receives well-formed messages or none (docs/contract.md, "Streaming")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode

#: The roles a chat message may have.
ROLES = frozenset({"system", "user", "assistant", "tool"})

#: A validated message: ``{"role": str, "content": str | list[block]}``.
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
        if "content" not in message:
            raise _bad(index, "has no 'content'")
        content = message["content"]
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
            if not content:
                raise _bad(index, "content is an empty list of blocks")
            out.append({"role": role, "content": [_check_block(index, i, b) for i, b in enumerate(content)]})
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
