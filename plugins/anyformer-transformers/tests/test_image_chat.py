"""image-text-to-text chat on a tiny LLaVA against transformers' own ``generate`` and ``pipeline`` on the same weights.

transformers renders the template with its processor (``apply_chat_template``); anyformer with the
core's sandbox, the image blocks kept; both then go through the processor, so the same greedy text
means the prompt, the image tokens and the pixels agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tiny_media import picture

import anyformer
from anyformer import AnyformerError, ErrorCode

TOKENS = 16


def _reference(folder: Path, pixels: list[Any], question: str) -> str:
    """transformers' greedy reply to one user message of ``pixels`` images then ``question``."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(folder))
    model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32).eval()
    content = [*({"type": "image"} for _ in pixels), {"type": "text", "text": question}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    images = [Image.fromarray(p, mode="RGB") for p in pixels] or None
    inputs = processor(images=images, text=text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=TOKENS, do_sample=False)
    return str(processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))


@pytest.fixture(scope="module")
def llava(tiny_media_dir: dict[str, Path]) -> Iterator[tuple[Path, anyformer.Loaded]]:
    folder = tiny_media_dir["image-text-to-text"]
    with anyformer.load(folder, backend="transformers", isolate=False) as model:
        yield folder, model


def _reply(model: anyformer.Loaded, pixels: list[Any], question: str) -> str:
    content = [*({"type": "image", "image": p} for p in pixels), {"type": "text", "text": question}]
    chunks = list(model.generate([{"role": "user", "content": content}], max_new_tokens=TOKENS))
    return chunks[-1].text


def test_an_image_chat_replies_as_transformers_generate(llava: tuple[Path, anyformer.Loaded]) -> None:
    folder, model = llava
    assert model.task == "image-text-to-text"
    import numpy as np

    replies = set()
    for image in (picture(50, 40, seed=0), np.full((40, 50, 3), 255, dtype=np.uint8)):
        pixels = [image]
        expected = _reference(folder, pixels, "What is this?")
        assert _reply(model, pixels, "What is this?") == expected
        replies.add(expected)
    assert len(replies) == 2 and all(replies), replies  # the image changes the reply: the pixels are read
    two = [picture(30, 30, seed=2), picture(40, 20, seed=3)]
    assert _reply(model, two, "Compare them.") == _reference(folder, two, "Compare them.")


def test_an_image_chat_equals_the_pipeline(llava: tuple[Path, anyformer.Loaded]) -> None:
    from PIL import Image
    from transformers import pipeline

    folder, model = llava
    pixels = picture(50, 40, seed=4)
    build: Any = pipeline
    pipe = build("image-text-to-text", model=str(folder), device="cpu")
    content = [{"type": "image", "image": Image.fromarray(pixels, mode="RGB")}, {"type": "text", "text": "Hi"}]
    want = pipe(
        text=[{"role": "user", "content": content}], max_new_tokens=TOKENS, do_sample=False, return_full_text=False
    )
    assert _reply(model, [pixels], "Hi") == want[0]["generated_text"]


def test_a_text_only_chat_and_an_audio_block(llava: tuple[Path, anyformer.Loaded]) -> None:
    folder, model = llava
    assert _reply(model, [], "Hello") == _reference(folder, [], "Hello")
    import numpy as np

    audio = {"type": "audio", "audio": {"array": np.zeros(1600, dtype=np.float32), "sampling_rate": 16000}}
    with pytest.raises(AnyformerError) as caught:
        list(model.generate([{"role": "user", "content": [audio, {"type": "text", "text": "hi"}]}], max_new_tokens=2))
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_can_run_chooses_image_text_to_text_and_says_it_reads_images(tiny_media_dir: dict[str, Path]) -> None:
    from anyformer_transformers.plugin import can_run
    from test_media_tasks import _described

    caps = anyformer.Caps(ram_bytes=8 * 2**30, store=True, cpu_count=2)
    verdict = can_run(_described(tiny_media_dir["image-text-to-text"]), caps, anyformer.Request())
    assert verdict.ok, verdict.reason
    estimate = verdict.estimate
    assert estimate is not None and estimate.inputs == ("image",)
    assert estimate.details["class"] == "LlavaForConditionalGeneration" and estimate.details["context"] == 512
    assert "processor_config.json" in estimate.files


def test_an_isolated_image_chat_replies_the_same(llava: tuple[Path, anyformer.Loaded]) -> None:
    """An image block's array crosses the isolated worker's pipe: the same greedy reply."""
    folder, model = llava
    pixels = [picture(50, 40, seed=0)]
    with anyformer.load(folder, backend="transformers", isolate=True) as isolated:
        assert _reply(isolated, pixels, "What is this?") == _reply(model, pixels, "What is this?")
