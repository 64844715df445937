"""The checks an image block passes before llama.cpp decodes it: format by magic bytes, size from the header."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from tiny_mmproj import png_bytes, random_pixels

from anyformer import AnyformerError, ErrorCode
from anyformer_llamacpp import images


def bmp_bytes(pixels: np.ndarray) -> bytes:
    """A 24-bit bottom-up BMP of an HxWx3 RGB array."""
    height, width = pixels.shape[:2]
    stride = (width * 3 + 3) // 4 * 4
    rows = b"".join(pixels[y, :, ::-1].tobytes().ljust(stride, b"\0") for y in range(height - 1, -1, -1))
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(rows), 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(info) + len(rows), 0, 0, 14 + len(info)) + info + rows


def jpeg_header(width: int, height: int) -> bytes:
    """The start of a JPEG: SOI, an APP0 segment and a baseline SOF0 stating the size (no pixel data)."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0"
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x11\0\x02\x11\x01\x03\x11\x01"
    return b"\xff\xd8" + app0 + sof0


def gif_header(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\0\0\0"


@pytest.mark.parametrize(
    ("data", "name"),
    [
        (png_bytes(random_pixels(3, 5)), "PNG"),
        (jpeg_header(640, 480), "JPEG"),
        (gif_header(10, 10), "GIF"),
        (bmp_bytes(random_pixels(3, 5)), "BMP"),
    ],
)
def test_the_formats_llama_cpp_decodes_are_recognised(data: bytes, name: str) -> None:
    assert images.sniff(data) == name


@pytest.mark.parametrize(
    "data",
    [
        jpeg_header(40000, 40000),
        gif_header(65535, 65535),
        png_bytes(random_pixels(1, 1))[:16] + struct.pack(">II", 9000, 9000),
        bmp_bytes(random_pixels(1, 1))[:18] + struct.pack("<ii", 100000, -3) + b"\0" * 28,
    ],
    ids=["JPEG 40000^2", "GIF 65535^2", "PNG 9000^2", "BMP 100000 wide"],
)
def test_a_canvas_too_large_is_bad_request_from_the_header(data: bytes) -> None:
    with pytest.raises(AnyformerError) as info:
        images.sniff(data)
    assert info.value.code is ErrorCode.BAD_REQUEST and "megapixels" in info.value.message


@pytest.mark.parametrize(
    "data",
    [b"", b"RIFF\0\0\0\0WAVEfmt ", b"\x00\x00\x00\x18ftypmp42", b"\xff\xd8\xff\xe0\x00", b"GIF89a\x01"],
    ids=["empty", "WAV", "MP4", "JPEG cut in its first segment", "GIF cut in its size"],
)
def test_audio_video_and_cut_headers_are_refused(data: bytes) -> None:
    with pytest.raises(AnyformerError) as info:
        images.sniff(data)
    assert info.value.code is ErrorCode.BAD_REQUEST


def test_a_bmp_gives_the_same_reply_as_a_png_of_the_same_pixels(vision) -> None:  # type: ignore[no-untyped-def]
    pixels = random_pixels(9, 13, seed=5)

    def ask(image: bytes) -> str:
        messages = [{"role": "user", "content": [{"type": "image", "image": image}]}]
        return vision.complete(messages, max_new_tokens=8).text

    assert ask(bmp_bytes(pixels)) == ask(png_bytes(pixels))
