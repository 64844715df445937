"""automatic-speech-recognition through ``loaded.run``, against torch on the same weights.

The fixture recorded, for seeded WAV clips, transformers' WhisperFeatureExtractor features and
torch's greedy decode (``generate`` with the same suppressed tokens) of a tiny random Whisper, with
the language it detects and with French forced, before exporting it in optimum's split layout.
Here the backend decodes the same WAV files with its own log-mel front end and loop: the token ids
must be identical, and so the text.
"""

from __future__ import annotations

import io
import json
import shutil
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx_exports import wav_bytes

import anyformer
from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.media.log_mel import LogMel


def test_transcriptions_equal_torch(whisper_dir: Path, reference: Any) -> None:
    expected = reference(whisper_dir)
    tokens = expected["tokens"]
    clips = expected["clips"]
    assert len({clip["detected"] for clip in clips}) > 1, "the clips should be detected as different languages"
    with anyformer.load(str(whisper_dir), backend="onnx") as loaded:
        assert loaded.task == "automatic-speech-recognition"
        for clip in clips:
            path = str(whisper_dir / clip["clip"])
            auto = loaded.run(path, max_new_tokens=tokens, return_token_ids=True)
            assert auto == {"token_ids": clip["auto"]["ids"], "text": clip["auto"]["text"]}
            french = loaded.run(path, language="fr", max_new_tokens=tokens, return_token_ids=True)
            assert french == {"token_ids": clip["fr"]["ids"], "text": clip["fr"]["text"]}
            assert auto["token_ids"] != french["token_ids"] or clip["detected"] == clip["fr"]["prompt"][1]
        # The same clip as bytes, as a pipeline-style dict and in a list gives the same reply.
        first = clips[0]
        data = (whisper_dir / first["clip"]).read_bytes()
        with wave.open(io.BytesIO(data)) as reader:
            samples = np.frombuffer(reader.readframes(reader.getnframes()), "<i2").astype(np.float32) / 32768
        assert loaded.run(data, max_new_tokens=tokens) == {"text": first["auto"]["text"]}
        as_dict = {"raw": samples, "sampling_rate": 16000}
        assert loaded.run([as_dict], max_new_tokens=tokens) == [{"text": first["auto"]["text"]}]
        # A plain list of numbers is one clip's samples, not a list of clips.
        assert loaded.run([float(x) for x in samples], max_new_tokens=tokens) == {"text": first["auto"]["text"]}


def test_the_generation_config_suppressions_are_applied(whisper_dir: Path, reference: Any, tmp_path: Path) -> None:
    expected = reference(whisper_dir)["clips"][0]
    copy = tmp_path / "whisper"
    shutil.copytree(whisper_dir, copy)
    generation = json.loads((copy / "generation_config.json").read_text())
    suppressed = set(generation["suppress_tokens"]) | set(generation["begin_suppress_tokens"][:1])
    assert not suppressed & set(expected["fr"]["ids"])
    generation["suppress_tokens"], generation["begin_suppress_tokens"] = [], []
    (copy / "generation_config.json").write_text(json.dumps(generation))
    with anyformer.load(str(copy), backend="onnx") as loaded:
        free = loaded.run(str(copy / expected["clip"]), language="fr", max_new_tokens=20, return_token_ids=True)
    assert free["token_ids"] != expected["fr"]["ids"]


@pytest.mark.parametrize("length", [1, 16000 * 2 + 7, 480000])
def test_log_mel_equals_the_whisper_feature_extractor(length: int) -> None:
    import warnings

    from transformers import WhisperFeatureExtractor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        extractor = WhisperFeatureExtractor(feature_size=80)
    ours = LogMel.from_config(json.loads(extractor.to_json_string()), "test")
    t = np.arange(length) / 16000
    audio = (0.3 * np.sin(2 * np.pi * 330 * t) + 0.1 * np.random.default_rng(length).normal(size=length)).astype(
        np.float32
    )
    want = extractor(audio, sampling_rate=16000, return_tensors="np").input_features[0]
    got = ours(audio)
    assert got.shape == want.shape == (80, 3000)
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.fixture(scope="module")
def whisper(whisper_dir: Path) -> Iterator[Any]:
    """The tiny Whisper loaded once for the refusal cases."""
    with anyformer.load(str(whisper_dir), backend="onnx") as loaded:
        yield loaded


_TONE = (0.2 * np.sin(np.arange(8000) / 5)).astype(np.float32)


@pytest.mark.parametrize(
    ("bad", "options", "words"),
    [
        (wav_bytes(_TONE, rate=8000), {}, "8000 Hz"),
        ({"raw": _TONE, "sampling_rate": 44100}, {}, "44100 Hz"),
        ({"raw": _TONE}, {}, "sampling_rate"),
        (b"ID3\x04\x00 an mp3 file", {}, "not a WAV"),
        (wav_bytes(_TONE)[:30], {}, "PCM WAV"),
        (np.zeros(16000 * 31, dtype=np.float32), {"max_duration_s": 30}, "31.0 s"),
        (_TONE, {"max_duration_s": -1}, "max_duration_s"),
        (_TONE, {"max_duration_s": float("nan")}, "max_duration_s"),
        (_TONE, {"max_duration_s": 10**7}, "max_duration_s"),
        (_TONE, {"chunk_length_s": 40}, "chunk_length_s"),
        (_TONE, {"chunk_length_s": "30"}, "chunk_length_s"),
        (_TONE, {"stride_length_s": 15}, "stride_length_s"),
        (_TONE, {"stride_length_s": [1, 2, 3]}, "stride_length_s"),
        (_TONE, {"return_timestamps": "word"}, "word"),
        (np.array([0.1, -np.inf], dtype=np.float32), {}, "infinite"),
        (np.array([0.1, np.nan], dtype=np.float32), {}, "NaN"),
        (np.zeros(0, dtype=np.float32), {}, "no samples"),
        (np.zeros((2, 800), dtype=np.float32), {}, "mono"),
        (np.zeros(800, dtype=np.int32), {}, "int32"),
        ("/no/such/clip.wav", {}, "cannot read"),
        (_TONE, {"language": "xx"}, "'xx'"),
        (_TONE, {"task": "summarize"}, "task"),
        (_TONE, {"return_timestamps": True}, "timestamps"),
        (_TONE, {"max_new_tokens": 0}, "max_new_tokens"),
        (_TONE, {"beams": 4}, "beams"),
    ],
)
def test_bad_audio_and_options_are_bad_request(whisper: Any, bad: Any, options: dict[str, Any], words: str) -> None:
    with pytest.raises(AnyformerError) as caught:
        whisper.run(bad, **options)
    assert caught.value.code == ErrorCode.BAD_REQUEST
    assert words in str(caught.value)


def test_wav_forms_decode_to_the_same_samples() -> None:
    from anyformer_onnx.media.audio_input import decode_wav

    tone = _TONE[:800]
    for width in (1, 2, 3, 4):
        for channels in (1, 2):
            if width == 3:  # numpy has no 24-bit type: pack by hand
                ints = (tone * (2**23 - 1)).astype("<i4")
                frames = np.repeat(ints, channels).view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
                buffer = io.BytesIO()
                with wave.open(buffer, "wb") as writer:
                    writer.setnchannels(channels)
                    writer.setsampwidth(3)
                    writer.setframerate(16000)
                    writer.writeframes(frames)
                data = buffer.getvalue()
            elif width == 1:
                buffer = io.BytesIO()
                with wave.open(buffer, "wb") as writer:
                    writer.setnchannels(channels)
                    writer.setsampwidth(1)
                    writer.setframerate(16000)
                    writer.writeframes((np.repeat(tone, channels) * 127 + 128).astype(np.uint8).tobytes())
                data = buffer.getvalue()
            else:
                data = wav_bytes(tone, width=width, channels=channels)
            samples, rate = decode_wav(data)
            assert rate == 16000 and samples.shape == tone.shape
            np.testing.assert_allclose(samples, tone, atol=2 / 2 ** (8 * width - 1) + 1e-6)
