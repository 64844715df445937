"""What the parent and an isolated worker say to each other, and how a dead worker is diagnosed.

Frames are a 4-byte big-endian length and a UTF-8 JSON object with an ``op``. JSON, not pickle:
the worker runs an engine on files from strangers, and a worker taken over by a hostile file must
not be able to run code in the parent by what it sends back (unpickling runs code). Every frame
is bounded (:data:`MAX_FRAME_BYTES`) and every field the parent reads is type-checked.

Parent to worker: ``prepare`` (the first frame: the parent's ``sys_path``; a later one may carry the
model's validated ``headers``), ``load``, ``generate`` (with a
generation ``id`` and a ``window`` of chunks it may send ahead), ``more`` (more window),
``cancel``, ``run`` (numbered with an ``id`` as a generation is, its window 0), ``dispose``. Worker
to parent: ``progress`` (while loading; with a run's ``id``, one unit of that run, after which the
worker waits for ``more`` or ``cancel``), ``loaded`` (with the handle's declarations: ``has_run``,
``run_progress``…), ``started``, ``chunks`` (a list of ``[delta, tokens, finish_reason,
prompt_tokens, preview]``), ``end``, ``result``, ``disposed``, and ``error`` (a code and message),
which ends the command, generation or run it answers.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode

#: The largest frame either side accepts: a result of ``run`` (embeddings of a batch) fits.
MAX_FRAME_BYTES = 64 * 1024 * 1024
_LENGTH = struct.Struct(">I")

#: Lines of the worker's stderr kept for the crash message and the out-of-memory check.
STDERR_TAIL_LINES = 200
#: Of those, how many the crash message quotes.
QUOTED_STDERR_LINES = 6
_QUOTED_STDERR_CHARS = 900

#: What engines print when an allocation fails: the C++ runtime, libc, Python, CUDA, Vulkan, ggml.
OOM_PATTERNS = re.compile(
    r"out of memory|std::bad_alloc|cannot allocate memory|memoryerror|cudaerrormemoryallocation"
    r"|error_?out_?of_?(device|host)_?memory|erroroutof(device|host)memory|failed to allocate"
    r"|unable to allocate|alloc(ation)? failed",
    re.IGNORECASE,
)


class ProtocolError(Exception):
    """The other side sent something that is not a well-formed frame."""


def encode_frame(message: Mapping[str, Any]) -> bytes:
    """One frame: the length prefix and the JSON payload."""
    payload = json.dumps(message, separators=(",", ":"), ensure_ascii=False, default=_not_json).encode("utf-8")
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"a {len(payload)}-byte message is over the {MAX_FRAME_BYTES}-byte frame limit")
    return _LENGTH.pack(len(payload)) + payload


def _not_json(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} cannot cross to or from an isolated worker")


def write_frame(fd: int, message: Mapping[str, Any]) -> None:
    """Write one whole frame to a file descriptor (``BrokenPipeError`` when the other side is gone)."""
    view = memoryview(encode_frame(message))
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exactly(fd: int, size: int) -> bytes | None:
    parts: list[bytes] = []
    left = size
    while left:
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            if left == size:
                return None
            raise ProtocolError(f"the stream ended {left} bytes into a {size}-byte frame")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def read_frame(fd: int) -> dict[str, Any] | None:
    """Read one frame; None at a clean end of the stream. A malformed frame raises :class:`ProtocolError`."""
    head = _read_exactly(fd, _LENGTH.size)
    if head is None:
        return None
    (size,) = _LENGTH.unpack(head)
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(f"a frame of {size} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    payload = _read_exactly(fd, size) if size else b""
    if payload is None:
        raise ProtocolError("the stream ended after a frame's length")
    try:
        message = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"a frame is not JSON: {exc}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise ProtocolError("a frame is not an object with an 'op'")
    return message


# ---- values that are not JSON: bytes and arrays (image blocks, run inputs and results) ----------


def encode_value(value: Any) -> Any:
    """``value`` as JSON data: bytes become ``{"$bytes": base64}``, arrays ``{"$array": …}``."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        return {str(k): encode_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    if hasattr(value, "__array__") and hasattr(value, "dtype") and hasattr(value, "shape"):
        import numpy as np

        array = np.ascontiguousarray(value)
        return {
            "$array": {
                "dtype": array.dtype.str,
                "shape": list(array.shape),
                "data": base64.b64encode(array.tobytes()).decode("ascii"),
            }
        }
    raise TypeError(f"{type(value).__name__} cannot cross to or from an isolated worker")


def decode_value(value: Any) -> Any:
    """The inverse of :func:`encode_value`; a malformed encoding raises :class:`ProtocolError`."""
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"$bytes"}:
        try:
            return base64.b64decode(value["$bytes"], validate=True)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"bad $bytes: {exc}") from exc
    if set(value) == {"$array"}:
        return _decode_array(value["$array"])
    return {k: decode_value(v) for k, v in value.items()}


def _decode_array(spec: Any) -> Any:
    import numpy as np

    try:
        dtype = np.dtype(spec["dtype"])
        if dtype.hasobject:
            raise ProtocolError("an object array cannot cross")
        shape = tuple(int(n) for n in spec["shape"])
        data = base64.b64decode(spec["data"], validate=True)
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    except ProtocolError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"bad $array: {exc}") from exc


# ---- errors across the pipe ---------------------------------------------------------------------


def error_frame(exc: AnyformerError) -> dict[str, Any]:
    """An ``error`` frame carrying an :class:`AnyformerError`'s code, message and need."""
    return {"op": "error", "code": exc.code.value, "message": exc.message, "need": exc.need}


def error_from_frame(frame: Mapping[str, Any]) -> AnyformerError:
    """The :class:`AnyformerError` an ``error`` frame carries (a malformed one is a protocol error)."""
    code, message, need = frame.get("code"), frame.get("message"), frame.get("need")
    if not isinstance(code, str) or code not in ErrorCode.__members__ or not isinstance(message, str):
        raise ProtocolError(f"a malformed error frame: {dict(frame)!r:.200}")
    if need is not None and (isinstance(need, bool) or not isinstance(need, int)):
        need = None
    return AnyformerError(code, message, need=need)


def exception_to_error(backend: str, stage: str, exc: BaseException) -> AnyformerError:
    """What the core makes of an exception a backend raised while ``stage`` (as in-process: _stream, _plugins)."""
    if isinstance(exc, AnyformerError):
        return exc
    if isinstance(exc, MemoryError):
        return AnyformerError(ErrorCode.OUT_OF_MEMORY, f"{backend}: out of memory while {stage}")
    return AnyformerError(ErrorCode.PLUGIN_ERROR, f"{backend}: {stage} raised {type(exc).__name__}: {exc}")


# ---- a dead worker --------------------------------------------------------------------------------


def describe_exit(returncode: int) -> str:
    """``killed by SIGSEGV`` or ``exited with status 3``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with status {returncode}"


def looks_out_of_memory(lines: Iterable[str]) -> bool:
    """True when the worker's stderr says an allocation failed."""
    return any(OOM_PATTERNS.search(line) for line in lines)


def oom_kill_count() -> int | None:
    """How many processes the kernel's OOM killer has ended in this process's memory cgroup, if readable."""
    for path, key in _oom_counters():
        try:
            with open(path, encoding="ascii") as counters:
                for line in counters:
                    name, _, number = line.partition(" ")
                    if name == key and number.strip().isdigit():
                        return int(number)
        except OSError:
            continue
    return None


def _oom_counters() -> list[tuple[str, str]]:
    candidates: list[tuple[str, str]] = []
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as groups:
            for line in groups:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    candidates.append((f"/sys/fs/cgroup{path.rstrip('/')}/memory.events", "oom_kill"))
                elif "memory" in controllers.split(","):
                    candidates.append((f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.oom_control", "oom_kill"))
    except (OSError, ValueError):
        pass
    candidates += [
        ("/sys/fs/cgroup/memory.events", "oom_kill"),
        ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),
    ]
    return candidates


def _quoted_lines(stderr_tail: Sequence[str]) -> list[str]:
    """The engine's last words: faulthandler's Python stack dump is cut to its headline and innermost frame."""
    lines = [line.strip() for line in stderr_tail if line.strip()]
    fatal = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("Fatal Python error:")), None)
    if fatal is None:
        return lines[-QUOTED_STDERR_LINES:]
    innermost = next((line for line in lines[fatal + 1 :] if line.startswith("File ")), None)
    return [*lines[:fatal][-(QUOTED_STDERR_LINES - 2) :], lines[fatal], *([f"at {innermost}"] if innermost else [])]


def crash_error(
    backend: str,
    pid: int,
    stage: str,
    returncode: int,
    stderr_tail: Sequence[str],
    *,
    oom_kills_before: int | None = None,
    oom_kills_after: int | None = None,
) -> AnyformerError:
    """The error for a worker that died while ``stage`` (``loading``, ``generating``…).

    Out of memory is recognised from the stderr tail, or from a SIGKILL while the cgroup's OOM-kill
    count went up. Dying of it while loading is ``OUT_OF_MEMORY`` (SAFETY R5); any other death, and
    any death during compute, is ``BACKEND_CRASHED`` (SAFETY R6).
    """
    killed_by_oom = (
        returncode == -signal.SIGKILL
        and oom_kills_before is not None
        and oom_kills_after is not None
        and oom_kills_after > oom_kills_before
    )
    out_of_memory = killed_by_oom or looks_out_of_memory(stderr_tail)
    how = describe_exit(returncode)
    if killed_by_oom:
        how += " (the kernel's OOM killer)"
    elif returncode == -signal.SIGKILL:
        how += " (the kernel's OOM killer sends SIGKILL; so does kill -9)"
    text = f"the {backend} engine's worker process (pid {pid}) {how} while {stage}"
    if out_of_memory:
        text += ": out of memory"
    quoted = _quoted_lines(stderr_tail)
    if quoted:
        tail = " | ".join(quoted)
        if len(tail) > _QUOTED_STDERR_CHARS:
            tail = "…" + tail[-_QUOTED_STDERR_CHARS:]
        text += f"; its last stderr lines: {tail}"
    else:
        text += "; it wrote nothing to stderr"
    text += "; this process is unharmed, load the model again to retry"
    code = ErrorCode.OUT_OF_MEMORY if out_of_memory and stage == "loading" else ErrorCode.BACKEND_CRASHED
    return AnyformerError(code, text)
