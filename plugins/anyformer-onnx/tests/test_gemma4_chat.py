"""Chat with images and audio on a Gemma 4 export (per-layer inputs, vision and audio encoders), against torch.

The fixture (gemma4_exports.py) built a tiny random ``Gemma4ForConditionalGeneration`` (4-layer
decoder with per-layer inputs, KV sharing and soft-capped logits; 2-layer vision and audio towers)
over a character vocabulary with Gemma 4's media tokens, recorded for questions about one image,
two images, nothing, one clip, and an image with two clips the prompt transformers'
``Gemma4Processor`` gives, the embeddings and per-layer inputs the language model received, torch's
greedy reply from ``generate`` and the logits of every step, then exported ``embed_tokens``,
``vision_encoder``, ``audio_encoder`` and ``decoder_model_merged``. Here the backend's image
processor, feature extractor, prompts, embeddings, logits and replies are compared with those, and
the tests show the comparison would catch media features or per-layer inputs left out.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from teacher_forcing import largest_gap, media_messages, refusal, replies, step_logits

import anyformer
from anyformer.plugin import AnyformerError, Caps, ErrorCode, Model, Refusal, Request
from anyformer_onnx import plugin
from anyformer_onnx.chat.decoder import DecodeLoop
from anyformer_onnx.chat.per_layer import PER_LAYER_INPUTS
from anyformer_onnx.media.gemma4_audio import Gemma4LogMel, audio_tokens, htk_mel_filters
from anyformer_onnx.media.gemma4_image import Gemma4ImageProcessor
from anyformer_onnx.tasks.names import AUDIO_TEXT_TO_TEXT, IMAGE_TEXT_TO_TEXT, TEXT_GENERATION
from anyformer_onnx.tasks.registry import task_of


@pytest.fixture(scope="module")
def gemma4(gemma4_dir: Path) -> Iterator[Any]:
    """The tiny Gemma 4 loaded once."""
    with anyformer.load(str(gemma4_dir), backend="onnx") as loaded:
        yield loaded


def _processor(folder: Path) -> Gemma4ImageProcessor:
    settings = json.loads((folder / "processor_config.json").read_text())["image_processor"]
    return Gemma4ImageProcessor.from_config(settings, "test")


def test_what_was_loaded(gemma4: Any) -> None:
    """Four graphs, image chat, a decoder with per-layer inputs and a cache for its two non-shared layers."""
    assert gemma4.task == IMAGE_TEXT_TO_TEXT
    assert [name.rsplit("/", 1)[-1] for name in gemma4.handle.details["files"]] == [
        "embed_tokens.onnx",
        "decoder_model_merged.onnx",
        "vision_encoder.onnx",
        "audio_encoder.onnx",
    ]
    graph = gemma4.handle.loop.graph
    assert graph.per_layer and graph.takes_embeds
    assert graph.kv_shapes == {
        "past_key_values.0.key": (2, 16),
        "past_key_values.0.value": (2, 16),
        "past_key_values.1.key": (2, 32),  # the full-attention layer's wider global head
        "past_key_values.1.value": (2, 32),
    }
    assert gemma4.audio_input


def test_pixels_and_positions_equal_transformers(gemma4_dir: Path) -> None:
    """Each test image's padded patches and (x, y) positions are the processor's, value for value."""
    from PIL import Image

    processor = _processor(gemma4_dir)
    names = json.loads((gemma4_dir / "reference.json").read_text())["images"]
    counts = []
    for index, name in enumerate(names):
        want = np.load(gemma4_dir / f"pixels{index}.npz")
        pixels, positions, tokens = processor(Image.open(gemma4_dir / name).convert("RGB"))
        np.testing.assert_array_equal(pixels, want["pixel_values"])
        np.testing.assert_array_equal(positions, want["image_position_ids"])
        assert tokens == int((want["image_position_ids"][:, 0] >= 0).sum()) // 9
        counts.append(tokens)
    assert len(set(counts)) == 3  # the three images pad differently


def _log_mel(folder: Path) -> Gemma4LogMel:
    settings = json.loads((folder / "processor_config.json").read_text())["feature_extractor"]
    return Gemma4LogMel.from_config(settings, "test")


def test_audio_features_and_mask_equal_transformers(gemma4_dir: Path) -> None:
    """Each clip's log-mel features and real-frame mask are the feature extractor's (per-bin mean and std set)."""
    front = _log_mel(gemma4_dir)
    assert front.mean is not None and front.std is not None
    for index in (0, 1):
        want = np.load(gemma4_dir / f"features{index}.npz")
        features, mask = front(np.load(gemma4_dir / f"clip{index}.npy"))
        np.testing.assert_allclose(features, want["input_features"], atol=1e-5)
        np.testing.assert_array_equal(mask, want["input_features_mask"])
    assert not want["input_features_mask"].all()  # the second clip ends in padding frames


@pytest.mark.parametrize("samples", [129, 320, 1000, 16_000, 16_001, 23_300, 23_403, 80_000])
def test_audio_token_counts_equal_the_processors(gemma4_dir: Path, samples: int) -> None:
    """A clip's token count (real frames the encoder keeps) is Gemma4Processor's, from the same mask arithmetic."""
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

    found = Gemma4AudioFeatureExtractor()([np.zeros(samples, dtype=np.float32)], return_tensors="np")
    mask = found["input_features_mask"][0]
    want = len(mask)
    for _ in range(2):  # Gemma4Processor.replace_audio_token's two stride-2 steps
        want = (want + 2 - 3) // 2 + 1
        mask = mask[::2][:want]
    front = _log_mel(gemma4_dir)
    assert audio_tokens(front(np.zeros(samples, dtype=np.float32))[1]) == int(mask.sum())


def test_mel_filters_equal_transformers() -> None:
    import warnings

    from transformers.audio_utils import mel_filter_bank

    with warnings.catch_warnings():  # its top filters fall between FFT bins (zero), as the extractor's own do
        warnings.simplefilter("ignore")
        want = mel_filter_bank(257, 128, 0.0, 8000.0, 16_000, norm=None, mel_scale="htk")
    np.testing.assert_allclose(htk_mel_filters(257, 128, 0.0, 8000.0, 16_000), want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("size", [(37, 45), (32, 32), (61, 20), (1000, 7), (7, 1000), (3000, 2), (1, 1), (479, 481)])
def test_target_sizes_equal_transformers(size: tuple[int, int]) -> None:
    """The resize target (aspect ratio kept, sides in multiples, the thin-image cases) is transformers'."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size

    height, width = size
    for budget in (70, 280):
        processor = Gemma4ImageProcessor(16, budget, 3, True, 3, 1 / 255, None, None)
        try:
            want = get_aspect_ratio_preserving_size(height, width, 16, processor.max_patches, 3)
        except ValueError:
            with pytest.raises(AnyformerError) as caught:
                processor.target_size(height, width)
            assert caught.value.code == ErrorCode.BAD_REQUEST
            continue
        assert processor.target_size(height, width) == want


def test_prompt_ids_equal_the_processors(gemma4: Any, gemma4_dir: Path) -> None:
    """Each image becomes <|image>, one <|image|> per soft token and <image|>, as Gemma4Processor writes them."""
    for reply in replies(gemma4_dir):
        prepared = gemma4.handle.media.prepare(media_messages(gemma4_dir, reply), False)
        assert prepared.ids == reply["prompt_ids"]
    with_images = replies(gemma4_dir)[1]["prompt_ids"]
    assert with_images.count(99) == 64 + 56 and with_images.count(100) == with_images.count(101) == 2
    both = replies(gemma4_dir)[4]["prompt_ids"]  # an image, then two clips: <|audio>, their tokens, <audio|>
    assert both.count(99) == 64 and both.count(102) == 37 + 25 and both.count(103) == both.count(104) == 2


def test_decoder_inputs_equal_torchs(gemma4: Any, gemma4_dir: Path) -> None:
    """inputs_embeds (image features spliced in) and per_layer_inputs (image positions read as the pad token)."""
    media = gemma4.handle.media
    for index, reply in enumerate(replies(gemma4_dir)):
        prepared = media.prepare(media_messages(gemma4_dir, reply), False)
        want = np.load(gemma4_dir / f"inputs{index}.npz")
        embeds = prepared.embeds if prepared.embeds is not None else media.embed(prepared.ids)
        np.testing.assert_allclose(embeds, want["inputs_embeds"], atol=1e-5)
        per_layer = media.embed_inputs(prepared.ids)[PER_LAYER_INPUTS]
        np.testing.assert_allclose(per_layer, want["per_layer_inputs"], atol=1e-5)
        for token, found in ((99, reply["images"]), (102, reply["clips"])):
            if found:  # the media rows differ from the pad token's embedding: features were spliced in
                rows = [i for i, t in enumerate(prepared.ids) if t == token]
                assert np.abs(embeds[0, rows] - media.embed([0])[0, 0]).max() > 1e-2


def test_step_logits_equal_torch(gemma4: Any, gemma4_dir: Path) -> None:
    """Every step's logits (the prompt with its images, then torch's reply through the cache) equal torch's."""
    for reply in replies(gemma4_dir):
        prepared = gemma4.handle.media.prepare(media_messages(gemma4_dir, reply), False)
        got = step_logits(gemma4.handle.loop, reply, prepared.ids, prepared.embeds)
        assert len(got) == len(reply["logits"]) == 10
        for index, (row, want) in enumerate(zip(got, reply["logits"], strict=True)):
            np.testing.assert_allclose(row, want, atol=2e-4, err_msg=f"{reply['question']} step {index}")


def test_greedy_replies_equal_torch(gemma4: Any, gemma4_dir: Path) -> None:
    """generate() at temperature 0 gives torch's greedy reply, its text and its prompt length."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(gemma4_dir / "tokenizer.json"))
    for reply in replies(gemma4_dir):
        chunks = list(gemma4.generate(media_messages(gemma4_dir, reply), max_new_tokens=10, temperature=0))
        want = [t for t in reply["reply_ids"] if t != 2]
        assert "".join(c.delta for c in chunks) == tokenizer.decode(want)
        assert chunks[-1].tokens == len(want)
        assert chunks[-1].prompt_tokens == len(reply["prompt_ids"])


@pytest.mark.parametrize(("prompt", "token"), [(0, 99), (3, 102)])
def test_zeroed_media_features_change_the_logits(gemma4: Any, gemma4_dir: Path, prompt: int, token: int) -> None:
    """The comparison can fail: the same prompt with the image (or audio) rows zeroed moves the logits off torch's."""
    reply = replies(gemma4_dir)[prompt]
    prepared = gemma4.handle.media.prepare(media_messages(gemma4_dir, reply), False)
    zeroed = prepared.embeds.copy()
    zeroed[0, [i for i, t in enumerate(prepared.ids) if t == token]] = 0
    assert largest_gap(step_logits(gemma4.handle.loop, reply, prepared.ids, zeroed), reply["logits"]) > 1e-2


def test_per_layer_inputs_of_the_image_token_change_the_logits(gemma4: Any, gemma4_dir: Path) -> None:
    """The comparison can fail: per-layer inputs read from the image token's own row (not the pad's) move the logits."""
    media = gemma4.handle.media
    reply = replies(gemma4_dir)[0]
    prepared = media.prepare(media_messages(gemma4_dir, reply), False)
    pad = media.media_pad

    def unswapped(ids: list[int]) -> dict[str, np.ndarray]:
        media.media_pad = None
        try:
            return media.embed_inputs(ids)
        finally:
            media.media_pad = pad

    loop = DecodeLoop(gemma4.handle.loop.graph, "cpu", unswapped)
    assert largest_gap(step_logits(loop, reply, prepared.ids, prepared.embeds), reply["logits"]) > 1e-2


@pytest.mark.parametrize(
    ("image", "words"),
    [(b"not an image at all", "image 0"), (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "image 0"), (42, "not a path")],
)
def test_a_bad_image_is_bad_request(gemma4: Any, image: Any, words: str) -> None:
    assert words in str(refusal(gemma4, [{"type": "image", "image": image}, {"type": "text", "text": "?"}]))


@pytest.mark.parametrize(
    ("audio", "words"),
    [
        (np.zeros(100, dtype=np.float32), "too short"),
        (np.zeros(16_000 * 31, dtype=np.float32), "at most"),
        ({"raw": np.zeros(8000, dtype=np.float32), "sampling_rate": 8000}, "8000"),
        (b"not a wav file", "audio 0"),
    ],
)
def test_bad_audio_is_bad_request(gemma4: Any, audio: Any, words: str) -> None:
    assert words in str(refusal(gemma4, [{"type": "audio", "audio": audio}, {"type": "text", "text": "?"}]))


def test_an_image_token_typed_in_a_message_is_bad_request(gemma4: Any, gemma4_dir: Path) -> None:
    image = str(gemma4_dir / "image0.png")
    content = [{"type": "image", "image": image}, {"type": "text", "text": "and <|image|> here"}]
    assert "image tokens" in str(refusal(gemma4, content))


def test_a_bidirectional_vision_decoder_is_read_for_text_only(gemma4_dir: Path, tmp_path: Path) -> None:
    """use_bidirectional_attention "vision" (image tokens attending each other) cannot ride on attention_mask."""
    folder = tmp_path / "bidirectional"
    shutil.copytree(gemma4_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["use_bidirectional_attention"] = "vision"
    (folder / "config.json").write_text(json.dumps(config))
    with anyformer.load(str(folder), backend="onnx") as loaded:
        assert loaded.task == TEXT_GENERATION
        assert len(loaded.handle.details["files"]) == 2 and not loaded.audio_input
        reply = replies(gemma4_dir)[2]
        chunks = list(loaded.generate(media_messages(gemma4_dir, reply), max_new_tokens=3, temperature=0))
        assert chunks[-1].tokens == 3
        with pytest.raises(AnyformerError) as caught:
            list(loaded.generate(media_messages(gemma4_dir, replies(gemma4_dir)[0]), max_new_tokens=2, temperature=0))
        assert caught.value.code == ErrorCode.BAD_REQUEST
        assert "use_bidirectional_attention" in str(caught.value)


# ---- can_run on descriptions alone ---------------------------------------------------------------

_GEMMA4_CONFIG = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "text_config": {
        "hidden_size": 1536,
        "hidden_size_per_layer_input": 256,
        "num_hidden_layers": 35,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "global_head_dim": 512,
        "max_position_embeddings": 131072,
    },
}
_GEMMA4_FILES = [
    ("onnx/embed_tokens_q4.onnx", 10**8),
    ("onnx/decoder_model_merged_q4.onnx", 10**9),
    ("onnx/vision_encoder_q4.onnx", 3 * 10**8),
    ("onnx/audio_encoder_q4.onnx", 3 * 10**8),
    ("config.json", 10),
    ("processor_config.json", 10),
    ("tokenizer.json", 10),
]


def _model(files: list[tuple[str, int]], config: dict[str, Any], **fields: Any) -> Model:
    model = Model.from_dict({"repo": "org/gemma-4", "files": [{"name": n, "size": s} for n, s in files], **fields})
    return Model(**{**model.__dict__, "config": config})


def _caps() -> Caps:
    return Caps(ram_bytes=16 * 10**9, store=True, cpu_count=2)


def test_can_run_reads_both_encoders_beside_the_text_graphs() -> None:
    """A Gemma 4 repo is image (and audio) chat: embed_tokens, the decoder and both encoders, one precision."""
    model = _model(_GEMMA4_FILES, _GEMMA4_CONFIG, task="image-text-to-text")
    assert task_of(model, None) == IMAGE_TEXT_TO_TEXT
    verdict = plugin.can_run(model=model, caps=_caps(), request=Request.build())
    assert verdict.ok, verdict.reason
    choice = plugin.plan(model, _caps(), Request.build())[1]
    assert choice is not None
    assert [part.graph.name for part in choice.parts] == [
        "onnx/embed_tokens_q4.onnx",
        "onnx/decoder_model_merged_q4.onnx",
        "onnx/vision_encoder_q4.onnx",
        "onnx/audio_encoder_q4.onnx",
    ]
    assert plugin.can_run(model=model, caps=_caps(), request=Request.build(task="audio-text-to-text")).ok


def test_can_run_reads_a_gemma4_with_an_audio_encoder_alone_as_audio_chat() -> None:
    model = _model([f for f in _GEMMA4_FILES if "vision" not in f[0]], _GEMMA4_CONFIG)
    assert task_of(model, None) == AUDIO_TEXT_TO_TEXT
    assert plugin.can_run(model=model, caps=_caps(), request=Request.build()).ok
    verdict = plugin.can_run(model=model, caps=_caps(), request=Request.build(task="image-text-to-text"))
    assert not verdict.ok
    assert verdict.code == Refusal.MODEL


def test_can_run_refuses_images_for_a_bidirectional_vision_decoder() -> None:
    config = {
        **_GEMMA4_CONFIG,
        "text_config": {**_GEMMA4_CONFIG["text_config"], "use_bidirectional_attention": "vision"},
    }
    model = _model(_GEMMA4_FILES, config)
    assert task_of(model, None) == TEXT_GENERATION
    assert plugin.can_run(model=model, caps=_caps(), request=Request.build()).ok
    verdict = plugin.can_run(model=model, caps=_caps(), request=Request.build(task="image-text-to-text"))
    assert not verdict.ok
    assert verdict.code == Refusal.MODEL
    assert "use_bidirectional_attention" in verdict.reason


def test_can_run_needs_the_image_processors_settings() -> None:
    files = [f for f in _GEMMA4_FILES if f[0] != "processor_config.json"]
    verdict = plugin.can_run(model=_model(files, _GEMMA4_CONFIG), caps=_caps(), request=Request.build())
    assert not verdict.ok
    assert verdict.code == Refusal.FORMAT
