"""``Loaded``: a model loaded by its backend, with the one streaming contract every backend shares."""

from __future__ import annotations

import threading
import weakref
from collections.abc import AsyncIterator, Generator
from typing import TYPE_CHECKING, Any

from anyformer._backend import BackendModel
from anyformer._chat_template import RenderNote, cancelled_by, noting_renders
from anyformer._honoured import refuse_unhonoured
from anyformer._run_progress import cancelled, check_run_controls
from anyformer._stream import CoreStream
from anyformer.contract._chunk import Chunk, GenerateOptions
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._features import Features
from anyformer.contract._messages import Message, has_audio, has_images, validate_messages
from anyformer.contract._model import Model
from anyformer.contract._progress import ProgressCallback
from anyformer.contract._verdict import Verdict

if TYPE_CHECKING:
    from anyformer._session import Session

_DONE = object()
# How long dispose waits for a generation running in another thread to stop.
_DISPOSE_WAIT_SECONDS = 30.0


class Loaded:
    """A loaded model. Use it as a context manager, or call :meth:`dispose` when done.

    As many generations run at once as the backend declares (:attr:`parallel`, 1 for most): one
    more ``generate`` while that many streams are open raises ``AnyformerError(BUSY)`` at once
    (servers queue in front of it). Each stream has its own cancel, stop strings, limits and
    finish reason. The model runs in this process or, loaded with ``isolate=True``, in a worker
    process (``worker_pid``); the contract is kept here either way.
    """

    def __init__(
        self, session: Session, model: Model, verdict: Verdict | None, others: tuple[Verdict, ...] = ()
    ) -> None:
        self._session = session
        # Open streams and running calls, at most ``parallel``; dispose waits on the condition for them to end.
        self._slots = threading.Condition()
        self._active = 0
        self._disposed = False
        # Set when dispose gave up waiting for a stream in another thread: the last stream frees the model
        # as it lets go of it, so memory a live engine call still uses is never freed under it.
        self._free_on_release = False
        self._freed = False
        self._free_lock = threading.Lock()
        # The streams now open: dispose stops them before freeing the model under them.
        self._open_streams: weakref.WeakSet[CoreStream] = weakref.WeakSet()
        # The cancel events of the runs in progress: dispose sets them, as it cancels open streams.
        self._running: list[threading.Event] = []
        #: The description the model was loaded from.
        self.model = model
        #: The chosen backend's verdict, with its estimate (None when the backend was named and not asked).
        self.verdict = verdict
        # The other backends' verdicts: which of them read the blocks this load does not.
        self._others = others

    def _check_inputs(self, messages: list[Message]) -> None:
        """``BAD_REQUEST`` for image or audio blocks the chosen load does not read (its ``Estimate.inputs``),
        naming the backends whose estimates read them."""
        estimate = self.verdict.estimate if self.verdict is not None else None
        if estimate is None or estimate.inputs is None:
            return
        for kind, present in (("image", has_images(messages)), ("audio", has_audio(messages))):
            if not present or kind in estimate.inputs:
                continue
            readers = [
                v.backend
                for v in self._others
                if v.ok and v.estimate is not None and v.estimate.inputs is not None and kind in v.estimate.inputs
            ]
            where = f"backends that read them for it: {', '.join(readers)}" if readers else "no installed backend does"
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"{self.backend} runs {self.model.ref} as text chat and reads no {kind} blocks; {where}",
            )

    @property
    def backend(self) -> str:
        """The id of the backend running the model."""
        return self._session.backend

    @property
    def task(self) -> str:
        """The task the model was loaded for."""
        return self._session.task

    @property
    def handle(self) -> BackendModel:
        """The backend's own handle, for backend-specific features (``BAD_REQUEST`` when isolated)."""
        return self._session.handle

    @property
    def features(self) -> Features:
        """What the backend's handle can do (raw text, parallel streams, honoured options…), as one record."""
        return self._session.features

    @property
    def parallel(self) -> int:
        """How many streams may be open at once on this model (the backend's ``parallel``; 1 for most)."""
        return self._session.features.parallel

    @property
    def isolated(self) -> bool:
        """True when the model runs in a worker process (``load(..., isolate=True)``)."""
        return self._session.pid is not None

    @property
    def worker_pid(self) -> int | None:
        """The worker process's id when isolated, else None."""
        return self._session.pid

    def __enter__(self) -> Loaded:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.dispose()

    def __repr__(self) -> str:
        state = "disposed" if self._disposed else "loaded"
        where = f", worker pid {self.worker_pid}" if self.isolated else ""
        return f"<Loaded {self.model.ref} on {self.backend} ({self.task}, {state}{where})>"

    def _check_open(self) -> None:
        if self._disposed:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.model.ref} was disposed; load it again")

    @property
    def raw_text(self) -> bool:
        """True when the backend continues raw text without a chat template (``generate(prompt=...)``)."""
        return self._session.features.raw_text

    @property
    def audio_input(self) -> bool:
        """True when the backend reads audio blocks in chat messages (others are refused with ``BAD_REQUEST``)."""
        return self._session.features.audio_input

    @property
    def prompt_logprobs(self) -> bool:
        """True when the backend scores a raw prompt's own tokens (``generate(prompt_logprobs=True)``)."""
        return self._session.features.prompt_logprobs

    @property
    def honours(self) -> frozenset[str]:
        """The optional generate options the backend honours (``min_p``, ``constraint``, ``tools``…);
        ``generate`` refuses the others with ``BAD_REQUEST``."""
        return self._session.features.honours

    def generate(
        self,
        messages: list[Message] | str | None = None,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        seed: int | None = None,
        thinking: bool = False,
        stop: str | list[str] | None = None,
        cancel: threading.Event | None = None,
        prompt: str | None = None,
        **extra: Any,
    ) -> Generator[Chunk, None, None]:
        """Stream a reply to ``messages`` as :class:`Chunk` objects.

        With ``prompt`` instead of ``messages`` the text is continued as written, with no chat
        template (a raw completion); only backends that declare it (:attr:`raw_text`) take one,
        the others raise ``BAD_REQUEST``. ``prompt_logprobs=True`` with ``logprobs=N`` also reports
        the prompt's tokens (on the first chunk; ``max_new_tokens=0`` scores the prompt alone), on a
        backend that declares it (:attr:`prompt_logprobs`).

        Malformed messages or options raise ``BAD_REQUEST`` here, before any work; a call while
        :attr:`parallel` streams are open raises ``BUSY``. Closing the iterator or setting
        ``cancel`` stops this stream only and leaves the model ready for the next call.
        """
        self._check_open()
        if prompt is not None:
            if messages is not None:
                raise AnyformerError(ErrorCode.BAD_REQUEST, "give messages or a raw prompt, not both")
            if not self._session.features.raw_text:
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST,
                    f"{self.backend} does not continue raw text; send messages (the chat template applies)",
                )
            if extra.get("prompt_logprobs") is True and not self._session.features.prompt_logprobs:
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST, f"{self.backend} does not report the prompt's log-probabilities"
                )
            checked: list[Message] = []
        else:
            checked = validate_messages(messages)
            self._check_inputs(checked)
            if has_audio(checked) and not self._session.features.audio_input:
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST,
                    f"{self.model.ref} on {self.backend} does not read audio: send no audio blocks",
                )
        options = GenerateOptions.build(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            thinking=thinking,
            stop=stop,
            cancel=cancel,
            prompt=prompt,
            **extra,
        )
        refuse_unhonoured(self.backend, self._session.features.honours, options)
        self._acquire()
        note = RenderNote()  # the render tells whether the prompt opened <think> (a worker reports it)
        try:
            with cancelled_by(options.cancel), noting_renders(note):  # an in-process backend renders here
                source = self._session.start(checked, options)
        except AnyformerError as exc:
            if exc.code is not ErrorCode.CANCELLED or not options.cancel.is_set():
                self._release()
                raise
            # Cancelled before the first token (mid-render): the stream ends at once with `cancelled`.
            source = iter(())
        except BaseException:
            self._release()
            raise
        stream = CoreStream(self.backend, source, options, self._release, note)
        with self._slots:
            self._open_streams.add(stream)
        return stream

    def complete(self, messages: list[Message] | str | None = None, **options: Any) -> Chunk:
        """Run ``generate`` to the end and return its last chunk (the whole text and finish reason)."""
        last = Chunk()
        for chunk in self.generate(messages, **options):
            last = chunk
        return last

    async def agenerate(self, messages: list[Message] | str | None = None, **options: Any) -> AsyncIterator[Chunk]:
        """The async twin of :meth:`generate`: the backend runs in a thread, chunks arrive on the loop.

        Cancelling the consuming task, or closing this iterator, cancels the generation.
        """
        import asyncio  # only servers use the async twin; keep `import anyformer` light

        cancel = options.pop("cancel", None) or threading.Event()
        stream = self.generate(messages, cancel=cancel, **options)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def pump() -> None:
            try:
                for chunk in stream:
                    loop.call_soon_threadsafe(queue.put_nowait, chunk)
            except BaseException as exc:  # handed to the consumer, which re-raises it
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)

        worker = threading.Thread(target=pump, name=f"anyformer-{self.backend}-generate", daemon=True)
        worker.start()
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()
            await asyncio.to_thread(worker.join)

    @property
    def run_progress(self) -> bool:
        """True when the backend's ``run`` reports progress and can be cancelled part way."""
        return self._session.features.run_progress

    def run(
        self,
        input: Any,
        progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
        **options: Any,
    ) -> Any:
        """Run a non-generation task (embeddings, classification, speech recognition…) on ``input``.

        On a backend that declares it (:attr:`run_progress`), ``progress`` gets a
        :class:`ProgressEvent` after each unit of work (a batch, a 30 s window of audio: ``stage``,
        ``done`` of ``total``), and setting ``cancel`` (a ``threading.Event``) stops the work at the
        next unit. Elsewhere ``progress`` gets nothing and the work runs to its end. Either way a
        run whose ``cancel`` is set before it returns (or that :meth:`dispose` cancels) raises
        ``AnyformerError(CANCELLED)`` and returns nothing, never a partial result; the model stays usable.
        """
        self._check_open()
        if not self._session.features.run:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"{self.backend} loaded {self.model.ref} for {self.task}; it has no run(), use generate()",
            )
        check_run_controls(progress, cancel)
        if cancel is not None and cancel.is_set():
            raise cancelled(self.backend)
        stop = cancel if cancel is not None else threading.Event()  # dispose sets it
        self._acquire()
        with self._slots:
            self._running.append(stop)
        try:
            result = self._session.run(input, options, progress, stop)
        finally:
            with self._slots:
                self._running.remove(stop)
            self._release()
        # A backend without run_progress ran to its end; the caller said stop meanwhile, so no result.
        if stop.is_set():
            raise cancelled(self.backend)
        return result

    def _acquire(self) -> None:
        """Take one of the model's ``parallel`` slots, or raise ``BUSY`` (``BAD_REQUEST`` once disposed)."""
        with self._slots:
            self._check_open()  # under the condition: dispose never frees a model a new stream just took
            limit = self._session.features.parallel
            if self._active >= limit:
                if limit == 1:
                    raise AnyformerError(
                        ErrorCode.BUSY, f"{self.model.ref} is already generating; wait for it or cancel it"
                    )
                raise AnyformerError(
                    ErrorCode.BUSY,
                    f"{self.model.ref} already serves {limit} streams, as many as it runs at once; "
                    "wait for one or cancel it",
                )
            self._active += 1

    def _release(self) -> None:
        """Let go of one slot after a generation or a run; free the model if ``dispose`` waits for the last one."""
        with self._slots:
            self._active -= 1
            free = self._free_on_release and self._active == 0
            self._slots.notify_all()
        if free:
            self._free()

    def _free(self) -> None:
        """Free the session exactly once, whoever gets here first (``dispose`` or the last stream)."""
        with self._free_lock:
            if self._freed:
                return
            self._freed = True
        self._session.dispose()

    def dispose(self) -> None:
        """Free the model's memory. Safe to call twice; called on ``__exit__``.

        Every open stream is cancelled and closed first, and every run in progress cancelled (it raises
        ``CANCELLED``). Generations and runs in other threads get
        ``_DISPOSE_WAIT_SECONDS`` (together) to stop; if an engine call has not returned by then,
        the model is freed when the last stream ends, never while one still runs on it.
        """
        with self._slots:
            if self._disposed:
                return
            self._disposed = True
            streams = list(self._open_streams)
            runs = list(self._running)
        for stream in streams:
            stream.cancel()
        for stop in runs:
            stop.set()  # a run_progress backend stops at its next unit; the others run to their end
        for stream in streams:
            try:
                stream.close()
            except ValueError:
                pass  # it is running in another thread right now; it stops at its next token
        # Wait for generations in other threads to let go of the model before freeing it.
        with self._slots:
            idle = self._slots.wait_for(lambda: self._active == 0, timeout=_DISPOSE_WAIT_SECONDS)
            if not idle:
                self._free_on_release = True  # the last stream to end frees it (see _release)
        if idle:
            self._free()
