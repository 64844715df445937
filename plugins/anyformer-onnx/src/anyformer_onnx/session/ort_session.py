"""Opening an ONNX graph with onnxruntime: validated first, on the chosen provider, with bounded threads.

The core's validator walks the protobuf with hard limits and checks every external-data location
(inside the model folder, no hardlinks, ranges within the files) before onnxruntime sees the file:
onnxruntime's own loader has followed external data out of the folder before (SAFETY.md O1).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
from pathlib import Path
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, check_onnx_external_data, usable_cpu_count
from anyformer_onnx.session.providers import CPU, CUDA, available_providers, choose_provider

#: Environment variable that sets the intra-op threads (default: every usable core).
THREADS_VARIABLE = "ANYFORMER_ONNX_THREADS"


def pick_threads(requested: Any = None) -> int:
    """Intra-op threads: the request's ``threads`` option, ``ANYFORMER_ONNX_THREADS``, else every usable core."""
    for value in (requested, os.environ.get(THREADS_VARIABLE)):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        if isinstance(value, str) and value.isdigit() and int(value) > 0:
            return int(value)
    return usable_cpu_count()


@functools.cache
def preload_cuda_libraries() -> None:
    """Load CUDA's and cuDNN's libraries from the ``nvidia-*`` wheels, where they came so, before a session.

    ``pip install onnxruntime-gpu[cuda,cudnn]`` puts them in site-packages, where the dynamic loader does not
    look; onnxruntime's ``preload_dlls`` (1.21 and later) loads them from there, and does nothing harmful where
    they come from the system instead. What it prints on a miss is swallowed: the session then falls back to
    the CPU and the provider it really runs on is what the estimate reports.
    """
    import onnxruntime

    preload = getattr(onnxruntime, "preload_dlls", None)
    if preload is None:
        return
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            preload()
        except Exception:  # a missing or mismatched wheel only means the system's libraries are used
            pass


def open_session(path: Path, *, provider: str | None = None, threads: int | None = None) -> tuple[Any, str]:
    """Validate ``path`` and its external data, then open an ``InferenceSession``; returns it and its provider.

    ``BAD_MODEL`` for a file the validator or onnxruntime rejects; ``OUT_OF_MEMORY`` when onnxruntime
    cannot allocate the weights.
    """
    check_onnx_external_data(path)
    import onnxruntime

    chosen = choose_provider(available_providers(), provider)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = pick_threads(threads)
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only: optimizer notes would reach the user's terminal
    providers = [chosen, CPU] if chosen == CUDA else [CPU]
    if chosen == CUDA:
        preload_cuda_libraries()
    try:
        session = onnxruntime.InferenceSession(str(path), sess_options=options, providers=providers)
    except MemoryError as exc:
        raise AnyformerError(
            ErrorCode.OUT_OF_MEMORY, f"{path.name}: out of memory opening the graph", cause=exc
        ) from exc
    except Exception as exc:  # onnxruntime raises its own exception types for every kind of bad graph
        text = error_text(exc)
        if "alloc" in text.lower() and "fail" in text.lower():
            raise AnyformerError(ErrorCode.OUT_OF_MEMORY, f"{path.name}: {text}", cause=exc) from exc
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"{path.name}: onnxruntime cannot open it: {text}", cause=exc
        ) from exc
    actual = session.get_providers()[0] if session.get_providers() else CPU
    return session, actual


def error_text(exc: BaseException) -> str:
    """What a message quotes of an onnxruntime error: its first line (its type's name where it says nothing)."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def run_refusing(session: Any, outputs: list[str], feeds: dict[str, Any], refused: str) -> list[Any]:
    """``session.run``; an error there (inputs of a shape the graph was not exported for: onnxruntime's own
    exception types) is ``BAD_REQUEST`` "``refused``: <the error's first line>"."""
    try:
        return list(session.run(outputs, feeds))
    except Exception as exc:  # onnxruntime's own error types
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{refused}: {error_text(exc)}") from exc
