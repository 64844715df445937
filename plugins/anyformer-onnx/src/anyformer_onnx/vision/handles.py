"""Vision graphs (``pixel_values`` in): classification, detection, segmentation and depth estimation.

Outputs are shaped as transformers' pipelines return them:

- image-classification: per image, the ``top_k`` (default 5, at most the number of labels) best
  ``{"label", "score"}``, best first; a list of images gives a list of those lists. Scores are a
  softmax over the labels, a sigmoid for a multi-label or one-label head (``function_to_apply``
  overrides: ``softmax``, ``sigmoid``, ``none``).
- object-detection (DETR and YOLOS heads: a softmax over the classes plus "no object", boxes as
  normalised centre, width and height): per image, every query whose best real class scores above
  ``threshold`` (default 0.5), in query order, as ``{"score", "label", "box": {"xmin", "ymin",
  "xmax", "ymax"}}`` with the box in the original image's pixels, truncated to integers.
- image-segmentation (semantic heads: ``logits`` [classes, h, w]): the logits resized to the
  original image bilinearly (as torch's ``interpolate`` with ``align_corners=False``), the best
  class per pixel; per image, one ``{"score": None, "label", "mask"}`` per class present, in class
  order, ``mask`` a uint8 [height, width] array of 0 and 255 (the pipeline's Pillow ``L`` image as
  an array).
- image-segmentation (Mask2Former heads: ``class_queries_logits`` [queries, classes + "no object"],
  ``masks_queries_logits`` [queries, h, w]): as Mask2Former's image processor, the mask logits are
  first resized bilinearly to 384x384, then per ``subtask``:

  - ``panoptic`` (the default): each query's best class over the classes and "no object"; queries
    whose best is a real class scoring above ``threshold`` (default 0.9) keep their mask
    probabilities (sigmoid), resized to the image bilinearly and weighted by that score; each pixel
    goes to the query weighing most there; a query's pixels are a segment when there are some and
    they are more than ``overlap_mask_area_threshold`` (default 0.5) of its pixels weighing at least
    ``mask_threshold`` (default 0.5). Segments in query order.
  - ``instance``: the best ``queries`` (query, class) pairs by class probability, best first; each
    pair's mask is the query's logits above 0, scored by the class probability times the mean mask
    probability inside the mask, resized to the image by nearest neighbour; a non-empty mask scoring
    at least ``threshold`` is a segment, later segments taking the pixels they share with earlier
    ones. (The pipeline takes the same pairs in torch's unsorted ``topk`` order, which is best first
    for 64 classes or more and differs for fewer.)
  - ``semantic``: per pixel, the class with the highest sum over queries of class probability times
    mask probability, as for semantic heads (``score`` None).

  Per image a list of ``{"score", "label", "mask"}``, scores rounded to 6 digits, masks as for
  semantic heads.
- depth-estimation (``predicted_depth`` [h, w]): per image ``{"predicted_depth", "depth"}``, the
  first resized to the original image bicubically (as torch's ``interpolate`` with
  ``align_corners=False``), a float32 [height, width] array; the second that map scaled to 0-255
  as uint8 (the pipeline's Pillow image as an array).

Each handle declares ``run_progress``: ``run`` reports an event after each image (``classify``,
``detect``, ``segment`` or ``estimate``; ``done`` of ``total`` images) and stops there when the caller
cancelled (the core's reporter raises ``CANCELLED``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from anyformer.plugin import (
    AnyformerError,
    BackendModel,
    ErrorCode,
    Features,
    ProgressCallback,
    ProgressEvent,
    no_progress,
)
from anyformer.plugin import load_images as images_of
from anyformer_onnx import BACKEND_ID
from anyformer_onnx.media.image_preprocessing import ImagePreprocessor
from anyformer_onnx.session.ort_session import run_refusing
from anyformer_onnx.text.classifier import FUNCTIONS, apply_function, labels_of, softmax


def reported(images: list[Any], stage: str, progress: ProgressCallback) -> Iterator[Any]:
    """The images one by one; ``progress`` hears of each once the caller is done with it (``done`` of ``total``
    images), and its ``CANCELLED`` (the core's reporter, when the caller cancelled) ends the loop there."""
    for done, image in enumerate(images, 1):
        yield image
        progress(ProgressEvent(stage=stage, backend=BACKEND_ID, done=done, total=len(images), message="images"))


class VisionGraph:
    """A session taking ``pixel_values`` (and ``pixel_mask`` when it asks), with the model's preprocessing."""

    def __init__(self, session: Any, preprocessor: ImagePreprocessor, label: str) -> None:
        inputs = {i.name for i in session.get_inputs()}
        unknown = sorted(inputs - {"pixel_values", "pixel_mask"})
        if "pixel_values" not in inputs or unknown:
            wanted = unknown[0] if unknown else "pixel_values"
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: not a vision graph this backend feeds ({wanted})")
        self.session: Any = session
        self.preprocessor = preprocessor
        self.label = label
        self.has_mask = "pixel_mask" in inputs
        self.outputs = [o.name for o in session.get_outputs()]

    def close(self) -> None:
        """Drop the session; later calls are ``BAD_REQUEST``."""
        self.session = None

    def run(self, image: Any, outputs: list[str]) -> list[np.ndarray]:
        """The graph's ``outputs`` for one RGB Pillow image (a batch of one: sizes may differ per image)."""
        if self.session is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.label} was disposed")
        pixels = self.preprocessor(image)[None]
        feeds = {"pixel_values": pixels}
        if self.has_mask:
            feeds["pixel_mask"] = np.ones((1, pixels.shape[2], pixels.shape[3]), dtype=np.int64)
        return run_refusing(
            self.session, outputs, feeds, f"{self.label}: the graph refused pixels of shape {pixels.shape}"
        )


def _unknown(task: str, rest: Mapping[str, Any]) -> None:
    if rest:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"unknown option {sorted(rest)[0]!r} for {task}")


class OnnxImageClassifierModel(BackendModel):
    """A loaded image classifier: a vision graph with a ``logits`` output and config.json's labels."""

    backend = BACKEND_ID
    #: ``run`` reports each image and stops between images when cancelled (the core's contract).
    features = Features(run_progress=True)
    task = "image-classification"

    def __init__(self, graph: VisionGraph, *, config: Mapping[str, Any], details: dict[str, Any]) -> None:
        self.graph = graph
        self.details = details
        self._output = "logits" if "logits" in graph.outputs else graph.outputs[0]
        self.labels = labels_of(config)
        problem = config.get("problem_type")
        if problem == "regression":
            self.function = "none"
        elif problem == "multi_label_classification" or len(self.labels) == 1:
            self.function = "sigmoid"
        else:
            self.function = "softmax"

    def dispose(self) -> None:
        """Drop the session; safe to call twice."""
        self.graph.close()

    def run(
        self,
        input: Any,
        *,
        top_k: Any = 5,
        function_to_apply: Any = None,
        progress: ProgressCallback = no_progress,
        **rest: Any,
    ) -> Any:
        """Classify an image or a list of images (the output shape is in the module docstring)."""
        _unknown(self.task, rest)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"top_k must be an integer ≥ 1, got {top_k!r}")
        function = self.function if function_to_apply is None else function_to_apply
        if function not in FUNCTIONS:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"function_to_apply must be one of {FUNCTIONS}, got {function!r}"
            )
        images, single = images_of(input, self.task)
        results = []
        for image in reported(images, "classify", progress):
            (logits,) = self.graph.run(image, [self._output])
            row = apply_function(logits.reshape(-1), str(function))
            order = sorted(range(row.shape[0]), key=lambda i: (-row[i], i))[:top_k]
            results.append([{"label": self.labels.get(i, f"LABEL_{i}"), "score": float(row[i])} for i in order])
        return results[0] if single else results


def corners(boxes: np.ndarray, width: int, height: int) -> np.ndarray:
    """Normalised (centre x, centre y, width, height) boxes as (xmin, ymin, xmax, ymax) in pixels."""
    cx, cy, w, h = (boxes[..., i].astype(np.float32) for i in range(4))
    xyxy = np.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], axis=-1)
    return xyxy * np.asarray([width, height, width, height], dtype=np.float32)


def _resize_axis(values: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Linear resampling of one axis to ``size`` samples, half-pixel centres, edges clamped (no antialiasing)."""
    length = values.shape[axis]
    source = np.maximum((np.arange(size, dtype=np.float64) + 0.5) * (length / size) - 0.5, 0.0)
    low = np.minimum(np.floor(source).astype(np.int64), length - 1)
    high = np.minimum(low + 1, length - 1)
    weight = (source - low).astype(np.float32)
    shape = [1] * values.ndim
    shape[axis] = size
    weight = weight.reshape(shape)
    return np.take(values, low, axis=axis) * (1 - weight) + np.take(values, high, axis=axis) * weight


def resize_bilinear(maps: np.ndarray, height: int, width: int) -> np.ndarray:
    """[channels, h, w] maps resized to [channels, height, width] as torch's bilinear ``align_corners=False``."""
    return _resize_axis(_resize_axis(maps.astype(np.float32), height, 1), width, 2)


# torch's bicubic convolution coefficient.
_CUBIC_A = -0.75


def _cubic_axis(values: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Cubic resampling of one axis to ``size`` samples, half-pixel centres, edge samples repeated."""
    length = values.shape[axis]
    source = (np.arange(size, dtype=np.float64) + 0.5) * (length / size) - 0.5
    base = np.floor(source)
    t = source - base
    a = _CUBIC_A

    def near(x: np.ndarray) -> np.ndarray:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    shape = [1] * values.ndim
    shape[axis] = size
    total = np.zeros([size if i == axis else n for i, n in enumerate(values.shape)], dtype=np.float64)
    for offset, weight in zip((-1, 0, 1, 2), (far(t + 1), near(t), near(1 - t), far(2 - t)), strict=True):
        index = np.clip(base + offset, 0, length - 1).astype(np.int64)
        total += np.take(values, index, axis=axis).astype(np.float64) * weight.reshape(shape)
    return total


def resize_bicubic(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """A [h, w] map resized to [height, width] as torch's bicubic ``align_corners=False``."""
    return _cubic_axis(_cubic_axis(image, height, 0), width, 1).astype(np.float32)


class OnnxDepthEstimatorModel(BackendModel):
    """A loaded depth estimator: a ``predicted_depth`` map per image."""

    backend = BACKEND_ID
    #: ``run`` reports each image and stops between images when cancelled (the core's contract).
    features = Features(run_progress=True)
    task = "depth-estimation"

    def __init__(self, graph: VisionGraph, *, details: dict[str, Any]) -> None:
        self.graph = graph
        self.details = details
        self._output = "predicted_depth" if "predicted_depth" in graph.outputs else graph.outputs[0]

    def dispose(self) -> None:
        """Drop the session; safe to call twice."""
        self.graph.close()

    def run(
        self,
        input: Any,
        *,
        progress: ProgressCallback = no_progress,
        **rest: Any,
    ) -> Any:
        """Estimate depth for an image or a list of images (the output shape is in the module docstring)."""
        _unknown(self.task, rest)
        images, single = images_of(input, self.task)
        results = []
        for image in reported(images, "estimate", progress):
            (raw,) = self.graph.run(image, [self._output])
            if raw.ndim < 2 or raw.size != raw.shape[-1] * raw.shape[-2]:
                raise AnyformerError(ErrorCode.BAD_MODEL, f"{self.graph.label}: a depth output of shape {raw.shape}")
            depth = resize_bicubic(raw.reshape(raw.shape[-2:]), image.size[1], image.size[0])
            span = float(depth.max() - depth.min())
            scaled = (depth - depth.min()) / span if span > 0 else np.zeros_like(depth)
            results.append({"predicted_depth": depth, "depth": (scaled * 255).astype(np.uint8)})
        return results[0] if single else results


class OnnxSegmenterModel(BackendModel):
    """A loaded semantic segmentation model: per-pixel class logits and config.json's labels."""

    backend = BACKEND_ID
    #: ``run`` reports each image and stops between images when cancelled (the core's contract).
    features = Features(run_progress=True)
    task = "image-segmentation"

    def __init__(self, graph: VisionGraph, *, config: Mapping[str, Any], details: dict[str, Any]) -> None:
        self.graph = graph
        self.details = details
        self._output = "logits" if "logits" in graph.outputs else graph.outputs[0]
        self.labels = labels_of(config)

    def dispose(self) -> None:
        """Drop the session; safe to call twice."""
        self.graph.close()

    def run(self, input: Any, *, subtask: Any = None, progress: ProgressCallback = no_progress, **rest: Any) -> Any:
        """Segment an image or a list of images (the output shape is in the module docstring)."""
        _unknown(self.task, rest)
        if subtask not in (None, "semantic"):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"subtask {subtask!r}: this model segments semantically only")
        images, single = images_of(input, self.task)
        results = []
        for image in reported(images, "segment", progress):
            (logits,) = self.graph.run(image, [self._output])
            if logits.ndim != 4:
                raise AnyformerError(ErrorCode.BAD_MODEL, f"{self.graph.label}: logits of shape {logits.shape}")
            classes = resize_bilinear(logits[0], image.size[1], image.size[0]).argmax(axis=0)
            found = []
            for index in np.unique(classes):
                mask = np.where(classes == index, 255, 0).astype(np.uint8)
                found.append({"score": None, "label": self.labels.get(int(index), f"LABEL_{int(index)}"), "mask": mask})
            results.append(found)
        return results[0] if single else results


class OnnxObjectDetectorModel(BackendModel):
    """A loaded DETR-style detector: ``logits`` over the classes and "no object", ``pred_boxes``."""

    backend = BACKEND_ID
    #: ``run`` reports each image and stops between images when cancelled (the core's contract).
    features = Features(run_progress=True)
    task = "object-detection"

    def __init__(self, graph: VisionGraph, *, config: Mapping[str, Any], details: dict[str, Any]) -> None:
        missing = [name for name in ("logits", "pred_boxes") if name not in graph.outputs]
        if missing:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{graph.label}: a detection graph needs a {missing[0]} output")
        self.graph = graph
        self.details = details
        self.labels = labels_of(config)

    def dispose(self) -> None:
        """Drop the session; safe to call twice."""
        self.graph.close()

    def run(self, input: Any, *, threshold: Any = 0.5, progress: ProgressCallback = no_progress, **rest: Any) -> Any:
        """Detect objects in an image or a list of images (the output shape is in the module docstring)."""
        _unknown(self.task, rest)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"threshold must be a number from 0 to 1, got {threshold!r}")
        images, single = images_of(input, self.task)
        results = []
        for image in reported(images, "detect", progress):
            logits, boxes = self.graph.run(image, ["logits", "pred_boxes"])
            probabilities = softmax(logits[0].astype(np.float32))[:, :-1]  # the last class is "no object"
            best = probabilities.argmax(axis=-1)
            scores = probabilities[np.arange(best.shape[0]), best]
            pixels = corners(boxes[0], image.size[0], image.size[1])
            found = []
            for query in np.nonzero(scores > threshold)[0]:
                xmin, ymin, xmax, ymax = (int(v) for v in pixels[query])  # truncated, as torch's .int()
                found.append(
                    {
                        "score": float(scores[query]),
                        "label": self.labels.get(int(best[query]), f"LABEL_{int(best[query])}"),
                        "box": {"xmin": xmin, "ymin": ymin, "xmax": xmax, "ymax": ymax},
                    }
                )
            results.append(found)
        return results[0] if single else results


#: Mask2Former's image processor resizes the mask logits to this square before anything else.
MASK2FORMER_MASK_SIDE = 384
SUBTASKS = ("panoptic", "instance", "semantic")


def _fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{name} must be a number from 0 to 1, got {value!r}")
    return float(value)


def sigmoid(values: np.ndarray) -> np.ndarray:
    """The logistic function, float32."""
    return (1 / (1 + np.exp(-values.astype(np.float32)))).astype(np.float32)


def resize_nearest(maps: np.ndarray, height: int, width: int) -> np.ndarray:
    """[channels, h, w] maps resized to [channels, height, width] as torch's ``nearest`` (float32 scale, floored)."""

    def index(length: int, size: int) -> np.ndarray:
        scale = np.float32(length) / np.float32(size)
        source = np.floor(np.arange(size, dtype=np.float32) * scale).astype(np.int64)
        return np.minimum(source, length - 1)

    return maps[:, index(maps.shape[1], height)][:, :, index(maps.shape[2], width)]


def _masks(found: list[tuple[float | None, str, np.ndarray]]) -> list[dict[str, Any]]:
    return [
        {"score": score, "label": label, "mask": np.where(mask, 255, 0).astype(np.uint8)}
        for score, label, mask in found
    ]


class OnnxMaskSegmenterModel(BackendModel):
    """A loaded Mask2Former: per query, class logits (the last "no object") and mask logits."""

    backend = BACKEND_ID
    #: ``run`` reports each image and stops between images when cancelled (the core's contract).
    features = Features(run_progress=True)
    task = "image-segmentation"
    outputs = ("class_queries_logits", "masks_queries_logits")

    def __init__(self, graph: VisionGraph, *, config: Mapping[str, Any], details: dict[str, Any]) -> None:
        missing = [name for name in self.outputs if name not in graph.outputs]
        if missing:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{graph.label}: a Mask2Former graph needs a {missing[0]} output")
        self.graph = graph
        self.details = details
        self.labels = labels_of(config)

    def dispose(self) -> None:
        """Drop the session; safe to call twice."""
        self.graph.close()

    def _label(self, index: int) -> str:
        return self.labels.get(index, f"LABEL_{index}")

    def run(
        self,
        input: Any,
        *,
        subtask: Any = None,
        threshold: Any = 0.9,
        mask_threshold: Any = 0.5,
        overlap_mask_area_threshold: Any = 0.5,
        progress: ProgressCallback = no_progress,
        **rest: Any,
    ) -> Any:
        """Segment an image or a list of images (the output shape is in the module docstring)."""
        _unknown(self.task, rest)
        if subtask is not None and subtask not in SUBTASKS:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"subtask must be one of {SUBTASKS}, got {subtask!r}")
        score_floor = _fraction("threshold", threshold)
        mask_floor = _fraction("mask_threshold", mask_threshold)
        overlap = _fraction("overlap_mask_area_threshold", overlap_mask_area_threshold)
        images, single = images_of(input, self.task)
        results = []
        for image in reported(images, "segment", progress):
            classes, masks = self.graph.run(image, list(self.outputs))
            if classes.ndim != 3 or masks.ndim != 4 or classes.shape[1] != masks.shape[1]:
                raise AnyformerError(
                    ErrorCode.BAD_MODEL, f"{self.graph.label}: outputs of shapes {classes.shape} and {masks.shape}"
                )
            side = MASK2FORMER_MASK_SIDE
            logits = resize_bilinear(masks[0], side, side)
            probabilities = softmax(classes[0].astype(np.float32))
            size = (image.size[1], image.size[0])
            if subtask == "instance":
                found = self._instances(probabilities, logits, size, score_floor)
            elif subtask == "semantic":
                found = self._semantic(probabilities, logits, size)
            else:
                found = self._panoptic(probabilities, logits, size, score_floor, mask_floor, overlap)
            results.append(_masks(found))
        return results[0] if single else results

    def _panoptic(
        self,
        probabilities: np.ndarray,
        logits: np.ndarray,
        size: tuple[int, int],
        score_floor: float,
        mask_floor: float,
        overlap: float,
    ) -> list[tuple[float | None, str, np.ndarray]]:
        best = probabilities.argmax(axis=-1)
        scores = probabilities.max(axis=-1)
        keep = np.nonzero((best != probabilities.shape[-1] - 1) & (scores > score_floor))[0]
        if keep.size == 0:
            return []
        weighted = resize_bilinear(sigmoid(logits[keep]), *size) * scores[keep][:, None, None]
        owner = weighted.argmax(axis=0)
        found: list[tuple[float | None, str, np.ndarray]] = []
        for k, query in enumerate(keep):
            mask = owner == k
            area, whole = int(mask.sum()), int((weighted[k] >= mask_floor).sum())
            if area > 0 and whole > 0 and area / whole > overlap:
                found.append((round(float(scores[query]), 6), self._label(int(best[query])), mask))
        return found

    def _instances(
        self, probabilities: np.ndarray, logits: np.ndarray, size: tuple[int, int], score_floor: float
    ) -> list[tuple[float | None, str, np.ndarray]]:
        scores = probabilities[:, :-1]
        queries, classes = scores.shape
        flat = scores.reshape(-1)
        order = np.argsort(-flat, kind="stable")[:queries]
        chosen = logits[order // classes]
        inside = chosen > 0
        mean = (sigmoid(chosen) * inside).reshape(queries, -1).sum(axis=1) / (
            inside.reshape(queries, -1).sum(axis=1) + np.float32(1e-6)
        )
        final = flat[order] * mean.astype(np.float32)
        binary = resize_nearest(inside, *size)
        segmentation = np.full(size, -1, dtype=np.int64)
        kept: list[int] = []
        for j in range(queries):
            if binary[j].any() and float(final[j]) >= score_floor:
                segmentation[binary[j]] = len(kept)
                kept.append(j)
        return [
            (round(float(final[j]), 6), self._label(int(order[j] % classes)), segmentation == index)
            for index, j in enumerate(kept)
        ]

    def _semantic(
        self, probabilities: np.ndarray, logits: np.ndarray, size: tuple[int, int]
    ) -> list[tuple[float | None, str, np.ndarray]]:
        per_class = np.einsum("qc,qhw->chw", probabilities[:, :-1], sigmoid(logits))
        owner = resize_bilinear(per_class, *size).argmax(axis=0)
        return [(None, self._label(int(index)), owner == index) for index in np.unique(owner)]
