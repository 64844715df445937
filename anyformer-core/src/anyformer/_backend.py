"""What a backend's ``load`` hook returns: the handle the core wraps in ``Loaded``."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class BackendModel(Protocol):
    """A loaded model as a backend holds it.

    ``backend`` is the id of the backend that owns it (its ``generate`` hook answers only for its
    own handles); ``task`` what it runs. ``dispose`` frees its memory and must be safe to call
    twice. Handles for non-generation tasks also have ``run(input, **options)``. A handle whose
    backend continues raw text without a chat template (``generate(prompt=...)``) sets
    ``raw_text = True``; the core refuses raw prompts for every other handle. One that also reports
    the prompt's own tokens' log-probabilities (``generate(prompt_logprobs=True)``) sets
    ``prompt_logprobs = True``. A handle that reads audio blocks in chat messages sets
    ``audio_input = True``; the core refuses messages with audio for every other handle. A handle
    that serves several streams at once (its ``generate`` and ``run`` are safe to call from several
    threads) sets ``parallel`` to how many; without it the core allows one at a time. A handle whose
    ``run`` reports progress and stops when cancelled sets ``run_progress = True``: the core then
    always calls ``run(input, progress=report, **options)``, ``report`` being a callable to call
    with a :class:`ProgressEvent` after each unit of work, which raises ``AnyformerError(CANCELLED)``
    once the caller cancelled (``anyformer._run_progress``); other handles' ``run`` never gets it.
    A handle lists the optional generate options it honours in ``honours`` (a frozenset of names:
    sampling options such as ``min_p`` or ``logit_bias``, and ``logprobs`` for chats,
    ``constraint``, ``tools``, ``template_variables``); the core refuses any other with
    ``BAD_REQUEST`` before the backend sees the call (:mod:`anyformer._honoured`).
    """

    backend: str
    task: str

    def dispose(self) -> None:
        """Free the model's memory; a second call does nothing."""


def run_of(handle: Any) -> Any:
    """The handle's ``run`` method, or None when the backend has none."""
    run = getattr(handle, "run", None)
    return run if callable(run) else None


def raw_text_of(handle: Any) -> bool:
    """True when the handle declares it continues raw text (``raw_text = True``)."""
    return getattr(handle, "raw_text", False) is True


def audio_input_of(handle: Any) -> bool:
    """True when the handle declares it reads audio blocks in messages (``audio_input = True``)."""
    return getattr(handle, "audio_input", False) is True


def parallel_of(handle: Any) -> int:
    """How many streams the handle serves at once: its ``parallel`` (a positive int), else 1."""
    value = getattr(handle, "parallel", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return 1
    return value


def prompt_logprobs_of(handle: Any) -> bool:
    """True when the handle declares it scores a raw prompt's tokens (``prompt_logprobs = True``)."""
    return raw_text_of(handle) and getattr(handle, "prompt_logprobs", False) is True


def run_progress_of(handle: Any) -> bool:
    """True when the handle's ``run`` takes the core's ``progress`` callable (``run_progress = True``)."""
    return run_of(handle) is not None and getattr(handle, "run_progress", False) is True


def honours_of(handle: Any) -> frozenset[str]:
    """The optional generate options the handle declares it honours (``honours``: a set of names), else none.

    The names are the sampling options (:data:`anyformer.contract._sampling.SAMPLING_OPTIONS`) and the
    features of :data:`anyformer.contract._sampling.FEATURES`; any other name is ignored.
    """
    from anyformer.contract._sampling import FEATURES, SAMPLING_OPTIONS

    value = getattr(handle, "honours", ())
    if isinstance(value, (str, bytes)) or not isinstance(value, (set, frozenset, tuple, list)):
        return frozenset()
    return frozenset(name for name in value if name in SAMPLING_OPTIONS or name in FEATURES)
