"""Opening a Whisper-style split export with its log-mel settings, tokenizer and generation config.

The loader of :mod:`anyformer_onnx.tasks.speech`, imported when such a model loads (it imports numpy).
"""

from __future__ import annotations

from typing import Any

from anyformer.plugin import (
    AnyformerError,
    BackendModel,
    ErrorCode,
    Model,
    ProgressCallback,
    ProgressEvent,
    Request,
    fetch_files,
    read_config_json,
)
from anyformer_onnx import BACKEND_ID
from anyformer_onnx.graphs import GraphSet
from anyformer_onnx.media.log_mel import LogMel
from anyformer_onnx.media.processor_files import PREPROCESSOR_CONFIG
from anyformer_onnx.session.ort_session import open_session
from anyformer_onnx.speech.handle import OnnxSpeechRecognizerModel, WhisperGraphs
from anyformer_onnx.speech.speech_files import SPEECH_FILES
from anyformer_onnx.text.setup import load_tokenizer


def open_speech_model(
    model: Model,
    request: Request,
    progress: ProgressCallback,
    graphs: GraphSet,
    provider: str,
    files: tuple[str, ...],
) -> BackendModel:
    """Open a Whisper-style split export with its log-mel settings, tokenizer and generation config."""
    missing = [name for name in SPEECH_FILES if model.file(name) is None]
    if missing:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{model.ref}: speech recognition needs {missing[0]}")
    extra = [name for name in files if model.file(name) is not None]
    paths = fetch_files(model, [*graphs.files, *extra], progress, backend=BACKEND_ID)
    label = f"{model.ref} ({graphs.graph.name})"
    front_end = LogMel.from_config(
        read_config_json(paths[PREPROCESSOR_CONFIG], f"{PREPROCESSOR_CONFIG} of {label}"), label
    )
    generation = read_config_json(paths["generation_config.json"], f"generation_config.json of {label}")
    tokenizer = load_tokenizer(paths["tokenizer.json"], label)
    progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=graphs.graph.name, total=graphs.size))
    threads = request.options.get("threads")
    sessions = []
    actual = provider
    for part in graphs.parts:
        session, actual = open_session(paths[part.graph.name], provider=provider, threads=threads)
        sessions.append(session)
    progress(
        ProgressEvent(stage="load", backend=BACKEND_ID, file=graphs.graph.name, done=graphs.size, total=graphs.size)
    )
    details: dict[str, Any] = {"files": list(graphs.files), "precision": graphs.precision, "provider": actual}
    encoder, first, with_past = sessions
    return OnnxSpeechRecognizerModel(
        WhisperGraphs(encoder, first, with_past, label),
        front_end=front_end,
        tokenizer=tokenizer,
        generation=generation,
        details=details,
    )
