"""Chat with images on a Qwen3.5 export (hybrid decoder, interleaved M-RoPE, resampled vision positions) against torch.

The fixture (qwen35_vl_exports.py) built a tiny random ``Qwen3_5ForConditionalGeneration``: a
2-block vision tower with patch 16 and a 4 x 4 learned position table resampled to each grid, and
a 4-layer decoder mixing gated-DeltaNet and full-attention layers whose rotary rows interleave T,
H and W. For three questions with images (non-square ones, two of them with two images) and one
without it recorded the prompt transformers renders and expands, ``get_rope_index``'s rows, the
decoder's input embeddings, torch's greedy reply and every step's logits; then exported
``vision_encoder``, ``embed_tokens`` and ``decoder_model_merged`` as onnx-community lays Qwen3.5 out.

Here the backend's pixels, prompts, positions and embeddings are compared with transformers', its
logits step by step and its replies with torch's, and the last tests show the comparison catches
positions other than the model's (plain rows, height and width swapped) and images left out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import qwen35_vl_exports
from teacher_forcing import Teacher, media_messages, replies

import anyformer
from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.chat.mrope import rope_index
from anyformer_onnx.chat.sampling import Sampler
from anyformer_onnx.media.qwen_vl_image import QwenVLImageProcessor

#: How far the loop's logits may be from torch's (torch's prefill is chunked, the export's token by token).
TOLERANCE = 2e-4


@pytest.fixture(scope="session")
def qwen35_vl_dir() -> Path:
    """The tiny Qwen3.5 with images, exported once per machine."""
    return qwen35_vl_exports.tiny_qwen35_vl()


@pytest.fixture(scope="module")
def qwen35_vl(qwen35_vl_dir: Path) -> Iterator[Any]:
    with anyformer.load(str(qwen35_vl_dir), backend="onnx") as loaded:
        yield loaded


@pytest.fixture(scope="module")
def torch_model(qwen35_vl_dir: Path) -> Any:
    """transformers' Qwen3.5 from the fixture's config (its rope index reads the config alone)."""
    from transformers import AutoConfig, Qwen3_5ForConditionalGeneration

    return Qwen3_5ForConditionalGeneration(AutoConfig.from_pretrained(str(qwen35_vl_dir))).eval()


def test_fixture_covers_images_and_text(qwen35_vl_dir: Path) -> None:
    recorded = replies(qwen35_vl_dir)
    assert sum(1 for r in recorded if r["images"]) >= 3 and any(not r["images"] for r in recorded)
    assert any(len(r["images"]) > 1 for r in recorded)
    grids = [tuple(g) for r in recorded for g in r["grids"]]
    assert any(g[1] != g[2] for g in grids)  # non-square: swapped height and width rows would differ


def test_pixels_and_grid_equal_transformers(qwen35_vl_dir: Path) -> None:
    """Patch 16 and Qwen3.5's mean and std (0.5) from preprocessor_config.json, against transformers' processor."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    config = json.loads((qwen35_vl_dir / "preprocessor_config.json").read_text())
    theirs = Qwen2VLImageProcessorPil.from_pretrained(str(qwen35_vl_dir))
    ours = QwenVLImageProcessor.from_config(config, "test")
    assert (ours.patch, ours.merge, ours.mean) == (16, 2, (0.5, 0.5, 0.5))
    generator = np.random.default_rng(5)
    images = [Image.open(path).convert("RGB") for path in sorted(qwen35_vl_dir.glob("image*.*"))]
    # Sizes that round, grow to min_pixels, shrink to max_pixels, and a narrow strip.
    for width, height in ((70, 40), (9, 14), (300, 170), (250, 5)):
        images.append(Image.fromarray(generator.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB"))
    for image in images:
        want = theirs(images=image, return_tensors="np")
        pixels, grid = ours(image)
        assert grid == tuple(int(v) for v in want["image_grid_thw"][0]), image.size
        np.testing.assert_allclose(pixels, want["pixel_values"], atol=1e-5, err_msg=str(image.size))


def test_rope_index_equals_qwen35s(torch_model: Any, qwen35_vl_dir: Path) -> None:
    """Our rows and delta against Qwen3_5Model.get_rope_index: the recorded prompts and placements of other grids."""
    import torch

    config = torch_model.config
    image, start, end = config.image_token_id, config.vision_start_token_id, config.vision_end_token_id

    def wrapped(grid: tuple[int, int, int]) -> list[int]:
        return [start, *[image] * (grid[0] * grid[1] * grid[2] // 4), end]

    cases = [(r["prompt_ids"], [tuple(g) for g in r["grids"]]) for r in replies(qwen35_vl_dir) if r["grids"]]
    cases += [
        ([5, 6, *wrapped((1, 2, 8)), 7, 8, 9], [(1, 2, 8)]),  # wide: the text resumes past the width row
        ([*wrapped((1, 10, 2)), 11], [(1, 10, 2)]),  # tall, at the very start
        ([5, *wrapped((1, 4, 4)), 12, *wrapped((1, 6, 2)), 14], [(1, 4, 4), (1, 6, 2)]),
    ]
    for ids, grids in cases:
        got, delta = rope_index(ids, image, grids, 2)
        tensor = torch.tensor([ids])
        want, want_delta = torch_model.model.get_rope_index(
            tensor,
            mm_token_type_ids=(tensor == image).int(),
            image_grid_thw=torch.tensor(grids),
            attention_mask=torch.ones_like(tensor),
        )
        np.testing.assert_array_equal(got, want[:, 0].numpy(), err_msg=str(grids))
        assert delta == int(want_delta[0, 0]), grids


def test_prompts_positions_and_embeddings_equal_transformers(qwen35_vl: Any, qwen35_vl_dir: Path) -> None:
    """The expanded prompt, its M-RoPE rows, and the decoder's input (image rows spliced in) equal transformers'."""
    for number, reply in enumerate(replies(qwen35_vl_dir)):
        prepared = qwen35_vl.handle.media.prepare(media_messages(qwen35_vl_dir, reply), False)
        assert prepared.ids == reply["prompt_ids"], reply["question"]
        want = np.load(qwen35_vl_dir / f"prompt_embeds{number}.npy")
        if not reply["images"]:
            assert prepared.positions is None and prepared.embeds is None
            continue
        np.testing.assert_array_equal(prepared.positions, np.asarray(reply["positions"]))
        assert int(prepared.positions.max()) + 1 - len(prepared.ids) == reply["delta"]
        assert prepared.embeds is not None
        np.testing.assert_allclose(prepared.embeds[0], want, atol=1e-5, err_msg=reply["question"])
        # The image rows are the vision encoder's, not the pad token's embedding.
        plain = qwen35_vl.handle.media.embed(prepared.ids)[0]
        rows = np.asarray(prepared.ids) == qwen35_vl.handle.media.kinds["image"].token_id
        assert np.abs(plain[rows] - want[rows]).max() > 0.1


def _forced(loaded: Any, reply: dict[str, Any], embeds: Any, positions: Any) -> list[np.ndarray]:
    teacher = Teacher(reply["reply_ids"])
    tokens = loaded.handle.loop.tokens(
        reply["prompt_ids"],
        teacher,
        limit=len(reply["reply_ids"]),
        stop_ids=frozenset({2}),
        prompt_embeds=embeds,
        prompt_positions=positions,
    )
    assert list(tokens) == reply["reply_ids"]
    return teacher.logits


def test_step_logits_equal_torch(qwen35_vl: Any, qwen35_vl_dir: Path) -> None:
    """Every step's logits (the prompt on its M-RoPE rows with the states carried, then the reply) equal torch's."""
    for reply in replies(qwen35_vl_dir):
        prepared = qwen35_vl.handle.media.prepare(media_messages(qwen35_vl_dir, reply), False)
        logits = _forced(qwen35_vl, reply, prepared.embeds, prepared.positions)
        assert len(logits) == len(reply["logits"])
        for index, (got, want) in enumerate(zip(logits, reply["logits"], strict=True)):
            np.testing.assert_allclose(got, want, atol=TOLERANCE, err_msg=f"{reply['question']} step {index}")


def test_greedy_replies_equal_torch(qwen35_vl: Any, qwen35_vl_dir: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(qwen35_vl_dir / "tokenizer.json"))
    for reply in replies(qwen35_vl_dir):
        messages = media_messages(qwen35_vl_dir, reply)
        chunks = list(qwen35_vl.generate(messages, max_new_tokens=len(reply["reply_ids"]), temperature=0))
        want = [t for t in reply["reply_ids"] if t != 2]
        assert "".join(c.delta for c in chunks) == tokenizer.decode(want), reply["question"]
        assert chunks[-1].tokens == len(want)
        assert chunks[-1].prompt_tokens == len(reply["prompt_ids"])
        prepared = qwen35_vl.handle.media.prepare(messages, False)
        ids = qwen35_vl.handle.loop.tokens(
            prepared.ids,
            Sampler(0.0, 0, 1.0, None),
            limit=len(reply["reply_ids"]),
            stop_ids=frozenset({2}),
            prompt_embeds=prepared.embeds,
            prompt_positions=prepared.positions,
        )
        assert list(ids) == reply["reply_ids"], reply["question"]


def _first_gap(loaded: Any, reply: dict[str, Any], embeds: Any, positions: Any) -> float:
    """How far the prompt step's logits are from torch's with these inputs."""
    teacher = Teacher(reply["reply_ids"][:1])
    tokens = loaded.handle.loop.tokens(
        reply["prompt_ids"], teacher, limit=1, stop_ids=frozenset(), prompt_embeds=embeds, prompt_positions=positions
    )
    list(tokens)
    return float(np.abs(teacher.logits[0] - np.asarray(reply["logits"][0])).max())


def test_the_comparison_catches_wrong_positions_and_missing_images(qwen35_vl: Any, qwen35_vl_dir: Path) -> None:
    """Plain rows, height and width swapped, or the pad token's embeddings in place of the image rows: torch's
    logits are missed by far more than the tolerance (so the tests above pin the positions and the features)."""
    for reply in [r for r in replies(qwen35_vl_dir) if r["images"]]:
        prepared = qwen35_vl.handle.media.prepare(media_messages(qwen35_vl_dir, reply), False)
        assert prepared.positions is not None and prepared.embeds is not None
        assert _first_gap(qwen35_vl, reply, prepared.embeds, prepared.positions) < TOLERANCE
        plain = np.broadcast_to(np.arange(len(prepared.ids)), prepared.positions.shape).copy()
        swapped = prepared.positions[[0, 2, 1]]
        unfilled = qwen35_vl.handle.media.embed(prepared.ids)
        for embeds, positions, what in (
            (prepared.embeds, plain, "plain positions"),
            (prepared.embeds, swapped, "height and width swapped"),
            (unfilled, prepared.positions, "no image features"),
        ):
            assert _first_gap(qwen35_vl, reply, embeds, positions) > 5 * TOLERANCE, (reply["question"], what)


def test_a_decoder_wanting_deepstack_features_is_bad_model(qwen35_vl_dir: Path, tmp_path: Path) -> None:
    """Qwen3-VL's decoder also reads the vision tower's deepstack features, which Qwen3.5's has not: refused, named."""
    import shutil

    import onnx

    folder = tmp_path / "deepstack"
    shutil.copytree(qwen35_vl_dir, folder)
    path = folder / "onnx" / "decoder_model_merged.onnx"
    graph = onnx.load(str(path))
    extra = onnx.helper.make_tensor_value_info("deepstack_visual_embeds", onnx.TensorProto.FLOAT, [3, "tokens", 64])
    graph.graph.input.append(extra)
    onnx.save(graph, str(path))
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(str(folder), backend="onnx")
    assert caught.value.code == ErrorCode.BAD_MODEL
    assert "deepstack_visual_embeds" in str(caught.value)


def test_a_decoder_with_qwen2_vls_contiguous_sections_would_fail(qwen35_vl_dir: Path) -> None:
    """torch's decoder on the fixture's weights and the backend's prompt gives the recorded first logits; with the
    rows laid over the rotary frequencies in Qwen2-VL's contiguous sections instead of Qwen3.5's interleaving it
    misses them by far more than the tolerance, so the step-logit test pins an interleaving export."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, Qwen3_5ForConditionalGeneration

    config = AutoConfig.from_pretrained(str(qwen35_vl_dir))
    model = Qwen3_5ForConditionalGeneration(config).eval()
    model.load_state_dict(load_file(str(qwen35_vl_dir / "torch_weights.safetensors")))
    section = config.text_config.rope_parameters["mrope_section"]

    def contiguous(freq: Any) -> Any:  # Qwen2-VL: T's section, then H's, then W's
        bounds = np.cumsum([0, *section])
        half = torch.cat([freq[row, ..., bounds[row] : bounds[row + 1]] for row in range(3)], dim=-1)
        return torch.cat((half, half), dim=-1)

    def first_logits(number: int, reply: dict[str, Any]) -> np.ndarray:
        embeds = torch.from_numpy(np.load(qwen35_vl_dir / f"prompt_embeds{number}.npy"))[None]
        positions = torch.tensor(reply["positions"])[:, None, :]
        with torch.no_grad():
            hidden = model.model.language_model(inputs_embeds=embeds, position_ids=positions).last_hidden_state
            return model.lm_head(hidden)[0, -1].numpy()

    rotary = model.model.language_model.rotary_emb
    for number, reply in enumerate(replies(qwen35_vl_dir)):
        if not reply["images"]:
            continue
        want = np.asarray(reply["logits"][0])
        np.testing.assert_allclose(first_logits(number, reply), want, atol=TOLERANCE)
        rotary.recomposition_frequencies = contiguous
        try:
            assert np.abs(first_logits(number, reply) - want).max() > 5 * TOLERANCE, reply["question"]
        finally:
            del rotary.recomposition_frequencies
