"""OpenAI request bodies checked and turned into anyformer calls, and the response objects built back.

Every field is read or refused (:mod:`anyformer.server._request_fields` lists them): a field the
server does not know is a 400 naming it, never silently ignored. Anything malformed raises
``BAD_REQUEST`` naming the field in ``param``.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import time
import uuid
from collections.abc import Sequence
from typing import Any

from anyformer.contract._chunk import MAX_LOGPROBS, GenerateOptions, TokenLogprob
from anyformer.contract._errors import AnyformerError
from anyformer.contract._messages import Message, validate_messages
from anyformer.server._errors import bad_request
from anyformer.server._limits import check_embedding_inputs, check_message_counts
from anyformer.server._limits import sampling_options as clamped_sampling
from anyformer.server._request_fields import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    EMBEDDING_FIELDS,
    chat_logprobs,
    constraint_of,
    refuse_unknown,
    sampling_options,
    thinking_of,
)

#: Tokens generated when a request names no ``max_tokens``.
DEFAULT_MAX_TOKENS = 1024
#: The task of models ``/v1/embeddings`` loads.
EMBEDDING_TASK = "feature-extraction"
#: OpenAI's role for system instructions in newer models; anyformer calls it ``system``.
_ROLE_ALIASES = {"developer": "system"}
#: The core's option names and the request fields they come from, for ``param`` in errors.
_PARAMS = {
    "max_new_tokens": "max_tokens",
    "temperature": "temperature",
    "seed": "seed",
    "stop": "stop",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repeat_penalty": "repeat_penalty",
    "logit_bias": "logit_bias",
    "constraint": "response_format",
    "template variable": "chat_template_kwargs",
    "tools": "tools",
    "tool_choice": "tool_choice",
}
#: The longest model name a request may give: Hub ids are under 100 characters, paths a few hundred.
MAX_MODEL_CHARS = 1024


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """A chat or completion request, checked: the model, the messages and the ``generate`` options."""

    model: str
    messages: list[Message]
    options: dict[str, Any]
    stream: bool = False
    include_usage: bool = False
    #: ``anyformer_preview: true`` (chat, streamed): send each chunk's provisional text as ``delta.anyformer_preview``.
    preview: bool = False
    #: ``/v1/completions``: the raw prompts to continue (no chat template), one choice each.
    prompts: tuple[str, ...] = ()
    #: ``/v1/completions`` ``echo``: each choice's text begins with its prompt.
    echo: bool = False
    #: Chat with thinking asked for: the reply may begin inside its reasoning (the template opened ``<think>``).
    thinking: bool = False


def _model_of(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_request("'model' must be a non-empty string: an id GET /v1/models lists", "model")
    if len(model) > MAX_MODEL_CHARS:
        raise bad_request(f"'model' is {len(model):,} characters; at most {MAX_MODEL_CHARS} are read", "model")
    if any(ord(c) < 32 or ord(c) == 127 for c in model):
        raise bad_request("'model' holds a control character", "model")
    return model.strip()


def _image_bytes(url: Any, where: str) -> bytes:
    if not isinstance(url, str) or not url.startswith("data:"):
        raise bad_request(
            f"{where}: only data: URLs are read (the server fetches nothing); got {str(url)[:40]!r}", where
        )
    header, _, payload = url.partition(",")
    if ";base64" not in header:
        raise bad_request(f"{where}: a data URL must be base64 encoded", where)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where}: the data URL is not valid base64", where) from None
    if not data:
        raise bad_request(f"{where}: the image is empty", where)
    return data


def _audio_bytes(part: Any, where: str) -> bytes:
    """An ``input_audio`` part's file bytes: ``{"data": base64, "format": "wav"}`` (WAV is what backends decode)."""
    audio = part.get("input_audio")
    if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
        raise bad_request(f"{where}: an input_audio part needs {{'data': base64, 'format': 'wav'}}", where)
    if audio.get("format", "wav") != "wav":
        raise bad_request(f"{where}: audio format {audio.get('format')!r}; send WAV ('format': 'wav')", where)
    try:
        data = base64.b64decode(audio["data"], validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where}: the audio data is not valid base64", where) from None
    if not data:
        raise bad_request(f"{where}: the audio is empty", where)
    return data


def _content_of(content: Any, index: int) -> Any:
    """OpenAI content parts as anyformer blocks: text stays text, data-URL images and input audio become bytes."""
    if content is None:
        return ""
    if not isinstance(content, list):
        return content  # a string, or something validate_messages refuses with the reason
    blocks: list[Any] = []
    for position, part in enumerate(content):
        where = f"messages[{index}].content[{position}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            blocks.append({"type": "image", "image": _image_bytes(url, where)})
        elif kind == "input_audio":
            blocks.append({"type": "audio", "audio": _audio_bytes(part, where)})
        elif kind in ("text", "input_text"):
            blocks.append({"type": "text", "text": part.get("text")})
        else:
            raise bad_request(f"{where}: unknown part type {kind!r} (text, image_url or input_audio)", "messages")
    return blocks


def _messages_of(raw: Any) -> list[Message]:
    if not isinstance(raw, list):
        raise bad_request("'messages' must be a list of {role, content} objects", "messages")
    check_message_counts(raw)
    converted = []
    for index, message in enumerate(raw):
        if not isinstance(message, dict):
            raise bad_request(f"messages[{index}] must be an object with 'role' and 'content'", "messages")
        role = message.get("role")
        role = _ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
        entry = {"role": role, "content": _content_of(message.get("content"), index)}
        entry.update({name: message[name] for name in ("tool_calls", "tool_call_id", "name") if name in message})
        converted.append(entry)
    try:
        return validate_messages(converted)
    except AnyformerError as exc:
        raise bad_request(exc.message, "messages") from None


def _chat_options(body: dict[str, Any]) -> dict[str, Any]:
    """What only a chat reads: logprobs, the thinking switches, tools and tool_choice."""
    options: dict[str, Any] = {}
    logprobs = chat_logprobs(body)
    if logprobs is not None:
        options["logprobs"] = logprobs
    thinking, variables = thinking_of(body)
    if thinking:
        options["thinking"] = True
    if variables:
        options["template_variables"] = variables
    for name in ("tools", "tool_choice"):
        if body.get(name) is not None:
            options[name] = body[name]
    if body.get("parallel_tool_calls") is not None and not isinstance(body["parallel_tool_calls"], bool):
        raise bad_request("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    return options


def _options_of(body: dict[str, Any], scoring: bool = False, chat: bool = False) -> dict[str, Any]:
    if body.get("n", 1) != 1:
        raise bad_request("only n=1 is supported: one reply per request (list several prompts instead)", "n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    options: dict[str, Any] = {"max_new_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens}
    if body.get("temperature") is not None:
        options["temperature"] = body["temperature"]
    for name in ("seed", "stop"):
        if body.get(name) is not None:
            options[name] = body[name]
    options.update(sampling_options(body))
    constraint = constraint_of(body)
    if constraint is not None:
        options["constraint"] = constraint
    if chat:
        options.update(_chat_options(body))
    options = clamped_sampling(options)
    try:
        # The core's own checks, before any model is loaded; scoring a prompt (echo + logprobs) takes max_tokens=0.
        checked: dict[str, Any] = (
            {**options, "prompt": "", "logprobs": 0, "prompt_logprobs": True} if scoring else options
        )
        GenerateOptions.build(**checked)
    except AnyformerError as exc:
        core_name = next((name for name in _PARAMS if exc.message.startswith(name)), None)
        message = exc.message.replace("max_new_tokens", "max_tokens")
        raise bad_request(message, _PARAMS.get(core_name or "")) from None
    return options


def _stream_of(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false", "stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    return stream, bool(stream_options.get("include_usage", False))


def parse_chat(body: Any) -> GenerationRequest:
    """A ``/v1/chat/completions`` body as a :class:`GenerationRequest`."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    refuse_unknown(body, CHAT_FIELDS, "/v1/chat/completions")
    model = _model_of(body)
    messages = _messages_of(body.get("messages"))
    stream, include_usage = _stream_of(body)
    preview = body.get("anyformer_preview", False)
    if not isinstance(preview, bool):
        raise bad_request("'anyformer_preview' must be true or false", "anyformer_preview")
    options = _options_of(body, chat=True)
    thinking = options.get("thinking", False)
    return GenerationRequest(model, messages, options, stream, include_usage, preview, thinking=thinking)


#: The most prompts one ``/v1/completions`` request may list (each is generated in turn).
MAX_PROMPTS = 16


def _prompts_of(raw: Any) -> tuple[str, ...]:
    prompts = [raw] if isinstance(raw, str) else raw
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise bad_request(
            "'prompt' must be a string or a non-empty list of strings (token arrays are not supported)", "prompt"
        )
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"'prompt' lists {len(prompts)} prompts; at most {MAX_PROMPTS} are taken", "prompt")
    return tuple(prompts)


def _refuse_unsupported_completion_fields(body: dict[str, Any]) -> None:
    """Fields of ``/v1/completions`` anyformer cannot honour yet: refused, never silently ignored."""
    if body.get("best_of", 1) != 1:
        raise bad_request("only best_of=1 is supported: one reply per prompt", "best_of")


def parse_completion(body: Any) -> GenerationRequest:
    """A ``/v1/completions`` body: each prompt is continued as written, with no chat template."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    refuse_unknown(body, COMPLETION_FIELDS, "/v1/completions")
    model = _model_of(body)
    prompts = _prompts_of(body.get("prompt"))
    _refuse_unsupported_completion_fields(body)
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise bad_request("'echo' must be true or false", "echo")
    logprobs = body.get("logprobs")
    if logprobs is not None and (
        isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_LOGPROBS
    ):
        raise bad_request(f"'logprobs' must be an integer in [0, {MAX_LOGPROBS}]", "logprobs")
    scoring = echo and logprobs is not None  # the prompt's own tokens are scored too (lm-eval's loglikelihood)
    if scoring and body.get("suffix") is not None:
        raise bad_request("'echo' with 'logprobs' scores the prompt; it takes no 'suffix'", "suffix")
    options = _options_of(body, scoring)
    if logprobs is not None:
        options["logprobs"] = logprobs
    if scoring:
        options["prompt_logprobs"] = True
    suffix = body.get("suffix")
    if suffix is not None:
        if not isinstance(suffix, str):
            raise bad_request("'suffix' must be a string", "suffix")
        options["suffix"] = suffix
    stream, include_usage = _stream_of(body)
    return GenerationRequest(model, [], options, stream, include_usage, prompts=prompts, echo=echo)


def parse_embeddings(body: Any) -> tuple[str, list[str]]:
    """A ``/v1/embeddings`` body as the model and its list of input strings."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    refuse_unknown(body, EMBEDDING_FIELDS, "/v1/embeddings")
    model = _model_of(body)
    raw = body.get("input")
    inputs = [raw] if isinstance(raw, str) else raw
    if not isinstance(inputs, list) or not inputs or not all(isinstance(text, str) for text in inputs):
        raise bad_request("'input' must be a string or a non-empty list of strings", "input")
    check_embedding_inputs(inputs)
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise bad_request("'encoding_format' must be float or base64", "encoding_format")
    return model, inputs


def parse_embeddings_request(body: Any) -> tuple[str, list[str], str]:
    """A ``/v1/embeddings`` body as the model, its input strings and its ``encoding_format``."""
    model, inputs = parse_embeddings(body)
    return model, inputs, body.get("encoding_format", "float")


# ---- responses -----------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    """A response id in OpenAI's style (``chatcmpl-…``, ``cmpl-…``)."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int | None, completion_tokens: int) -> dict[str, Any]:
    """OpenAI's usage object; without a prompt count from the backend, only completion tokens are given."""
    if prompt_tokens is None:
        return {"completion_tokens": completion_tokens}
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def finish_reason_of(reason: str | None) -> str | None:
    """anyformer's finish reason in OpenAI's words (a cancelled reply stopped)."""
    return "stop" if reason == "cancelled" else reason


def chat_completion(
    rid: str,
    model: str,
    text: str,
    finish: str | None,
    use: dict[str, Any],
    *,
    message: dict[str, Any] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A whole ``chat.completion`` object; ``message`` replaces the plain one built from ``text``."""
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message if message is not None else {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish_reason_of(finish),
            }
        ],
        "usage": use,
    }


def chat_chunk(
    rid: str,
    model: str,
    delta: dict[str, Any],
    finish: str | None = None,
    use: dict[str, Any] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; with ``use`` set it is the usage-only chunk at the end."""
    choices = (
        []
        if use is not None
        else [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason_of(finish)}]
    )
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if use is not None:
        chunk["usage"] = use
    return chunk


def completion_logprobs(
    entries: Sequence[TokenLogprob], start: int, prompt_entries: Sequence[TokenLogprob] = ()
) -> dict[str, Any]:
    """OpenAI's completions ``logprobs`` object; ``start`` is where the reply begins in prompt + reply.

    ``prompt_entries`` (``echo`` with ``logprobs``) are the prompt's tokens, placed before the reply's;
    the prompt's first token has a null log-probability and null alternatives, as OpenAI gives it.
    """
    both = [(e, e.offset) for e in prompt_entries] + [(e, start + e.offset) for e in entries]
    return {
        "tokens": [e.token for e, _ in both],
        "token_logprobs": [e.logprob for e, _ in both],
        # A dict, as OpenAI and llama.cpp give it: two alternatives with the same text keep the later.
        "top_logprobs": [None if e.logprob is None else dict(e.top) for e, _ in both],
        "text_offset": [offset for _, offset in both],
    }


def completion_choice(
    index: int, text: str, finish: str | None, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One choice of a ``text_completion``."""
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason_of(finish)}


def text_completion(
    rid: str,
    model: str,
    text: str,
    finish: str | None,
    use: dict[str, Any] | None,
    *,
    index: int = 0,
    choices: list[dict[str, Any]] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``text_completion`` object (whole, or one streamed piece when ``use`` is None).

    ``choices`` replaces the one choice built from ``text`` and ``finish`` (several prompts).
    """
    body: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices if choices is not None else [completion_choice(index, text, finish, logprobs)],
    }
    if use is not None:
        body["usage"] = use
    return body


def embeddings_list(model: str, vectors: list[list[float]], encoding: str, prompt_tokens: int) -> dict[str, Any]:
    """An embeddings ``list`` object; ``base64`` packs each vector as little-endian float32."""
    import struct

    def encode(vector: list[float]) -> Any:
        if encoding == "base64":
            return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
        return vector

    return {
        "object": "list",
        "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
