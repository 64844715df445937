"""What a backend's ``load`` hook returns: the handle that owns generation, which the core wraps in ``Loaded``."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator
from typing import Any

from anyformer.contract._chunk import Chunk, GenerateOptions
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._features import Features
from anyformer.contract._messages import Message


class BackendModel(abc.ABC):
    """A loaded model as a backend holds it; every backend's handle subclasses this.

    ``backend`` is the id of the backend that owns it, ``task`` what it was loaded for, and
    ``features`` what it can do beyond plain chat (a :class:`Features` record: raw text, parallel
    streams, honoured options…; a class attribute, or an instance attribute set in ``__init__``
    when it depends on the load). A chat handle overrides :meth:`generate`; a handle for a
    non-generation task (embeddings, classification, speech) overrides :meth:`run`. Every handle
    implements :meth:`dispose`.

    The core calls these methods only through ``Loaded``, which has already validated the
    messages and options, refused what ``features`` does not cover, and holds at most
    ``features.parallel`` calls at once.
    """

    #: The id of the backend that loaded the model (its entry point's name).
    backend: str
    #: The task the model was loaded for (``"text-generation"``, ``"feature-extraction"``…).
    task: str
    #: What the handle can do; the defaults are a plain chat model serving one stream at a time.
    features: Features = Features()

    def generate(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Start generating a reply to ``messages``; the base refuses (a handle that does not chat).

        :param messages: validated chat messages; empty for a raw completion (``options.prompt``, sent
            only to a handle whose ``features.raw_text`` is set).
        :param options: validated options: ``max_new_tokens``, ``temperature`` (0 is greedy and
            repeatable), ``seed``, ``thinking``, ``stop``, ``cancel`` (a ``threading.Event``) and the
            optional ones ``features.honours`` lists.
        :returns: an iterator of :class:`Chunk` whose ``delta`` is the new text and ``tokens`` the
            count generated so far (never decreasing, at most ``max_new_tokens``); the last may carry
            ``finish_reason``. Check ``options.cancel`` between tokens and put the model back in a
            usable state in a ``finally`` block: the core closes the iterator on cancel. Errors found
            before any work are raised here, at the call, not from the iterator.
        """
        raise AnyformerError(
            ErrorCode.BAD_REQUEST, f"{self.backend} loaded this model for {self.task}; it does not generate text"
        )

    def run(self, input: Any, **options: Any) -> Any:
        """Run a non-generation task on ``input``; the base refuses (a handle that only chats).

        A handle whose ``features.run_progress`` is set also gets ``progress=``, a callable to call
        with a :class:`ProgressEvent` after each unit of work; it raises ``AnyformerError(CANCELLED)``
        once the caller cancelled, and the handle lets that propagate.
        """
        raise AnyformerError(
            ErrorCode.BAD_REQUEST, f"{self.backend} loaded this model for {self.task}; it has no run(), use generate()"
        )

    @abc.abstractmethod
    def dispose(self) -> None:
        """Free the model's memory; a second call does nothing."""


def overrides_run(handle: BackendModel) -> bool:
    """True when the handle's class has a ``run`` of its own (it runs a non-generation task)."""
    return getattr(type(handle), "run", BackendModel.run) is not BackendModel.run


def features_of(handle: BackendModel) -> Features:
    """The handle's ``features``, checked, with ``run`` set from whether it overrides ``run``.

    ``PLUGIN_ERROR`` naming the backend when the record is not a :class:`Features` or a field is
    wrong: a bug in the plugin, caught where the handle first crosses into the core.
    """
    declared = getattr(handle, "features", None)
    backend = getattr(handle, "backend", "?")
    if not isinstance(declared, Features):
        raise AnyformerError(
            ErrorCode.PLUGIN_ERROR,
            f"{backend}: the handle's features is {type(declared).__name__}, not an anyformer.plugin.Features",
        )
    if declared.run and not overrides_run(handle):
        raise AnyformerError(ErrorCode.PLUGIN_ERROR, f"{backend}: the handle declares run but has no run() of its own")
    try:
        return dataclasses.replace(declared, run=overrides_run(handle)).checked()
    except AnyformerError as exc:
        raise AnyformerError(ErrorCode.PLUGIN_ERROR, f"{backend}: {exc.message}") from None
