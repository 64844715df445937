"""Chat with audio on a multimodal export with one graph per module (Qwen2-Audio), against torch on the same weights.

The fixture built a tiny random ``Qwen2AudioForConditionalGeneration`` (a 2-layer Whisper-style
audio tower with its projector, a 2-layer Qwen2) over a character vocabulary with the processor's
audio tokens, and recorded, for questions about seeded 16 kHz clips and one without audio, the
prompt ``Qwen2AudioProcessor`` builds (its own log-mel features and audio token expansion, the
model's own chat template) and torch's greedy reply, plus the decoder's input embeddings for the
first clip; then it exported ``audio_encoder``, ``embed_tokens`` and ``decoder_model_merged``.
Here the backend builds the prompt from messages with audio blocks through its own front end and
graphs: the prompt ids must be the processor's, the embeddings torch's, the replies identical.
"""

from __future__ import annotations

import json
import shutil
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx_exports import wav_bytes
from teacher_forcing import refusal

import anyformer
from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.media.audio_encoder import real_frames
from anyformer_onnx.media.log_mel import LogMel


def _messages(folder: Path, reply: dict[str, Any], audio: Any = None) -> list[dict[str, Any]]:
    if reply["clip"] is None:
        return [{"role": "user", "content": reply["question"]}]
    clip = str(folder / reply["clip"]) if audio is None else audio
    blocks = [{"type": "audio", "audio": clip}, {"type": "text", "text": reply["question"]}]
    return [{"role": "user", "content": blocks}]


def _audio_token(folder: Path) -> int:
    token: int = json.loads((folder / "config.json").read_text())["audio_token_index"]
    return token


def _samples(path: Path) -> np.ndarray:
    with wave.open(str(path)) as reader:
        return np.frombuffer(reader.readframes(reader.getnframes()), "<i2").astype(np.float32) / 32768


@pytest.fixture(scope="module")
def qwen2_audio(qwen2_audio_dir: Path) -> Iterator[Any]:
    """The tiny Qwen2-Audio loaded once."""
    with anyformer.load(str(qwen2_audio_dir), backend="onnx") as loaded:
        yield loaded


def test_greedy_replies_with_audio_equal_torch(qwen2_audio: Any, qwen2_audio_dir: Path, reference: Any) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(qwen2_audio_dir / "tokenizer.json"))
    assert qwen2_audio.task == "audio-text-to-text"
    assert qwen2_audio.audio_input
    for reply in reference(qwen2_audio_dir)["replies"]:
        want = [t for t in reply["reply_ids"] if t != 2]
        chunks = list(
            qwen2_audio.generate(
                _messages(qwen2_audio_dir, reply), max_new_tokens=len(reply["reply_ids"]), temperature=0
            )
        )
        assert "".join(c.delta for c in chunks) == tokenizer.decode(want, skip_special_tokens=False), reply
        assert chunks[-1].tokens == len(want)
        # The prompt counts the audio token once per row of the audio encoder, as the processor expands it.
        assert chunks[-1].prompt_tokens == len(reply["prompt_ids"])


def test_the_prompt_is_the_processors_and_its_embeddings_torchs(
    qwen2_audio: Any, qwen2_audio_dir: Path, reference: Any
) -> None:
    reply = reference(qwen2_audio_dir)["replies"][0]
    ids, embeds = qwen2_audio.handle.media.prompt(_messages(qwen2_audio_dir, reply), False)
    assert ids == reply["prompt_ids"]
    assert ids.count(_audio_token(qwen2_audio_dir)) == reply["audio_tokens"] == 50  # 2 s: 200 frames, 50 rows
    want = np.load(qwen2_audio_dir / "prompt_embeds.npy")
    assert embeds is not None and embeds.shape == (1, *want.shape)
    np.testing.assert_allclose(embeds[0], want, atol=2e-5)


def test_every_audio_form_gives_the_same_prompt(qwen2_audio: Any, qwen2_audio_dir: Path, reference: Any) -> None:
    reply = reference(qwen2_audio_dir)["replies"][1]
    path = qwen2_audio_dir / reply["clip"]
    samples = _samples(path)
    forms = [
        path.read_bytes(),
        path,
        samples,
        (samples * 32768).astype(np.int16),
        {"raw": samples, "sampling_rate": 16000},
        {"array": samples[None, :], "sampling_rate": 16000},
    ]
    base_ids, base = qwen2_audio.handle.media.prompt(_messages(qwen2_audio_dir, reply), False)
    assert base_ids == reply["prompt_ids"]
    for form in forms:
        ids, embeds = qwen2_audio.handle.media.prompt(_messages(qwen2_audio_dir, reply, form), False)
        assert ids == base_ids
        np.testing.assert_allclose(embeds, base, atol=1e-6)


def test_two_clips_in_one_conversation_each_take_their_rows(qwen2_audio: Any, qwen2_audio_dir: Path) -> None:
    first, second = (_samples(qwen2_audio_dir / f"clip{i}.wav") for i in (0, 1))
    messages = [
        {"role": "user", "content": [{"type": "audio", "audio": first}, {"type": "text", "text": "and"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "audio", "audio": second}, {"type": "text", "text": "?"}]},
    ]
    ids, embeds = qwen2_audio.handle.media.prompt(messages, False)
    assert embeds is not None
    token = _audio_token(qwen2_audio_dir)
    starts = [i for i, t in enumerate(ids) if t == token and ids[i - 1] != token]
    assert ids.count(token) == 50 + 112 and len(starts) == 2
    alone = [qwen2_audio.handle.media.kinds["audio"].encode(clip, "clip") for clip in (first, second)]
    np.testing.assert_allclose(embeds[0, starts[0] : starts[0] + 50], alone[0], atol=1e-6)
    np.testing.assert_allclose(embeds[0, starts[1] : starts[1] + 112], alone[1], atol=1e-6)


def test_a_preprocessor_config_and_the_processors_default_wrappers_do_as_well(
    qwen2_audio_dir: Path, reference: Any, tmp_path: Path
) -> None:
    # Older repos keep the feature extractor in preprocessor_config.json and have no processor_config.json:
    # the audio token is then wrapped in Qwen2AudioProcessor's default <|audio_bos|> and <|audio_eos|>.
    copy = tmp_path / "older"
    shutil.copytree(qwen2_audio_dir, copy)
    processor = json.loads((copy / "processor_config.json").read_text())
    (copy / "preprocessor_config.json").write_text(json.dumps(processor["feature_extractor"]))
    (copy / "processor_config.json").unlink()
    reply = reference(qwen2_audio_dir)["replies"][0]
    with anyformer.load(str(copy), backend="onnx") as loaded:
        ids, _ = loaded.handle.media.prompt(_messages(copy, reply), False)
    assert ids == reply["prompt_ids"]


@pytest.mark.parametrize("length", [1, 159, 160, 161, 16000 * 2 + 7, 16000 * 12, 480000])
def test_the_front_end_equals_the_models_feature_extractor(qwen2_audio_dir: Path, length: int) -> None:
    import warnings

    from transformers import WhisperFeatureExtractor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        extractor = WhisperFeatureExtractor.from_pretrained(str(qwen2_audio_dir))
    settings = json.loads((qwen2_audio_dir / "processor_config.json").read_text())["feature_extractor"]
    ours = LogMel.from_config(settings, "test")
    t = np.arange(length) / 16000
    audio = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.random.default_rng(length).normal(size=length)).astype(
        np.float32
    )
    # What Qwen2AudioProcessor asks of it: padded to the window, with the mask of real frames.
    want = extractor(audio, sampling_rate=16000, return_attention_mask=True, padding="max_length", return_tensors="np")
    got = ours(audio)
    assert got.shape == want.input_features[0].shape == (128, 3000)
    np.testing.assert_allclose(got, want.input_features[0], atol=1e-4)
    assert real_frames(ours, length) == int(want.attention_mask.sum())


_TONE = (0.2 * np.sin(np.arange(8000) / 5)).astype(np.float32)


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (wav_bytes(_TONE, rate=8000), "8000 Hz"),
        ({"raw": _TONE, "sampling_rate": 44100}, "44100 Hz"),
        (np.zeros(16000 * 31, dtype=np.float32), "31.0 s; at most 30 s fit the model's audio window"),
        (np.array([0.1, np.nan] * 800, dtype=np.float32), "NaN"),
        (np.array([0.1, np.inf] * 800, dtype=np.float32), "infinite"),
        (b"ID3\x04\x00 an mp3 file", "not a WAV"),
        (b"\x89PNG\r\n\x1a\n not audio", "not a WAV"),
        (wav_bytes(_TONE)[:30], "PCM WAV"),
        (np.zeros((2, 800), dtype=np.float32), "mono"),
        (np.zeros(800, dtype=np.int32), "int32"),
        (np.zeros(1, dtype=np.float32), "too short"),
        ("/no/such/clip.wav", "cannot read"),
    ],
    ids=lambda value: repr(value)[:30],
)
def test_bad_audio_is_bad_request(qwen2_audio: Any, bad: Any, words: str) -> None:
    message = str(refusal(qwen2_audio, [{"type": "audio", "audio": bad}, {"type": "text", "text": "?"}]))
    assert words in message
    assert "audio 0" in message or "audio block" in message or "messages[0]" in message


def test_images_typed_audio_tokens_and_too_many_clips_are_bad_request(qwen2_audio: Any) -> None:
    cases = [
        ([{"type": "image", "image": b"\x89PNG\r\n\x1a\n"}, {"type": "text", "text": "?"}], "no image encoder"),
        ("what is <|AUDIO|> here?", "audio tokens"),
        ([{"type": "audio", "audio": _TONE}] * 17, "at most 16"),
    ]
    for content, words in cases:
        assert words in str(refusal(qwen2_audio, content))


def test_models_without_an_audio_encoder_refuse_audio(llava_dir: Path, tiny_llama_dir: Path) -> None:
    messages = [{"role": "user", "content": [{"type": "audio", "audio": _TONE}, {"type": "text", "text": "?"}]}]
    for folder in (llava_dir, tiny_llama_dir):
        with anyformer.load(str(folder), backend="onnx") as loaded:
            assert not loaded.audio_input
            with pytest.raises(AnyformerError) as caught:
                list(loaded.generate(messages, max_new_tokens=2, temperature=0))
            assert caught.value.code == ErrorCode.BAD_REQUEST
            assert "audio" in str(caught.value)


def test_a_repo_with_both_encoders_splices_each_blocks_rows_in_order(
    qwen2_audio_dir: Path, llava_dir: Path, tmp_path: Path
) -> None:
    # Gemma 4's layout: embed_tokens, decoder_model_merged, vision_encoder and audio_encoder side by side.
    # The tiny LLaVA's vision encoder gives rows of the tiny Qwen2-Audio's width (64); its image token is
    # stood in for by <unk>, a special token no text encodes to.
    both = tmp_path / "both"
    shutil.copytree(qwen2_audio_dir, both)
    shutil.copy(llava_dir / "onnx" / "vision_encoder.onnx", both / "onnx")
    shutil.copy(llava_dir / "preprocessor_config.json", both)
    config = json.loads((both / "config.json").read_text())
    (both / "config.json").write_text(json.dumps({**config, "image_token_index": 0}))
    image = str(llava_dir / json.loads((llava_dir / "reference.json").read_text())["replies"][0]["image"])
    clip = _samples(qwen2_audio_dir / "clip0.wav")
    content = [
        {"type": "image", "image": image},
        {"type": "audio", "audio": clip},
        {"type": "text", "text": "and"},
        {"type": "image", "image": image},
    ]
    with anyformer.load(str(both), backend="onnx") as loaded:
        assert loaded.task == "image-text-to-text" and loaded.audio_input
        media = loaded.handle.media
        ids, embeds = media.prompt([{"role": "user", "content": content}], False)
        rows = {kind: media.kinds[kind].encode(value, kind) for kind, value in (("image", image), ("audio", clip))}
        assert rows["image"].shape[0] == 16 and rows["audio"].shape[0] == 50
        token = _audio_token(qwen2_audio_dir)
        runs = []  # (kind, start) of each run of media tokens, in prompt order
        for i, t in enumerate(ids):
            if t in (0, token) and (i == 0 or ids[i - 1] != t):
                runs.append(("image" if t == 0 else "audio", i))
        assert [kind for kind, _ in runs] == ["image", "audio", "image"]
        for kind, start in runs:
            np.testing.assert_allclose(embeds[0, start : start + rows[kind].shape[0]], rows[kind], atol=1e-6)
        reply = loaded.complete([{"role": "user", "content": content}], max_new_tokens=4)
        assert reply.prompt_tokens == len(ids) and reply.tokens >= 1
