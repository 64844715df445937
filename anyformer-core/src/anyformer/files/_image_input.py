"""Images given to a handle's ``run``, checked before any decoder sees their pixels (for every backend).

An image is a path, the bytes of an encoded file, a ``HxWx3`` (``HxW`` grey, ``HxWx4`` RGBA)
uint8 array, or a Pillow image. Encoded files are recognised by their magic bytes (PNG, JPEG, GIF,
BMP, WebP only) and their stated width and height are checked from the header, before Pillow
decodes a single pixel: a few hundred bytes cannot claim a gigapixel canvas. A file that then fails
to decode (cut short, corrupt) is ``BAD_REQUEST`` too, never a Pillow traceback.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.files._media_input import MAX_IMAGE_PIXELS, check_image_size, read_media_file, rgb_pixels

#: Magic bytes of the formats read, and Pillow's name for each.
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
)
FORMATS = "PNG, JPEG, GIF, BMP or WebP"


def _bad(message: str, cause: BaseException | None = None) -> AnyformerError:
    return AnyformerError(ErrorCode.BAD_REQUEST, message, cause=cause)


def image_format(data: bytes) -> str | None:
    """Pillow's name for the format ``data`` starts like (``PNG``…), None for anything else."""
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def decode_image(data: bytes, what: str = "the image") -> Any:
    """A decoded RGB Pillow image from encoded bytes, checked by magic bytes and stated size first."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    name = image_format(data)
    if name is None:
        raise _bad(f"{what} is not an image anyformer reads ({FORMATS})")
    try:
        image = Image.open(io.BytesIO(data), formats=[name])  # reads the header only
    except Image.DecompressionBombError as exc:  # Pillow's own bound, far above ours
        raise _bad(f"{what} ({name}) claims a canvas over {MAX_IMAGE_PIXELS // 2**20} megapixels", exc) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise _bad(f"{what} starts like a {name} but its header is malformed", exc) from None
    check_image_size(f"{what} ({name})", *image.size)
    try:
        image.load()
        # As transformers' load_image: the camera's orientation applied, then RGB.
        return ImageOps.exif_transpose(image).convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise _bad(f"{what} ({name}) cannot be decoded: {exc}", exc) from None


def _from_array(value: Any, what: str) -> Any:
    from PIL import Image

    return Image.fromarray(rgb_pixels(value, what), mode="RGB")


def load_image(value: Any, what: str = "the image") -> Any:
    """An RGB Pillow image from a path, encoded bytes, a uint8 array or a Pillow image; ``BAD_REQUEST`` otherwise."""
    from PIL import Image

    if isinstance(value, Image.Image):
        check_image_size(what, *value.size)
        return value.convert("RGB")
    if isinstance(value, str) and value.startswith(("http://", "https://")):
        raise _bad(f"{what}: URLs are not fetched; pass a path, the file's bytes or an array")
    if isinstance(value, (str, Path)):
        return decode_image(read_media_file(value, what), what)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return decode_image(bytes(value), what)
    if type(value).__module__ == "numpy" and hasattr(value, "shape"):  # numpy is not imported for the other forms
        return _from_array(value, what)
    raise _bad(f"{what} is a {type(value).__name__}; send a path, encoded bytes or a uint8 array")


def load_images(value: Any, task: str, limit: int = 256) -> tuple[list[Any], bool]:
    """The images of a ``run`` input (one, or a list) and whether it was a single one."""
    single = not isinstance(value, (list, tuple))
    items = [value] if single else list(value)
    if not items:
        raise _bad(f"{task} takes an image or a non-empty list of images")
    if len(items) > limit:
        raise _bad(f"{len(items)} images in one call; at most {limit}")
    return [load_image(item, f"image {i}" if not single else "the image") for i, item in enumerate(items)], single
