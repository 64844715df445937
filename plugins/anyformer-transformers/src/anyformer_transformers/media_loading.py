"""From a description to a vision or speech handle: the image processor or feature extractor, and the network.

The processors come from ``preprocessor_config.json`` through transformers' auto classes with
``trust_remote_code=False`` (the class is one transformers ships, never the repo's code); the
network as every other task's (``loading.build_network``: safetensors only, the plan's dtype).
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
    fetch_files,
)
from anyformer_transformers import BACKEND_ID
from anyformer_transformers.estimate import Plan
from anyformer_transformers.loading import build_network, folder_of
from anyformer_transformers.placement import describe
from anyformer_transformers.speech_model import SpeechModel
from anyformer_transformers.tasks import (
    DEPTH_ESTIMATION,
    IMAGE_CLASSIFICATION,
    IMAGE_SEGMENTATION,
    OBJECT_DETECTION,
    SPEECH_RECOGNITION,
)
from anyformer_transformers.vision_model import VisionModel


def _auto_class(task: str, model_type: str) -> Any:
    import transformers

    if task == IMAGE_SEGMENTATION:
        from transformers.models.auto import modeling_auto

        # A segmenter is a semantic, universal or instance head: the table that names its model_type decides.
        for table, auto in (
            ("MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES", "AutoModelForUniversalSegmentation"),
            ("MODEL_FOR_INSTANCE_SEGMENTATION_MAPPING_NAMES", "AutoModelForInstanceSegmentation"),
        ):
            if model_type in getattr(modeling_auto, table, {}):
                return getattr(transformers, auto)
        return transformers.AutoModelForSemanticSegmentation
    return {
        IMAGE_CLASSIFICATION: transformers.AutoModelForImageClassification,
        OBJECT_DETECTION: transformers.AutoModelForObjectDetection,
        DEPTH_ESTIMATION: transformers.AutoModelForDepthEstimation,
        SPEECH_RECOGNITION: transformers.AutoModelForSpeechSeq2Seq,
    }[task]


def _processor(auto: Any, folder: Any, model: Model, what: str) -> Any:
    try:
        return auto.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{model.ref}: transformers cannot load its {what}: {exc}") from exc


def load_media_model(model: Model, task: str, names: list[str], plan: Plan, progress: ProgressCallback) -> BackendModel:
    """Fetch ``names`` and build the handle for a vision or speech ``task`` in ``plan.dtype``."""
    paths = fetch_files(model, names, progress, backend=BACKEND_ID)
    folder = folder_of(paths)
    progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=str(folder.name), done=0, total=None))
    import transformers

    network = build_network(_auto_class(task, str(model.config.get("model_type"))), folder, plan, model)
    details: dict[str, Any] = {**describe(plan), "class": type(network).__name__}
    config = network.config.to_dict()
    handle: BackendModel
    if task == SPEECH_RECOGNITION:
        extractor = _processor(transformers.AutoFeatureExtractor, folder, model, "feature extractor")
        tokenizer = _processor(transformers.AutoTokenizer, folder, model, "tokenizer")
        handle = SpeechModel(network, extractor, tokenizer, details=details)
    else:
        processor = _processor(transformers.AutoImageProcessor, folder, model, "image processor")
        handle = VisionModel(network, processor, task=task, config=config, details=details)
    progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=str(folder.name), done=1, total=1))
    return handle
