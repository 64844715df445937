"""What a generation yields, and the options it takes (docs/contract.md, "Streaming")."""

from __future__ import annotations

import dataclasses
import enum
import threading
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode


class FinishReason(str, enum.Enum):
    """Why a generation ended."""

    #: The model ended its answer, or a stop string was reached.
    STOP = "stop"
    #: ``max_new_tokens`` were generated.
    LENGTH = "length"
    #: The caller cancelled (``cancel`` set, or the iterator closed).
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One step of a stream: the whole ``text`` so far, the ``delta`` it added, ``tokens`` generated.

    Backends yield chunks with ``delta`` and ``tokens``; the core rebuilds ``text`` from the deltas,
    so a backend may leave ``text`` empty. Only the last chunk carries ``finish_reason``.
    ``prompt_tokens`` is the prompt's length in tokens when the backend reports it (on any chunk;
    the core carries it on every chunk after), for usage counts; None when it does not.
    """

    text: str = ""
    delta: str = ""
    tokens: int = 0
    finish_reason: str | None = None
    prompt_tokens: int | None = None


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """The options of one ``generate`` call, validated by the core before a backend sees them."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int | None = None
    thinking: bool = False
    stop: tuple[str, ...] = ()
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    #: Backend-specific settings passed through unchanged (``top_p``, ``repeat_penalty``…).
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

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
        **extra: Any,
    ) -> GenerateOptions:
        """Validate user options; anything malformed raises ``BAD_REQUEST`` before any work."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"max_new_tokens must be an integer ≥ 1, got {max_new_tokens!r}"
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
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"stop must be a string or a list of strings, got {stop!r}")
        if any(not s for s in stops):
            raise AnyformerError(ErrorCode.BAD_REQUEST, "stop strings must not be empty")
        if cancel is not None and not (hasattr(cancel, "is_set") and hasattr(cancel, "set")):
            raise AnyformerError(ErrorCode.BAD_REQUEST, "cancel must be a threading.Event")
        return cls(
            max_new_tokens=max_new_tokens,
            temperature=float(temperature),
            seed=seed,
            thinking=thinking,
            stop=stops,
            cancel=cancel if cancel is not None else threading.Event(),
            extra=extra,
        )
