"""Image blocks checked before llama.cpp sees them: encoded files by their magic bytes and stated size, arrays by shape.

llama.cpp's media helper decodes with stb_image, and when that fails it tries the bytes as audio and
then as video through an ``ffprobe``/``ffmpeg`` child process. Only the formats stb_image reads
(PNG, JPEG, GIF, BMP) are handed to it, with their width and height read from the header first
so a few bytes cannot claim a gigapixel canvas; video decoding is switched off where it is called.
"""

from __future__ import annotations

import struct
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, check_image_size, read_media_file

FORMATS = "PNG, JPEG, GIF or BMP"


def _bad(message: str) -> AnyformerError:
    return AnyformerError(ErrorCode.BAD_REQUEST, message)


def _png_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _gif_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 10:
        return None
    width, height = struct.unpack("<HH", data[6:10])
    return width, height


def _bmp_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 26:
        return None
    width, height = struct.unpack("<ii", data[18:26])
    return abs(width), abs(height)


# JPEG start-of-frame markers (SOF0-SOF15 less DHT, JPG and DAC), which carry the frame size.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if length < 2:
            return None
        if marker in _JPEG_SOF:
            if at + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + length
    return None


_SNIFFERS = (
    (b"\x89PNG\r\n\x1a\n", "PNG", _png_size),
    (b"\xff\xd8\xff", "JPEG", _jpeg_size),
    (b"GIF87a", "GIF", _gif_size),
    (b"GIF89a", "GIF", _gif_size),
    (b"BM", "BMP", _bmp_size),
)


def sniff(data: bytes, what: str = "the image") -> str:
    """The format of an encoded image (``PNG``…), after its stated size is checked; else ``BAD_REQUEST``."""
    for magic, name, size_of in _SNIFFERS:
        if data.startswith(magic):
            size = size_of(data)
            if size is None:
                raise _bad(f"{what} starts like a {name} but its header is cut short or malformed")
            check_image_size(f"{what} ({name})", *size)
            return name
    raise _bad(f"{what} is not an image llama.cpp reads ({FORMATS})")


def encoded_bytes(image: Any, what: str = "the image") -> bytes:
    """The bytes of an image block given as bytes or a path, checked by :func:`sniff`."""
    data = read_media_file(image, what) if isinstance(image, str) else bytes(image)
    sniff(data, what)
    return data
