"""What one request may cost before any work is done for it: its JSON, its messages, its sampling numbers.

A body inside the byte limit can still be expensive: ``{"messages": [{}, {}, …]}`` in 8 MB is four
million objects, and building them takes seconds and hundreds of megabytes while the event loop
waits. So a body's JSON values are counted on its bytes before it is parsed (a C-speed count, no
objects built), at most :data:`MAX_JSON_VALUES`; bodies over :data:`INLINE_PARSE_BYTES` are parsed
in worker threads, at most :data:`PARSING_AT_ONCE` at a time, so large bodies queue behind each
other and never behind (or in front of) the small requests of other clients. Messages and content
parts are capped too, and sampling numbers are given one safe meaning each (:func:`sampling_options`).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

from anyformer.server._errors import bad_request

#: The most JSON values (objects, arrays, strings, numbers, literals) and object keys one body may hold.
MAX_JSON_VALUES = 100_000
#: The most messages one chat request may hold.
MAX_MESSAGES = 2_048
#: The most content parts one message may hold, and one request in all.
MAX_PARTS_PER_MESSAGE = 64
MAX_PARTS = 512
#: Bodies up to this size are parsed on the event loop (well under a millisecond); larger ones in threads.
INLINE_PARSE_BYTES = 64 * 1024
#: Large bodies parsed at once (each holds a thread and up to the body's size in memory).
PARSING_AT_ONCE = 2
#: The most inputs and characters one ``/v1/embeddings`` request may give.
MAX_EMBEDDING_INPUTS = 2_048
MAX_EMBEDDING_CHARS = 1_000_000
#: Inputs embedded in one turn at the model; a longer request takes several turns, and others' come between.
EMBEDDING_BATCH = 32
#: Temperatures below this sample as greedy decoding does (5e-324 and -0.0 included): dividing
#: logits by a subnormal overflows to infinity, and the limit of sampling as T -> 0 is the argmax.
GREEDY_BELOW_TEMPERATURE = 1e-3
#: ``top_p`` below this keeps only the likeliest token, as any smaller positive value does.
LEAST_TOP_P = 1e-6
#: ``top_k`` above this cuts nothing (no vocabulary is that large): it is sent as this.
LARGEST_TOP_K = 1_000_000
#: ``max_tokens`` above this is this: a generation ends at the context long before.
LARGEST_MAX_TOKENS = 2**31 - 1

# A JSON string once its escaped quotes are gone: what is inside one is not structure.
_JSON_STRING = re.compile(rb'"[^"]*"')
_T = TypeVar("_T")


def json_value_bound(body: bytes) -> int:
    """An upper bound on the number of JSON values and keys in ``body``, counted without parsing it.

    Every value but the first follows a ``,``, a ``:`` or a ``[`` outside a string, and every key
    precedes a ``:``, so those (``:`` twice), plus one, bound the values and keys. Only C-speed byte counts
    run first; strings are blanked (a regular expression, a microsecond a string) only when the
    counts are over the limit and there are at most :data:`MAX_JSON_VALUES` strings.
    """
    # Escaped backslashes, then escaped quotes, as two other bytes: every quote left delimits a string.
    plain = body.replace(b"\\\\", b"__").replace(b'\\"', b"__") if b"\\" in body else body
    strings = plain.count(b'"') // 2
    if strings > MAX_JSON_VALUES:
        return strings  # each string is a value or a key: over the limit already
    bound = plain.count(b",") + 2 * plain.count(b":") + plain.count(b"[") + 1
    if bound <= MAX_JSON_VALUES or not strings:
        return bound
    structure = _JSON_STRING.sub(b'""', plain)  # commas and colons in prose are not structure
    return structure.count(b",") + 2 * structure.count(b":") + structure.count(b"[") + 1


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(body: bytes) -> Any:
    """``body`` as JSON: at most :data:`MAX_JSON_VALUES` values, strict (no NaN), every string valid UTF-8."""
    values = json_value_bound(body)
    if values > MAX_JSON_VALUES:
        raise bad_request(
            f"the request body holds about {values:,} JSON values and keys; at most {MAX_JSON_VALUES:,} are read"
        )
    try:
        parsed = json.loads(body, parse_constant=_no_constants)
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise bad_request(f"the request body is not valid JSON: {str(exc)[:200]}") from None
    try:  # "\ud800" decodes to a lone surrogate, which nothing downstream can encode
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request("the request body holds a lone UTF-16 surrogate (such as \\ud800)") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
    return parsed


class BodyParser:
    """Parses bodies and checks them (``check``, e.g. ``parse_chat``) without holding the event loop.

    One per application: its semaphore is what makes large bodies take turns.
    """

    def __init__(self, at_once: int = PARSING_AT_ONCE) -> None:
        self._turns = asyncio.Semaphore(at_once)

    async def parse(self, body: bytes, check: Callable[[Any], _T]) -> _T:
        """``check(parse_json(body))``: inline for a small body, else in a thread when a turn is free."""
        if len(body) <= INLINE_PARSE_BYTES:
            return check(parse_json(body))
        async with self._turns:
            return await asyncio.to_thread(lambda: check(parse_json(body)))


def check_message_counts(raw: Any) -> None:
    """Refuse a ``messages`` list over :data:`MAX_MESSAGES`, or content parts over their caps (400)."""
    if not isinstance(raw, list):
        return  # the schema says what is wrong with it
    if len(raw) > MAX_MESSAGES:
        raise bad_request(f"'messages' holds {len(raw):,} messages; at most {MAX_MESSAGES:,} are read", "messages")
    parts = 0
    for index, message in enumerate(raw):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            if len(content) > MAX_PARTS_PER_MESSAGE:
                raise bad_request(
                    f"messages[{index}].content holds {len(content):,} parts; at most {MAX_PARTS_PER_MESSAGE} "
                    "per message",
                    "messages",
                )
            parts += len(content)
    if parts > MAX_PARTS:
        raise bad_request(f"the messages hold {parts:,} content parts; at most {MAX_PARTS} in all", "messages")


def check_embedding_inputs(inputs: list[str]) -> None:
    """Refuse more than :data:`MAX_EMBEDDING_INPUTS` inputs, :data:`MAX_EMBEDDING_CHARS` characters, or an empty one."""
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise bad_request(f"'input' lists {len(inputs):,} texts; at most {MAX_EMBEDDING_INPUTS:,} per request", "input")
    total = sum(len(text) for text in inputs)
    if total > MAX_EMBEDDING_CHARS:
        raise bad_request(f"'input' holds {total:,} characters; at most {MAX_EMBEDDING_CHARS:,} per request", "input")
    empty = next((index for index, text in enumerate(inputs) if not text), None)
    if empty is not None:
        raise bad_request(f"'input'[{empty}] is empty; every input must hold some text", "input")


def embedding_batches(inputs: list[str]) -> list[list[str]]:
    """``inputs`` in turns of at most :data:`EMBEDDING_BATCH`, in order."""
    return [inputs[start : start + EMBEDDING_BATCH] for start in range(0, len(inputs), EMBEDDING_BATCH)]


def _number(value: Any) -> float | None:
    """``value`` when it is a finite JSON number (not a boolean), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def sampling_options(options: dict[str, Any]) -> dict[str, Any]:
    """The sampling numbers of a request with their edge values given one safe meaning.

    Out-of-range values are left for the core's checks to refuse (400); in-range values that no
    sampler computes safely are mapped to the value that means the same: a temperature below
    :data:`GREEDY_BELOW_TEMPERATURE` (subnormals, ``-0.0``) is greedy (0), a ``top_p`` below
    :data:`LEAST_TOP_P` is that (the likeliest token alone either way), a ``top_k`` past
    :data:`LARGEST_TOP_K` is that (no cut either way), and ``max_tokens`` past :data:`LARGEST_MAX_TOKENS` is that.
    """
    result = dict(options)
    temperature = _number(result.get("temperature"))
    if temperature is not None and 0 <= temperature < GREEDY_BELOW_TEMPERATURE:
        result["temperature"] = 0.0
    top_p = _number(result.get("top_p"))
    if top_p is not None and 0 < top_p < LEAST_TOP_P:
        result["top_p"] = LEAST_TOP_P
    top_k = result.get("top_k")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > LARGEST_TOP_K:
        result["top_k"] = LARGEST_TOP_K
    most = result.get("max_new_tokens")
    if isinstance(most, int) and not isinstance(most, bool) and most > LARGEST_MAX_TOKENS:
        result["max_new_tokens"] = LARGEST_MAX_TOKENS
    return result
