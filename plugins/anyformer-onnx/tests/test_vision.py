"""Vision tasks through ``loaded.run``, against transformers' pipelines.

The fixtures recorded ``transformers.pipeline(task)`` (its Pillow image processors) on tiny random
ViT, YOLOS, SegFormer, Mask2Former and DPT models, for images of other sizes than the model's,
before exporting them. Here the exported graphs run through the backend on the same files: labels,
boxes and masks equal, scores within 1e-4.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_classification import _same

import anyformer
from anyformer.plugin import AnyformerError, ErrorCode


def test_image_classification_equals_the_pipeline(vit_dir: Path, reference: Any) -> None:
    expected = reference(vit_dir)
    paths = [str(vit_dir / name) for name in expected["images"]]
    with anyformer.load(str(vit_dir), backend="onnx") as loaded:
        assert loaded.task == "image-classification"
        _same(loaded.run(paths[0]), expected["single"])
        _same(loaded.run(paths), expected["batch"])
        _same(loaded.run(paths[0], top_k=2), expected["top_k_2"])
        # The same image as bytes and as decoded pixels gives the same answer as its path.
        _same(loaded.run(Path(paths[1]).read_bytes()), expected["batch"][1])
        from PIL import Image

        _same(loaded.run(np.asarray(Image.open(paths[2]).convert("RGB"))), expected["batch"][2])
        assert len({row[0]["label"] for row in expected["batch"]}) > 1, "the fixture should not give one label for all"


def test_object_detection_equals_the_pipeline(yolos_dir: Path, reference: Any) -> None:
    expected = reference(yolos_dir)
    paths = [str(yolos_dir / name) for name in expected["images"]]
    with anyformer.load(str(yolos_dir), backend="onnx") as loaded:
        assert loaded.task == "object-detection"
        _same(loaded.run(paths[0]), expected["single"])
        _same(loaded.run(paths, threshold=0.3), expected["batch"])
        labels = {box["label"] for row in expected["batch"] for box in row}
        assert len(labels) > 1 and expected["single"], "the fixture should find boxes of more than one label"
        assert len(loaded.run(paths[0], threshold=0.3)) >= len(loaded.run(paths[0], threshold=0.9))


@pytest.fixture(scope="module")
def vit(vit_dir: Path) -> Iterator[Any]:
    """The tiny ViT loaded once for the refusal cases."""
    with anyformer.load(str(vit_dir), backend="onnx") as loaded:
        yield loaded


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(noise, "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def _giant_png_header(side: int) -> bytes:
    """A PNG whose header (its checksum valid) claims side x side pixels; its pixels are 4x4."""
    import zlib

    data = bytearray(_png(4, 4))
    data[16:24] = side.to_bytes(4, "big") * 2
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (b"not an image at all", "not an image"),
        (_png(64, 64)[:2000], "cannot be decoded"),
        (_giant_png_header(9000), "megapixels"),  # over this backend's bound
        (_giant_png_header(100_000), "megapixels"),  # over Pillow's too
        (np.zeros((8, 8, 3), dtype=np.float32), "uint8"),
        (np.zeros((8, 8, 2), dtype=np.uint8), "shape"),
        ("/no/such/image.png", "cannot read"),
        ("https://example.com/cat.png", "URL"),
        (12, "int"),
        ([], "non-empty"),
    ],
)
def test_bad_images_are_bad_request(vit: Any, bad: Any, words: str) -> None:
    with pytest.raises(AnyformerError) as caught:
        vit.run(bad)
    assert caught.value.code == ErrorCode.BAD_REQUEST
    assert words in str(caught.value)


def test_bad_options_are_bad_request(vit_dir: Path, yolos_dir: Path) -> None:
    image = str(vit_dir / "image0.png")
    with anyformer.load(str(vit_dir), backend="onnx") as loaded:
        for bad in ({"top_k": 0}, {"function_to_apply": "tanh"}, {"threshold": 0.5}):
            with pytest.raises(AnyformerError) as caught:
                loaded.run(image, **bad)
            assert caught.value.code == ErrorCode.BAD_REQUEST
    with anyformer.load(str(yolos_dir), backend="onnx") as loaded:
        for bad in ({"threshold": 2}, {"threshold": "high"}, {"top_k": 3}):
            with pytest.raises(AnyformerError) as caught:
                loaded.run(image, **bad)
            assert caught.value.code == ErrorCode.BAD_REQUEST


def test_image_segmentation_equals_the_pipeline(segformer_dir: Path, reference: Any) -> None:
    expected = reference(segformer_dir)
    paths = [str(segformer_dir / name) for name in expected["images"]]
    with anyformer.load(str(segformer_dir), backend="onnx") as loaded:
        assert loaded.task == "image-segmentation"
        got = loaded.run(paths)
        assert _masks_equal(loaded.run(paths[1]), got[1])
    labels = set()
    for row, want in zip(got, expected["batch"], strict=True):
        assert [(s["score"], s["label"]) for s in row] == [(s["score"], s["label"]) for s in want]
        for segment, wanted in zip(row, want, strict=True):
            mask = segment["mask"]
            assert mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 255}
            # Equal pixel for pixel: the bilinear upsampling is torch's, only a near tie could flip a pixel.
            assert np.array_equal(mask // 255, np.asarray(wanted["mask"], dtype=np.uint8))
            labels.add(segment["label"])
    assert len(labels) > 2, "the fixture should find several classes"


def _same_segments(got: list[list[dict[str, Any]]], want: list[list[dict[str, Any]]]) -> int:
    """Labels and masks equal, scores within 1e-4 (None for None); the number of non-empty segments."""
    found = 0
    assert len(got) == len(want)
    for row, wanted_row in zip(got, want, strict=True):
        assert [s["label"] for s in row] == [s["label"] for s in wanted_row]
        for segment, wanted in zip(row, wanted_row, strict=True):
            if wanted["score"] is None:
                assert segment["score"] is None
            else:
                assert segment["score"] == pytest.approx(wanted["score"], abs=1e-4)
            mask = segment["mask"]
            assert mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 255}
            assert np.array_equal(mask // 255, np.asarray(wanted["mask"], dtype=np.uint8))
            found += bool(mask.any())
    return found


@pytest.mark.parametrize(
    ("case", "options"),
    [
        ("panoptic", {}),
        ("panoptic_low", {"subtask": "panoptic", "threshold": 0.5}),
        ("panoptic_options", {"threshold": 0.5, "mask_threshold": 0.6, "overlap_mask_area_threshold": 0.3}),
        ("instance", {"subtask": "instance", "threshold": 0.2}),
        ("semantic", {"subtask": "semantic"}),
    ],
)
def test_mask2former_segmentation_equals_the_pipeline(
    mask2former_dir: Path, reference: Any, case: str, options: dict[str, Any]
) -> None:
    expected = reference(mask2former_dir)
    paths = [str(mask2former_dir / name) for name in expected["images"]]
    with anyformer.load(str(mask2former_dir), backend="onnx") as loaded:
        assert loaded.task == "image-segmentation"
        got = loaded.run(paths, **options)
        assert _masks_equal(loaded.run(paths[2], **options), got[2])
    found = _same_segments(got, expected[case])
    labels = {s["label"] for row in expected[case] for s in row}
    # Not a trivial comparison: segments of several labels, more than one in some image.
    assert found >= 3 and len(labels) >= 2 and max(len(row) for row in expected[case]) >= 2


def test_mask2former_bad_options_are_bad_request(mask2former_dir: Path) -> None:
    image = str(mask2former_dir / "image0.png")
    with anyformer.load(str(mask2former_dir), backend="onnx") as loaded:
        for bad in (
            {"subtask": "amodal"},
            {"threshold": 1.5},
            {"mask_threshold": "half"},
            {"overlap_mask_area_threshold": -0.1},
            {"top_k": 3},
        ):
            with pytest.raises(AnyformerError) as caught:
                loaded.run(image, **bad)
            assert caught.value.code == ErrorCode.BAD_REQUEST


def _masks_equal(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return [s["label"] for s in a] == [s["label"] for s in b] and all(
        np.array_equal(x["mask"], y["mask"]) for x, y in zip(a, b, strict=True)
    )


def test_resize_bilinear_equals_torch() -> None:
    import torch

    from anyformer_onnx.vision.handles import resize_bilinear

    maps = np.random.default_rng(5).normal(size=(3, 8, 11)).astype(np.float32)
    for height, width in ((37, 45), (5, 4), (8, 11), (61, 20)):
        want = torch.nn.functional.interpolate(
            torch.from_numpy(maps)[None], size=(height, width), mode="bilinear", align_corners=False
        )[0].numpy()
        np.testing.assert_allclose(resize_bilinear(maps, height, width), want, atol=1e-5)


def test_depth_estimation_equals_the_pipeline(dpt_dir: Path, reference: Any) -> None:
    expected = reference(dpt_dir)
    paths = [str(dpt_dir / name) for name in expected["images"]]
    with anyformer.load(str(dpt_dir), backend="onnx") as loaded:
        assert loaded.task == "depth-estimation"
        got = loaded.run(paths)
        single = loaded.run(paths[0])
    np.testing.assert_array_equal(single["predicted_depth"], got[0]["predicted_depth"])
    for out, want in zip(got, expected["batch"], strict=True):
        depth = np.asarray(want["predicted_depth"], dtype=np.float32)
        assert out["predicted_depth"].shape == depth.shape and out["depth"].dtype == np.uint8
        np.testing.assert_allclose(out["predicted_depth"], depth, rtol=1e-4, atol=1e-4 * np.abs(depth).max())
        # The 0-255 image truncates; a value on a boundary may land one step lower or higher.
        assert np.abs(out["depth"].astype(int) - np.asarray(want["depth"])).max() <= 1


def test_resize_bicubic_equals_torch() -> None:
    import torch

    from anyformer_onnx.vision.handles import resize_bicubic

    image = np.random.default_rng(6).normal(size=(8, 11)).astype(np.float32)
    for height, width in ((37, 45), (5, 4), (8, 11), (61, 20)):
        want = torch.nn.functional.interpolate(
            torch.from_numpy(image)[None, None], size=(height, width), mode="bicubic", align_corners=False
        )[0, 0].numpy()
        np.testing.assert_allclose(resize_bicubic(image, height, width), want, atol=1e-5)
