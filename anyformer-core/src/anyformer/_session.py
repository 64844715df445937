"""Where a loaded model runs: in this process, or in an isolated worker (``anyformer.isolation._worker_session``).

``Loaded`` holds one session and keeps the contract itself (validation, the limit of open streams
and BUSY, CoreStream), so both kinds of session only start work, run it and free it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from anyformer._backend import (
    BackendModel,
    audio_input_of,
    honours_of,
    parallel_of,
    prompt_logprobs_of,
    raw_text_of,
    run_of,
    run_progress_of,
)
from anyformer._run_progress import run_reporter
from anyformer.contract._chunk import Chunk, GenerateOptions
from anyformer.contract._messages import Message
from anyformer.contract._progress import ProgressCallback

if TYPE_CHECKING:
    from anyformer._plugins import PluginManager


class Session(Protocol):
    """A loaded model as ``Loaded`` drives it: at most ``parallel`` calls and streams at once (``Loaded`` counts)."""

    @property
    def backend(self) -> str:
        """The id of the backend running the model."""

    @property
    def task(self) -> str:
        """The task the model was loaded for."""

    @property
    def pid(self) -> int | None:
        """The worker's process id, or None when the model runs in this process."""

    @property
    def handle(self) -> BackendModel:
        """The backend's own handle; only an in-process session has one."""

    @property
    def has_run(self) -> bool:
        """True when the model runs a non-generation task through ``run``."""

    @property
    def raw_text(self) -> bool:
        """True when the backend continues raw text without a chat template (``generate(prompt=...)``)."""

    @property
    def run_progress(self) -> bool:
        """True when the backend's ``run`` reports progress and stops between units when cancelled."""

    @property
    def audio_input(self) -> bool:
        """True when the backend reads audio blocks in chat messages."""

    @property
    def parallel(self) -> int:
        """How many streams (and ``run`` calls) the backend serves at once on this model."""

    @property
    def prompt_logprobs(self) -> bool:
        """True when the backend reports a raw prompt's tokens' log-probabilities."""

    @property
    def honours(self) -> frozenset[str]:
        """The optional generate options the backend honours (``BackendModel``'s ``honours``)."""

    def start(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Begin a generation; errors the backend finds before streaming are raised here."""

    def run(
        self,
        input: Any,
        options: dict[str, Any],
        progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> Any:
        """Run a non-generation task on ``input``; a ``run_progress`` backend reports to ``progress`` and
        raises ``CANCELLED`` between units once ``cancel`` is set."""

    def dispose(self) -> None:
        """Free the model; a second call does nothing."""


class InProcessSession:
    """The backend's handle in this process, driven through the plugin manager's hooks."""

    pid = None

    def __init__(self, handle: BackendModel, manager: PluginManager) -> None:
        self._handle = handle
        self._manager = manager
        self.backend = handle.backend
        self.task = handle.task

    @property
    def handle(self) -> BackendModel:
        """The backend's own handle."""
        return self._handle

    @property
    def has_run(self) -> bool:
        """True when the handle has ``run``."""
        return run_of(self._handle) is not None

    @property
    def raw_text(self) -> bool:
        """True when the handle declares ``raw_text``."""
        return raw_text_of(self._handle)

    @property
    def run_progress(self) -> bool:
        """True when the handle declares ``run_progress``."""
        return run_progress_of(self._handle)

    @property
    def audio_input(self) -> bool:
        """True when the handle declares ``audio_input``."""
        return audio_input_of(self._handle)

    @property
    def parallel(self) -> int:
        """The handle's ``parallel`` (1 when it declares none)."""
        return parallel_of(self._handle)

    @property
    def prompt_logprobs(self) -> bool:
        """True when the handle declares ``prompt_logprobs``."""
        return prompt_logprobs_of(self._handle)

    @property
    def honours(self) -> frozenset[str]:
        """The handle's ``honours`` (none when it declares nothing)."""
        return honours_of(self._handle)

    def start(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Call the owning backend's generate hook."""
        return self._manager.generate(self._handle, messages, options)

    def run(
        self,
        input: Any,
        options: dict[str, Any],
        progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> Any:
        """Call the handle's ``run``, with the core's ``progress`` callable when it declares ``run_progress``."""
        run = run_of(self._handle)
        if run_progress_of(self._handle):
            return run(input, progress=run_reporter(self.backend, progress, cancel), **options)
        return run(input, **options)

    def dispose(self) -> None:
        """Call the handle's ``dispose`` (``Loaded`` calls this once)."""
        self._handle.dispose()
