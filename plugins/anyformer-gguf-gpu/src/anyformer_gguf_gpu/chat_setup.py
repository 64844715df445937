"""A chat turned into prompt ids for a GGUF engine, the checks on it before replying, and the reply's token chunks."""

from __future__ import annotations

from typing import Any

from anyformer.plugin import (
    AnyformerError,
    Chunk,
    Constraint,
    ErrorCode,
    FinishReason,
    GenerateOptions,
    Message,
    chat_constraint,
    has_images,
    render_chat,
    tool_inputs,
)
from anyformer_gguf_gpu.tokenizer import GGUFTokenizer, StreamDecoder


def chat_prompt_ids(
    tokenizer: GGUFTokenizer,
    messages: list[Message],
    thinking: bool,
    options: GenerateOptions | None = None,
    model: str = "this model",
) -> list[int]:
    """The GGUF's chat template rendered in the core's sandbox, then tokenised with special tokens parsed.

    ``options`` brings the call's tools (the core's ``tool_inputs``: ``model`` names the model
    in its refusal)."""
    bos_text = tokenizer.tokens[tokenizer.bos_id] if tokenizer.bos_id is not None else ""
    eos_text = tokenizer.tokens[tokenizer.eos_id] if tokenizer.eos_id is not None else ""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    variables: dict[str, Any] = {}
    if options is not None:
        messages, variables = tool_inputs(template, messages, options, model)
    prompt = render_chat(
        template,
        messages,
        bos_token=bos_text,
        eos_token=eos_text,
        enable_thinking=thinking,
        **variables,
    )
    # The template writes BOS itself when it wants one; otherwise the vocabulary's rule applies.
    add_special = not (bos_text and prompt.startswith(bos_text))
    return tokenizer.encode(prompt, add_special=add_special, parse_special=True)


def reply_constraint(tokenizer: GGUFTokenizer, options: GenerateOptions) -> Constraint | None:
    """The constraint a chat reply decodes under: the request's, or a forced tool call in the syntax of the
    GGUF's template family (the core's ``chat_constraint``)."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    return chat_constraint(options, template)


def check_text_only(messages: list[Message], backend: str) -> None:
    """``BAD_REQUEST`` where the chat holds image blocks: the GGUF engines read text only."""
    if has_images(messages):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"the {backend} backend reads text only, not image blocks")


def check_prompt_fits(ids: list[int], context: int) -> None:
    """``BAD_REQUEST`` where the prompt is empty or leaves no room in the context for a reply."""
    if not ids:
        raise AnyformerError(ErrorCode.BAD_REQUEST, "the prompt is empty")
    if len(ids) >= context:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"the prompt is {len(ids)} tokens; the context holds {context}")


def token_chunk(
    text: StreamDecoder, token: int, count: int, max_new_tokens: int, prompt_tokens: int, *, complete: bool = False
) -> Chunk:
    """The chunk of the ``count``-th generated ``token``: its text, and at ``max_new_tokens`` the rest of
    the text with a ``length`` finish (``complete``: a constraint's value is whole, a ``stop`` finish);
    ``prompt_tokens`` rides on the first chunk only."""
    delta = text.push(token)
    last = count >= max_new_tokens
    if last or complete:
        delta += text.flush()
    finish = FinishReason.STOP if complete else FinishReason.LENGTH if last else None
    return Chunk(
        delta=delta,
        tokens=count,
        finish_reason=None if finish is None else finish.value,
        prompt_tokens=prompt_tokens if count == 1 else None,
    )
