"""The pixels ImagePreprocessor makes equal those of transformers' Pillow image processors for the same config."""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np
import pytest

from anyformer_onnx.media.image_preprocessing import ImagePreprocessor


def _images() -> list[Any]:
    from PIL import Image

    generator = np.random.default_rng(3)
    sizes = [(45, 37), (20, 61), (64, 64), (300, 200)]
    return [Image.fromarray(generator.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB") for w, h in sizes]


def _processor(kind: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "clip":  # shortest edge, then a centre crop
            from transformers import CLIPImageProcessor

            return CLIPImageProcessor(size={"shortest_edge": 40}, crop_size={"height": 36, "width": 32})
        if kind == "detr":  # DETR's shortest and longest edge
            from transformers import DetrImageProcessor

            return DetrImageProcessor(size={"shortest_edge": 48, "longest_edge": 80}, do_pad=False)
        if kind == "dpt":  # the aspect kept, sides multiples of 14 (Depth Anything's settings)
            from transformers import DPTImageProcessor

            return DPTImageProcessor(
                size={"height": 42, "width": 42}, keep_aspect_ratio=True, ensure_multiple_of=14, resample=3
            )
        if kind == "mask2former":  # shortest and longest edge, each side rounded up to a multiple of 32
            from transformers import Mask2FormerImageProcessorPil

            return Mask2FormerImageProcessorPil(size={"shortest_edge": 40, "longest_edge": 80})
        if kind == "convnext":  # a short side under 384: resized to shortest_edge / crop_pct, centre crop
            from transformers import ConvNextImageProcessor

            return ConvNextImageProcessor(size={"shortest_edge": 40}, crop_pct=0.875)
        if kind == "convnext-large":  # 384 and over: warped to a square
            from transformers import ConvNextImageProcessor

            return ConvNextImageProcessor(size={"shortest_edge": 384})
        from transformers import ViTImageProcessor

        return ViTImageProcessor(size={"height": 24, "width": 40}, resample=1, do_normalize=False)


@pytest.mark.parametrize("kind", ["clip", "detr", "vit", "dpt", "convnext", "convnext-large", "mask2former"])
def test_pixels_equal_transformers(kind: str) -> None:
    reference = _processor(kind)
    ours = ImagePreprocessor.from_config(json.loads(reference.to_json_string()), "test")
    for image in _images():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = reference(images=image, return_tensors="np")["pixel_values"][0]
        got = ours(image)
        assert got.shape == want.shape, (image.size, got.shape, want.shape)
        np.testing.assert_allclose(got, want, atol=1e-5)
