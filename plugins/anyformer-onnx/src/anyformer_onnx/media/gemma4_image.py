"""Gemma 4 images: the image processor's padded patches and positions, the vision encoder that reads them.

The processor (transformers' ``Gemma4ImageProcessor``; its keys sit under ``image_processor`` in
``processor_config.json``, as transformers 5 and transformers.js save a Gemma 4 processor, or in
``preprocessor_config.json``):

- a budget of ``max_soft_tokens`` (70, 140, 280, 560 or 1120) soft tokens per image, each the
  average of ``pooling_kernel_size``² patches of ``patch_size`` pixels: ``max_patches`` =
  ``max_soft_tokens * pooling_kernel_size**2``;
- resize (bicubic by default, Pillow on the uint8 image) to the largest size of the image's aspect
  ratio within ``max_patches`` patches whose sides are multiples of ``pooling_kernel_size *
  patch_size`` (each side scaled by ``sqrt(max_patches * patch**2 / area)`` and floored to a
  multiple; a side that floors to nothing becomes one multiple, the other the aspect ratio's
  whole part of multiples, at most the budget's side);
- rescale by ``rescale_factor`` (computed in float64, then float32), no normalisation by default
  (the model maps [0, 1] to [-1, 1] itself);
- cut into ``patch_size`` squares row by row, each flattened as (row, column, channel): rows
  [patches, patch² * 3]; each patch's position (x, y) = (column, row); both padded to
  ``max_patches`` rows, the pixels with zeros and the positions with -1.

The image's soft-token count is its patches over ``pooling_kernel_size``²; the processor writes
``<|image>``, that many ``<|image|>`` and ``<image|>`` in the prompt for it.

The ``vision_encoder`` graph (onnx-community's layout) takes ``pixel_values`` [1, max_patches,
patch² * 3] and ``pixel_position_ids`` [1, max_patches, 2] and returns ``image_features``
[soft tokens, text hidden]: the vision tower's pooled rows without the padding ones, projected
into the text model's embedding space.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode, load_image
from anyformer_onnx.media.gemma4_media import gemma4_media_kind, processor_part
from anyformer_onnx.media.image_preprocessing import BICUBIC, float_triple, resample_of, rescale_of
from anyformer_onnx.media.prompter import MAX_IMAGES, MediaKind
from anyformer_onnx.session.ort_session import run_refusing
from anyformer_onnx.text.setup import TextSetup

#: The soft-token budgets transformers' processor accepts.
SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)
#: Names the vision encoder's patch position input goes by (transformers calls it both).
POSITION_INPUTS = ("pixel_position_ids", "image_position_ids")


def _int(config: Mapping[str, Any], key: str, default: int, label: str) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: the Gemma 4 image processor's {key} is {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Gemma4ImageProcessor:
    """The patches, positions and soft-token count one Gemma 4 model asks for (see the module docstring)."""

    patch: int
    soft_tokens: int
    pooling: int
    resize: bool
    resample: int
    rescale: float | None
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], label: str) -> Gemma4ImageProcessor:
        """Read the image processor's settings; ``BAD_MODEL`` for values transformers' processor would refuse."""
        soft_tokens = _int(config, "max_soft_tokens", 280, label)
        if soft_tokens not in SOFT_TOKEN_BUDGETS:
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{label}: max_soft_tokens {soft_tokens} is not one of {SOFT_TOKEN_BUDGETS}"
            )
        normalize = bool(config.get("do_normalize", False))
        owner = "the Gemma 4 image processor's"
        return cls(
            patch=_int(config, "patch_size", 16, label),
            soft_tokens=soft_tokens,
            pooling=_int(config, "pooling_kernel_size", 3, label),
            resize=bool(config.get("do_resize", True)),
            resample=resample_of(config, BICUBIC),
            rescale=rescale_of(config),
            mean=float_triple(config.get("image_mean"), (0.0,) * 3, "image_mean", label, owner) if normalize else None,
            std=float_triple(config.get("image_std"), (1.0,) * 3, "image_std", label, owner) if normalize else None,
        )

    @property
    def max_patches(self) -> int:
        """The patch rows every image is padded to."""
        return self.soft_tokens * self.pooling**2

    def target_size(self, height: int, width: int, what: str = "the image") -> tuple[int, int]:
        """The (height, width) an image is resized to: its aspect ratio within the patch budget, sides in multiples."""
        side = self.pooling * self.patch
        factor = math.sqrt(self.max_patches * self.patch**2 / (height * width))
        new_h = math.floor(factor * height / side) * side
        new_w = math.floor(factor * width / side) * side
        if new_h == 0 and new_w == 0:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{what} ({width}x{height}) resizes to nothing")
        longest = (self.max_patches // self.pooling**2) * side
        if new_h == 0:
            new_h, new_w = side, min(width // height * side, longest)
        elif new_w == 0:
            new_h, new_w = min(height // width * side, longest), side
        if new_h * new_w > self.max_patches * self.patch**2:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"{what} is {width}x{height}: too narrow to fit {self.max_patches} patches of {self.patch} pixels",
            )
        return new_h, new_w

    def __call__(self, image: Any, what: str = "the image") -> tuple[np.ndarray, np.ndarray, int]:
        """``pixel_values`` [max_patches, patch² * 3] float32, positions [max_patches, 2] int64 and the soft tokens."""
        height, width = image.size[1], image.size[0]
        if self.resize:
            new_h, new_w = self.target_size(height, width, what)
            if (new_h, new_w) != (height, width):
                image = image.resize((new_w, new_h), resample=self.resample, reducing_gap=None)
        values: np.ndarray = np.asarray(image, dtype=np.uint8)
        if self.rescale is not None:
            values = (values.astype(np.float64) * self.rescale).astype(np.float32)
        else:
            values = values.astype(np.float32)
        if self.mean is not None and self.std is not None:
            values = (values - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        p = self.patch
        rows, cols = values.shape[0] // p, values.shape[1] // p
        count = rows * cols
        if count == 0 or count > self.max_patches:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"{what} gives {count} patches; the processor takes 1 to {self.max_patches}"
            )
        # [H, W, C] → (patch row, pixel row, patch col, pixel col, C) → (patch row, patch col, pixel row, pixel col, C)
        patches = values[: rows * p, : cols * p].reshape(rows, p, cols, p, 3).transpose(0, 2, 1, 3, 4)
        pixels = np.zeros((self.max_patches, p * p * 3), dtype=np.float32)
        pixels[:count] = patches.reshape(count, p * p * 3)
        positions = np.full((self.max_patches, 2), -1, dtype=np.int64)
        y, x = np.divmod(np.arange(count), cols)
        positions[:count, 0], positions[:count, 1] = x, y
        return pixels, positions, count // self.pooling**2


class Gemma4VisionGraph:
    """A ``vision_encoder`` session taking padded patches and their positions (see the module docstring)."""

    def __init__(self, session: Any, processor: Gemma4ImageProcessor, label: str) -> None:
        inputs = {i.name: i for i in session.get_inputs()}
        named = [name for name in POSITION_INPUTS if name in inputs]
        unknown = sorted(set(inputs) - {"pixel_values", *named})
        if "pixel_values" not in inputs or len(named) != 1 or unknown:
            wanted = unknown[0] if unknown else "pixel_values and pixel_position_ids"
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{label}: not a Gemma 4 vision encoder this backend feeds ({wanted})"
            )
        outputs = [o.name for o in session.get_outputs()]
        width = 3 * processor.patch**2
        shape = inputs["pixel_values"].shape
        if len(shape) != 3 or (isinstance(shape[2], int) and shape[2] != width):
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                f"{label}: the vision encoder takes pixel_values of shape {shape}, not [1, patches, {width}] "
                "as the image processor's patch_size gives",
            )
        self.session: Any = session
        self.processor = processor
        self.label = label
        self.position_input = named[0]
        self.output = "image_features" if "image_features" in outputs else outputs[0]
        self.position_type: Any = np.int32 if inputs[self.position_input].type == "tensor(int32)" else np.int64
        # An fp16 export may read fp16 pixels; every other precision's encoder reads float32.
        self.pixel_type: Any = np.float16 if inputs["pixel_values"].type == "tensor(float16)" else np.float32

    def close(self) -> None:
        """Drop the session; later calls are ``BAD_REQUEST``."""
        self.session = None

    def encode(self, value: Any, what: str) -> np.ndarray:
        """One image block's feature rows [soft tokens, hidden]."""
        if self.session is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.label} was disposed")
        pixels, positions, tokens = self.processor(load_image(value, what), what)
        feeds = {
            "pixel_values": pixels[None].astype(self.pixel_type),
            self.position_input: positions[None].astype(self.position_type),
        }
        refused = f"{self.label}: the graph refused {what}'s {pixels.shape[0]} patches"
        rows = np.asarray(run_refusing(self.session, [self.output], feeds, refused)[0])
        rows = rows.reshape(-1, rows.shape[-1])
        if rows.shape[0] != tokens:
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                f"{self.label}: {rows.shape[0]} image_features rows for {what}; the processor writes {tokens} "
                "image tokens for it",
            )
        return rows


def gemma4_image_kind(
    session: Any,
    text: TextSetup,
    config: Mapping[str, Any],
    preprocessor: Mapping[str, Any] | None,
    processor: Mapping[str, Any] | None,
    label: str,
) -> tuple[Gemma4VisionGraph, MediaKind]:
    """Gemma 4's vision encoder and its image blocks: the image token, wrapped in ``<|image>`` … ``<image|>``.

    The image processor's settings come from processor_config.json's ``image_processor``, else from
    preprocessor_config.json; ``BAD_MODEL`` when neither has them or a token is not in tokenizer.json.
    """
    settings = processor_part(processor, preprocessor, "image_processor", "image", label)
    graph = Gemma4VisionGraph(session, Gemma4ImageProcessor.from_config(settings, label), label)
    keys = ("image_token_id", "boi_token_id", "eoi_token_id")
    return graph, gemma4_media_kind("image", keys, graph.encode, MAX_IMAGES, text, config, label)
