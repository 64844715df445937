"""Image blocks through llama.cpp's multimodal path, on a tiny random llama with a tiny random LLaVA projector.

Replies are checked against llama.cpp's own multimodal path driven by hand (libmtmd with its default
marker), and the KV cache against a fresh model. Inputs that could reach native code in a bad
state (a corrupt PNG, hostile projectors) run in a child process, so a crash would show as a
signal, not as a dead test runner.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tiny_gguf import CHATML_WITH_THINKING, write_tiny_llama
from tiny_mmproj import png_bytes, random_pixels, write_tiny_mmproj

import anyformer
from anyformer import AnyformerError, ErrorCode

PROJECTOR = "mmproj-tiny-f32.gguf"
LANGUAGE_MODEL = "tiny-llama-F32.gguf"


def _folder(root: Path, **projector: Any) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    write_tiny_llama(root / LANGUAGE_MODEL)
    write_tiny_mmproj(root / PROJECTOR, **projector)
    return root


def _ask(image: Any, text: str = "what is this") -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, {"type": "image", "image": image}]}]


PICTURE = random_pixels(12, 20, seed=1)
OTHER_PICTURE = random_pixels(24, 16, seed=2)


def _reference_reply(folder: Path, image_bytes: bytes, text: str, max_tokens: int) -> str:
    """The greedy reply from llama.cpp's multimodal path driven directly: libmtmd, its default marker, Llama.eval."""
    import llama_cpp
    from llama_cpp import Llama, mtmd_cpp

    marker = mtmd_cpp.mtmd_default_marker().decode()
    prompt = anyformer.render_chat(
        CHATML_WITH_THINKING, [{"role": "user", "content": f"{text}\n{marker}"}], enable_thinking=False
    )
    llama = Llama(model_path=str(folder / LANGUAGE_MODEL), n_ctx=512, n_threads=2, flash_attn=True, verbose=False)
    params = mtmd_cpp.mtmd_context_params_default()
    params.use_gpu = False
    params.print_timings = False
    ctx = mtmd_cpp.mtmd_init_from_file(str(folder / PROJECTOR).encode(), llama._model.model, params)
    assert ctx
    try:
        buffer = (ctypes.c_uint8 * len(image_bytes)).from_buffer_copy(image_bytes)
        bitmap = mtmd_cpp.mtmd_helper_bitmap_init_from_buf(ctx, buffer, len(image_bytes), False)
        assert bitmap
        text_input = mtmd_cpp.mtmd_input_text()
        encoded = prompt.encode()
        text_input.text, text_input.text_len = encoded, len(encoded)
        text_input.add_special, text_input.parse_special = False, True
        chunks = mtmd_cpp.mtmd_input_chunks_init()
        bitmaps = (mtmd_cpp.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd_cpp.mtmd_tokenize(ctx, chunks, ctypes.byref(text_input), bitmaps, 1) == 0
        for index in range(mtmd_cpp.mtmd_input_chunks_size(chunks)):
            chunk = mtmd_cpp.mtmd_input_chunks_get(chunks, index)
            if mtmd_cpp.mtmd_input_chunk_get_type(chunk) == mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_TEXT:
                count = ctypes.c_size_t()
                tokens = mtmd_cpp.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                llama.eval([tokens[i] for i in range(count.value)])
            else:
                new_n_past = llama_cpp.llama_pos(0)
                status = mtmd_cpp.mtmd_helper_eval_chunk_single(
                    ctx, llama._ctx.ctx, chunk, llama.n_tokens, 0, llama.n_batch, False, ctypes.byref(new_n_past)
                )
                assert status == 0
                llama.n_tokens = new_n_past.value
        mtmd_cpp.mtmd_input_chunks_free(chunks)
        mtmd_cpp.mtmd_bitmap_free(bitmap)
        reply = []
        for _ in range(max_tokens):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama._ctx.ctx, -1), shape=(llama.n_vocab(),))
            token = int(logits.argmax())
            if llama_cpp.llama_vocab_is_eog(llama._model.vocab, token):
                break
            reply.append(token)
            llama.eval([token])
        return llama.detokenize(reply).decode("utf-8", "replace")
    finally:
        mtmd_cpp.mtmd_free(ctx)
        llama.close()


# ---- description and load ---------------------------------------------------------------------------


def test_check_accepts_the_folder_for_image_text_to_text(vision_folder: Path) -> None:
    model, selection = anyformer.check(vision_folder, task="image-text-to-text", backend="llamacpp")
    chosen = selection.chosen
    assert chosen is not None and chosen.ok
    assert chosen.estimate is not None
    assert PROJECTOR in chosen.estimate.files and chosen.estimate.details["projector"] == PROJECTOR
    assert chosen.estimate.disk_bytes == sum(f.size or 0 for f in model.files)


def test_the_projector_is_loaded_with_the_model(vision: anyformer.Loaded) -> None:
    assert vision.handle._projector is not None


# ---- generation with images -------------------------------------------------------------------------


def test_png_bytes_stream_the_same_reply_as_llama_cpp_own_multimodal_path(
    vision: anyformer.Loaded, vision_folder: Path
) -> None:
    image = png_bytes(PICTURE)
    chunks = list(vision.generate(_ask(image), max_new_tokens=12))
    assert chunks[-1].finish_reason in ("stop", "length")
    assert [c.tokens for c in chunks] == sorted(c.tokens for c in chunks) and 1 <= chunks[-1].tokens <= 12
    assert "".join(c.delta for c in chunks) == chunks[-1].text
    assert chunks[-1].text == _reference_reply(vision_folder, image, "what is this", 12)


def test_an_array_a_png_and_a_path_of_the_same_pixels_give_the_same_reply(
    vision: anyformer.Loaded, tmp_path: Path
) -> None:
    from_png = vision.complete(_ask(png_bytes(PICTURE)), max_new_tokens=10)
    from_array = vision.complete(_ask(PICTURE), max_new_tokens=10)
    path = tmp_path / "picture.png"
    path.write_bytes(png_bytes(PICTURE))
    from_path = vision.complete(_ask(str(path)), max_new_tokens=10)
    assert from_array.text == from_png.text == from_path.text
    assert from_array.tokens >= 1 and from_array.finish_reason in ("stop", "length")


def test_grey_rgba_and_read_only_arrays_are_read(vision: anyformer.Loaded) -> None:
    grey = PICTURE[:, :, 0]
    rgba = np.concatenate([PICTURE, np.full((*PICTURE.shape[:2], 1), 255, np.uint8)], axis=2)
    read_only = np.frombuffer(PICTURE.tobytes(), np.uint8).reshape(PICTURE.shape)
    expected = vision.complete(_ask(PICTURE), max_new_tokens=6).text
    assert vision.complete(_ask(rgba), max_new_tokens=6).text == expected
    assert vision.complete(_ask(read_only), max_new_tokens=6).text == expected
    assert vision.complete(_ask(grey), max_new_tokens=6).tokens >= 1


def test_the_image_changes_the_reply(vision: anyformer.Loaded) -> None:
    replies = {vision.complete(_ask(p), max_new_tokens=12).text for p in (PICTURE, OTHER_PICTURE, PICTURE[::-1])}
    assert len(replies) > 1


def test_two_images_in_one_conversation(vision: anyformer.Loaded) -> None:
    messages = [
        {"role": "user", "content": [{"type": "image", "image": PICTURE}, {"type": "text", "text": "and"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "image", "image": png_bytes(OTHER_PICTURE)}]},
    ]
    last = vision.complete(messages, max_new_tokens=8)
    assert last.tokens >= 1 and last.finish_reason in ("stop", "length")


def test_the_cache_stays_right_around_image_calls(vision: anyformer.Loaded, vision_folder: Path) -> None:
    text_only = [{"role": "user", "content": "what is this"}]
    with anyformer.load(vision_folder, backend="llamacpp") as fresh:
        expected_text = fresh.complete(text_only, max_new_tokens=10).text
        expected_other = fresh.complete(_ask(OTHER_PICTURE), max_new_tokens=10).text
    # text, an image, another image after the same text, then text again: each as on a fresh model
    assert vision.complete(text_only, max_new_tokens=10).text == expected_text
    vision.complete(_ask(PICTURE), max_new_tokens=10)
    assert vision.complete(_ask(OTHER_PICTURE), max_new_tokens=10).text == expected_other
    assert vision.complete(text_only, max_new_tokens=10).text == expected_text
    assert vision.complete(_ask(OTHER_PICTURE), max_new_tokens=10).text == expected_other


def test_a_user_text_with_llama_cpp_marker_stays_text(vision: anyformer.Loaded) -> None:
    from llama_cpp import mtmd_cpp

    marker = mtmd_cpp.mtmd_default_marker().decode()
    reply = vision.complete(_ask(PICTURE, text=f"is this {marker} an image?"), max_new_tokens=4)
    assert reply.tokens >= 1


def test_cancel_after_an_image_leaves_the_model_usable(vision: anyformer.Loaded) -> None:
    import threading

    expected = vision.complete(_ask(PICTURE), max_new_tokens=6).text
    cancel = threading.Event()
    for chunk in vision.generate(_ask(OTHER_PICTURE), max_new_tokens=50, cancel=cancel):
        if chunk.tokens >= 2:
            cancel.set()
    assert chunk.finish_reason == "cancelled"
    assert vision.complete(_ask(PICTURE), max_new_tokens=6).text == expected


# ---- refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "words"),
    [
        (b"this is no image at all", "not an image"),
        (b"\x89PNG\r\n\x1a\n", "cut short"),
        (png_bytes(random_pixels(1, 1))[:16] + b"IHDR" + b"\xff" * 8, "megapixels"),
        (np.zeros((4, 4, 3), np.float32), "uint8"),
        (np.zeros((4, 4, 2), np.uint8), "shape"),
        (np.zeros((0, 4, 3), np.uint8), "at least one"),
        ("/nonexistent/picture.png", "cannot read"),
    ],
    ids=["text bytes", "bare PNG magic", "4G x 4G PNG header", "float array", "two channels", "empty", "missing path"],
)
def test_an_image_that_is_not_one_is_bad_request(vision: anyformer.Loaded, image: Any, words: str) -> None:
    with pytest.raises(AnyformerError) as info:
        list(vision.generate(_ask(image), max_new_tokens=4))
    assert info.value.code is ErrorCode.BAD_REQUEST and words in info.value.message
    assert vision.complete("hello", max_new_tokens=2).tokens >= 1


_GENERATE_IN_CHILD = """
import json, sys, anyformer
image = open(sys.argv[2], "rb").read()
with anyformer.load(sys.argv[1], backend="llamacpp") as loaded:
    try:
        loaded.complete([{"role": "user", "content": [{"type": "image", "image": image}]}], max_new_tokens=4)
        code = None
    except anyformer.AnyformerError as exc:
        code = exc.code.value
    after = loaded.complete("hello", max_new_tokens=2).tokens
print(json.dumps({"code": code, "after": after}))
"""


def _corrupt_png_payload(data: bytes) -> bytes:
    at = data.index(b"IDAT") + 4
    return data[:at] + bytes(b ^ 0x5A for b in data[at:])


@pytest.mark.parametrize(
    "mangle",
    [lambda d: d[: len(d) // 2], _corrupt_png_payload, lambda d: d[:33] + b"\x00" * 64],
    ids=["cut in half", "scrambled pixels", "zeroed after the header"],
)
def test_a_corrupt_png_is_bad_request_in_a_child_process(vision_folder: Path, tmp_path: Path, mangle: Any) -> None:
    image = tmp_path / "corrupt.png"
    image.write_bytes(mangle(png_bytes(PICTURE)))
    done = subprocess.run(
        [sys.executable, "-c", _GENERATE_IN_CHILD, str(vision_folder), str(image)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"the child died with {done.returncode}: {done.stderr[-2000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] in ("BAD_REQUEST", None) and result["after"] >= 1
    if result["code"] is None:  # stb_image may still decode a damaged PNG; then it is an image
        pytest.skip("llama.cpp decoded the damaged PNG")


def test_a_projector_without_a_vision_encoder_refuses_images(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "audio-only", vision=False)
    with anyformer.load(folder, backend="llamacpp") as loaded:
        with pytest.raises(AnyformerError) as info:
            list(loaded.generate(_ask(PICTURE)))
        assert info.value.code is ErrorCode.BAD_REQUEST and "no vision encoder" in info.value.message
        assert loaded.complete("hello", max_new_tokens=2).tokens >= 1


# ---- hostile projectors -----------------------------------------------------------------------------

_LOAD_IN_CHILD = """
import json, sys, anyformer
try:
    anyformer.load(sys.argv[1], backend="llamacpp").dispose()
    print(json.dumps({"code": None}))
except anyformer.AnyformerError as exc:
    print(json.dumps({"code": exc.code.value, "message": exc.message}))
"""

# Each of these crashed llama.cpp's clip loader (segfault or ggml abort) before the checks, except the
# unknown type and the width mismatch, which llama.cpp refuses itself.
HOSTILE_PROJECTORS: dict[str, tuple[dict[str, Any], str]] = {
    "no mm.0.weight": ({"drop_tensors": ("mm.0.weight",)}, "mm.0.weight"),
    "no patch embedding": ({"drop_tensors": ("v.patch_embd.weight",)}, "v.patch_embd.weight"),
    "no attention query": ({"drop_tensors": ("v.blk.1.attn_q.weight",)}, "v.blk.1.attn_q.weight"),
    "3 heads for width 32": ({"heads": 3}, "head_count"),
    "patch larger than the image": ({"patch_size": 64}, "patch_size"),
    "32-wide output for a 64-wide model": ({"text_embedding": 32}, "width is 64"),
    "unknown projector type": ({"projector_type": "nonesuch"}, "unknown projector type"),
}


def _load_in_child(folder: Path) -> dict[str, Any]:
    command = [sys.executable, "-c", _LOAD_IN_CHILD, str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the child died with {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(HOSTILE_PROJECTORS))
def test_a_hostile_projector_is_bad_model_in_a_child_process(case: str, tmp_path: Path) -> None:
    options, words = HOSTILE_PROJECTORS[case]
    result = _load_in_child(_folder(tmp_path / "hostile", **options))
    assert result["code"] == "BAD_MODEL" and words in (result["message"] or ""), f"{case}: {result}"


@pytest.mark.parametrize("cut", [0.5, 0.999], ids=["half", "one byte short"])
def test_a_truncated_projector_is_bad_model(cut: float, vision_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "cut"
    shutil.copytree(vision_folder, folder)
    data = (vision_folder / PROJECTOR).read_bytes()
    (folder / PROJECTOR).write_bytes(data[: int(len(data) * cut)] if cut < 0.999 else data[:-1])
    result = _load_in_child(folder)
    assert result["code"] == "BAD_MODEL", result
