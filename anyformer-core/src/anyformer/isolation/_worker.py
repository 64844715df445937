"""The isolated worker process: it loads one backend's model and runs its handle's methods for the parent.

Started by :mod:`anyformer.isolation._worker_session` as ``python -c BOOTSTRAP``; the bootstrap reads the
first frame, takes the parent's ``sys.path`` (so the worker imports what the caller would, plugins
on a test's path included), imports this module while the parent is still choosing a backend, then
reads the ``load`` frame and calls :func:`main`. The backend is loaded from the one entry point
the parent chose, so only that plugin is imported here.

fd 1 is the protocol's and nobody else's: it is moved to a private descriptor and fd 1 then points
at stderr, so an engine that prints to stdout cannot corrupt a frame. stdin carries commands; a
reader thread hands ``cancel`` and ``more`` to the generation in progress at once and queues the
rest for the main thread, which runs one command at a time. A handle that declares ``parallel`` > 1
has each generation run in a thread of its own instead, up to that many at once, their frames told
apart by the generation's ``id``; ``dispose`` stops them all and waits for them. When stdin ends
(the parent died or let go) the model is disposed and the worker exits; if the main thread is stuck
in an engine call or a template, the worker ends itself after :data:`ORPHAN_GRACE_SECONDS`. A
watchdog thread does the same when the parent process is gone (the worker is re-parented), so no
worker outlives its parent, whatever it is doing. Ctrl-C is the parent's to handle: the worker
ignores SIGINT, and faulthandler writes a Python traceback to stderr if the engine crashes.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from anyformer._backend import BackendModel, features_of
from anyformer._chat_template import STOP_PROCESS, RenderNote, cancelled_by, enable_hard_stop, noting_renders
from anyformer._entry_points import EntryPointRecord
from anyformer._plugins import ENTRY_POINT_GROUP, PluginManager
from anyformer._run_progress import run_reporter
from anyformer._session import start_generation
from anyformer.contract._chunk import Chunk, GenerateOptions
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._features import Features
from anyformer.contract._model import Model
from anyformer.contract._progress import ProgressEvent
from anyformer.contract._request import Request
from anyformer.isolation._worker_protocol import (
    decode_value,
    encode_value,
    error_frame,
    exception_to_error,
    read_frame,
    write_frame,
)

_STDIN_CLOSED = {"op": "dispose", "reason": "stdin closed"}
#: How long the main thread has to dispose and return once the parent let go, before the worker ends itself.
ORPHAN_GRACE_SECONDS = 3.0
#: How often the watchdog asks whether the parent process is still there.
PARENT_POLL_SECONDS = 0.25


def _watch_parent(parent: int) -> None:
    """The watchdog thread: end the worker at once when its parent process is gone.

    Not ``PR_SET_PDEATHSIG``: Linux sends that signal when the *thread* that started the worker
    ends, and a server or a pre-start starts workers from short-lived threads.
    """
    while True:
        time.sleep(PARENT_POLL_SECONDS)
        if os.getppid() != parent:
            os._exit(0)


def _end_if_stuck(finished: threading.Event) -> None:
    """After the parent let go: a main thread still busy after the grace is abandoned work; end the process."""
    if not finished.wait(ORPHAN_GRACE_SECONDS):
        os._exit(0)


class _Generation:
    """The flow control of the generation in progress: its id, cancel event and window of chunks."""

    def __init__(self, ident: int, window: int) -> None:
        self.ident = ident
        self.cancel = threading.Event()
        self._window = window
        self._changed = threading.Condition()

    def grant(self, count: int) -> None:
        with self._changed:
            self._window += count
            self._changed.notify()

    def stop(self) -> None:
        with self._changed:
            self.cancel.set()
            self._changed.notify()

    def take(self) -> bool:
        """Wait for room to send one more chunk; False when cancelled."""
        with self._changed:
            while self._window <= 0 and not self.cancel.is_set():
                self._changed.wait()
            if self.cancel.is_set():
                return False
            self._window -= 1
            return True


class Worker:
    """The worker's state: the protocol descriptors, the plugin host, the loaded handle."""

    def __init__(self, commands_fd: int, replies_fd: int) -> None:
        self._in = commands_fd
        self._out = replies_fd
        self._write_lock = threading.Lock()
        self._commands: queue.Queue[dict[str, Any]] = queue.Queue()
        # The generations in progress, by id (one at a time unless the handle declares ``parallel``).
        self._generations: dict[int, _Generation] = {}
        self._threads: list[threading.Thread] = []
        self._manager = PluginManager()
        self._handle: BackendModel | None = None
        self._features = Features()
        self._backend = "?"
        #: Set when :meth:`serve` returns; the stdin thread ends a worker whose main thread never gets there.
        self.finished = threading.Event()

    def send(self, message: Mapping[str, Any]) -> None:
        with self._write_lock:
            write_frame(self._out, message)

    # ---- commands -------------------------------------------------------------------------------

    def read_commands(self) -> None:
        """The stdin thread: cancel and more act at once, the rest wait for the main thread."""
        try:
            while True:
                frame = read_frame(self._in)
                if frame is None:
                    break
                op = frame["op"]
                ident = frame.get("id")
                generation = self._generations.get(ident) if isinstance(ident, int) else None
                if op in ("cancel", "more"):
                    if generation is not None:
                        if op == "cancel":
                            generation.stop()
                        else:
                            generation.grant(int(frame.get("count", 0)))
                    continue
                self._commands.put(frame)
        except Exception as exc:  # a broken pipe or frame: end as if the parent let go
            print(f"anyformer worker: reading commands failed: {exc}", file=sys.stderr)
        for generation in list(self._generations.values()):
            generation.stop()
        self._commands.put(_STDIN_CLOSED)
        _end_if_stuck(self.finished)

    def serve(self, load: Mapping[str, Any]) -> int:
        """Load the model, then run commands until ``dispose`` or the end of stdin."""
        threading.Thread(target=self.read_commands, name="anyformer-worker-commands", daemon=True).start()
        if not self._load(load):
            return 0
        while True:
            command = self._commands.get()
            op = command["op"]
            if op == "dispose":
                self._stop_generations()
                self._dispose()
                if command is not _STDIN_CLOSED:
                    self.send({"op": "disposed"})
                return 0
            if op == "generate" and self._features.parallel > 1:
                self._generate_in_thread(command)
            elif op == "generate":
                self._generate(command)
            elif op == "run":
                self._run(command)
            else:
                self.send(error_frame(AnyformerError(ErrorCode.BAD_REQUEST, f"unknown worker command {op!r}")))

    def _load(self, command: Mapping[str, Any]) -> bool:
        try:
            backend = command["backend"]
            self._backend = backend
            entry = command["entry_point"]
            self._manager.load_entry_point(EntryPointRecord(name=backend, value=entry, group=ENTRY_POINT_GROUP))
            model_data = dict(command["model"])
            model = dataclasses.replace(Model.from_dict(model_data), config=dict(model_data.get("config") or {}))
            fields = dict(command["request"])
            request = Request(
                **{**fields, "prefer": tuple(fields.get("prefer") or ()), "rpc": tuple(fields.get("rpc") or ())}
            )
            self._handle = self._manager.load(backend, model, request, self._progress)
            self._features = features_of(self._handle)
        except AnyformerError as exc:
            self.send(error_frame(exc))
            return False
        except Exception as exc:
            self.send(error_frame(exception_to_error(self._backend, "loading", exc)))
            return False
        self.send(
            {
                "op": "loaded",
                "backend": self._handle.backend,
                "task": self._handle.task,
                "features": self._features.to_dict(),
            }
        )
        return True

    def _progress(self, event: ProgressEvent) -> None:
        self.send({"op": "progress", **dataclasses.asdict(event)})

    def _dispose(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                handle.dispose()
            except Exception as exc:
                print(f"anyformer worker: dispose raised {type(exc).__name__}: {exc}", file=sys.stderr)

    # ---- work -----------------------------------------------------------------------------------

    def _generate(self, command: Mapping[str, Any]) -> None:
        self._run_generation(self._register(command), command)

    def _register(self, command: Mapping[str, Any]) -> _Generation:
        """Make the generation a command starts known to the stdin thread (its cancel and more)."""
        # The parent numbers its generations; a command without a number answers as generation 0.
        ident = command.get("id")
        generation = _Generation(ident if isinstance(ident, int) else 0, int(command.get("window", 1)))
        self._generations[generation.ident] = generation
        return generation

    def _run_generation(self, generation: _Generation, command: Mapping[str, Any]) -> None:
        try:
            with cancelled_by(generation.cancel):  # a cancel stops a chat template mid-render too
                self._stream(command, generation)
        finally:
            self._generations.pop(generation.ident, None)

    def _generate_in_thread(self, command: Mapping[str, Any]) -> None:
        """Run a generation beside the others (a handle with ``parallel`` > 1); the main thread reads on."""
        self._threads = [thread for thread in self._threads if thread.is_alive()]
        generation = self._register(command)  # before the thread starts: a cancel sent at once finds it
        thread = threading.Thread(
            target=self._run_generation,
            args=(generation, command),
            name=f"anyformer-worker-generation-{generation.ident}",
            daemon=True,
        )
        self._threads.append(thread)
        thread.start()

    def _stop_generations(self) -> None:
        """Cancel every generation in progress and wait for their threads (before the model is disposed)."""
        for generation in list(self._generations.values()):
            generation.stop()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def _stream(self, command: Mapping[str, Any], generation: _Generation) -> None:
        ident = generation.ident
        assert self._handle is not None
        try:
            options = GenerateOptions.build(**decode_value(command["options"]), cancel=generation.cancel)
            note = RenderNote()
            with noting_renders(note):
                source = start_generation(self._handle, decode_value(command["messages"]), options)
        except Exception as exc:
            self.send({**error_frame(exception_to_error(self._backend, "generate", exc)), "id": ident})
            return
        # The parent's chunks say whether the prompt opened <think>: the render happened here (at the start,
        # or at the first token for a backend that renders lazily: then the first chunks frame says so).
        told = note.thinking_opened
        self.send({"op": "started", "id": ident, **({"thinking_opened": True} if told else {})})
        failure: AnyformerError | None = None
        try:
            for raw in _noted(_until_done(source, options, generation), note):
                if not isinstance(raw, Chunk) or not isinstance(raw.delta, str) or not isinstance(raw.tokens, int):
                    failure = AnyformerError(
                        ErrorCode.PLUGIN_ERROR, f"{self._backend}: generate yielded {type(raw).__name__}, not a Chunk"
                    )
                    break
                preview = raw.preview if isinstance(raw.preview, str) else None
                item = [raw.delta, raw.tokens, raw.finish_reason, raw.prompt_tokens, preview]
                if raw.logprobs or raw.prompt_logprobs:
                    item.append([[e.token, e.logprob, [list(pair) for pair in e.top]] for e in raw.logprobs])
                if raw.prompt_logprobs:
                    item.append([[e.token, e.logprob, [list(pair) for pair in e.top]] for e in raw.prompt_logprobs])
                frame: dict[str, Any] = {"op": "chunks", "id": ident, "items": [item]}
                if note.thinking_opened and not told:
                    frame["thinking_opened"] = told = True
                self.send(frame)
        except Exception as exc:
            failure = exception_to_error(self._backend, "generate", exc)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:
                    failure = failure or exception_to_error(self._backend, "generate", exc)
        self.send({**error_frame(failure), "id": ident} if failure else {"op": "end", "id": ident})

    def _run(self, command: Mapping[str, Any]) -> None:
        """Run the handle's ``run``; a ``run_progress`` handle's events go back as ``progress`` frames with the
        run's ``id``, and the parent's ``cancel`` for that id makes its next event raise ``CANCELLED``."""
        ident = command.get("id")
        # Registered like a generation so that the stdin thread's cancel reaches it at once.
        control = self._register(command) if isinstance(ident, int) else None
        reply_id = {"id": ident} if control is not None else {}
        try:
            if self._handle is None or not self._features.run:
                raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self._backend}: the loaded model has no run()")
            run = self._handle.run
            options = decode_value(command["options"])
            if self._features.run_progress:

                def forward(event: ProgressEvent) -> None:
                    self.send({"op": "progress", **reply_id, **dataclasses.asdict(event)})
                    if control is not None:
                        control.take()  # the parent's answer: more, or a cancel the reporter then raises

                cancel = control.cancel if control is not None else None
                value = run(
                    decode_value(command["input"]), progress=run_reporter(self._backend, forward, cancel), **options
                )
            else:
                value = run(decode_value(command["input"]), **options)
            self.send({"op": "result", **reply_id, "value": encode_value(value)})
        except Exception as exc:
            self.send({**error_frame(exception_to_error(self._backend, "run", exc)), **reply_id})
        finally:
            if control is not None:
                self._generations.pop(control.ident, None)


def _noted(chunks: Iterator[Any], note: RenderNote) -> Iterator[Any]:
    """``chunks``, each read with ``note`` current (a backend that renders at its first token notes it there)."""
    while True:
        with noting_renders(note):
            try:
                raw = next(chunks)
            except StopIteration:
                return
        yield raw


def _until_done(source: Iterator[Chunk], options: GenerateOptions, generation: _Generation) -> Iterator[Any]:
    """The backend's chunks while the window allows, up to the last one the parent's CoreStream would take."""
    while generation.take():
        try:
            raw = next(source)
        except StopIteration:
            return
        yield raw
        if not isinstance(raw, Chunk) or raw.finish_reason is not None or raw.tokens >= options.max_new_tokens:
            return


def prepare(frame: Mapping[str, Any]) -> None:
    """Work the worker can do before it knows its backend: import the module every backend imports
    (``anyformer.plugin``), and take the validated headers the parent sent (``headers``) into the
    header cache, so that the backend's ``load`` parses none of them again.
    """
    import anyformer.plugin  # noqa: F401  (the helpers every backend imports with its entry point)

    headers = frame.get("headers")
    if isinstance(headers, list):
        from anyformer.files._gguf_share import adopt_shared_headers

        try:
            adopt_shared_headers(headers)
        except Exception:  # a malformed hand-over costs only the parse it would have saved
            pass


def main(load: Mapping[str, Any]) -> int:
    """Run the worker with the ``load`` frame the bootstrap read; fd 0 and 1 carry the protocol."""
    commands_fd = os.dup(0)
    replies_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)  # an engine's printf lands in stderr, never in a frame
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # On a descriptor of its own: engines point fd 2 at /dev/null while loading (llama-cpp-python
    # does), and a crash there must still leave its Python stack in the parent's crash message.
    crash_log = os.fdopen(os.dup(2), "w")
    faulthandler.enable(file=crash_log, all_threads=False)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="anyformer-worker-parent", daemon=True).start()
    enable_hard_stop(STOP_PROCESS)  # a chat template that outlives its limit ends this worker, not the parent
    worker = Worker(commands_fd, replies_fd)
    try:
        return worker.serve(load)
    except BrokenPipeError:
        return 0
    finally:
        worker.finished.set()
