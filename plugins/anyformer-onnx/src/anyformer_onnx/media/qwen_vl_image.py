"""Qwen2-VL-family images: the image processor's patches and grid, and the vision encoder graph that reads them.

The processor (transformers' ``Qwen2VLImageProcessor``, keys of ``preprocessor_config.json``):

- resize (bicubic by default) to the size nearest the image's whose sides are multiples of
  ``patch_size * merge_size`` (28) and whose area lies within ``min_pixels`` .. ``max_pixels``
  (also written ``size: {"shortest_edge", "longest_edge"}``): each side rounded to a multiple, then,
  when the area is out of range, both sides scaled by the square root of the ratio and rounded down
  (too large) or up (too small) to multiples;
- rescale by ``rescale_factor``, normalise with ``image_mean``/``image_std`` (CLIP's by default);
- cut into ``patch_size`` squares and flatten: ``pixel_values`` [h * w, C * T * P * P] with the rows
  in merge blocks (``merge_size`` x ``merge_size`` neighbouring patches are consecutive rows, blocks
  row by row) and each row channel, then ``temporal_patch_size`` copies of the still image, then
  the patch's pixels; ``image_grid_thw`` = (1, h, w) in patches.

The ``vision_encoder`` graph (transformers.js's layout) takes ``pixel_values`` and the grid as
``grid_thw`` (or ``image_grid_thw``) [images, 3] and returns ``image_features`` [tokens, hidden]:
one row per merged patch, ``h * w / merge_size**2`` for an image.

Qwen3.5 (``Qwen3_5ForConditionalGeneration``, transformers.js's ``qwen3_5``) uses this processor
too, with ``patch_size`` 16 and mean and std 0.5 from its preprocessor_config.json, and the same
graph contract: what its tower adds (a learned position table resampled bilinearly to each grid,
2-D rotary rows) is inside the ``vision_encoder`` graph, and it has no deepstack outputs (Qwen3-VL's
extra decoder inputs, which the decoder's check refuses).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode, load_image
from anyformer_onnx.chat.mrope import Grid
from anyformer_onnx.media.image_preprocessing import BICUBIC, float_triple, resample_of, rescale_of
from anyformer_onnx.session.ort_session import run_refusing

#: CLIP's normalisation, the processor's default.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: The widest aspect ratio the processor takes.
MAX_ASPECT = 200
#: Names the vision encoder's grid input goes by.
GRID_INPUTS = ("grid_thw", "image_grid_thw")


def _int(config: Mapping[str, Any], keys: tuple[str, ...], default: int, label: str) -> int:
    for key in keys:
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: preprocessor_config.json's {key} is {value!r}")
        return value
    return default


@dataclasses.dataclass(frozen=True)
class QwenVLImageProcessor:
    """The patches and grid one Qwen2-VL-family model asks for (see the module docstring)."""

    patch: int
    merge: int
    temporal: int
    min_pixels: int
    max_pixels: int
    resample: int
    rescale: float | None
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], label: str) -> QwenVLImageProcessor:
        """Read ``preprocessor_config.json``; ``BAD_MODEL`` for values the processor would not take."""
        if not config.get("do_resize", True):
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: a Qwen2-VL processor without do_resize")
        size = config.get("size")
        size = size if isinstance(size, Mapping) else {}
        patch = _int(config, ("patch_size",), 14, label)
        merge = _int(config, ("merge_size",), 2, label)
        temporal = _int(config, ("temporal_patch_size",), 2, label)
        low = _int(config, ("min_pixels",), 0, label) or _int(size, ("shortest_edge", "min_pixels"), 56 * 56, label)
        high = _int(config, ("max_pixels",), 0, label) or _int(
            size, ("longest_edge", "max_pixels"), 28 * 28 * 1280, label
        )
        if low > high:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: min_pixels {low} above max_pixels {high}")
        normalize = config.get("do_normalize", True)
        return cls(
            patch=patch,
            merge=merge,
            temporal=temporal,
            min_pixels=low,
            max_pixels=high,
            resample=resample_of(config, BICUBIC),
            rescale=rescale_of(config),
            mean=float_triple(config.get("image_mean"), CLIP_MEAN, "image_mean", label) if normalize else None,
            std=float_triple(config.get("image_std"), CLIP_STD, "image_std", label) if normalize else None,
        )

    def target_size(self, height: int, width: int, what: str = "the image") -> tuple[int, int]:
        """The (height, width) an image is resized to: multiples of patch * merge, the area within bounds."""
        if max(height, width) / min(height, width) > MAX_ASPECT:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"{what} is {width}x{height}: the aspect ratio passes {MAX_ASPECT}"
            )
        factor = self.patch * self.merge
        new_h, new_w = round(height / factor) * factor, round(width / factor) * factor
        if new_h * new_w > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            new_h = max(factor, math.floor(height / beta / factor) * factor)
            new_w = max(factor, math.floor(width / beta / factor) * factor)
        elif new_h * new_w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            new_h = math.ceil(height * beta / factor) * factor
            new_w = math.ceil(width * beta / factor) * factor
        return new_h, new_w

    def __call__(self, image: Any, what: str = "the image") -> tuple[np.ndarray, Grid]:
        """``pixel_values`` [patches, C * T * P * P] float32 and the grid (1, h, w) for one RGB Pillow image."""
        height, width = image.size[1], image.size[0]
        new_h, new_w = self.target_size(height, width, what)
        if (new_h, new_w) != (height, width):
            image = image.resize((new_w, new_h), resample=self.resample, reducing_gap=None)
        values: np.ndarray = np.asarray(image, dtype=np.uint8).astype(np.float32)
        if self.rescale is not None:
            values = values * np.float32(self.rescale)
        if self.mean is not None and self.std is not None:
            values = (values - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        p, m = self.patch, self.merge
        h, w = new_h // p, new_w // p
        # [H, W, C] → (block row, merge row, pixel row, block col, merge col, pixel col, C)
        blocks = values.reshape(h // m, m, p, w // m, m, p, 3)
        # → (block row, block col, merge row, merge col, C, pixel row, pixel col)
        blocks = blocks.transpose(0, 3, 1, 4, 6, 2, 5)
        # A still image is its own temporal neighbour: the patch repeats temporal_patch_size times.
        frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], self.temporal, p, p))
        return np.ascontiguousarray(frames.reshape(h * w, 3 * self.temporal * p * p)), (1, h, w)


class QwenVisionGraph:
    """A ``vision_encoder`` session taking patches and their grid (see the module docstring)."""

    def __init__(self, session: Any, processor: QwenVLImageProcessor, label: str) -> None:
        inputs = {i.name: i for i in session.get_inputs()}
        grids = [name for name in GRID_INPUTS if name in inputs]
        unknown = sorted(set(inputs) - {"pixel_values", *grids})
        if "pixel_values" not in inputs or len(grids) != 1 or unknown:
            wanted = unknown[0] if unknown else "pixel_values and grid_thw"
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{label}: not a Qwen2-VL vision encoder this backend feeds ({wanted})"
            )
        outputs = [o.name for o in session.get_outputs()]
        if "image_features" not in outputs:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: the vision encoder has no image_features output")
        shape = inputs["pixel_values"].shape
        width = 3 * processor.temporal * processor.patch**2
        if len(shape) != 2 or (isinstance(shape[1], int) and shape[1] != width):
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                f"{label}: the vision encoder takes pixel_values of shape {shape}, not [patches, {width}] "
                "as preprocessor_config.json's patch sizes give",
            )
        self.session: Any = session
        self.processor = processor
        self.grid_input = grids[0]
        self.grid_type: Any = np.int32 if inputs[self.grid_input].type == "tensor(int32)" else np.int64
        # An fp16 export may read fp16 pixels; every other precision's encoder reads float32.
        self.pixel_type: Any = np.float16 if inputs["pixel_values"].type == "tensor(float16)" else np.float32
        self.label = label

    def close(self) -> None:
        """Drop the session; later calls are ``BAD_REQUEST``."""
        self.session = None

    def encode(self, value: Any, what: str) -> tuple[np.ndarray, Grid]:
        """One image block's feature rows [tokens, hidden] and its patch grid."""
        if self.session is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.label} was disposed")
        pixels, grid = self.processor(load_image(value, what), what)
        feeds = {
            "pixel_values": pixels.astype(self.pixel_type),
            self.grid_input: np.asarray([grid], dtype=self.grid_type),
        }
        refused = f"{self.label}: the graph refused {what}'s grid {grid}"
        rows = np.asarray(run_refusing(self.session, ["image_features"], feeds, refused)[0])
        rows = rows.reshape(-1, rows.shape[-1])
        tokens = grid[0] * grid[1] * grid[2] // self.processor.merge**2
        if rows.shape[0] != tokens:
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                f"{self.label}: {rows.shape[0]} image_features rows for grid {grid}; the processor writes {tokens} "
                f"image tokens (merge_size {self.processor.merge})",
            )
        return rows, grid
