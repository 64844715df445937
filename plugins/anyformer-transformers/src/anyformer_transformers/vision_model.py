"""A vision model loaded for one task: image classification, object detection, segmentation, depth.

The image goes through the repo's image processor (``preprocessor_config.json``, as
``transformers.pipeline`` prepares it), the network runs once per image, and the processor's own
post-processing reads the outputs. Results have the ONNX backend's shapes, which are the pipelines'
with arrays where a pipeline gives Pillow images or tensors (plain data crosses to an isolated worker):

- image-classification: per image the ``top_k`` (default 5, at most the number of labels) best
  ``{"label", "score"}``, best first; softmax over the labels, sigmoid for a multi-label or
  one-label head (``function_to_apply``: ``softmax``, ``sigmoid``, ``none``).
- object-detection: per image ``{"score", "label", "box": {"xmin", "ymin", "xmax", "ymax"}}`` for
  each detection above ``threshold`` (default 0.5), boxes in the image's pixels, truncated to integers.
- image-segmentation: per image ``{"score", "label", "mask"}``, ``mask`` a uint8 [height, width]
  array of 0 and 255; a panoptic or instance head (``subtask``, ``threshold``, ``mask_threshold``,
  ``overlap_mask_area_threshold``) gives its segments with scores, a semantic head one mask per
  class present (``score`` None).
- depth-estimation: per image ``{"predicted_depth", "depth"}``: the map at the image's size as a
  float32 [height, width] array, and that map scaled to 0-255 as uint8.

A list of images gives a list of those. The handle declares ``run_progress``: ``run`` reports an
event after each image (``classify``, ``detect``, ``segment``, ``estimate``) and stops there once
the caller cancelled (the core's reporter raises ``CANCELLED``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from anyformer.plugin import (
    AnyformerError,
    BackendModel,
    ErrorCode,
    Features,
    ProgressCallback,
    ProgressEvent,
    load_images,
    no_progress,
)
from anyformer_transformers import BACKEND_ID
from anyformer_transformers.classifier_model import FUNCTIONS, apply_function, labels_of
from anyformer_transformers.tasks import DEPTH_ESTIMATION, IMAGE_CLASSIFICATION, IMAGE_SEGMENTATION, OBJECT_DETECTION

#: The progress stage of each task.
STAGES = {
    IMAGE_CLASSIFICATION: "classify",
    OBJECT_DETECTION: "detect",
    IMAGE_SEGMENTATION: "segment",
    DEPTH_ESTIMATION: "estimate",
}
SUBTASKS = ("panoptic", "instance", "semantic")


def _bad(message: str) -> AnyformerError:
    return AnyformerError(ErrorCode.BAD_REQUEST, message)


def _fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise _bad(f"{name} must be a number from 0 to 1, got {value!r:.40}")
    return float(value)


def _mask(segmentation: Any, index: int) -> Any:
    """The 0/255 uint8 mask of the pixels equal to ``index`` (the pipeline's Pillow ``L`` image, as an array)."""
    import numpy as np

    return (np.asarray(segmentation) == index).astype(np.uint8) * 255


class VisionModel(BackendModel):
    """The handle: the network, its image processor, the task it was loaded for and its labels."""

    backend = BACKEND_ID
    #: ``run`` reports each image and stops between images when cancelled (the core's contract).
    features = Features(run_progress=True)

    def __init__(
        self, network: Any, processor: Any, *, task: str, config: Mapping[str, Any], details: dict[str, Any]
    ) -> None:
        self._network: Any = network
        self._processor: Any = processor
        self.task = task
        self.labels = labels_of(config)
        self._problem = config.get("problem_type")
        #: What was loaded: class, dtype, device.
        self.details = details

    def dispose(self) -> None:
        """Drop the network; safe to call twice."""
        self._network = None

    def _label(self, index: int) -> str:
        return self.labels.get(index, f"LABEL_{index}")

    def _options(self, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` checked for this task, with the pipeline's defaults; an unknown one is ``BAD_REQUEST``."""
        if self.task == IMAGE_CLASSIFICATION:
            allowed: dict[str, Any] = {"top_k": 5, "function_to_apply": None}
        elif self.task == OBJECT_DETECTION:
            allowed = {"threshold": 0.5}
        elif self.task == IMAGE_SEGMENTATION:
            allowed = {"subtask": None, "threshold": 0.9, "mask_threshold": 0.5, "overlap_mask_area_threshold": 0.5}
        else:
            allowed = {}
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise _bad(f"unknown option {unknown[0]!r} for {self.task}")
        chosen = {**allowed, **options}
        for name in ("threshold", "mask_threshold", "overlap_mask_area_threshold"):
            if name in chosen:
                chosen[name] = _fraction(name, chosen[name])
        top_k = chosen.get("top_k", 1)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise _bad(f"top_k must be an integer ≥ 1, got {top_k!r:.40}")
        if chosen.get("function_to_apply") not in (None, *FUNCTIONS):
            raise _bad(f"function_to_apply must be one of {FUNCTIONS}, got {chosen['function_to_apply']!r:.40}")
        if chosen.get("subtask") not in (None, *SUBTASKS):
            raise _bad(f"subtask must be one of {SUBTASKS}, got {chosen['subtask']!r:.40}")
        return chosen

    def run(self, input: Any, *, progress: ProgressCallback = no_progress, **options: Any) -> Any:
        """Answer the task for an image or a list of images (the shapes are in the module docstring)."""
        network = self._network
        if network is None:
            raise _bad("the model was disposed; load it again")
        chosen = self._options(options)
        images, single = load_images(input, self.task)
        results = []
        for done, image in enumerate(images, 1):
            outputs = self._forward(network, image)
            results.append(self._answer(outputs, image, chosen))
            progress(
                ProgressEvent(
                    stage=STAGES[self.task], backend=BACKEND_ID, done=done, total=len(images), message="images"
                )
            )
        return results[0] if single else results

    def _forward(self, network: Any, image: Any) -> Any:
        import torch

        inputs = self._processor(images=[image], return_tensors="pt").to(network.dtype).to(network.device)
        with torch.inference_mode():
            return network(**inputs)

    def _answer(self, outputs: Any, image: Any, options: dict[str, Any]) -> Any:
        size = [(image.height, image.width)]
        if self.task == IMAGE_CLASSIFICATION:
            return self._classes(outputs, options)
        if self.task == OBJECT_DETECTION:
            found = self._processor.post_process_object_detection(
                outputs, threshold=options["threshold"], target_sizes=size
            )[0]
            return [
                {
                    "score": float(score),
                    "label": self._label(int(label)),
                    "box": dict(zip(("xmin", "ymin", "xmax", "ymax"), box.int().tolist(), strict=True)),
                }
                for score, label, box in zip(found["scores"], found["labels"], found["boxes"], strict=True)
            ]
        if self.task == IMAGE_SEGMENTATION:
            return self._segments(outputs, size, options)
        depth = self._processor.post_process_depth_estimation(outputs, size)[0]["predicted_depth"]
        predicted = depth.detach().float().cpu().numpy()
        span = float(predicted.max() - predicted.min())
        scaled = (predicted - predicted.min()) / span if span > 0 else predicted * 0
        return {"predicted_depth": predicted, "depth": (scaled * 255).astype("uint8")}

    def _function(self, asked: Any) -> str:
        """The pipeline's choice of score function when none is asked."""
        if asked is not None:
            return str(asked)
        if self._problem == "regression":
            return "none"
        if self._problem == "multi_label_classification" or len(self.labels) == 1:
            return "sigmoid"
        return "softmax"

    def _classes(self, outputs: Any, options: dict[str, Any]) -> list[dict[str, Any]]:
        row = apply_function(outputs.logits[0].float().cpu(), self._function(options["function_to_apply"])).tolist()
        order = sorted(range(len(row)), key=lambda i: (-row[i], i))[: options["top_k"]]
        return [{"label": self._label(i), "score": float(row[i])} for i in order]

    def _segments(self, outputs: Any, size: list[tuple[int, int]], options: dict[str, Any]) -> list[dict[str, Any]]:
        import numpy as np

        subtask = options["subtask"]
        processor = self._processor
        method = None
        if subtask in ("panoptic", None) and hasattr(processor, "post_process_panoptic_segmentation"):
            method = processor.post_process_panoptic_segmentation
        elif subtask in ("instance", None) and hasattr(processor, "post_process_instance_segmentation"):
            method = processor.post_process_instance_segmentation
        if method is not None:
            found = method(
                outputs,
                threshold=options["threshold"],
                mask_threshold=options["mask_threshold"],
                overlap_mask_area_threshold=options["overlap_mask_area_threshold"],
                target_sizes=size,
            )[0]
            segmentation = found["segmentation"].cpu().numpy()
            return [
                {
                    "score": info["score"],
                    "label": self._label(int(info["label_id"])),
                    "mask": _mask(segmentation, info["id"]),
                }
                for info in found["segments_info"]
            ]
        if subtask in ("semantic", None) and hasattr(processor, "post_process_semantic_segmentation"):
            segmentation = processor.post_process_semantic_segmentation(outputs, target_sizes=size)[0].cpu().numpy()
            return [
                {"score": None, "label": self._label(int(index)), "mask": _mask(segmentation, int(index))}
                for index in np.unique(segmentation)
            ]
        raise _bad(f"subtask {subtask!r}: this model's image processor does not segment that way")
