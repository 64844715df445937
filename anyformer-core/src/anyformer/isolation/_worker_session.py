"""The parent's side of an isolated worker: a session whose backend runs in another process.

Why a plain subprocess with a pipe protocol, and not ``multiprocessing`` with the spawn context:

- **No pickle from the worker.** The worker runs a native engine on files from strangers. A
  ``multiprocessing`` connection unpickles what the other side sends, so a worker taken over by a
  hostile file could run code in the parent. Here the parent reads bounded JSON frames and checks
  every field (``_worker_protocol``).
- **The caller's ``__main__`` is left alone.** Spawn re-imports the parent's main module in the
  child, which breaks scripts without a ``__main__`` guard, notebooks and servers. The worker is
  ``python -c BOOTSTRAP`` and imports only anyformer and the chosen backend's entry point.
- **The death is ours to read.** The exit status (the signal) and stderr are captured directly, so
  an abort, a segfault or an OOM kill becomes ``BACKEND_CRASHED`` (or ``OUT_OF_MEMORY`` while
  loading) with the signal and the last stderr lines, and out of memory is recognised from them.

A reader thread hands the worker's stdout frames out (EOF: the worker died): those of a
generation to that generation's own queue (by its ``id``), the rest to the session's; another
thread keeps the last lines of its stderr. Several generations may stream at once over the one
pipe when the worker's handle declares ``parallel`` > 1. Chunks stream under a credit window per
generation: the worker runs at most :data:`WINDOW` chunks ahead of the caller, so a cancel or a
closed iterator stops the engine within a few tokens; ``cancel`` is a message, and a closed
iterator sends one too. The frames a cancelled generation still sends are dropped by the reader;
a new generation waits (at most :data:`SETTLE_SECONDS`) until the worker has a free slot again.
A ``run`` is numbered and routed the same way; its progress events come back one at a time, the
worker waiting for each to be taken (``more``) or refused (``cancel``) before its next unit.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import queue
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from anyformer._backend import BackendModel
from anyformer._chat_template import note_thinking_opened
from anyformer.contract._chunk import Chunk, GenerateOptions, TokenLogprob
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._features import Features
from anyformer.contract._messages import Message
from anyformer.contract._model import Model
from anyformer.contract._progress import ProgressCallback, ProgressEvent
from anyformer.contract._request import Request
from anyformer.isolation._worker_protocol import (
    STDERR_TAIL_LINES,
    ProtocolError,
    crash_error,
    decode_value,
    encode_frame,
    encode_value,
    error_from_frame,
    oom_kill_count,
    read_frame,
)
from anyformer.isolation._worker_start import BOOTSTRAP as BOOTSTRAP
from anyformer.isolation._worker_start import end_process as _end_process
from anyformer.isolation._worker_start import end_worker_process as end_worker_process
from anyformer.isolation._worker_start import start_worker_process as start_worker_process

_log = logging.getLogger("anyformer.isolation")

#: Chunks the worker may send ahead of the caller; more are granted as the caller takes them.
WINDOW = 16
#: How often a waiting stream looks at its cancel event.
_POLL_SECONDS = 0.02
#: How long a new call waits for cancelled generations to stop before it is ``BUSY`` (a bug, logged).
SETTLE_SECONDS = 30.0
#: How long ``dispose`` waits for the worker to free the model and exit before ending it.
DISPOSE_SECONDS = 10.0
#: The most bytes of one stderr line kept.
_STDERR_LINE_BYTES = 4096

_EOF = object()


def _read_replies(fd: int, deliver: Callable[[Any], None]) -> None:
    """The stdout thread: every frame to ``deliver``, then a protocol error if any, then ``_EOF``."""
    try:
        while True:
            frame = read_frame(fd)
            if frame is None:
                break
            deliver(frame)
    except (ProtocolError, OSError, ValueError) as exc:
        deliver(ProtocolError(str(exc)))
    finally:
        deliver(_EOF)


def _read_stderr(stream: Any, tail: collections.deque[str]) -> None:
    """The stderr thread: keep the last lines (each cut at a bounded length)."""
    try:
        for line in iter(lambda: stream.readline(_STDERR_LINE_BYTES), b""):
            tail.append(line.decode("utf-8", "replace").rstrip("\n"))
    except (OSError, ValueError):
        pass


def _copy(error: AnyformerError) -> AnyformerError:
    return AnyformerError(error.code, error.message, need=error.need)


class _Router:
    """Hands the worker's frames out: a generation's to that generation's queue, the rest to the session's.

    A separate object, so the reader thread holds no reference to the session (a dropped session
    must still be collected and end its worker).
    """

    def __init__(self) -> None:
        self.frames: queue.Queue[Any] = queue.Queue()
        # The generations the worker still runs, each with the queue its frames go to; the abandoned
        # ones (cancelled or closed by the caller) have theirs dropped until their end. The condition
        # wakes a generation waiting for a free slot and dispose waiting for the last one.
        self.routes: dict[int, queue.Queue[Any]] = {}
        self.abandoned: set[int] = set()
        self.changed = threading.Condition()
        self.ended: Any = None  # the reader's last item (_EOF or a ProtocolError) once it stopped
        self._count = 0

    def deliver(self, item: Any) -> None:
        """The reader thread's hand-out: a generation's frames to its queue, the rest to the session's."""
        with self.changed:
            if item is _EOF or isinstance(item, ProtocolError):
                if self.ended is None or item is not _EOF:
                    self.ended = item
                for frames in (self.frames, *self.routes.values()):
                    frames.put(item)
                self.changed.notify_all()
                return
            ident, op = item.get("id"), item["op"]
            route = self.routes.get(ident) if isinstance(ident, int) else None
            if route is None or op not in ("started", "chunks", "progress", "end", "result", "error"):
                self.frames.put(item)
                return
            if ident not in self.abandoned:
                route.put(item)
            if op in ("end", "result", "error"):  # the worker is done with it: its slot is free
                del self.routes[ident]
                self.abandoned.discard(ident)
                self.changed.notify_all()

    def route(self) -> tuple[int, queue.Queue[Any]]:
        """Number a new generation and open the queue its frames will go to."""
        frames: queue.Queue[Any] = queue.Queue()
        with self.changed:
            self._count += 1
            ident = self._count
            self.routes[ident] = frames
            if self.ended is not None:  # the worker is gone already: the reader will not say so again
                frames.put(self.ended)
        return ident, frames

    def abandon(self, ident: int) -> bool:
        """Drop a generation's further frames; True when the worker still runs it (tell it to stop)."""
        with self.changed:
            if ident not in self.routes:
                return False
            self.abandoned.add(ident)
            return True


class WorkerSession:
    """A model loaded by a backend in a worker process (see the module docstring)."""

    def __init__(self, process: subprocess.Popen[bytes], backend: str) -> None:
        self._process = process
        self.backend = backend
        self.task = ""
        #: What the worker's handle declared it can do (the ``loaded`` frame's ``features``).
        self.features = Features()
        self._oom_before = oom_kill_count()
        self._router = _Router()
        self._frames = self._router.frames
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._write_lock = threading.Lock()
        self._dead: AnyformerError | None = None
        #: The RPC servers the load spans: a death is explained by the ones that stopped answering.
        self._rpc: tuple[str, ...] = ()
        self._disposed = False
        self._run_lock = threading.Lock()  # one run() at a time: its reply comes on the session's queue
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        self._threads = [
            threading.Thread(
                target=_read_replies,
                args=(process.stdout.fileno(), self._router.deliver),
                name=f"anyformer-{backend}-worker-replies",
                daemon=True,
            ),
            threading.Thread(
                target=_read_stderr,
                args=(process.stderr, self._stderr),
                name=f"anyformer-{backend}-worker-stderr",
                daemon=True,
            ),
        ]
        for thread in self._threads:
            thread.start()
        self._finalizer = weakref.finalize(self, _end_process, process)

    # ---- starting -------------------------------------------------------------------------------

    @classmethod
    def spawn(
        cls,
        backend: str,
        entry_point: str,
        model: Model,
        request: Request,
        progress: ProgressCallback,
        process: subprocess.Popen[bytes] | None = None,
    ) -> WorkerSession:
        """Have a worker load ``model`` on ``backend`` (progress forwarded) and return the session.

        ``process`` is a worker from :func:`start_worker_process`, started earlier; without one, one is started.
        """
        try:
            load = encode_frame(_load_message(backend, entry_point, model, request))
        except BaseException:
            if process is not None:
                end_worker_process(process)
            raise
        process = process or start_worker_process()
        session = cls(process, backend)
        session._rpc = request.rpc
        try:
            session._write(load, "loading")
            while True:
                frame = session._next("loading")
                assert frame is not None  # no cancel event: _next returns a frame or raises
                op = frame["op"]
                if op == "progress":
                    progress(_progress_event(frame))
                elif op == "loaded":
                    session._loaded(frame)
                    return session
                elif op == "error":
                    raise error_from_frame(frame)
                else:
                    raise session._broken(f"unexpected {op!r} while loading", "loading")
        except ProtocolError as exc:
            session._reap()
            raise session._broken(str(exc), "loading") from None
        except BaseException:
            session._reap()
            raise

    def _loaded(self, frame: Mapping[str, Any]) -> None:
        backend, task = frame.get("backend"), frame.get("task")
        if backend != self.backend or not isinstance(task, str):
            raise self._broken(f"a malformed loaded frame {dict(frame)!r:.200}", "loading")
        try:
            self.features = Features.from_dict(frame.get("features"))
        except (AnyformerError, TypeError) as exc:
            raise self._broken(f"a loaded frame with malformed features ({exc})", "loading") from None
        self.task = task

    # ---- what Loaded reads ----------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self._process.pid

    @property
    def handle(self) -> BackendModel:
        """There is none here: the backend's handle lives in the worker."""
        raise AnyformerError(
            ErrorCode.BAD_REQUEST,
            f"{self.backend} runs in an isolated worker process (pid {self.pid}): its handle is not in this "
            "process; load with isolate=False for backend-specific features",
        )

    # ---- talking to the worker ------------------------------------------------------------------

    def _write(self, frame: bytes, stage: str) -> None:
        if self._dead is not None:
            raise _copy(self._dead)
        assert self._process.stdin is not None
        view = memoryview(frame)
        try:
            with self._write_lock:
                while view:
                    view = view[os.write(self._process.stdin.fileno(), view) :]
        except (BrokenPipeError, OSError, ValueError):
            raise self._crashed(stage) from None

    def _send(self, message: Mapping[str, Any], stage: str) -> None:
        self._write(encode_frame(message), stage)

    def _next(
        self,
        stage: str,
        *,
        cancel: Any = None,
        timeout: float | None = None,
        frames: queue.Queue[Any] | None = None,
    ) -> dict[str, Any] | None:  # None only when ``cancel`` is set while waiting
        source = self._frames if frames is None else frames
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = _POLL_SECONDS if cancel is not None else None
            if deadline is not None:
                left = max(deadline - time.monotonic(), 0.0)
                wait = left if wait is None else min(wait, left)
            try:
                item = source.get(timeout=wait)
            except queue.Empty:
                if cancel is not None and cancel.is_set():
                    return None
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(stage) from None
                continue
            if item is _EOF:
                source.put(_EOF)  # every later reader sees the end too
                raise self._crashed(stage)
            if isinstance(item, ProtocolError):
                raise self._broken(str(item), stage)
            return item

    def _crashed(self, stage: str) -> AnyformerError:
        """The worker is gone: wait for its status and stderr, and say how it died (once)."""
        if self._dead is None:
            try:
                returncode = self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:  # stdout closed but the process lingers: end it
                self._process.kill()
                returncode = self._process.wait()
            self._threads[1].join(timeout=2)
            self._dead = crash_error(
                self.backend,
                self.pid,
                stage,
                returncode,
                list(self._stderr),
                oom_kills_before=self._oom_before,
                oom_kills_after=oom_kill_count(),
            )
            self._dead = _name_silent_rpc_servers(self._dead, self._rpc)
        return _copy(self._dead)

    def _broken(self, why: str, stage: str) -> AnyformerError:
        """The worker sent something malformed: it is not trusted any more, so it is ended."""
        if self._dead is None:
            _end_process(self._process)
            self._dead = AnyformerError(
                ErrorCode.BACKEND_CRASHED,
                f"the {self.backend} engine's worker process (pid {self.pid}) broke the protocol while {stage} "
                f"({why}) and was ended; this process is unharmed, load the model again to retry",
            )
        return _copy(self._dead)

    def _settle(self, limit: int | None = None) -> None:
        """Wait until the worker runs fewer than ``limit`` generations (default: ``parallel``).

        Generations the caller cancelled or closed still hold a slot in the worker until it has
        stopped them; when they do not stop within :data:`SETTLE_SECONDS` the call is ``BUSY`` and
        the log says why (the worker, and every stream it still serves, lives on).
        """
        if self._dead is not None:
            raise _copy(self._dead)
        limit = self.features.parallel if limit is None else limit
        router = self._router
        with router.changed:
            settled = router.changed.wait_for(
                lambda: len(router.routes) < limit or router.ended is not None, timeout=SETTLE_SECONDS
            )
            ended = router.ended
        if ended is not None:
            raise (
                self._broken(str(ended), "generating")
                if isinstance(ended, ProtocolError)
                else self._crashed("generating")
            )
        if not settled:
            # A generation that never stops after its cancel is the backend's bug. Ending the worker for
            # it would end every other stream the engine serves, so the new request is refused instead
            # (``dispose`` still ends a worker that will not settle).
            _log.error(
                "the %s engine's worker (pid %s) still runs %d cancelled or closed generations %g s after "
                "their cancel; this is a bug in the backend, please report it",
                self.backend,
                self.pid,
                len(router.routes),
                SETTLE_SECONDS,
            )
            raise AnyformerError(
                ErrorCode.BUSY,
                f"the {self.backend} engine is still stopping cancelled generations after {SETTLE_SECONDS:g} s; "
                "retry shortly",
            )

    # ---- the session ----------------------------------------------------------------------------

    def start(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Send the generation to the worker; errors it finds before streaming are raised here."""
        self._settle()
        settings = {
            **options.extra,
            "max_new_tokens": options.max_new_tokens,
            "temperature": options.temperature,
            "seed": options.seed,
            "thinking": options.thinking,
            "stop": list(options.stop),
        }
        if options.prompt is not None:
            settings["prompt"] = options.prompt
        if options.logprobs is not None:
            settings["logprobs"] = options.logprobs
        if options.suffix is not None:
            settings["suffix"] = options.suffix
        if options.constraint is not None:
            settings["constraint"] = options.constraint.to_dict()
        if options.tools:
            settings["tools"] = list(options.tools)
            settings["tool_choice"] = _choice_setting(options.tool_choice)
            if options.tool_choice != "auto":
                settings.pop("constraint", None)  # a forced call's constraint is made again from tool_choice
        if options.template_variables:
            settings["template_variables"] = options.template_variables
        ident, frames = self._router.route()
        if options.prompt_logprobs:
            settings["prompt_logprobs"] = True
        try:
            frame = encode_frame(
                {
                    "op": "generate",
                    "id": ident,
                    "window": WINDOW,
                    "messages": encode_value(messages),
                    "options": encode_value(settings),
                }
            )
        except (TypeError, ValueError) as exc:
            with self._router.changed:
                self._router.routes.pop(ident, None)
            if isinstance(exc, TypeError):
                raise AnyformerError(ErrorCode.BAD_REQUEST, f"{exc}; load with isolate=False to pass it") from None
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"the request is too large for a worker: {exc}") from None
        self._write(frame, "generating")
        try:
            reply = self._next("generating", cancel=options.cancel, frames=frames)
        except ProtocolError as exc:  # pragma: no cover - _next turns these into errors
            raise self._broken(str(exc), "generating") from None
        if reply is None:  # cancelled while the engine prepares the prompt: it is told; its frames are dropped
            if self._router.abandon(ident):
                self._send({"op": "cancel", "id": ident}, "generating")
            return iter(())
        if reply["op"] == "error":
            raise self._checked_error(reply, "generating")
        if reply["op"] != "started":
            raise self._broken(f"expected started, got {reply['op']!r}", "generating")
        if reply.get("thinking_opened") is True:
            note_thinking_opened()  # the worker's render opened <think>: the core's note for this stream says so
        return self._chunks(ident, options, frames)

    def _checked_error(self, frame: Mapping[str, Any], stage: str) -> AnyformerError:
        try:
            return error_from_frame(frame)
        except ProtocolError as exc:
            return self._broken(str(exc), stage)

    def _chunks(self, ident: int, options: GenerateOptions, frames: queue.Queue[Any]) -> Iterator[Chunk]:
        taken = 0
        try:
            while True:
                frame = self._next("generating", cancel=options.cancel, frames=frames)
                if frame is None:
                    return  # cancelled while the engine works: the finally tells the worker
                op = frame["op"]
                if op == "chunks":
                    if frame.get("thinking_opened") is True:
                        note_thinking_opened()  # a lazy render in the worker opened <think>: this stream's note
                    for chunk in self._checked_chunks(frame):
                        yield chunk
                        taken += 1
                        if taken >= WINDOW // 2:
                            self._send({"op": "more", "id": ident, "count": taken}, "generating")
                            taken = 0
                elif op == "end":
                    return
                elif op == "error":
                    raise self._checked_error(frame, "generating")
                else:
                    raise self._broken(f"unexpected {op!r} while generating", "generating")
        finally:
            if self._dead is None and self._router.abandon(ident):
                try:
                    self._send({"op": "cancel", "id": ident}, "generating")
                except AnyformerError:
                    pass  # it died; the next call says so

    def _checked_chunks(self, frame: Mapping[str, Any]) -> list[Chunk]:
        items = frame.get("items")
        chunks = []
        if isinstance(items, list):
            for item in items:
                if not (isinstance(item, list) and len(item) in (5, 6, 7)):
                    break
                delta, tokens, finish, prompt, preview = item[:5]
                logprobs = _token_logprobs(item[5]) if len(item) >= 6 else ()
                prompt_logprobs = _token_logprobs(item[6]) if len(item) == 7 else ()
                if logprobs is None or prompt_logprobs is None:
                    break
                if preview is not None and not isinstance(preview, str):
                    break
                if not isinstance(delta, str) or isinstance(tokens, bool) or not isinstance(tokens, int):
                    break
                if finish is not None and not isinstance(finish, str):
                    break
                if prompt is not None and (isinstance(prompt, bool) or not isinstance(prompt, int)):
                    break
                chunks.append(
                    Chunk(
                        delta=delta,
                        tokens=tokens,
                        finish_reason=finish,
                        prompt_tokens=prompt,
                        preview=preview,
                        logprobs=logprobs,
                        prompt_logprobs=prompt_logprobs,
                    )
                )
            else:
                return chunks
        raise self._broken("a malformed chunks frame", "generating")

    def run(
        self,
        input: Any,
        options: dict[str, Any],
        progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> Any:
        """Send ``input`` to the handle's ``run`` in the worker and return its result.

        The run is numbered like a generation: its ``progress`` frames come back on its own queue
        and go to ``progress``, and the worker waits for a ``more`` after each one (a window of
        none ahead), so a cancel set on seeing an event stops it at that unit, as in-process. When
        ``cancel`` is set (or ``progress`` raises) a ``cancel`` frame for it is sent and the call
        waits for the worker to stop at its next unit, so the model is free again when this returns.
        """
        with self._run_lock:
            return self._run(input, options, progress, cancel)

    def _run(
        self, input: Any, options: dict[str, Any], progress: ProgressCallback | None, cancel: threading.Event | None
    ) -> Any:
        self._settle()
        ident, frames = self._router.route()
        try:
            frame = encode_frame(
                {"op": "run", "id": ident, "window": 0, "input": encode_value(input), "options": encode_value(options)}
            )
        except (TypeError, ValueError) as exc:
            with self._router.changed:
                self._router.routes.pop(ident, None)
            if isinstance(exc, TypeError):
                raise AnyformerError(ErrorCode.BAD_REQUEST, f"{exc}; load with isolate=False to pass it") from None
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"the input is too large for a worker: {exc}") from None
        self._write(frame, "running")
        stopping = False  # a cancel frame was sent: wait for the worker's last word on this run
        failure: BaseException | None = None  # what the caller's progress callback raised
        finished = False
        try:
            while True:
                # Only a backend that stops part way is told to; another's run ends in its own time.
                watch = cancel if self.features.run_progress and not stopping else None
                reply = self._next("running", cancel=watch, frames=frames)
                if reply is None:
                    self._send({"op": "cancel", "id": ident}, "running")
                    stopping = True
                    continue
                op = reply["op"]
                if op == "progress":
                    if stopping:
                        continue
                    try:
                        event = _progress_event(reply)
                    except ProtocolError as exc:
                        raise self._broken(str(exc), "running") from None
                    try:
                        if progress is not None:
                            progress(event)
                    except BaseException as exc:  # re-raised once the worker has stopped
                        failure = exc
                    # The worker waits for this answer after each event, so a cancel the callback sets
                    # stops it at the same unit as in-process.
                    stopping = failure is not None or (cancel is not None and cancel.is_set())
                    self._send({"op": "cancel" if stopping else "more", "id": ident, "count": 1}, "running")
                    continue
                finished = True
                if op == "error":
                    error = self._checked_error(reply, "running")
                    if failure is not None:
                        raise failure
                    raise error
                if op != "result":
                    raise self._broken(f"expected a result, got {op!r}", "running")
                if failure is not None:
                    raise failure
                try:
                    return decode_value(reply.get("value"))
                except ProtocolError as exc:
                    raise self._broken(str(exc), "running") from None
        finally:
            # Left early (Ctrl-C, a dead worker): the worker is told to stop; a later call waits for it (_settle).
            if not finished and self._dead is None and self._router.abandon(ident):
                try:
                    self._send({"op": "cancel", "id": ident}, "running")
                except AnyformerError:
                    pass

    def dispose(self) -> None:
        """Have the worker free the model and exit; end it if it does not within :data:`DISPOSE_SECONDS`."""
        if self._disposed:
            return
        self._disposed = True
        try:
            if self._dead is None:
                self._settle(limit=1)  # every generation stopped: nothing streams while the model is freed
                self._send({"op": "dispose"}, "disposing")
                deadline = time.monotonic() + DISPOSE_SECONDS
                while True:
                    frame = self._next("disposing", timeout=max(deadline - time.monotonic(), 0.0))
                    if frame is not None and frame["op"] == "disposed":
                        break
        except (AnyformerError, TimeoutError):
            pass  # it died or hung: ending the process frees everything it held
        finally:
            self._reap()

    def _reap(self) -> None:
        """Close the pipes and make sure the process is gone."""
        process = self._process
        if process.stdin is not None:
            try:
                process.stdin.close()
            except OSError:
                pass
        try:
            process.wait(timeout=DISPOSE_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        self._finalizer()
        for thread in self._threads:
            thread.join(timeout=2)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _token_logprobs(raw: Any) -> tuple[TokenLogprob, ...] | None:
    """A chunk's token log-probabilities from the worker's frame; None when malformed."""
    if not isinstance(raw, list):
        return None
    entries = []
    for entry in raw:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)):
            return None
        if not (_is_number(entry[1]) or entry[1] is None):  # None: a prompt's first token
            return None
        top = entry[2]
        if not isinstance(top, list) or not all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and _is_number(p[1]) for p in top
        ):
            return None
        logprob = None if entry[1] is None else float(entry[1])
        entries.append(TokenLogprob(entry[0], logprob, tuple((t, float(v)) for t, v in top)))
    return tuple(entries)


def _name_silent_rpc_servers(error: AnyformerError, endpoints: tuple[str, ...]) -> AnyformerError:
    """A worker that used RPC servers died: say which of them no longer accept a connection.

    llama.cpp ends its process when a server it uses goes away (a lost connection is an abort in
    ggml-rpc), so the likeliest cause of the death is named first.
    """
    if not endpoints:
        return error
    from anyformer.rpc._protocol import reachable

    silent = [endpoint for endpoint in endpoints if not reachable(endpoint)]
    if not silent:
        return error
    servers = ", ".join(silent)
    verb = "does" if len(silent) == 1 else "do"
    return AnyformerError(
        error.code,
        f"RPC server {servers} {verb} not answer any more (llama.cpp ends its process when a server it uses goes "
        f"away; load again without it, or once it is back): {error.message}",
    )


def _load_message(backend: str, entry_point: str, model: Model, request: Request) -> dict[str, Any]:
    description = json.loads(json.dumps({**model.to_dict(), "config": dict(model.config)}, default=str))
    fields = dataclasses.asdict(request)
    try:
        json.dumps(fields["options"])
    except (TypeError, ValueError) as exc:
        raise AnyformerError(
            ErrorCode.BAD_REQUEST, f"load options must be JSON data to reach an isolated worker: {exc}"
        ) from None
    return {
        "op": "load",
        "backend": backend,
        "entry_point": entry_point,
        "model": description,
        "request": fields,
    }


def _progress_event(frame: Mapping[str, Any]) -> ProgressEvent:
    names = {field.name for field in dataclasses.fields(ProgressEvent)}
    values = {k: v for k, v in frame.items() if k in names}
    if not isinstance(values.get("stage"), str):
        raise ProtocolError("a progress frame without a stage")
    for key in ("done", "total"):
        if values.get(key) is not None and (isinstance(values[key], bool) or not isinstance(values[key], int)):
            raise ProtocolError(f"a progress frame with a non-integer {key}")
    return ProgressEvent(**values)


def _choice_setting(choice: str | None) -> Any:
    """``GenerateOptions.tool_choice`` as ``generate`` takes it again in the worker."""
    if choice is not None and choice.startswith("function:"):
        return {"type": "function", "function": {"name": choice.removeprefix("function:")}}
    return choice
