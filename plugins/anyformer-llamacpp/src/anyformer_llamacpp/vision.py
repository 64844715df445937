"""llama.cpp's multimodal path (libmtmd through ``llama_cpp.mtmd_cpp``): the projector's context, images as bitmaps.

Only the lower-level API is used, so the decode loop and the KV bookkeeping stay ours: a prompt is
rendered with a marker where each image was, ``mtmd_tokenize`` cuts it into text chunks (token ids,
evaluated by the engine with ``Llama.eval``) and image chunks (encoded by the projector and decoded
into the KV cache by ``mtmd_helper_eval_chunk_single``).

The marker is random per load (``<__anyformer_image_…__>``), not llama.cpp's ``<__media__>``, so a
user's text that happens to contain llama.cpp's marker stays text and cannot move or add an image.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import secrets
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from anyformer.plugin import (
    AnyformerError,
    ErrorCode,
    Model,
    ProgressCallback,
    ProgressEvent,
    fetch_files,
    read_gguf_header,
    rgb_pixels,
)
from anyformer_llamacpp import BACKEND_ID, images
from anyformer_llamacpp.file_choice import projector_for
from anyformer_llamacpp.projector_checks import check_projector

# ggml's log levels.
_LOG_ERROR = 4
_LOG_CONT = 5

#: The last error lines libmtmd logged (its loader reports why it refused a file only there).
_ERRORS: collections.deque[str] = collections.deque(maxlen=8)
_logger: Any = None

#: Where llama.cpp's media helper looks for ``ffprobe``: nowhere, so bytes are never handed to ffmpeg.
_NO_FFMPEG = b"/nonexistent/anyformer-no-ffmpeg"


def _install_logger() -> None:
    """Route libmtmd's log lines to a callback that keeps the errors and drops the chatter (once)."""
    global _logger
    if _logger is not None:
        return
    import llama_cpp
    from llama_cpp import mtmd_cpp

    last_level = [0]

    def keep_errors(level: int, text: bytes | None, _user: Any) -> None:
        if level != _LOG_CONT:
            last_level[0] = level
        if last_level[0] == _LOG_ERROR and text:
            line = text.decode("utf-8", "replace").strip()
            if line:
                _ERRORS.append(line)

    _logger = llama_cpp.llama_log_callback(keep_errors)
    mtmd_cpp.mtmd_log_set(_logger, None)
    mtmd_cpp.mtmd_helper_log_set(_logger, None)


def _last_errors() -> str:
    return "; ".join(dict.fromkeys(_ERRORS)) or "no reason given"


@dataclasses.dataclass(frozen=True)
class FoundProjector:
    """A repo's projector, fetched and checked: its path when it reads images, else why not."""

    name: str
    path: Path | None
    note: str | None = None


def find_projector(model: Model, facts: dict[str, Any], progress: ProgressCallback) -> FoundProjector | None:
    """Fetch the repo's projector and check its header (``BAD_MODEL`` when hostile); None when there is none."""
    mmproj = projector_for(model)
    if mmproj is None:
        return None
    path = fetch_files(model, [mmproj.name], progress, backend=BACKEND_ID)[mmproj.name]
    progress(ProgressEvent(stage="verify", backend=BACKEND_ID, file=mmproj.name))
    header = read_gguf_header(path, name=mmproj.name)
    width = facts.get("embedding_length")
    checked = check_projector(mmproj.name, header, width if isinstance(width, int) else None)
    if not checked.vision:
        note = f"the projector {mmproj.name} has no vision encoder (it reads no images)"
        return FoundProjector(mmproj.name, None, note)
    return FoundProjector(mmproj.name, path)


@dataclasses.dataclass(frozen=True)
class ImageChunk:
    """One image of a prompt, ready to evaluate: the chunk, the KV cells it fills and the positions it takes."""

    chunk: int
    n_tokens: int
    n_pos: int


class Chunks:
    """An ``mtmd_input_chunks`` list; freed by :meth:`close` or, failing that, when collected."""

    def __init__(self, pointer: int) -> None:
        from llama_cpp import mtmd_cpp

        self.pointer = pointer
        self._finalizer = weakref.finalize(self, mtmd_cpp.mtmd_input_chunks_free, pointer)

    def close(self) -> None:
        self._finalizer()


class Projector:
    """An open ``mtmd_context``: the projector file bound to the loaded language model."""

    def __init__(self, ctx: int, marker: str, name: str) -> None:
        from llama_cpp import mtmd_cpp

        self._mtmd = mtmd_cpp
        self._ctx: int | None = ctx
        self.marker = marker
        self.name = name

    @classmethod
    def open(cls, path: Path, text_model: Any, *, threads: int, use_gpu: bool) -> Projector:
        """Load the projector for ``text_model`` (a ``llama_model`` pointer); ``BAD_MODEL`` when llama.cpp refuses."""
        from llama_cpp import mtmd_cpp

        _install_logger()
        _ERRORS.clear()
        marker = f"<__anyformer_image_{secrets.token_hex(8)}__>"
        marker_bytes = marker.encode()
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = threads
        params.print_timings = False
        params.media_marker = marker_bytes
        ctx = mtmd_cpp.mtmd_init_from_file(str(path).encode(), text_model, params)
        if not ctx:
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{path.name}: llama.cpp's multimodal loader refused it ({_last_errors()})"
            )
        projector = cls(ctx, marker, path.name)
        if not mtmd_cpp.mtmd_support_vision(ctx):
            projector.close()
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{path.name}: llama.cpp found no vision encoder in it")
        if (mtmd_cpp.mtmd_get_marker(ctx) or b"") != marker_bytes:
            projector.close()
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{path.name}: llama.cpp did not take the media marker")
        return projector

    def close(self) -> None:
        """Free the context (before the language model it points into); a second call does nothing."""
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            self._mtmd.mtmd_free(ctx)

    # ---- images -----------------------------------------------------------------------------------

    def _bitmap(self, image: Any, what: str) -> int:
        mtmd = self._mtmd
        if hasattr(image, "shape") and hasattr(image, "__array__"):
            pixels = rgb_pixels(image, what)
            height, width = pixels.shape[:2]
            # llama.cpp copies the pixels; a read-only array is fine.
            bitmap = mtmd.mtmd_bitmap_init(width, height, pixels.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
            if not bitmap:
                raise AnyformerError(ErrorCode.BAD_REQUEST, f"{what}: llama.cpp could not take the pixels")
            return int(bitmap)
        data = images.encoded_bytes(image, what)
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        options = mtmd.mtmd_helper_init_opt_default()
        options.video_params.ffmpeg_bin_dir = _NO_FFMPEG
        _ERRORS.clear()
        wrapper = mtmd.mtmd_helper_bitmap_init_from_buf_wrapper(self._ctx, buffer, len(data), False, options)
        if wrapper.video_ctx:
            mtmd.mtmd_helper_video_free(wrapper.video_ctx)
        bitmap = wrapper.bitmap
        if bitmap and mtmd.mtmd_bitmap_is_audio(bitmap):
            mtmd.mtmd_bitmap_free(bitmap)
            bitmap = None
        if not bitmap:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"{what} could not be decoded as an image ({images.FORMATS} are read)"
            )
        return int(bitmap)

    def tokenize(self, prompt: str, pictures: Sequence[Any], *, add_special: bool) -> tuple[list[Any], Chunks]:
        """Cut ``prompt`` (one marker per picture, in order) into token lists and :class:`ImageChunk` items.

        Every picture is decoded first; one that is not an image is ``BAD_REQUEST`` before any work.
        Returns the segments and the :class:`Chunks` that own the image chunks.
        """
        mtmd = self._mtmd
        if self._ctx is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.name} was disposed")
        bitmaps: list[int] = []
        chunks: Chunks | None = None
        try:
            for number, picture in enumerate(pictures, 1):
                bitmaps.append(self._bitmap(picture, f"image {number}"))
            text = mtmd.mtmd_input_text()
            encoded = prompt.encode("utf-8")
            text.text = encoded
            text.text_len = len(encoded)
            text.add_special = add_special
            text.parse_special = True
            pointer = mtmd.mtmd_input_chunks_init()
            if not pointer:
                raise MemoryError("mtmd_input_chunks_init")
            chunks = Chunks(pointer)
            array = (mtmd.mtmd_bitmap_p_ctypes * max(len(bitmaps), 1))(*bitmaps)
            _ERRORS.clear()
            status = mtmd.mtmd_tokenize(self._ctx, pointer, ctypes.byref(text), array, len(bitmaps))
            if status != 0:
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST, f"llama.cpp could not prepare the images (status {status}: {_last_errors()})"
                )
            segments: list[Any] = []
            for index in range(mtmd.mtmd_input_chunks_size(pointer)):
                chunk = mtmd.mtmd_input_chunks_get(pointer, index)
                kind = mtmd.mtmd_input_chunk_get_type(chunk)
                if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    count = ctypes.c_size_t()
                    tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                    if count.value:
                        segments.append([int(tokens[i]) for i in range(count.value)])
                elif kind == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                    n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
                    n_pos = int(mtmd.mtmd_input_chunk_get_n_pos(chunk))
                    segments.append(ImageChunk(chunk=int(chunk), n_tokens=n_tokens, n_pos=n_pos))
                else:
                    raise AnyformerError(ErrorCode.BAD_REQUEST, "llama.cpp made a non-image media chunk")
        except BaseException:
            if chunks is not None:
                chunks.close()
            raise
        finally:
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)
        return segments, chunks

    def eval_image(self, context: Any, image: ImageChunk, n_past: int, n_batch: int, *, logits_last: bool) -> int:
        """Encode ``image`` and decode it into the KV cache at ``n_past``; returns the position after it."""
        from llama_cpp import llama_cpp as lib

        if self._ctx is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.name} was disposed")
        new_n_past = lib.llama_pos(0)
        _ERRORS.clear()
        status = self._mtmd.mtmd_helper_eval_chunk_single(
            self._ctx, context, image.chunk, n_past, 0, n_batch, logits_last, ctypes.byref(new_n_past)
        )
        if status != 0:
            raise AnyformerError(
                ErrorCode.OUT_OF_MEMORY if status == 2 else ErrorCode.BAD_REQUEST,
                f"llama.cpp could not evaluate an image (status {status}: {_last_errors()})",
            )
        return int(new_n_past.value)
