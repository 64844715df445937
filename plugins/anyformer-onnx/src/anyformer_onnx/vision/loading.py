"""Opening an image graph with its preprocessing (preprocessor_config.json) and labels (config.json).

The loader of :mod:`anyformer_onnx.tasks.vision`, imported when such a model loads (it imports numpy).
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
from anyformer_onnx.graphs import GraphChoice
from anyformer_onnx.media.image_preprocessing import ImagePreprocessor
from anyformer_onnx.media.processor_files import PREPROCESSOR_CONFIG
from anyformer_onnx.session.ort_session import open_session
from anyformer_onnx.tasks.names import DEPTH_ESTIMATION, IMAGE_CLASSIFICATION, IMAGE_SEGMENTATION
from anyformer_onnx.vision.handles import (
    OnnxDepthEstimatorModel,
    OnnxImageClassifierModel,
    OnnxMaskSegmenterModel,
    OnnxObjectDetectorModel,
    OnnxSegmenterModel,
    VisionGraph,
)


def open_vision_model(
    model: Model,
    request: Request,
    progress: ProgressCallback,
    task: str,
    choice: GraphChoice,
    provider: str,
    files: tuple[str, ...],
) -> BackendModel:
    """Open an image graph with its preprocessing (preprocessor_config.json) and labels (config.json).

    ``files``: the family's files read beside the graph when the repo has them.
    """
    if model.file(PREPROCESSOR_CONFIG) is None:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{model.ref}: {task} needs {PREPROCESSOR_CONFIG}")
    extra = [name for name in files if model.file(name) is not None]
    paths = fetch_files(model, [*choice.files, *extra], progress, backend=BACKEND_ID)
    label = f"{model.ref} ({choice.graph.name})"
    preprocessor = ImagePreprocessor.from_config(
        read_config_json(paths[PREPROCESSOR_CONFIG], f"{PREPROCESSOR_CONFIG} of {label}"), label
    )
    config = read_config_json(paths["config.json"], f"config.json of {label}") if "config.json" in paths else {}
    progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.graph.name, total=choice.size))
    session, actual = open_session(paths[choice.graph.name], provider=provider, threads=request.options.get("threads"))
    progress(
        ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.graph.name, done=choice.size, total=choice.size)
    )
    details: dict[str, Any] = {"file": choice.graph.name, "precision": choice.precision, "provider": actual}
    graph = VisionGraph(session, preprocessor, label)
    config = config or dict(model.config)
    if task == IMAGE_CLASSIFICATION:
        return OnnxImageClassifierModel(graph, config=config, details=details)
    if task == IMAGE_SEGMENTATION:
        if "class_queries_logits" in graph.outputs:
            return OnnxMaskSegmenterModel(graph, config=config, details=details)
        return OnnxSegmenterModel(graph, config=config, details=details)
    if task == DEPTH_ESTIMATION:
        return OnnxDepthEstimatorModel(graph, details=details)
    return OnnxObjectDetectorModel(graph, config=config, details=details)
