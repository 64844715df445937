"""What a generation yields, and the options it takes (docs/contract.md, "Streaming")."""

from __future__ import annotations

import dataclasses
import enum
import threading
from typing import Any

from anyformer.contract._constraint import Constraint
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._sampling import normalised_sampling
from anyformer.contract._tool_calls import ToolCall, call_constraint, check_tool_choice
from anyformer.contract._tools import check_tools, check_variables, function_names

#: The most stop strings one generation takes: each is checked after every token.
MAX_STOP_STRINGS = 16
#: The longest stop string, in characters.
MAX_STOP_CHARS = 256
#: The most alternatives ``logprobs`` asks for at each token.
MAX_LOGPROBS = 20
#: The longest raw prompt, in characters (a backend still refuses one longer than its context).
MAX_PROMPT_CHARS = 4_000_000


def _check_sampling(extra: dict[str, Any]) -> None:
    """``top_p`` and ``top_k``, the sampling options backends read from ``extra``, when given."""
    top_p = extra.get("top_p")
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1  # NaN fails too
    ):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"top_p must be a number in (0, 1], got {top_p!r:.40}")
    top_k = extra.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"top_k must be an integer ≥ 0, got {top_k!r:.40}")


class FinishReason(str, enum.Enum):
    """Why a generation ended."""

    #: The model ended its answer, or a stop string was reached.
    STOP = "stop"
    #: ``max_new_tokens`` were generated.
    LENGTH = "length"
    #: The caller cancelled (``cancel`` set, or the iterator closed).
    CANCELLED = "cancelled"
    #: The reply called tools (``generate(tools=...)``): the last chunk's ``tool_calls`` has them.
    TOOL_CALLS = "tool_calls"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability (``generate(logprobs=N)``; the prompt's with ``prompt_logprobs=True``).

    ``token`` is the token's text, ``logprob`` its natural-log probability under the model's
    distribution before sampling (a log-softmax of the logits), and ``top`` the ``N`` likeliest
    tokens there with theirs, most likely first (the chosen token is added when it is not among
    them). ``offset`` is where the token's text begins in the stream's ``text``; backends leave
    it 0 and the core fills it. The prompt's first token has nothing before it to be predicted
    from: its ``logprob`` is None and ``top`` empty, as OpenAI reports it.
    """

    token: str
    logprob: float | None
    top: tuple[tuple[str, float], ...] = ()
    offset: int = 0


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One step of a stream: the whole ``text`` so far, the ``delta`` it added, ``tokens`` generated.

    Backends yield chunks with ``delta`` and ``tokens``; the core rebuilds ``text`` from the deltas,
    so a backend may leave ``text`` empty. Only the last chunk carries ``finish_reason``.
    ``prompt_tokens`` is the prompt's length in tokens when the backend reports it (on any chunk;
    the core carries it on every chunk after), for usage counts; None when it does not.

    ``preview`` is provisional text for display only, never part of ``text``: the whole answer as
    a backend that refines text in place sees it now, before it settles (a text-diffusion model's
    answer with its still-masked positions). Most backends never set it; the core passes it on
    with the chunk it came in, and the last chunk has none. Callers may ignore it.

    ``logprobs`` (only with ``generate(logprobs=N)``) holds a :class:`TokenLogprob` for each token
    whose text begins in this chunk's ``delta``; tokens past a stop string are dropped.
    ``prompt_logprobs`` (only with ``generate(prompt_logprobs=True)``) holds one for each token of
    the prompt, on the first chunk; their ``offset`` is where their text begins in the prompt.

    ``tool_calls`` (only with ``generate(tools=...)``, on the last chunk) holds the calls the reply
    made, read from its text (:mod:`anyformer.contract._tool_calls`); the finish reason is then
    ``tool_calls``. ``text`` stays the reply as the model wrote it.

    ``thinking_opened`` (set by the core on every chunk) is True when the chat template ended the
    prompt inside ``<think>`` (Qwen3 with thinking on, DeepSeek-R1): the reply's text up to
    ``</think>`` is then reasoning, though the reply itself never wrote ``<think>``.
    """

    text: str = ""
    delta: str = ""
    tokens: int = 0
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    preview: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    thinking_opened: bool = False


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """The options of one ``generate`` call, validated by the core before a backend sees them."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int | None = None
    thinking: bool = False
    stop: tuple[str, ...] = ()
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    #: The raw text to continue, with no chat template (``generate(prompt=...)``); None for a chat.
    prompt: str | None = None
    #: Report each generated token's log-probability and this many alternatives (in a chat only where the
    #: backend's ``honours`` has ``logprobs``).
    logprobs: int | None = None
    #: With a raw prompt: the text after the gap, for fill-in-the-middle (the prompt is the text before it).
    suffix: str | None = None
    #: With a raw prompt and ``logprobs``: report the prompt's tokens too (scoring; ``max_new_tokens`` may be 0).
    prompt_logprobs: bool = False
    #: Sampling options (``top_p``, ``min_p``, ``logit_bias``…, see ``SAMPLING_OPTIONS``) and backend-specific
    #: settings, passed through unchanged; a sampling option the backend does not honour is refused.
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Structured output: what the reply must match (None: free text).
    constraint: Constraint | None = None
    #: Tool definitions (OpenAI's ``{"type": "function", "function": {...}}``) the chat template renders.
    tools: tuple[dict[str, Any], ...] = ()
    #: Extra chat template variables (``reasoning_effort``, a request's ``chat_template_kwargs``).
    template_variables: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: ``auto`` (the model may call a tool), ``required`` (it must call one) or ``function:NAME`` (it must
    #: call that one; both through a constraint); None without tools. ``none`` leaves the tools out.
    tool_choice: str | None = None

    @classmethod
    def build(
        cls,
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        seed: int | None = None,
        thinking: bool = False,
        stop: str | list[str] | tuple[str, ...] | None = None,
        cancel: threading.Event | None = None,
        prompt: str | None = None,
        logprobs: int | None = None,
        suffix: str | None = None,
        prompt_logprobs: bool = False,
        constraint: Constraint | dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | tuple[dict[str, Any], ...] | None = None,
        template_variables: dict[str, Any] | None = None,
        tool_choice: Any = None,
        **extra: Any,
    ) -> GenerateOptions:
        """Validate user options; anything malformed raises ``BAD_REQUEST`` before any work."""
        if not isinstance(prompt_logprobs, bool):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"prompt_logprobs must be True or False, got {prompt_logprobs!r}"
            )
        least = 0 if prompt_logprobs else 1  # scoring a prompt alone generates nothing
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < least:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"max_new_tokens must be an integer ≥ {least}, got {max_new_tokens!r}"
            )
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 100:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"temperature must be a number in [0, 100], got {temperature!r}"
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"seed must be an integer in [0, 2^32), got {seed!r}")
        if not isinstance(thinking, bool):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"thinking must be True or False, got {thinking!r}")
        stops: tuple[str, ...]
        if stop is None:
            stops = ()
        elif isinstance(stop, str):
            stops = (stop,)
        elif isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
            stops = tuple(stop)
        else:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"stop must be a string or a list of strings, got {stop!r:.80}")
        if any(not s for s in stops):
            raise AnyformerError(ErrorCode.BAD_REQUEST, "stop strings must not be empty")
        if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"stop takes at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} characters each",
            )
        if prompt is not None and not isinstance(prompt, str):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"prompt must be a string, got {type(prompt).__name__}")
        if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"prompt is {len(prompt):,} characters; at most {MAX_PROMPT_CHARS:,} are read"
            )
        if logprobs is not None:
            if isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_LOGPROBS:
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST, f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {logprobs!r:.40}"
                )
        if suffix is not None:
            if not isinstance(suffix, str) or len(suffix) > MAX_PROMPT_CHARS:
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST, f"suffix must be a string of at most {MAX_PROMPT_CHARS:,} characters"
                )
            if prompt is None:
                raise AnyformerError(ErrorCode.BAD_REQUEST, "suffix fills the middle after a raw prompt (prompt=...)")
        if prompt_logprobs and (logprobs is None or suffix is not None or prompt is None):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, "prompt_logprobs scores a raw prompt: it takes logprobs=N and no suffix"
            )
        _check_sampling(extra)
        extra = normalised_sampling(extra)
        checked_tools = check_tools(tools)
        if checked_tools and prompt is not None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "tools are rendered by the chat template: send messages")
        choice = check_tool_choice(tool_choice, function_names(checked_tools))
        if choice == "none":
            checked_tools, choice = (), None  # no tools are rendered, and none are read back
        elif checked_tools:
            choice = choice or "auto"
        else:
            choice = None
        checked_constraint = None if constraint is None else Constraint.build(constraint)
        if choice is not None and choice != "auto":
            if checked_constraint is not None:
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST, "tool_choice forces a call: it takes no constraint (response_format) too"
                )
            checked_constraint = call_constraint(checked_tools, choice)
        if cancel is not None and not (hasattr(cancel, "is_set") and hasattr(cancel, "set")):
            raise AnyformerError(ErrorCode.BAD_REQUEST, "cancel must be a threading.Event")
        return cls(
            max_new_tokens=max_new_tokens,
            temperature=float(temperature),
            seed=seed,
            thinking=thinking,
            stop=stops,
            cancel=cancel if cancel is not None else threading.Event(),
            prompt=prompt,
            logprobs=logprobs,
            suffix=suffix,
            prompt_logprobs=prompt_logprobs,
            extra=extra,
            constraint=checked_constraint,
            tools=checked_tools,
            template_variables=check_variables(template_variables),
            tool_choice=choice,
        )
