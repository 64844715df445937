"""Chat templates from model files, rendered in jinja2's immutable sandbox.

A GGUF's ``tokenizer.chat_template`` is code from a stranger: CVE-2024-34359 ran a shell command
from one. Templates render in ``ImmutableSandboxedEnvironment``, so reaching ``__class__``,
``__mro__`` or mutating a list raises, and that becomes ``BAD_MODEL`` (SAFETY.md G16).
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Sequence
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._messages import Message, text_of

#: The longest template we compile: real ones are a few KiB.
MAX_TEMPLATE_CHARS = 256 * 1024

#: Used when a model ships no template: ChatML, the format most small instruct models are tuned on.
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class _TemplateRaised(Exception):
    """A template called ``raise_exception`` (its way of rejecting the conversation)."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> Any:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(value, indent=indent, ensure_ascii=False)
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"the model's chat template does not compile: {exc}", cause=exc
        ) from exc


def render_chat(
    template: str | None,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **variables: Any,
) -> str:
    """Render ``messages`` with a model's chat template (ChatML when it has none), in the sandbox.

    Text blocks are joined into a string for templates that expect string content. Extra
    ``variables`` (``enable_thinking`` and the like) are passed to the template.
    """
    from jinja2 import TemplateError
    from jinja2.sandbox import SecurityError

    source = template or CHATML_TEMPLATE
    if len(source) > MAX_TEMPLATE_CHARS:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"the model's chat template is {len(source)} characters; refused")
    compiled = _compile(source)
    plain = [{"role": m["role"], "content": text_of(m["content"])} for m in messages]
    try:
        return compiled.render(
            messages=plain,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **variables,
        )
    except SecurityError as exc:
        raise AnyformerError(
            ErrorCode.BAD_MODEL,
            f"the model's chat template tried an unsafe operation and was stopped: {exc}",
            cause=exc,
        ) from exc
    except _TemplateRaised as exc:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"the model's chat template rejected the messages: {exc}") from None
    except (TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as exc:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"the model's chat template failed: {exc}", cause=exc) from exc
