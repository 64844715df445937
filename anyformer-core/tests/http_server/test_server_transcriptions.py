"""``POST /v1/audio/transcriptions`` on the ONNX backend's tiny Whisper, through the openai client, against
the Python API's transcription of the same clip; and the PyAV decoder at other rates and formats."""

from __future__ import annotations

import io
import sys
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anyformer

from .conftest import REPO_ROOT
from .server_support import plain_request, serve_in_thread

av = pytest.importorskip("av")
pytest.importorskip("python_multipart")

from anyformer._audio_decode import container_of, decode_audio  # noqa: E402
from anyformer.server._transcriptions import to_srt, to_vtt  # noqa: E402

#: Tokens each transcription runs to: the tiny random Whisper rarely ends on its own.
TOKENS = 20


def _onnx_exports() -> Any:
    pytest.importorskip("anyformer_onnx")
    sys.path.insert(0, str(REPO_ROOT / "plugins" / "anyformer-onnx" / "tests"))
    try:
        import onnx_exports
    finally:
        sys.path.pop(0)
    return onnx_exports


@pytest.fixture(scope="module")
def whisper_dir() -> Path:
    """The ONNX plugin's tiny random Whisper (optimum's split export), with seeded WAV clips."""
    return Path(_onnx_exports().tiny_whisper())


@pytest.fixture(scope="module")
def timestamps_dir() -> Path:
    """The tiny random Whisper with timestamp tokens."""
    return Path(_onnx_exports().tiny_whisper_timestamps())


@pytest.fixture(scope="module")
def speech_server(whisper_dir: Path, timestamps_dir: Path) -> Iterator[str]:
    from anyformer.server import ModelPool, create_app

    pool = ModelPool(isolate=False)
    with serve_in_thread(create_app(pool, models=[str(whisper_dir), str(timestamps_dir)])) as url:
        yield url


def encode(samples: np.ndarray, rate: int, container: str, codec: str) -> bytes:
    """``samples`` (mono float32 at ``rate``) written by PyAV as ``container`` with ``codec``."""
    out = io.BytesIO()
    with av.open(out, mode="w", format=container) as file:
        stream = file.add_stream(codec, rate=rate, layout="mono")
        frame_size = stream.codec_context.frame_size or 1024
        layout_format = stream.codec_context.format.name
        for start in range(0, samples.size, frame_size):
            piece = samples[start : start + frame_size]
            frame = av.AudioFrame.from_ndarray(piece.reshape(1, -1).astype(np.float32), format="flt", layout="mono")
            frame.sample_rate = rate
            resampler = av.AudioResampler(format=layout_format, layout="mono", rate=rate)
            for converted in resampler.resample(frame):
                for packet in stream.encode(converted):
                    file.mux(packet)
        for packet in stream.encode(None):
            file.mux(packet)
    return out.getvalue()


def wav_of(samples: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def sine(freq: float, rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    return float(np.fft.rfftfreq(samples.size, 1 / rate)[int(np.argmax(spectrum))])


# ---- the decoder ------------------------------------------------------------------------------------


def test_a_16_khz_wav_decodes_to_the_samples_the_python_api_reads(whisper_dir: Path) -> None:
    data = (whisper_dir / "clip0.wav").read_bytes()
    with wave.open(io.BytesIO(data)) as reader:
        expected = np.frombuffer(reader.readframes(reader.getnframes()), "<i2").astype(np.float32) / 32768
    np.testing.assert_array_equal(decode_audio(data), expected)


def test_a_48_khz_wav_is_resampled_to_the_same_signal_at_16_khz() -> None:
    decoded = decode_audio(wav_of(sine(440, 48_000, 1.0), 48_000))
    reference = sine(440, 16_000, 1.0)
    assert abs(decoded.size - reference.size) <= 16
    middle = slice(800, 15_000)  # the resampler's filter settles within its first and last few ms
    assert np.max(np.abs(decoded[middle] - reference[middle])) < 0.01


@pytest.mark.parametrize(
    ("container", "codec", "rate"),
    [
        ("mp3", "mp3", 44_100),
        ("ogg", "libopus", 48_000),
        ("webm", "libopus", 48_000),
        ("ipod", "aac", 22_050),
        ("flac", "flac", 8_000),
    ],
)
def test_compressed_audio_at_any_rate_decodes_to_its_tone(container: str, codec: str, rate: int) -> None:
    data = encode(sine(440, rate, 1.5), rate, container, codec)
    decoded = decode_audio(data)
    assert 1.45 * 16_000 <= decoded.size <= 1.6 * 16_000, decoded.size / 16_000
    assert dominant_hz(decoded, 16_000) == pytest.approx(440, abs=2)


@pytest.mark.parametrize(
    "data",
    [b"not audio at all", b"#EXTM3U\n#EXT-X-VERSION:3\nhttp://127.0.0.1:9/x.ts\n", b"RIFF\x00\x00\x00\x00WAVEjunk"],
)
def test_what_is_not_decodable_audio_is_refused(data: bytes) -> None:
    with pytest.raises(anyformer.AnyformerError) as caught:
        decode_audio(data)
    assert caught.value.code.value == "BAD_REQUEST"


def test_playlists_are_never_handed_to_ffmpeg() -> None:
    assert container_of(b"#EXTM3U\nfile.ts") is None and container_of(b"ffconcat version 1.0") is None


def test_subtitles_are_written_as_srt_and_vtt() -> None:
    segments = [{"start": 0.0, "end": 2.5, "text": " Hello"}, {"start": 2.5, "end": 3661.042, "text": " world"}]
    assert to_srt(segments) == "1\n00:00:00,000 --> 00:00:02,500\nHello\n\n2\n00:00:02,500 --> 01:01:01,042\nworld\n"
    assert (
        to_vtt(segments) == "WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello\n\n00:00:02.500 --> 01:01:01.042\nworld\n"
    )


# ---- over HTTP ----------------------------------------------------------------------------------------


def test_the_openai_client_gets_the_python_apis_text(speech_server: str, whisper_dir: Path) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{speech_server}/v1", api_key="none")
    with anyformer.load(str(whisper_dir), backend="onnx") as loaded:
        for clip in ("clip0.wav", "clip1.wav"):
            expected = loaded.run(str(whisper_dir / clip))["text"]
            with open(whisper_dir / clip, "rb") as file:
                answer = client.audio.transcriptions.create(model=str(whisper_dir), file=file)
            assert answer.text == expected
            assert expected.strip(), "the tiny Whisper should say something"
        text = client.audio.transcriptions.create(
            model=str(whisper_dir), file=(whisper_dir / "clip0.wav").read_bytes(), response_format="text"
        )
        assert text == loaded.run(str(whisper_dir / "clip0.wav"))["text"]


def test_an_mp3_at_44_1_khz_is_transcribed(speech_server: str, whisper_dir: Path) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{speech_server}/v1", api_key="none")
    answer = client.audio.transcriptions.create(
        model=str(whisper_dir), file=("tone.mp3", encode(sine(523, 44_100, 2.0), 44_100, "mp3", "mp3"), "audio/mpeg")
    )
    assert isinstance(answer.text, str) and answer.text.strip()


def test_timed_formats_carry_the_models_segments(speech_server: str, timestamps_dir: Path) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{speech_server}/v1", api_key="none")
    samples = sine(300, 16_000, 6.0)
    data = wav_of(samples, 16_000)
    with anyformer.load(str(timestamps_dir), backend="onnx") as loaded:
        expected = loaded.run({"raw": decode_audio(data), "sampling_rate": 16_000}, return_timestamps=True)
    assert expected["chunks"], "the timestamp model should give segments"
    verbose = client.audio.transcriptions.create(model=str(timestamps_dir), file=data, response_format="verbose_json")
    assert verbose.text == expected["text"] and verbose.duration == pytest.approx(6.0)
    got = [(s.start, s.end, s.text) for s in verbose.segments]
    want = [
        (c["timestamp"][0], c["timestamp"][1] if c["timestamp"][1] is not None else 6.0, c["text"])
        for c in expected["chunks"]
    ]
    assert got == want
    srt = client.audio.transcriptions.create(model=str(timestamps_dir), file=data, response_format="srt")
    segments = [{"start": s, "end": e, "text": t} for s, e, t in want]
    assert srt == to_srt(segments)
    vtt = client.audio.transcriptions.create(model=str(timestamps_dir), file=data, response_format="vtt")
    assert vtt == to_vtt(segments)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": "Say it in French"}, "prompt"),
        ({"temperature": "0.4"}, "temperature"),
        ({"response_format": "xml"}, "response_format"),
        ({"timestamp_granularities[]": "word"}, "timestamp_granularities[]"),
        ({"chunking_strategy": "auto"}, "chunking_strategy"),
        ({"stream": "true"}, "stream"),
    ],
)
def test_fields_that_would_change_the_reply_but_are_not_honoured_are_refused(
    speech_server: str, whisper_dir: Path, fields: dict[str, str], param: str
) -> None:
    reply = _multipart(speech_server, {"model": str(whisper_dir), **fields}, (whisper_dir / "clip0.wav").read_bytes())
    assert reply.status == 400 and reply.json()["error"]["param"] == param, reply.body


def test_a_file_that_is_not_audio_is_400(speech_server: str, whisper_dir: Path) -> None:
    reply = _multipart(speech_server, {"model": str(whisper_dir)}, b"%PDF-1.7 not a clip")
    assert reply.status == 400 and "not audio" in reply.json()["error"]["message"]
    missing = _multipart(speech_server, {"model": str(whisper_dir)}, None)
    assert missing.status == 400 and missing.json()["error"]["param"] == "file"


def _multipart(url: str, fields: dict[str, str], file: bytes | None) -> Any:
    boundary = "anyformer-test-boundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    if file is not None:
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.bin"\r\n'
        parts.append(head.encode() + b"Content-Type: application/octet-stream\r\n\r\n" + file + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    return plain_request("POST", f"{url}/v1/audio/transcriptions", body, headers)


def test_a_foreign_pages_upload_form_is_still_refused(speech_server: str, whisper_dir: Path) -> None:
    boundary = "b"
    body = f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{whisper_dir}\r\n--{boundary}--\r\n'
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", "Origin": "http://evil.example"}
    reply = plain_request("POST", f"{speech_server}/v1/audio/transcriptions", body.encode(), headers)
    assert reply.status == 403
    elsewhere = plain_request(
        "POST", f"{speech_server}/v1/chat/completions", body.encode(), {"Content-Type": headers["Content-Type"]}
    )
    assert elsewhere.status == 415, "only the upload routes take forms"


def test_anyformer_run_transcribes_an_audio_file(whisper_dir: Path, capsys: Any) -> None:
    import json

    from anyformer.cli._main import main

    clip = str(whisper_dir / "clip1.wav")
    with anyformer.load(str(whisper_dir), backend="onnx") as loaded:
        expected = loaded.run(clip)["text"]
    assert main(["run", str(whisper_dir), clip, "--in-process", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"text": expected}
    assert main(["run", str(whisper_dir), "hello there", "--in-process"]) == 2
    assert "give the file" in capsys.readouterr().err
