"""The bounds every backend applies to a request's images and audio (``anyformer.plugin``'s media helpers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from anyformer import AnyformerError, ErrorCode
from anyformer.plugin import MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE, check_image_size, read_media_file, rgb_pixels


@pytest.mark.parametrize(
    ("width", "height"), [(0, 10), (10, 0), (-1, 5), (MAX_IMAGE_SIDE + 1, 1), (8193, 8192), (MAX_IMAGE_PIXELS, 2)]
)
def test_a_canvas_outside_the_bounds_is_a_bad_request(width: int, height: int) -> None:
    with pytest.raises(AnyformerError) as caught:
        check_image_size("the image", width, height)
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert f"{width}x{height}" in str(caught.value)


@pytest.mark.parametrize(("width", "height"), [(1, 1), (8192, 8192), (MAX_IMAGE_SIDE, 2)])
def test_a_canvas_within_the_bounds_passes(width: int, height: int) -> None:
    check_image_size("the image", width, height)


def test_grey_and_rgba_arrays_become_contiguous_rgb() -> None:
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4)
    rgb = rgb_pixels(grey)
    assert rgb.shape == (3, 4, 3) and rgb.flags.c_contiguous
    assert (rgb[:, :, 0] == grey).all() and (rgb[:, :, 2] == grey).all()
    rgba = np.arange(3 * 4 * 4, dtype=np.uint8).reshape(3, 4, 4)
    assert (rgb_pixels(rgba[:, ::-1]) == rgba[:, ::-1, :3]).all()


@pytest.mark.parametrize(
    ("array", "says"),
    [
        (np.zeros((2, 2, 3), dtype=np.float32), "float32"),
        (np.zeros((2, 2, 2), dtype=np.uint8), "shape"),
        (np.zeros((2,), dtype=np.uint8), "shape"),
        (np.zeros((0, 4, 3), dtype=np.uint8), "4x0 pixels"),
    ],
)
def test_an_array_that_is_no_image_is_a_bad_request(array: np.ndarray, says: str) -> None:
    with pytest.raises(AnyformerError) as caught:
        rgb_pixels(array, "the picture")
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert "the picture" in str(caught.value) and says in str(caught.value)


def test_a_media_file_is_read_within_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = tmp_path / "a.wav"
    small.write_bytes(b"RIFF1234")
    assert read_media_file(small, "the audio", "audio") == b"RIFF1234"
    import anyformer.files._media_input as media

    monkeypatch.setattr(media, "MAX_MEDIA_FILE_BYTES", 4)
    with pytest.raises(AnyformerError) as caught:
        read_media_file(str(small), "the audio", "audio")
    assert caught.value.code is ErrorCode.BAD_REQUEST and "audio files up to" in str(caught.value)


@pytest.mark.parametrize(("name", "says"), [("", "is not a file"), ("missing.png", "cannot read")])
def test_a_path_that_is_no_readable_file_is_a_bad_request(tmp_path: Path, name: str, says: str) -> None:
    with pytest.raises(AnyformerError) as caught:
        read_media_file(tmp_path / name, "the image")
    assert caught.value.code is ErrorCode.BAD_REQUEST and says in str(caught.value)
