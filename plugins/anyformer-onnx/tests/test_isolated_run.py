"""The new inputs and outputs cross to an isolated worker (``isolate=True``, what ``anyformer serve`` uses).

Image bytes and audio arrays go in (to ``run``, and inside chat messages), depth arrays come out,
through the core's worker protocol; the answers equal the in-process ones.
"""

from __future__ import annotations

import io
import wave
from pathlib import Path
from typing import Any

import numpy as np

import anyformer


def test_image_bytes_in_and_arrays_out_cross_to_a_worker(dpt_dir: Path, reference: Any) -> None:
    name = reference(dpt_dir)["images"][0]
    data = (dpt_dir / name).read_bytes()
    with anyformer.load(str(dpt_dir), backend="onnx") as loaded:
        here = loaded.run(data)
    with anyformer.load(str(dpt_dir), backend="onnx", isolate=True) as loaded:
        assert loaded.worker_pid
        there = loaded.run(data)
    assert isinstance(there["predicted_depth"], np.ndarray)
    np.testing.assert_array_equal(there["predicted_depth"], here["predicted_depth"])
    np.testing.assert_array_equal(there["depth"], here["depth"])


def test_an_audio_dict_crosses_to_a_worker(whisper_dir: Path, reference: Any) -> None:
    clip = reference(whisper_dir)["clips"][0]
    with wave.open(io.BytesIO((whisper_dir / clip["clip"]).read_bytes())) as reader:
        samples = np.frombuffer(reader.readframes(reader.getnframes()), "<i2").astype(np.float32) / 32768
    with anyformer.load(str(whisper_dir), backend="onnx", isolate=True) as loaded:
        got = loaded.run({"raw": samples, "sampling_rate": 16000}, max_new_tokens=reference(whisper_dir)["tokens"])
    assert got == {"text": clip["auto"]["text"]}


def test_audio_blocks_in_messages_cross_to_a_worker(qwen2_audio_dir: Path, reference: Any) -> None:
    from tokenizers import Tokenizer

    reply = reference(qwen2_audio_dir)["replies"][0]
    with wave.open(str(qwen2_audio_dir / reply["clip"])) as reader:
        samples = np.frombuffer(reader.readframes(reader.getnframes()), "<i2").astype(np.float32) / 32768
    clips = [{"raw": samples, "sampling_rate": 16000}, (qwen2_audio_dir / reply["clip"]).read_bytes()]
    want = Tokenizer.from_file(str(qwen2_audio_dir / "tokenizer.json")).decode(
        [t for t in reply["reply_ids"] if t != 2], skip_special_tokens=False
    )
    with anyformer.load(str(qwen2_audio_dir), backend="onnx", isolate=True) as loaded:
        assert loaded.worker_pid and loaded.audio_input
        for clip in clips:
            blocks = [{"type": "audio", "audio": clip}, {"type": "text", "text": reply["question"]}]
            got = loaded.complete([{"role": "user", "content": blocks}], max_new_tokens=len(reply["reply_ids"]))
            assert got.text == want
            assert got.prompt_tokens == len(reply["prompt_ids"])
