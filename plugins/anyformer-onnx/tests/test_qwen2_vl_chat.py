"""Chat with images on a Qwen2-VL export (M-RoPE decoder, grid-reading vision encoder), against transformers and torch.

The fixture built a tiny random ``Qwen2VLForConditionalGeneration`` (2-layer vision tower with its
merger, 2-layer decoder with M-RoPE) over a character vocabulary with Qwen2-VL's vision tokens,
recorded for questions about one image, two images and none the prompt transformers' processor
gives (its patches, grids and ``<|image_pad|>`` expansion), torch's greedy reply and the logits of
every step, then exported ``vision_encoder`` (``pixel_values``, ``grid_thw``), ``embed_tokens`` and
``decoder_model_merged`` (``position_ids`` [3, batch, seq]). Here the backend's image processor and
rope index are compared with transformers' on the same inputs, its prompts with the recorded ones,
its logits step by step and its replies with torch's.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx_exports import QWEN_VL_BLOCK_TEMPLATE
from teacher_forcing import Teacher, media_messages

import anyformer
from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.chat.mrope import rope_index, step_positions
from anyformer_onnx.chat.sampling import Sampler
from anyformer_onnx.media.qwen_vl_image import QwenVLImageProcessor


@pytest.fixture(scope="module")
def qwen2_vl(qwen2_vl_dir: Path) -> Iterator[Any]:
    """The tiny Qwen2-VL loaded once."""
    with anyformer.load(str(qwen2_vl_dir), backend="onnx") as loaded:
        yield loaded


@pytest.fixture(scope="module")
def torch_model(qwen2_vl_dir: Path) -> Any:
    """transformers' Qwen2-VL from the fixture's config (its rope index depends on the config alone)."""
    from transformers import AutoConfig, Qwen2VLForConditionalGeneration

    return Qwen2VLForConditionalGeneration(AutoConfig.from_pretrained(str(qwen2_vl_dir))).eval()


@pytest.fixture(scope="module")
def family(torch_model: Any) -> list[Any]:
    """Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's transformers models (tiny, same vision token ids): their rope indices."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel, Qwen3VLConfig, Qwen3VLModel

    config = torch_model.config
    ids = {key: getattr(config, key) for key in ("image_token_id", "video_token_id")}
    ids.update(vision_start_token_id=config.vision_start_token_id, vision_end_token_id=config.vision_end_token_id)
    text = {
        "vocab_size": config.text_config.vocab_size,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "eos_token_id": 2,
    }
    vision = {"depth": 1, "hidden_size": 16, "out_hidden_size": 32, "num_heads": 2, "intermediate_size": 32}
    others = [
        model_class(config_class(text_config=text, vision_config=vision, **ids)).eval()
        for config_class, model_class in ((Qwen2_5_VLConfig, Qwen2_5_VLModel), (Qwen3VLConfig, Qwen3VLModel))
    ]
    return [torch_model.model, *others]


def _transformers_index(model: Any, ids: list[int], grids: list[tuple[int, int, int]]) -> tuple[np.ndarray, int]:
    import torch

    image = model.config.image_token_id
    tensor = torch.tensor([ids])
    positions, delta = model.get_rope_index(
        tensor,
        mm_token_type_ids=(tensor == image).int(),
        image_grid_thw=torch.tensor(grids) if grids else None,
        attention_mask=torch.ones_like(tensor),
    )
    return positions[:, 0].numpy(), int(delta[0, 0])


def test_rope_index_equals_transformers(
    torch_model: Any, family: list[Any], qwen2_vl_dir: Path, reference: Any
) -> None:
    """Our index against Qwen2-VL's get_rope_index, and Qwen2.5-VL's and Qwen3-VL's (the same rule for images)."""
    config = torch_model.config
    image, start, end = config.image_token_id, config.vision_start_token_id, config.vision_end_token_id

    def wrapped(grid: tuple[int, int, int]) -> list[int]:
        return [start, *[image] * (grid[0] * grid[1] * grid[2] // 4), end]

    cases = [(r["prompt_ids"], [tuple(g) for g in r["grids"]]) for r in reference(qwen2_vl_dir)["replies"]]
    cases += [
        ([5, 6, *wrapped((1, 2, 8)), 7, 8, 9], [(1, 2, 8)]),  # wide: the text resumes past the width row
        ([*wrapped((1, 10, 2)), 11], [(1, 10, 2)]),  # tall, at the very start
        ([5, *wrapped((1, 4, 4)), 12, 13, *wrapped((1, 6, 2)), 14], [(1, 4, 4), (1, 6, 2)]),
        ([5, *wrapped((1, 2, 2))], [(1, 2, 2)]),  # the image ends the prompt
    ]
    assert any(g for _, g in cases) and any(not g for _, g in cases)
    for ids, grids in cases:
        got, delta = rope_index(ids, image, grids, 2)
        for model in family:
            want, want_delta = _transformers_index(model, ids, grids)
            np.testing.assert_array_equal(got, want, err_msg=type(model).__name__)
            assert delta == want_delta, (type(model).__name__, ids, grids)


def test_decode_positions_continue_as_transformers(torch_model: Any) -> None:
    """The rows after the prompt: transformers' compute_3d_position_ids with the cache holding the prompt."""
    import torch

    config = torch_model.config
    ids = [5, config.vision_start_token_id, *[config.image_token_id] * 12, config.vision_end_token_id, 6]
    grid = (1, 4, 12)  # a wide image: the delta is far from zero
    _, delta = rope_index(ids, config.image_token_id, [grid], 2)
    assert delta < -5
    torch_model.model.rope_deltas = torch.tensor([[delta]])

    class Cache:
        def get_seq_length(self) -> int:
            return len(ids) + 3

    embeds = torch.zeros(1, 2, config.text_config.hidden_size)
    want = torch_model.model.compute_3d_position_ids(
        input_ids=None, inputs_embeds=embeds, attention_mask=None, cache=Cache()
    )
    np.testing.assert_array_equal(step_positions(len(ids) + 3, 2, delta), want.numpy())


def test_pixels_and_grid_equal_transformers(qwen2_vl_dir: Path) -> None:
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    config = json.loads((qwen2_vl_dir / "preprocessor_config.json").read_text())
    theirs = Qwen2VLImageProcessorPil.from_pretrained(str(qwen2_vl_dir))
    ours = QwenVLImageProcessor.from_config(config, "test")
    generator = np.random.default_rng(3)
    images = [Image.open(path).convert("RGB") for path in sorted(qwen2_vl_dir.glob("image*.*"))]
    # Sizes that round, grow to min_pixels, shrink to max_pixels, and a narrow strip.
    for width, height in ((57, 31), (9, 14), (300, 170), (250, 3)):
        images.append(Image.fromarray(generator.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB"))
    for image in images:
        want = theirs(images=image, return_tensors="np")
        pixels, grid = ours(image)
        assert grid == tuple(int(v) for v in want["image_grid_thw"][0]), image.size
        assert pixels.shape == want["pixel_values"].shape
        np.testing.assert_allclose(pixels, want["pixel_values"], atol=1e-5, err_msg=str(image.size))


def test_processor_reads_min_and_max_pixels_keys() -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    legacy = QwenVLImageProcessor.from_config({"min_pixels": 3136, "max_pixels": 12544}, "test")
    sized = QwenVLImageProcessor.from_config({"size": {"shortest_edge": 3136, "longest_edge": 12544}}, "test")
    assert legacy == sized
    for height, width in ((45, 37), (1000, 30), (13, 13), (224, 224), (500, 900)):
        want = smart_resize(height, width, factor=28, min_pixels=3136, max_pixels=12544)
        assert legacy.target_size(height, width) == want
    with pytest.raises(AnyformerError) as caught:
        legacy.target_size(1, 250)
    assert caught.value.code == ErrorCode.BAD_REQUEST


def test_prompts_equal_the_processors(qwen2_vl: Any, qwen2_vl_dir: Path, reference: Any) -> None:
    for reply in reference(qwen2_vl_dir)["replies"]:
        prepared = qwen2_vl.handle.media.prepare(media_messages(qwen2_vl_dir, reply), False)
        assert prepared.ids == reply["prompt_ids"], reply["question"]
        assert (prepared.positions is None) == (not reply["images"])


def test_a_block_template_renders_the_prompt_transformers_renders(
    qwen2_vl_dir: Path, reference: Any, tmp_path: Path
) -> None:
    """With a template that reads blocks, each image is placed by the template itself (no stand-in, no newline
    between blocks): the prompt equals transformers' rendering of the same messages, each ``<|image_pad|>``
    repeated for its image's merged patches as Qwen2VLProcessor repeats it (grid from transformers' processor)."""
    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer

    folder = tmp_path / "qwen2-vl-blocks"
    shutil.copytree(qwen2_vl_dir, folder)
    (folder / "chat_template.jinja").write_text(QWEN_VL_BLOCK_TEMPLATE, encoding="utf-8")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    images = AutoImageProcessor.from_pretrained(str(folder))
    merge = json.loads((folder / "config.json").read_text())["vision_config"]["spatial_merge_size"]
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    replies = [r for r in reference(qwen2_vl_dir)["replies"] if r["images"]]
    assert any(len(r["images"]) > 1 for r in replies)
    with anyformer.load(str(folder), backend="onnx") as loaded:
        for reply in replies:
            messages = media_messages(folder, reply)
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, chat_template=QWEN_VL_BLOCK_TEMPLATE
            )
            pictures = [Image.open(folder / name).convert("RGB") for name in reply["images"]]
            counts = iter(int(np.prod(g)) // merge**2 for g in images(images=pictures)["image_grid_thw"])
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            want = [t for i in ids for t in ([i] * next(counts) if i == pad else [i])]
            got = loaded.handle.media.prepare(messages, False).ids
            assert got == want, reply["question"]
            assert got != reply["prompt_ids"]  # the stand-in rendering put newlines between the blocks


def test_step_logits_equal_torch(qwen2_vl: Any, qwen2_vl_dir: Path, reference: Any) -> None:
    """Each step's logits (the prompt with images on their M-RoPE rows, then the reply token by token) equal torch's.

    Through the decode loop itself, so the rows after the prompt (plain position + rope delta) are
    the loop's own.
    """
    for reply in reference(qwen2_vl_dir)["replies"]:
        teacher = Teacher(reply["reply_ids"])
        tokens = qwen2_vl.handle.loop.tokens(
            reply["prompt_ids"],
            teacher,
            limit=len(reply["reply_ids"]),
            stop_ids=frozenset({2}),
            **_prompt_inputs(qwen2_vl, media_messages(qwen2_vl_dir, reply)),
        )
        assert list(tokens) == reply["reply_ids"]
        assert len(teacher.logits) == len(reply["logits"])
        for index, (got, want) in enumerate(zip(teacher.logits, reply["logits"], strict=True)):
            np.testing.assert_allclose(got, want, atol=2e-4, err_msg=f"{reply['question']} step {index}")


def test_greedy_replies_equal_torch(qwen2_vl: Any, qwen2_vl_dir: Path, reference: Any) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(qwen2_vl_dir / "tokenizer.json"))
    for reply in reference(qwen2_vl_dir)["replies"]:
        messages = media_messages(qwen2_vl_dir, reply)
        ids = list(
            qwen2_vl.handle.loop.tokens(
                reply["prompt_ids"],
                Sampler(0.0, 0, 1.0, None),
                limit=len(reply["reply_ids"]),
                stop_ids=frozenset({2}),
                **_prompt_inputs(qwen2_vl, messages),
            )
        )
        assert ids == reply["reply_ids"], reply["question"]
        chunks = list(qwen2_vl.generate(messages, max_new_tokens=len(reply["reply_ids"]), temperature=0))
        want = [t for t in reply["reply_ids"] if t != 2]
        assert "".join(c.delta for c in chunks) == tokenizer.decode(want), reply["question"]
        assert chunks[-1].prompt_tokens == len(reply["prompt_ids"])


def _prompt_inputs(loaded: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    prepared = loaded.handle.media.prepare(messages, False)
    return {"prompt_embeds": prepared.embeds, "prompt_positions": prepared.positions}


def test_text_only_turn_as_a_string(qwen2_vl: Any, qwen2_vl_dir: Path, reference: Any) -> None:
    reply = next(r for r in reference(qwen2_vl_dir)["replies"] if not r["images"])
    messages = [{"role": "user", "content": reply["question"]}]
    chunks = list(qwen2_vl.generate(messages, max_new_tokens=len(reply["reply_ids"]), temperature=0))
    assert chunks[-1].tokens == len([t for t in reply["reply_ids"] if t != 2])
    assert chunks[-1].prompt_tokens == len(reply["prompt_ids"])


def test_typed_image_tokens_and_bad_images_are_bad_request(qwen2_vl: Any) -> None:
    cases = [
        [{"role": "user", "content": "what is <|image_pad|> here?"}],
        [{"role": "user", "content": [{"type": "image", "image": b"not an image"}, {"type": "text", "text": "?"}]}],
        [{"role": "user", "content": [{"type": "audio", "audio": b"RIFF"}, {"type": "text", "text": "?"}]}],
    ]
    for messages in cases:
        with pytest.raises(AnyformerError) as caught:
            list(qwen2_vl.generate(messages, max_new_tokens=2, temperature=0))
        assert caught.value.code == ErrorCode.BAD_REQUEST


def test_rope_index_refuses_runs_that_fit_no_grid() -> None:
    for ids, grids in (([1, 9, 9, 9, 2], [(1, 2, 2)]), ([1, 9, 2], []), ([1, 2], [(1, 2, 2)])):
        with pytest.raises(AnyformerError) as caught:
            rope_index(ids, 9, grids, 2)
        assert caught.value.code == ErrorCode.BAD_REQUEST


def test_an_image_to_a_text_only_model_is_bad_request(tiny_qwen2_dir: Path) -> None:
    messages = [{"role": "user", "content": [{"type": "image", "image": b"\x89PNG"}, {"type": "text", "text": "?"}]}]
    with anyformer.load(str(tiny_qwen2_dir), backend="onnx") as loaded:
        with pytest.raises(AnyformerError) as caught:
            list(loaded.generate(messages, max_new_tokens=2, temperature=0))
    assert caught.value.code == ErrorCode.BAD_REQUEST


@pytest.mark.parametrize(
    ("swap", "message"),
    [
        ("decoder", "position_ids are not M-RoPE"),  # a grid-reading encoder beside a plain decoder
        ("vision", "takes no image grid"),  # an M-RoPE decoder beside a LLaVA-style encoder
    ],
)
def test_mixed_halves_are_bad_model(
    qwen2_vl_dir: Path, llava_dir: Path, tmp_path: Path, swap: str, message: str
) -> None:
    """A Qwen2-VL repo with LLaVA's decoder, or LLaVA's vision encoder: refused at load, naming what misfits."""
    folder = tmp_path / "mixed"
    shutil.copytree(qwen2_vl_dir, folder)
    name = "decoder_model_merged.onnx" if swap == "decoder" else "vision_encoder.onnx"
    shutil.copy(llava_dir / "onnx" / name, folder / "onnx" / name)
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(str(folder), backend="onnx")
    assert caught.value.code == ErrorCode.BAD_MODEL
    assert message in str(caught.value)
