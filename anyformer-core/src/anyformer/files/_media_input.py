"""Bounds on the images and audio files a request hands a backend, checked before any decoder runs.

Every backend that reads images or audio applies the same limits, so a hostile request meets the
same refusal whichever backend was chosen: a file read from a path is at most
:data:`MAX_MEDIA_FILE_BYTES`, and an image's canvas (as its header states it, or as an array's
shape gives it) at most :data:`MAX_IMAGE_PIXELS` pixels and :data:`MAX_IMAGE_SIDE` a side, so a
few hundred bytes cannot claim a gigapixel canvas (SAFETY's hostile inputs). Each refusal is
``BAD_REQUEST`` naming what was wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from anyformer.contract._errors import AnyformerError, ErrorCode

if TYPE_CHECKING:
    import numpy as np

#: Most pixels one image may have (8192x8192): a decoded RGB copy is at most 192 MiB.
MAX_IMAGE_PIXELS = 8192 * 8192
#: Longest image side accepted.
MAX_IMAGE_SIDE = 1 << 15
#: Largest image or audio file read from a path.
MAX_MEDIA_FILE_BYTES = 64 * 2**20


def _bad(message: str, cause: BaseException | None = None) -> AnyformerError:
    return AnyformerError(ErrorCode.BAD_REQUEST, message, cause=cause)


def check_image_size(what: str, width: int, height: int) -> None:
    """``BAD_REQUEST`` unless a ``width`` x ``height`` canvas is within the pixel and side bounds."""
    if width < 1 or height < 1:
        raise _bad(f"{what} is {width}x{height} pixels: an image needs at least one")
    if width > MAX_IMAGE_SIDE or height > MAX_IMAGE_SIDE or width * height > MAX_IMAGE_PIXELS:
        raise _bad(f"{what} is {width}x{height} pixels; at most {MAX_IMAGE_PIXELS // 2**20} megapixels are read")


def read_media_file(path: str | Path, what: str, kind: str = "image") -> bytes:
    """The bytes of an image or audio file (``kind`` names it in the message), at most :data:`MAX_MEDIA_FILE_BYTES`.

    ``BAD_REQUEST`` for a path that is not a regular file, one too large (checked before reading)
    or one that cannot be read.
    """
    file = Path(path)
    try:
        size = file.stat().st_size  # a missing or unreadable path says why, below
        if not file.is_file():
            raise _bad(f"{what}: {path} is not a file")
        if size > MAX_MEDIA_FILE_BYTES:
            raise _bad(
                f"{what}: {path} is {size} bytes; {kind} files up to {MAX_MEDIA_FILE_BYTES // 2**20} MiB are read"
            )
        return file.read_bytes()
    except OSError as exc:
        raise _bad(f"{what}: cannot read {path} ({exc.strerror or exc})", exc) from None


def rgb_pixels(value: Any, what: str = "the image") -> np.ndarray:
    """An image array as a C-contiguous ``HxWx3`` uint8 array; ``HxW`` grey and ``HxWx4`` RGBA are converted.

    ``BAD_REQUEST`` for another dtype or shape, or a canvas over the bounds.
    """
    import numpy as np  # only a caller that already holds an array gets here

    array = np.asarray(value)
    if array.dtype != np.uint8:
        raise _bad(f"{what} is an array of {array.dtype}; send uint8 pixels (HxWx3 RGB)")
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    elif array.ndim == 3 and array.shape[2] == 4:
        array = array[:, :, :3]
    elif not (array.ndim == 3 and array.shape[2] == 3):
        raise _bad(f"{what} is an array of shape {array.shape}; send HxWx3 RGB (or HxW grey, HxWx4 RGBA)")
    check_image_size(what, array.shape[1], array.shape[0])
    return np.ascontiguousarray(array)
