"""Pixels for a vision graph, as the model's ``preprocessor_config.json`` asks: resize, crop, rescale, normalize.

Done with Pillow and numpy, in the order transformers' image processors apply the same keys:

- ``do_resize`` with ``size``: ``{"height", "width"}`` (exact), ``{"shortest_edge"}`` (the short
  side to that length, the aspect kept) or ``{"shortest_edge", "longest_edge"}`` (DETR's rule: the
  short side to ``shortest_edge`` unless that makes the long side pass ``longest_edge``); an int is
  a square. ``resample`` is Pillow's filter number (bilinear when absent).
  DPT's processors add ``keep_aspect_ratio`` (scale both sides by the factor nearer 1) and
  ``ensure_multiple_of`` (each side rounded to a multiple); ConvNeXt's ``crop_pct`` resizes a
  short side under 384 to ``shortest_edge / crop_pct`` and crops the centre square. MaskFormer's
  and Mask2Former's add ``size_divisor`` (default 32: each side of the resized image rounded up to
  a multiple; one image is never padded further).
- ``do_center_crop`` with ``crop_size`` (``{"height", "width"}``).
- ``do_rescale`` by ``rescale_factor`` (1/255), then ``do_normalize`` with ``image_mean`` and
  ``image_std`` (ImageNet's when absent), channels first.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: Pillow's bilinear and bicubic filter numbers (transformers' default resample, and some processors').
BILINEAR = 2
BICUBIC = 3
_FILTERS = (0, 1, 2, 3, 4, 5)  # nearest, lanczos, bilinear, bicubic, box, hamming


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def float_triple(
    value: Any, default: tuple[float, float, float], key: str, label: str, owner: str = "preprocessor_config.json's"
) -> tuple[float, float, float]:
    """An image processor's per-channel ``image_mean`` or ``image_std``: one number for all three, or three.

    ``default`` when absent; ``BAD_MODEL`` (naming ``owner``'s ``key``) for anything else.
    """
    if value is None:
        return default
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (float(value),) * 3
    if isinstance(value, (list, tuple)) and len(value) == 3 and all(isinstance(v, (int, float)) for v in value):
        return (float(value[0]), float(value[1]), float(value[2]))
    raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: {owner} {key} is not 3 numbers")


def resample_of(config: Mapping[str, Any], default: int) -> int:
    """An image processor's ``resample``: Pillow's filter number, ``default`` when absent or not one."""
    resample = config.get("resample", default)
    return int(resample) if resample in _FILTERS else default


def rescale_of(config: Mapping[str, Any]) -> float | None:
    """An image processor's ``rescale_factor`` (default 1/255); None if ``do_rescale`` is off or it is not a number."""
    factor = config.get("rescale_factor", 1 / 255)
    return float(factor) if config.get("do_rescale", True) and isinstance(factor, (int, float)) else None


@dataclasses.dataclass(frozen=True)
class ImagePreprocessor:
    """The preprocessing one vision model asks for (see the module docstring)."""

    size: dict[str, int] | None
    resample: int
    crop: tuple[int, int] | None
    rescale: float | None
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None
    keep_aspect: bool = False
    multiple: int = 1
    crop_pct: float | None = None
    divisor: int = 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any], label: str) -> ImagePreprocessor:
        """Read ``preprocessor_config.json``'s keys; ``BAD_MODEL`` for values no processor would take."""
        size: dict[str, int] | None = None
        if config.get("do_resize", True):
            raw = config.get("size")
            side = _positive_int(raw)
            if side:
                size = {"height": side, "width": side}
            elif isinstance(raw, Mapping):
                size = {str(k): int(v) for k, v in raw.items() if _positive_int(v)}
            if not size or not ({"height", "width"} <= set(size) or "shortest_edge" in size):
                raise AnyformerError(
                    ErrorCode.BAD_MODEL, f"{label}: preprocessor_config.json's size {raw!r} is unusable"
                )
        crop: tuple[int, int] | None = None
        if config.get("do_center_crop"):
            raw = config.get("crop_size")
            side = _positive_int(raw)
            if side:
                crop = (side, side)
            elif isinstance(raw, Mapping) and _positive_int(raw.get("height")) and _positive_int(raw.get("width")):
                crop = (int(raw["height"]), int(raw["width"]))
            else:
                raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: preprocessor_config.json's crop_size is unusable")
        normalize = config.get("do_normalize", True)
        mean = float_triple(config.get("image_mean"), IMAGENET_MEAN, "image_mean", label) if normalize else None
        std = float_triple(config.get("image_std"), IMAGENET_STD, "image_std", label) if normalize else None
        kind = str(config.get("image_processor_type") or "")
        keep_aspect, multiple, crop_pct, divisor = False, 1, None, 0
        if kind.startswith("DPT"):
            if config.get("do_pad"):
                raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: DPT's padding (do_pad) is not implemented")
            keep_aspect = bool(config.get("keep_aspect_ratio"))
            multiple = _positive_int(config.get("ensure_multiple_of")) or 1
        if kind.startswith(("MaskFormer", "Mask2Former")) and size is not None:
            divisor = _positive_int(config.get("size_divisor", 32)) or 0
        if kind.startswith("ConvNext") and size is not None and "shortest_edge" in size:
            pct = config.get("crop_pct", 224 / 256)
            crop_pct = float(pct) if isinstance(pct, (int, float)) and 0 < pct <= 1 else 224 / 256
        return cls(
            size=size,
            resample=resample_of(config, BILINEAR),
            crop=crop,
            rescale=rescale_of(config),
            mean=mean,
            std=std,
            keep_aspect=keep_aspect,
            multiple=multiple,
            crop_pct=crop_pct,
            divisor=divisor,
        )

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) an image of this size is resized to."""
        new_height, new_width = self._resized(height, width)
        if self.divisor:
            new_height = -(-new_height // self.divisor) * self.divisor
            new_width = -(-new_width // self.divisor) * self.divisor
        return new_height, new_width

    def _resized(self, height: int, width: int) -> tuple[int, int]:
        if self.size is None:
            return height, width
        if "height" in self.size and "width" in self.size:
            if not self.keep_aspect and self.multiple == 1:
                return self.size["height"], self.size["width"]
            return self._dpt_size(height, width)
        short = self.size["shortest_edge"]
        if self.crop_pct is not None:
            if short >= 384:  # ConvNeXt warps large sizes to a square, uncropped
                return short, short
            short = int(short / self.crop_pct)
        longest = self.size.get("longest_edge")
        low, high = min(height, width), max(height, width)
        exact: float | None = None
        if longest is not None and high / low * short > longest:
            # The long side would pass its limit: the short side shrinks so the long side fits.
            exact = longest * low / high
            short = round(exact)
        if low == short:
            return height, width
        other = int((exact if exact is not None else short) * high / low)
        return (other, short) if width < height else (short, other)

    def _dpt_size(self, height: int, width: int) -> tuple[int, int]:
        """DPT's rule: scale both sides by the factor nearer 1 when keeping the aspect, then round to multiples."""
        assert self.size is not None
        scale_h, scale_w = self.size["height"] / height, self.size["width"] / width
        if self.keep_aspect:
            if abs(1 - scale_w) < abs(1 - scale_h):
                scale_h = scale_w
            else:
                scale_w = scale_h

        def to_multiple(value: float) -> int:
            rounded = round(value / self.multiple) * self.multiple  # Python's rounding, as transformers'
            return rounded if rounded > 0 else math.ceil(value / self.multiple) * self.multiple

        return to_multiple(scale_h * height), to_multiple(scale_w * width)

    def __call__(self, image: Any) -> np.ndarray:
        """``pixel_values`` [3, H, W] float32 for one RGB Pillow image."""
        height, width = image.size[1], image.size[0]
        new_height, new_width = self.target_size(height, width)
        if (new_height, new_width) != (height, width):
            image = image.resize((new_width, new_height), resample=self.resample, reducing_gap=None)
        pixels = np.asarray(image, dtype=np.uint8)
        if self.crop_pct is not None and self.size is not None and self.size["shortest_edge"] < 384:
            side = self.size["shortest_edge"]
            pixels = _center_crop(pixels, side, side)
        if self.crop is not None:
            pixels = _center_crop(pixels, *self.crop)
        values: np.ndarray = pixels.astype(np.float32)
        if self.rescale is not None:
            values = values * np.float32(self.rescale)
        if self.mean is not None and self.std is not None:
            values = (values - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return np.ascontiguousarray(values.transpose(2, 0, 1))


def _center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centre ``height`` x ``width`` of ``pixels``, zero-padded where the image is smaller."""
    rows, cols = pixels.shape[:2]
    if rows < height or cols < width:
        padded = np.zeros((max(rows, height), max(cols, width), pixels.shape[2]), pixels.dtype)
        top, left = (padded.shape[0] - rows) // 2, (padded.shape[1] - cols) // 2
        padded[top : top + rows, left : left + cols] = pixels
        pixels, rows, cols = padded, padded.shape[0], padded.shape[1]
    top, left = (rows - height) // 2, (cols - width) // 2
    return pixels[top : top + height, left : left + width]
