"""Chat with images on a multimodal export with one graph per module, against torch on the same weights.

The fixture recorded torch's greedy replies of a tiny random LLaVA (CLIP vision tower, llama
decoder, a character vocabulary) to questions about seeded images, the image token expanded as
transformers' processor expands it, and one question without an image; then exported
``vision_encoder``, ``embed_tokens`` and ``decoder_model_merged``. Here the backend streams its
greedy replies to the same messages: the token ids must be identical.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer.plugin import AnyformerError, ErrorCode


def _messages(folder: Path, reply: dict[str, Any]) -> list[dict[str, Any]]:
    if reply["image"] is None:
        return [{"role": "user", "content": reply["question"]}]
    blocks = [{"type": "image", "image": str(folder / reply["image"])}, {"type": "text", "text": reply["question"]}]
    return [{"role": "user", "content": blocks}]


def test_greedy_replies_with_images_equal_torch(llava_dir: Path, reference: Any) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(llava_dir / "tokenizer.json"))
    expected = reference(llava_dir)
    with anyformer.load(str(llava_dir), backend="onnx") as loaded:
        assert loaded.task == "image-text-to-text"
        for reply in expected["replies"]:
            want = [t for t in reply["reply_ids"] if t != 2]
            chunks = list(
                loaded.generate(_messages(llava_dir, reply), max_new_tokens=len(reply["reply_ids"]), temperature=0)
            )
            text = "".join(chunk.delta for chunk in chunks)
            assert text == tokenizer.decode(want, skip_special_tokens=False), reply["question"]
            assert chunks[-1].tokens == len(want)
            if reply["image"] is not None:
                # The prompt counts the image token once per feature row of the vision encoder.
                assert chunks[-1].prompt_tokens > expected["image_tokens"]


def test_the_image_changes_the_reply(llava_dir: Path, reference: Any) -> None:
    reply = reference(llava_dir)["replies"][0]
    other = dict(reply, image="image1.jpeg")
    with anyformer.load(str(llava_dir), backend="onnx") as loaded:
        first = "".join(c.delta for c in loaded.generate(_messages(llava_dir, reply), max_new_tokens=12, temperature=0))
        second = "".join(
            c.delta for c in loaded.generate(_messages(llava_dir, other), max_new_tokens=12, temperature=0)
        )
    assert first != second


def test_bad_images_and_typed_image_tokens_are_bad_request(llava_dir: Path) -> None:
    with anyformer.load(str(llava_dir), backend="onnx") as loaded:
        cases = [
            [{"role": "user", "content": [{"type": "image", "image": b"not an image"}, {"type": "text", "text": "?"}]}],
            [{"role": "user", "content": "what is <image> here?"}],
        ]
        for messages in cases:
            with pytest.raises(AnyformerError) as caught:
                list(loaded.generate(messages, max_new_tokens=4, temperature=0))
            assert caught.value.code == ErrorCode.BAD_REQUEST
