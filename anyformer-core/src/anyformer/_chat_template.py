"""Chat templates from model files, rendered in jinja2's immutable sandbox with bounded work.

A GGUF's ``tokenizer.chat_template`` is code from a stranger: CVE-2024-34359 ran a shell command
from one. Templates render in a subclass of ``ImmutableSandboxedEnvironment``, so reaching
``__class__``, ``__mro__`` or mutating a list raises, and that becomes ``BAD_MODEL`` (SAFETY.md G16).

The sandbox alone stops code, not work: a template may loop 10^10 times or double a string until
it takes gigabytes. So every render has a budget (:class:`_Budget`): loop iterations (every
``{% for %}`` iterable is wrapped when the template is compiled), a deadline checked at every loop
step, call, filter and operator, a size for every string or list an operator, filter, ``~`` or
call makes, and a size for the output. Whatever runs over is ``BAD_MODEL`` at once. In an isolated
worker a timer is the backstop (:func:`enable_hard_stop`): a render that somehow outlives its
deadline ends the worker, and the caller gets ``BACKEND_CRASHED`` quoting why.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import functools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._messages import Message, text_of

#: The longest template we compile: real ones are a few KiB.
MAX_TEMPLATE_CHARS = 256 * 1024
#: Seconds one render may take; real templates take milliseconds.
RENDER_SECONDS = 5.0
#: Loop steps one render may take, every ``{% for %}`` together.
MAX_LOOP_STEPS = 1_000_000
#: The output (and any one string or list made on the way) is held under this many characters, or
#: twice the messages' text and 64 Ki more when that is larger (a long conversation renders whole).
MAX_RENDERED_CHARS = 16 * 1024 * 1024
#: How long past :data:`RENDER_SECONDS` a render may run in a worker before the worker ends itself.
HARD_STOP_GRACE_SECONDS = 5.0

#: Used when a model ships no template: ChatML, the format most small instruct models are tuned on.
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: A number of 8 digits or more in a format string: a width or precision that allocates megabytes.
_HUGE_FORMAT_NUMBER = re.compile(r"\d{8,}")
_ITER_FILTER = "__anyformer_bounded_iter"
_SIZE_FILTER = "__anyformer_bounded_size"


class _TemplateRaised(Exception):
    """A template called ``raise_exception`` (its way of rejecting the conversation)."""


class _OverBudget(Exception):
    """A render ran over one of its limits; the message says which."""


class _Cancelled(Exception):
    """The generation this render is for was cancelled (see :func:`cancelled_by`)."""


class _OverCallerLimit(Exception):
    """The output passed the caller's ``max_chars`` (a prompt longer than the caller can use)."""


class _Budget:
    """What one render may still do: a deadline, loop steps, and the largest value it may make."""

    def __init__(self, seconds: float, max_chars: int) -> None:
        self.cancel = _CANCEL.get()
        self.ticks = 0
        self.started = time.monotonic()
        self.deadline = self.started + seconds
        self.seconds = seconds
        self.steps = MAX_LOOP_STEPS
        self.max_chars = max_chars

    def tick(self) -> None:
        # The clock and the cancel event are read every 32nd tick: a tick is well under a microsecond of
        # template work, and reading them at each one made a ChatML render 2.9x slower than jinja2's own
        # sandbox (0.87 ms for 20 messages); sampled, the budget costs 1.6x (0.56 ms).
        self.ticks += 1
        if not self.ticks & 31:
            self.check()

    def check(self) -> None:
        """Read the cancel event and the clock now."""
        if self.cancel is not None and self.cancel.is_set():
            raise _Cancelled()
        if time.monotonic() > self.deadline:
            raise _OverBudget(f"it ran for over {self.seconds:g} s")

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise _OverBudget(f"its loops ran over {MAX_LOOP_STEPS:,} steps")
        self.tick()

    def sized(self, value: Any) -> Any:
        # A list item is a pointer (8 bytes) to boot: lists get an eighth of a string's length.
        allowed = self.max_chars if isinstance(value, (str, bytes)) else self.max_chars // 8
        if isinstance(value, (str, list, tuple, bytes)) and len(value) > allowed:
            raise _OverBudget(f"it made a value of {len(value):,} items, over the {allowed:,} allowed")
        return value

    def check_arguments(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """Refuse a number or format string that asks for more than the budget before it is allocated."""
        for value in (*args, *kwargs.values()):
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > self.max_chars:
                raise _OverBudget(f"it passed {value:,} to a call, over the {self.max_chars:,} allowed")


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("anyformer_template_budget", default=None)
_CANCEL: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "anyformer_render_cancel", default=None
)


@contextlib.contextmanager
def cancelled_by(cancel: threading.Event | None) -> Iterator[None]:
    """Renders in this block stop with ``CANCELLED`` once ``cancel`` is set (a generation's cancel event).

    Backends render inside ``generate`` and do not pass the event on; the core sets it around the call.
    """
    token = _CANCEL.set(cancel)
    try:
        yield
    finally:
        _CANCEL.reset(token)


class RenderNote:
    """What the renders of one generation showed about its prompt (filled by :func:`render_chat`).

    ``thinking_opened``: the prompt ends inside ``<think>``, which the template wrote itself (Qwen3
    with thinking on, QwQ, DeepSeek-R1's later templates): the reply begins inside its reasoning.
    """

    __slots__ = ("thinking_opened",)

    def __init__(self) -> None:
        self.thinking_opened = False


_NOTE: contextvars.ContextVar[RenderNote | None] = contextvars.ContextVar("anyformer_render_note", default=None)


@contextlib.contextmanager
def noting_renders(note: RenderNote) -> Iterator[RenderNote]:
    """Renders in this block record what their prompt showed in ``note`` (the core sets it around a backend's start)."""
    token = _NOTE.set(note)
    try:
        yield note
    finally:
        _NOTE.reset(token)


def note_thinking_opened() -> None:
    """Record that the prompt opened ``<think>`` (an isolated worker's render, reported to its parent)."""
    note = _NOTE.get()
    if note is not None:
        note.thinking_opened = True


def opens_thinking(prompt: str) -> bool:
    """True when a rendered prompt ends inside ``<think>`` (the generation begins in the reasoning)."""
    return prompt.rstrip().endswith("<think>")


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:  # compiled templates only run inside render_chat; this is a safety net
        budget = _Budget(RENDER_SECONDS, MAX_RENDERED_CHARS)
        _BUDGET.set(budget)
    return budget


def _bounded_iter(iterable: Any) -> Iterator[Any]:
    """What every ``{% for %}`` iterates: the template's iterable, one budgeted step at a time."""
    budget = _budget()
    for item in iterable:
        budget.step()
        yield item


def _bounded_size(value: Any) -> Any:
    """What every ``~`` concatenation passes through."""
    return _budget().sized(value)


def _bounded_filter(function: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose arguments and result are held to the budget (``center(10**9)``, ``indent``)."""

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        budget.check_arguments(args[1:], kwargs)
        return budget.sized(function(*args, **kwargs))

    return bounded


def _bounded_ast(template: Any) -> Any:
    """Wrap every loop's iterable and every ``~`` in the budget's filters (filters cannot be shadowed)."""
    from jinja2 import nodes

    every = [template, *template.find_all(nodes.Node)]  # listed first: the loop below adds nodes
    for loop in every:
        if isinstance(loop, nodes.For):
            loop.iter = nodes.Filter(loop.iter, _ITER_FILTER, [], [], None, None, lineno=loop.lineno)
    for parent in every:
        for field in parent.fields:
            child = getattr(parent, field, None)
            if isinstance(child, nodes.Concat):
                setattr(parent, field, nodes.Filter(child, _SIZE_FILTER, [], [], None, None, lineno=child.lineno))
            elif isinstance(child, list):
                for index, item in enumerate(child):
                    if isinstance(item, nodes.Concat):
                        child[index] = nodes.Filter(item, _SIZE_FILTER, [], [], None, None, lineno=item.lineno)
    return template


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _to_json(value: Any, indent: Any = None, **_: Any) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=False)


def _bounded_environment() -> Any:
    """The sandbox with budgets: built on first use, so importing anyformer does not import jinja2."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedSandbox(ImmutableSandboxedEnvironment):  # type: ignore[misc]
        """jinja2's immutable sandbox whose every loop step, call, operator and format is budgeted."""

        intercepted_binops = frozenset({"*", "**", "+", "%", "//"})

        def _parse(self, source: str, name: str | None, filename: str | None) -> Any:
            return _bounded_ast(super()._parse(source, name, filename))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            budget = _budget()
            budget.tick()
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                raise _OverBudget(f"it raised a number to the power {right}")
            if operator == "*":
                for count, other in ((left, right), (right, left)):
                    if isinstance(count, int) and isinstance(other, (str, list, tuple)):
                        if count * len(other) > budget.max_chars // (1 if isinstance(other, str) else 8):
                            raise _OverBudget(f"it repeated a value {count:,} times")
            if operator == "%" and isinstance(left, str) and _HUGE_FORMAT_NUMBER.search(left):
                raise _OverBudget("it formatted with a width of ten million or more")
            return budget.sized(super().call_binop(context, operator, left, right))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            budget = _budget()
            budget.tick()
            budget.check_arguments(args, kwargs)
            # ``'{:>999999999}'.format(x)``: the sandbox's wrapper keeps the bound method it wraps.
            owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
            if isinstance(owner, str) and _HUGE_FORMAT_NUMBER.search(owner):
                raise _OverBudget("it formatted with a width of ten million or more")
            return budget.sized(super().call(__context, __obj, *args, **kwargs))

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _to_json
    env.filters = {name: _bounded_filter(function) for name, function in env.filters.items()}
    env.filters[_ITER_FILTER] = _bounded_iter
    env.filters[_SIZE_FILTER] = _bounded_size
    return env


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    return _bounded_environment()


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> Any:
    from jinja2 import TemplateError

    try:
        return _environment().from_string(source)
    except (TemplateError, RecursionError) as exc:
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"the model's chat template does not compile: {exc}", cause=exc
        ) from exc


# ---- the backstop in a worker ---------------------------------------------------------------------

_hard_stop: Callable[[str], None] | None = None


def enable_hard_stop(stop: Callable[[str], None]) -> None:
    """In an isolated worker: call ``stop(reason)`` (which ends the process) when a render outlives its limit.

    The sandbox's checks stop every loop, call and operator a template can write; this is for what
    they cannot see (a single native call that runs long), so that no template holds a worker.
    """
    global _hard_stop
    _hard_stop = stop


def _arm_hard_stop(seconds: float) -> threading.Timer | None:
    stop = _hard_stop
    if stop is None:
        return None
    limit = seconds + HARD_STOP_GRACE_SECONDS
    timer = threading.Timer(
        limit, stop, args=(f"the model's chat template rendered for over {limit:g} s; the worker ended itself",)
    )
    timer.daemon = True
    timer.start()
    return timer


# ---- rendering ------------------------------------------------------------------------------------


_TOOLS_VARIABLE = re.compile(r"\btools\b")


def template_takes_tools(template: str | None) -> bool:
    """True when a chat template reads the ``tools`` variable (the ChatML fallback does not)."""
    return template is not None and _TOOLS_VARIABLE.search(template) is not None


def render_chat(
    template: str | None,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    max_chars: int | None = None,
    time_limit: float = RENDER_SECONDS,
    blocks: bool = False,
    **variables: Any,
) -> str:
    """Render ``messages`` with a model's chat template (ChatML when it has none), in the bounded sandbox.

    Text blocks are joined into a string for templates that expect string content. With ``blocks``, a
    message whose content is a list of blocks reaches the template as that list, as transformers'
    processors pass it to a multimodal template: text blocks as ``{"type": "text", "text": ...}``, any
    other block as ``{"type": kind}`` alone (its data never enters the sandbox), so the template writes
    its own placeholder for each image or clip where it sits. Extra
    ``variables`` (``enable_thinking`` and the like) are passed to the template. ``max_chars`` is
    the caller's cap on the prompt (what its context can hold at the most): rendering stops as soon
    as the output passes it, with ``BAD_REQUEST``, before anything is tokenized. A template that
    runs over ``time_limit`` seconds, :data:`MAX_LOOP_STEPS` loop steps or the size limit is
    ``BAD_MODEL``.
    """
    from jinja2 import TemplateError
    from jinja2.sandbox import SecurityError

    source = template or CHATML_TEMPLATE
    if len(source) > MAX_TEMPLATE_CHARS:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"the model's chat template is {len(source)} characters; refused")
    compiled = _compile(source)
    # Tool fields (tool_calls, tool_call_id, name) pass through as transformers passes them to templates.
    plain = [{**m, "content": _content(m["content"], blocks)} for m in messages]
    given = sum(len(text_of(m["content"])) for m in messages)
    limit = max(MAX_RENDERED_CHARS, 2 * given + 65536)
    budget = _Budget(time_limit, limit)
    token = _BUDGET.set(budget)
    timer = _arm_hard_stop(time_limit)
    try:
        prompt = _render(compiled, budget, max_chars, plain, add_generation_prompt, bos_token, eos_token, variables)
        note = _NOTE.get()
        if note is not None:
            note.thinking_opened = add_generation_prompt and opens_thinking(prompt)
        return prompt
    except _Cancelled:
        raise AnyformerError(ErrorCode.CANCELLED, "cancelled while rendering the chat template") from None
    except _OverCallerLimit:
        raise AnyformerError(
            ErrorCode.BAD_REQUEST,
            f"the prompt rendered to over {max_chars:,} characters, more than the model's context can hold; "
            "send a shorter conversation",
        ) from None
    except _OverBudget as exc:
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"the model's chat template was stopped: {exc}; nothing was generated"
        ) from None
    except SecurityError as exc:
        raise AnyformerError(
            ErrorCode.BAD_MODEL,
            f"the model's chat template tried an unsafe operation and was stopped: {exc}",
            cause=exc,
        ) from exc
    except _TemplateRaised as exc:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"the model's chat template rejected the messages: {exc}") from None
    except MemoryError:
        raise AnyformerError(ErrorCode.BAD_MODEL, "the model's chat template ran out of memory; refused") from None
    except (
        TemplateError,
        TypeError,
        ValueError,
        AttributeError,
        KeyError,
        IndexError,
        RecursionError,
        ArithmeticError,
    ) as exc:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"the model's chat template failed: {exc}", cause=exc) from exc
    finally:
        if timer is not None:
            timer.cancel()
        _BUDGET.reset(token)


def _content(content: str | list[dict[str, Any]], blocks: bool) -> str | list[dict[str, str]]:
    """A message's content as the template sees it: its text, or (``blocks``) its blocks without their data."""
    if not blocks or isinstance(content, str):
        return text_of(content)
    return [{"type": "text", "text": b["text"]} if b["type"] == "text" else {"type": b["type"]} for b in content]


def _render(
    compiled: Any,
    budget: _Budget,
    max_chars: int | None,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    bos_token: str,
    eos_token: str,
    variables: dict[str, Any],
) -> str:
    """The output, piece by piece, stopped the moment it passes either limit."""
    pieces: list[str] = []
    total = 0
    cap = budget.max_chars if max_chars is None else min(max_chars, budget.max_chars)
    stream = compiled.generate(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=bos_token,
        eos_token=eos_token,
        **variables,
    )
    try:
        for piece in stream:
            total += len(piece)
            if total > cap:
                if max_chars is not None and total > max_chars:
                    raise _OverCallerLimit()
                raise _OverBudget(f"its output passed {budget.max_chars:,} characters")
            pieces.append(piece)
            budget.tick()
    finally:
        stream.close()
    budget.check()  # a render that finished past its limit (in one long call the ticks did not see) failed
    return "".join(pieces)


def _stop_process(reason: str) -> None:
    """The worker's hard stop: say why on stderr (the parent quotes it), then end at once."""
    try:
        os.write(2, f"anyformer worker: {reason}\n".encode())
    finally:
        os._exit(70)


#: What :mod:`anyformer.isolation._worker` passes to :func:`enable_hard_stop`.
STOP_PROCESS = _stop_process
