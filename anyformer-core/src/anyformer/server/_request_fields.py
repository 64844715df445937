"""Every request field the OpenAI endpoints know, and what each becomes (docs/server.md, "Request fields").

A field that is not listed is a 400 naming it: a client that sends one expects something we do not
do. Fields that change nothing in the reply (``user``, ``metadata``, ``store``…) are accepted and
left alone. The fields past the core's own (``max_tokens``, ``temperature``, ``seed``, ``stop``) are
turned here into ``generate`` options: the sampling options, chat ``logprobs``, ``response_format``
(a constraint), the thinking switches (template variables); the backend then honours each or the
core refuses it (:mod:`anyformer._honoured`), and :func:`named_for_http` gives the refusal the
request's own field names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from anyformer.contract._chunk import MAX_LOGPROBS
from anyformer.contract._constraint import Constraint
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._sampling import SAMPLING_OPTIONS
from anyformer.server._errors import bad_request

#: Fields that change nothing in the reply: accepted, and not passed on.
ACCEPTED_UNUSED = frozenset({"user", "metadata", "store", "service_tier", "prediction_id"})
#: What both text endpoints read (``keep_alive``: how long the model stays loaded afterwards, server/_keep_alive.py).
_COMMON = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "n",
        "max_tokens",
        "temperature",
        "seed",
        "stop",
        "keep_alive",
        *SAMPLING_OPTIONS,
    }
)
#: Every field ``/v1/chat/completions`` reads.
CHAT_FIELDS = _COMMON | {
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
    "chat_template_kwargs",
    "anyformer_preview",
}
#: Every field ``/v1/completions`` reads.
COMPLETION_FIELDS = _COMMON | {"prompt", "suffix", "echo", "logprobs", "best_of", "response_format"}
#: Every field ``/v1/embeddings`` reads (``dimensions`` would change the vectors: refused).
EMBEDDING_FIELDS = frozenset({"model", "input", "encoding_format", "keep_alive"})
#: ``reasoning_effort`` values; every one but ``none`` turns thinking on.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
#: The core's option names, in refusals, as the request spells them.
_HTTP_NAMES = {
    "constraint": "response_format",
    "template_variables": "chat_template_kwargs",
    "logprobs": "logprobs",
    "tools": "tools",
    **{name: name for name in SAMPLING_OPTIONS},
}


def refuse_unknown(body: dict[str, Any], known: Iterable[str], endpoint: str) -> None:
    """A 400 naming every field of ``body`` that is neither read nor one of :data:`ACCEPTED_UNUSED`."""
    allowed = frozenset(known) | ACCEPTED_UNUSED
    unknown = sorted(name for name in body if name not in allowed)
    if unknown:
        listed = ", ".join(repr(name) for name in unknown[:8])
        raise bad_request(
            f"{endpoint} does not take {listed}: it would be ignored, so the request is refused (docs/server.md)",
            unknown[0],
        )


def sampling_options(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling options a body gives (the core leaves out values that change nothing, such as
    ``frequency_penalty: 0``, so a backend without penalties does not refuse them)."""
    return {name: body[name] for name in SAMPLING_OPTIONS if body.get(name) is not None}


def chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat ``logprobs`` (true/false) and ``top_logprobs`` (0-20) as the core's ``logprobs`` count, or None."""
    wanted = body.get("logprobs")
    top = body.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise bad_request("'logprobs' must be true or false on /v1/chat/completions", "logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_LOGPROBS):
        raise bad_request(f"'top_logprobs' must be an integer in [0, {MAX_LOGPROBS}]", "top_logprobs")
    if not wanted:
        if top:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    return top or 0


def constraint_of(body: dict[str, Any]) -> dict[str, Any] | None:
    """``response_format`` as a constraint's dict (``text``, or none: None); malformed is a 400 naming it."""
    value = body.get("response_format")
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad_request("'response_format' must be an object with a 'type'", "response_format")
    if value["type"] == "text":
        return None
    try:
        return Constraint.build(value).to_dict()
    except AnyformerError as exc:
        raise bad_request(f"response_format: {exc.message.removeprefix('constraint: ')}", "response_format") from None


def thinking_of(body: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """Whether thinking is on, and the template variables, from ``reasoning_effort`` and ``chat_template_kwargs``.

    ``chat_template_kwargs.enable_thinking`` sets thinking (anyformer's ``thinking``, which every
    backend reads); ``reasoning_effort`` reaches the template as itself and turns thinking on unless
    it is ``none``; other kwargs reach the template as given. Without them thinking stays off.
    """
    variables: dict[str, Any] = {}
    thinking = False
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise bad_request(f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}", "reasoning_effort")
        variables["reasoning_effort"] = effort
        thinking = effort != "none"
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
        kwargs = dict(kwargs)
        enable = kwargs.pop("enable_thinking", None)
        if enable is not None:
            if not isinstance(enable, bool):
                raise bad_request("chat_template_kwargs.enable_thinking must be true or false", "chat_template_kwargs")
            thinking = enable
        variables.update(kwargs)
    return thinking, variables


def named_for_http(exc: AnyformerError) -> AnyformerError:
    """A refusal of options a backend does not honour, naming the request's fields (``param`` set)."""
    if exc.code is not ErrorCode.BAD_REQUEST or getattr(exc, "param", None):
        return exc
    head, sep, rest = exc.message.partition(": not honoured by ")
    names = [name.strip() for name in head.split(",")]
    if not sep or not all(name in _HTTP_NAMES for name in names):
        return exc
    fields = [_HTTP_NAMES[name] for name in names]
    return bad_request(f"{', '.join(fields)}: not honoured by {rest}", fields[0])
