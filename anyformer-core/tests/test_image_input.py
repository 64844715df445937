"""``load_image`` / ``load_images``: a ``run`` input's images checked by magic bytes and stated size before decoding."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from anyformer import AnyformerError, ErrorCode
from anyformer.plugin import MAX_IMAGE_PIXELS, load_image, load_images


def _png(width: int, height: int, pixels: bytes | None = None) -> bytes:
    """A PNG whose header states ``width`` x ``height``; its pixel data is ``pixels`` (grey) or none at all."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    body = chunk(b"IDAT", zlib.compress(pixels)) if pixels is not None else b""
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + body + chunk(b"IEND", b"")


def _refused(value: object, says: str) -> None:
    with pytest.raises(AnyformerError) as caught:
        load_image(value)
    assert caught.value.code is ErrorCode.BAD_REQUEST and says in str(caught.value), str(caught.value)


def test_a_real_png_decodes_to_rgb_pixels_equal_to_pillow() -> None:
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="RGB").save(buffer, format="PNG")
    image = load_image(buffer.getvalue())
    assert image.mode == "RGB" and image.size == (7, 5) and (np.asarray(image) == pixels).all()


def test_a_canvas_stated_past_the_bound_is_refused_before_decoding() -> None:
    side = int(MAX_IMAGE_PIXELS**0.5) + 1
    _refused(_png(side, side), "pixels")


def test_bytes_that_are_no_image_a_cut_file_and_a_url_are_bad_requests(tmp_path: Path) -> None:
    _refused(b"GIF8 not really", "not an image")
    _refused(_png(4, 4), "cannot be decoded")  # a header, no pixel data
    _refused("https://example.com/cat.png", "URLs are not fetched")
    _refused(object(), "send a path")


def test_arrays_and_paths_and_lists() -> None:
    grey = np.zeros((3, 4), dtype=np.uint8)
    assert load_image(grey).size == (4, 3)
    images, single = load_images([grey, grey], "image-classification")
    assert len(images) == 2 and not single
    with pytest.raises(AnyformerError) as caught:
        load_images([], "image-classification")
    assert caught.value.code is ErrorCode.BAD_REQUEST
