"""Starting a worker process, in a module light enough to import before the rest of anyformer.

The ``anyformer`` command starts its worker first thing (:func:`prestart`), so the worker's
interpreter start and its imports overlap the command's own; ``load`` then takes that process
(:func:`take_prestarted`) instead of starting one. A prestarted worker nobody takes is ended
(:func:`discard_prestarted`, and at exit at the latest).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys

from anyformer.isolation._worker_protocol import encode_frame

#: The worker's first lines: take the parent's sys.path from the first frame, import the worker
#: (anyformer) while the parent still describes and selects, do what each ``prepare`` frame asks
#: (:func:`share_headers`), then read the ``load`` frame and run.
#: When the worker is done (the model freed, or never loaded) it ends without the interpreter's
#: teardown: unloading numpy, torch or an engine's modules takes tens of ms that the parent's
#: ``dispose`` would wait for, and nothing is left to flush but stderr.
BOOTSTRAP = """\
import json, os, struct, sys
def _read(n):
    data = b""
    while len(data) < n:
        part = os.read(0, n - len(data))
        if not part:
            sys.exit(0)
        data += part
    return data
def _frame():
    return json.loads(_read(struct.unpack(">I", _read(4))[0]))
_next = _frame()
sys.path[:] = _next["sys_path"]
from anyformer.isolation._worker import main, prepare
while _next.get("op") == "prepare":
    prepare(_next)
    _next = _frame()
code = main(_next)
sys.stderr.flush()
os._exit(code)
"""


def end_process(process: subprocess.Popen[bytes]) -> None:
    """The finalizer of a session dropped without ``dispose``: the worker must not outlive it."""
    if process.poll() is None:
        process.kill()
        process.wait()


def start_worker_process() -> subprocess.Popen[bytes]:
    """Start a worker interpreter and send it this process's ``sys.path``: it imports anyformer at once.

    The caller describes the model and selects a backend meanwhile, then hands the process to
    :meth:`WorkerSession.spawn` (or to :func:`end_worker_process` when it does not need it).
    """
    # ggml attaches gdb to print a backtrace before it aborts: seconds of work whose output
    # would bury the assertion line the crash message quotes. The worker's faulthandler says
    # where Python was; gdb's view is one in-process run away.
    env = {"GGML_NO_BACKTRACE": "1", **os.environ}
    process = subprocess.Popen(
        [sys.executable, "-c", BOOTSTRAP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        close_fds=True,
        env=env,
    )
    assert process.stdin is not None
    try:
        prepare = {"op": "prepare", "sys_path": list(sys.path)}
        os.write(process.stdin.fileno(), encode_frame(prepare))
    except OSError:
        pass  # the worker is already gone: the load that follows reports how it died
    return process


def end_worker_process(process: subprocess.Popen[bytes]) -> None:
    """End a worker started by :func:`start_worker_process` that was never given a model."""
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    end_process(process)


_prestarted: subprocess.Popen[bytes] | None = None


def prestart() -> None:
    """Start a worker now, for the ``load`` this process is about to make (see :func:`take_prestarted`)."""
    global _prestarted
    if _prestarted is None:
        _prestarted = start_worker_process()
        atexit.register(discard_prestarted)


def take_prestarted() -> subprocess.Popen[bytes] | None:
    """The prestarted worker, once (None when there is none)."""
    global _prestarted
    process, _prestarted = _prestarted, None
    return process


def share_headers(process: subprocess.Popen[bytes], path: str) -> None:
    """Send a worker the validated headers this process has cached for the local model ``path``.

    The worker's backend reads them again to load the model; with them in its header cache it
    parses none (see ``anyformer.files._gguf_share``). Sent as soon as the parent has described
    the model, so the worker takes them in while the parent chooses a backend.
    """
    from anyformer.files._gguf_share import shared_headers

    entries = shared_headers(path)
    if not entries or process.stdin is None:
        return
    try:
        frame = memoryview(encode_frame({"op": "prepare", "headers": entries}))
    except (TypeError, ValueError):
        return  # over the frame limit (a huge chat template), or not JSON: the worker reads the headers itself
    try:
        while frame:
            frame = frame[os.write(process.stdin.fileno(), frame) :]
    except OSError:
        pass  # the worker is gone: the load that follows reports how it died


def discard_prestarted() -> None:
    """End the prestarted worker if no ``load`` took it."""
    process = take_prestarted()
    if process is not None:
        end_worker_process(process)
