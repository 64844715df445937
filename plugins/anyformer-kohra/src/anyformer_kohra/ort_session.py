"""Opening an onnxruntime session on a model file, safely: the external-data check always comes first.

onnxruntime follows every external-data ``location`` a graph names, so
:func:`anyformer.plugin.check_onnx_external_data` vets the file (and its data files) before
onnxruntime sees the path. Library failures become ``BAD_MODEL`` naming the file. Nothing here is
kohra-specific: it is the part another ONNX backend would share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, check_onnx_external_data, usable_cpu_count
from anyformer_kohra.ort_providers import session_providers


def open_session(path: Path, *, threads: int | None = None) -> tuple[Any, str]:
    """Check ``path`` and open an ``InferenceSession`` on it; return the session and its provider."""
    check_onnx_external_data(path)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or usable_cpu_count()
    options.inter_op_num_threads = 1
    # Our own logging decides what a user sees; onnxruntime's warnings about unused initializers are noise.
    options.log_severity_level = 3
    providers = session_providers(ort.get_available_providers())
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidGraph, ...)
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"{path.name}: onnxruntime cannot load the graph: {exc}", cause=exc
        ) from exc
    return session, session.get_providers()[0]
