"""Image graphs: classification, object detection, segmentation and depth, read with ``preprocessor_config.json``."""

from __future__ import annotations

from anyformer.plugin import BackendModel, Model, ProgressCallback, Refusal, Request
from anyformer_onnx.graphs import ENCODER_STEMS, GraphChoice, choose_graph
from anyformer_onnx.media.processor_files import PREPROCESSOR_CONFIG
from anyformer_onnx.tasks.family import Graphs, Problem, TaskFamily, known_paths
from anyformer_onnx.tasks.names import DEPTH_ESTIMATION, IMAGE_CLASSIFICATION, IMAGE_SEGMENTATION, OBJECT_DETECTION

#: Detection heads (config.json ``model_type``) whose output is read: a softmax over the classes and
#: a last "no object" class, with normalised centre/size boxes.
DETR_STYLE = ("detr", "yolos", "table-transformer")
#: Segmentation heads (config.json ``architectures``) whose output is read besides ``…ForSemanticSegmentation``:
#: per query, class logits and mask logits, post-processed as Mask2Former's image processor does.
MASK_SEGMENTATION_HEADS = ("Mask2FormerForUniversalSegmentation",)


def _choose(model: Model, device: str, wanted: str | None) -> GraphChoice | None:
    return choose_graph(model, ENCODER_STEMS, device, wanted)


def _problem(model: Model, task: str, _graphs: Graphs | None) -> Problem:
    """The preprocessor config every image task reads, and the segmentation and detection heads read."""
    if model.file(PREPROCESSOR_CONFIG) is None:
        return Refusal.FORMAT, f"{task} needs {PREPROCESSOR_CONFIG} (the resize and normalisation), absent here"
    if task == IMAGE_SEGMENTATION:
        architectures = model.config.get("architectures")
        names = [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []
        if not any(name.endswith("ForSemanticSegmentation") or name in MASK_SEGMENTATION_HEADS for name in names):
            head = f"head {names[0]!r}" if names else "a model without config.json architectures"
            return (
                Refusal.MODEL,
                f"image-segmentation of {head}: this backend reads semantic heads (…ForSemanticSegmentation) "
                f"and {', '.join(MASK_SEGMENTATION_HEADS)} only",
            )
    if task == OBJECT_DETECTION:
        kind = model.config.get("model_type")
        if kind not in DETR_STYLE:
            return Refusal.MODEL, f"object-detection head {kind!r}: this backend reads {', '.join(DETR_STYLE)} heads"
    return None


def _open(
    model: Model, request: Request, progress: ProgressCallback, task: str, graphs: Graphs, provider: str
) -> BackendModel:
    from anyformer_onnx.vision.loading import open_vision_model  # numpy and the image handles: at load only

    assert isinstance(graphs, GraphChoice)  # this family chooses one graph
    return open_vision_model(model, request, progress, task, graphs, provider, FAMILY.files)


FAMILY = TaskFamily(
    name="vision",
    tasks=(IMAGE_CLASSIFICATION, OBJECT_DETECTION, IMAGE_SEGMENTATION, DEPTH_ESTIMATION),
    choose=_choose,
    graph_paths=known_paths(ENCODER_STEMS),
    open=_open,
    files=("config.json", PREPROCESSOR_CONFIG),
    problem=_problem,
    architectures=(
        ("ForImageClassification", IMAGE_CLASSIFICATION),
        ("ForObjectDetection", OBJECT_DETECTION),
        ("ForSemanticSegmentation", IMAGE_SEGMENTATION),
        ("ForUniversalSegmentation", IMAGE_SEGMENTATION),
        ("ForInstanceSegmentation", IMAGE_SEGMENTATION),
        ("ForDepthEstimation", DEPTH_ESTIMATION),
    ),
)
