"""Image blocks checked before llama.cpp sees them: encoded files by their magic bytes and stated size, arrays by shape.

llama.cpp's media helper decodes with stb_image, and when that fails it tries the bytes as audio and
then as video through an ``ffprobe``/``ffmpeg`` child process. Only the formats stb_image reads
(PNG, JPEG, GIF, BMP) are handed to it, with their width and height read from the header first
so a few bytes cannot claim a gigapixel canvas; video decoding is switched off where it is called.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from anyformer import AnyformerError, ErrorCode

#: Most pixels one image may have (a 8192x8192 canvas): a decoded RGB copy is at most 192 MiB.
MAX_PIXELS = 8192 * 8192
#: Longest side accepted.
MAX_SIDE = 1 << 15
#: Largest encoded image file read from a path.
MAX_FILE_BYTES = 64 * 1024 * 1024

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


def _check_size(what: str, width: int, height: int) -> None:
    if width < 1 or height < 1:
        raise _bad(f"{what} is {width}x{height} pixels: an image needs at least one")
    if width > MAX_SIDE or height > MAX_SIDE or width * height > MAX_PIXELS:
        raise _bad(f"{what} is {width}x{height} pixels; at most {MAX_PIXELS // 2**20} megapixels are read")


def sniff(data: bytes, what: str = "the image") -> str:
    """The format of an encoded image (``PNG``…), after its stated size is checked; else ``BAD_REQUEST``."""
    for magic, name, size_of in _SNIFFERS:
        if data.startswith(magic):
            size = size_of(data)
            if size is None:
                raise _bad(f"{what} starts like a {name} but its header is cut short or malformed")
            _check_size(f"{what} ({name})", *size)
            return name
    raise _bad(f"{what} is not an image llama.cpp reads ({FORMATS})")


def encoded_bytes(image: Any, what: str = "the image") -> bytes:
    """The bytes of an image block given as bytes or a path, checked by :func:`sniff`."""
    if isinstance(image, str):
        path = Path(image)
        try:
            size = path.stat().st_size
            if not path.is_file():
                raise _bad(f"{what}: {image} is not a file")
            if size > MAX_FILE_BYTES:
                raise _bad(f"{what}: {image} is {size} bytes; image files up to {MAX_FILE_BYTES // 2**20} MiB are read")
            data = path.read_bytes()
        except OSError as exc:
            raise _bad(f"{what}: cannot read {image} ({exc.strerror or exc})") from None
    else:
        data = bytes(image)
    sniff(data, what)
    return data


def rgb_array(image: Any, what: str = "the image") -> np.ndarray:
    """An image array as a C-contiguous HxWx3 uint8 array (HxW grey and HxWx4 RGBA are converted)."""
    array = np.asarray(image)
    if array.dtype != np.uint8:
        raise _bad(f"{what} is an array of {array.dtype}; send uint8 pixels (HxWx3 RGB)")
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    elif array.ndim == 3 and array.shape[2] == 4:
        array = array[:, :, :3]
    elif not (array.ndim == 3 and array.shape[2] == 3):
        raise _bad(f"{what} is an array of shape {array.shape}; send HxWx3 RGB (or HxW grey, HxWx4 RGBA)")
    _check_size(what, array.shape[1], array.shape[0])
    return np.ascontiguousarray(array)
