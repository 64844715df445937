"""Long-form audio (30 s chunks with 5 s strides) and segment timestamps, against transformers' pipeline.

The fixture (``tiny_whisper_timestamps``) recorded what ``pipeline("automatic-speech-recognition",
chunk_length_s=30)`` returns on seeded clips of 52 s, 4.5 s and 71 s for a tiny random Whisper whose
vocabulary has Whisper's 1501 timestamp tokens: greedy decoding (``num_beams=1``), 24 new tokens a
reply, with the language detected per chunk or French forced, with and without
``return_timestamps=True``. The backend must return the same text and the same segments with the
same times, exactly: decoding is greedy, so the replies are deterministic, and onnxruntime's logits
agree with torch's closely enough that no argmax flips on these clips (a flip would change the tokens
and fail the test, not shift a time slightly). The random model's text is byte soup, but its
timestamps (pairs, segments restarting inside a window, timestamps inside the strides) exercise
every path of the pipeline's merge.

The pure pieces are also checked against transformers' own functions on seeded random inputs: the
chunk spans against ``chunk_iter``, the overlap merge against ``_find_longest_common_sequence``, the
window merge against ``_decode_asr`` and the timestamp rules against ``WhisperTimeStampLogitsProcessor``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anyformer
from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.speech.longform import chunk_spans, longest_common_merge, merge_windows, timestamp_rules

_MODES = {
    "chunked": {},
    "chunked_timestamps": {"return_timestamps": True},
    "chunked_fr": {"language": "fr"},
    "timestamps": {"return_timestamps": True},
}


@pytest.fixture(scope="module")
def long_whisper(whisper_timestamps_dir: Path) -> Iterator[Any]:
    with anyformer.load(str(whisper_timestamps_dir), backend="onnx") as loaded:
        yield loaded


def _as_recorded(result: dict[str, Any]) -> dict[str, Any]:
    return {"text": result["text"], "chunks": [[c["text"], *c["timestamp"]] for c in result.get("chunks", [])]}


# Clip 1 (4.5 s) is one window; its unchunked pipeline call ("timestamps") is recorded too.
@pytest.mark.parametrize(
    ("clip", "mode"), [(clip, mode) for clip in (0, 1, 2) for mode in _MODES if mode != "timestamps" or clip == 1]
)
def test_long_form_and_timestamps_equal_the_pipeline(
    long_whisper: Any, whisper_timestamps_dir: Path, reference: Any, clip: int, mode: str
) -> None:
    expected = reference(whisper_timestamps_dir)
    record = expected["clips"][clip]
    audio = np.load(whisper_timestamps_dir / record["clip"])
    got = long_whisper.run(audio, max_new_tokens=expected["tokens"], **_MODES[mode])
    assert _as_recorded(got) == record[mode]
    if "timestamps" in mode:
        assert len(got["chunks"]) > 2 and all(isinstance(c["timestamp"], tuple) for c in got["chunks"])
    else:
        assert "chunks" not in got


def test_the_references_exercise_long_form(whisper_timestamps_dir: Path, reference: Any) -> None:
    """The recorded clips are long enough to be chunked and their replies hold timestamps past one window."""
    clips = reference(whisper_timestamps_dir)["clips"]
    lengths = [np.load(whisper_timestamps_dir / c["clip"], mmap_mode="r").size / 16000 for c in clips]
    assert sum(seconds > 30 for seconds in lengths) == 2
    assert max(c["chunked_timestamps"]["chunks"][-1][2] for c in clips) > 60
    assert all(c["chunked"]["text"] != c["chunked_fr"]["text"] for c in clips)


def test_token_ids_of_a_long_clip_are_the_merged_text_tokens(long_whisper: Any, whisper_timestamps_dir: Path) -> None:
    audio = np.load(whisper_timestamps_dir / "long0.npy")
    got = long_whisper.run(audio, max_new_tokens=24, language="fr", return_token_ids=True)
    assert got["token_ids"] and all(t < 256 for t in got["token_ids"])
    # A shorter chunk with its own strides is accepted and changes the windows.
    other = long_whisper.run(audio, max_new_tokens=24, language="fr", chunk_length_s=20, stride_length_s=[4, 2])
    assert other["text"] != got["text"]


def test_a_clip_over_the_bound_is_refused_before_decoding(long_whisper: Any) -> None:
    with pytest.raises(AnyformerError) as caught:
        long_whisper.run(np.zeros(16000 * 61, dtype=np.float32), max_duration_s=60)
    assert caught.value.code == ErrorCode.BAD_REQUEST
    assert "61.0 s" in str(caught.value) and "60 s" in str(caught.value)


@pytest.mark.parametrize("total", [1, 79_999, 80_000, 480_000, 480_001, 800_000, 832_000, 1_136_000, 1_440_123])
@pytest.mark.parametrize(("chunk", "left", "right"), [(480_000, 80_000, 80_000), (320_000, 64_000, 32_000)])
def test_chunk_spans_equal_the_pipelines_chunk_iter(total: int, chunk: int, left: int, right: int) -> None:
    from transformers.pipelines.automatic_speech_recognition import chunk_iter

    class Features:
        sampling_rate = 16000

        def __call__(self, chunk: np.ndarray, **_: Any) -> dict[str, Any]:
            return {"size": chunk.shape[0]}

    audio = np.zeros(total, dtype=np.float32)
    theirs = [(item["size"], item["stride"]) for item in chunk_iter(audio, Features(), chunk, left, right)]
    ours = [(end - start, (end - start, sl, sr)) for start, end, sl, sr in chunk_spans(total, chunk, left, right)]
    assert ours == theirs


def test_longest_common_merge_equals_transformers() -> None:
    from transformers.models.whisper.tokenization_whisper import _find_longest_common_sequence

    generator = np.random.default_rng(0)
    for _ in range(300):
        base = generator.integers(0, 6, size=int(generator.integers(0, 30))).tolist()
        runs = []
        for _ in range(int(generator.integers(1, 4))):
            start = int(generator.integers(0, len(base) + 1))
            piece = base[start : start + int(generator.integers(0, 15))]
            if generator.random() < 0.3 and piece:
                piece[int(generator.integers(0, len(piece)))] = int(generator.integers(0, 6))
            runs.append(piece)
        want, _ = _find_longest_common_sequence(runs, [])
        assert longest_common_merge(runs) == [int(t) for t in want]


def _random_reply(generator: np.random.Generator, timestamp_begin: int, text: list[int]) -> list[int]:
    """Tokens as Whisper emits them: text runs between timestamps, pairs, restarts, an unpaired end."""
    tokens: list[int] = []
    stamp = int(generator.integers(0, 60))
    for _ in range(int(generator.integers(0, 7))):
        tokens.append(timestamp_begin + stamp)
        tokens += [int(generator.choice(text)) for _ in range(int(generator.integers(0, 5)))]
        stamp = min(1500, stamp + int(generator.integers(0, 400)))
        tokens.append(timestamp_begin + stamp)
        if generator.random() < 0.2:
            stamp = int(generator.integers(0, 100))  # a new sequential segment
    if generator.random() < 0.3:
        tokens += [int(generator.choice(text)) for _ in range(int(generator.integers(1, 4)))]
    return tokens


def test_merge_windows_equals_the_pipelines_decode_asr(whisper_timestamps_dir: Path) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    from transformers.models.whisper.tokenization_whisper import _decode_asr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = AutoTokenizer.from_pretrained(str(whisper_timestamps_dir))
    ours = Tokenizer.from_file(str(whisper_timestamps_dir / "tokenizer.json"))
    generation = json.loads((whisper_timestamps_dir / "generation_config.json").read_text())
    begin = generation["no_timestamps_token_id"] + 1
    languages = {v: k.strip("<|>") for k, v in generation["lang_to_id"].items()}
    special = {i for i, t in ours.get_added_tokens_decoder().items() if t.special and i < begin}
    # Letters, other bytes, two language tokens and another special token (<|transcribe|>).
    text = [*range(97, 123), 32, 200, 201, *sorted(languages)[:2], generation["task_to_id"]["transcribe"]]
    generator = np.random.default_rng(3)
    for case in range(250):
        timestamps = bool(case % 2)
        chunk_seconds = [30.0] * int(generator.integers(1, 4))
        chunk_seconds[-1] = float(generator.integers(6, 31))
        windows = []
        for index, seconds in enumerate(chunk_seconds):
            left = 5.0 if index else 0.0
            right = 5.0 if index < len(chunk_seconds) - 1 else 0.0
            windows.append((_random_reply(generator, begin, text), (seconds, left, right)))
        outputs = [
            {"tokens": torch.tensor([tokens]), "stride": stride, "is_last": i == len(windows) - 1}
            for i, (tokens, stride) in enumerate(windows)
        ]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want_text, optional = _decode_asr(
                theirs, outputs, return_timestamps=timestamps, return_language=None, time_precision=0.02
            )
        got_text, segments, _ = merge_windows(
            windows,
            timestamp_begin=begin,
            precision=0.02,
            special=special,
            languages=languages,
            timestamps=timestamps,
            decode=lambda ids: ours.decode(ids, skip_special_tokens=False),
        )
        assert got_text == want_text, case
        if timestamps:
            assert segments == optional["chunks"], case


def test_timestamp_rules_equal_whispers_logits_processor() -> None:
    import torch
    from transformers import GenerationConfig
    from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

    vocabulary, eos, no_timestamps = 300, 50, 60
    begin = no_timestamps + 1
    config = GenerationConfig(eos_token_id=eos, no_timestamps_token_id=no_timestamps, max_initial_timestamp_index=5)
    processor = WhisperTimeStampLogitsProcessor(config, begin_index=3)
    generator = np.random.default_rng(5)
    for case in range(400):
        reply = _random_reply(generator, begin, list(range(0, 50)))[: int(generator.integers(0, 8))]
        scale = 4.0 if case % 3 else 0.3  # a flat distribution makes the timestamps' total mass win
        logits = (generator.normal(size=vocabulary) * scale).astype(np.float32)
        logits[generator.integers(0, vocabulary, size=5)] = -np.inf  # as the suppressions leave them
        prompt = [1, 2, 3]
        want = processor(torch.tensor([prompt + reply]), torch.tensor(logits[None].copy()))[0].numpy()
        got = logits.copy()
        timestamp_rules(got, reply, timestamp_begin=begin, no_timestamps=no_timestamps, eos=eos, max_initial=5)
        assert np.array_equal(np.isneginf(got), np.isneginf(want)), case
        assert int(np.argmax(got)) == int(np.argmax(want)), case
