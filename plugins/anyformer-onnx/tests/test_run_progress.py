"""Progress and cancel of long runs (``loaded.run(input, progress=, cancel=)``) on the ONNX backend.

The speech model reports one event per 30 s window of long-form audio (``done`` of ``total``
windows of the whole call) and the embedding model one per batch; cancelling after the first
window or batch raises ``CANCELLED`` and returns nothing, in this process and through an isolated
worker, and the model then gives the same answer as before (the recorded pipeline's).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anyformer
from anyformer.plugin import AnyformerError, ErrorCode, ProgressEvent
from anyformer_onnx.speech.longform import chunk_spans
from anyformer_onnx.text.encoder import BATCH

#: transformers' chunk_length_s=30 with its default strides (30/6 s), in samples at 16 kHz.
_SPANS = (480_000, 80_000, 80_000)


@pytest.fixture(scope="module", params=[False, True], ids=["in-process", "isolated"])
def long_whisper(request: Any, whisper_timestamps_dir: Path) -> Iterator[anyformer.Loaded]:
    with anyformer.load(str(whisper_timestamps_dir), backend="onnx", isolate=request.param) as loaded:
        yield loaded


def _clip(whisper_timestamps_dir: Path, reference: Any, index: int) -> tuple[np.ndarray, dict[str, Any], int]:
    expected = reference(whisper_timestamps_dir)
    record = expected["clips"][index]
    return np.load(whisper_timestamps_dir / record["clip"]), record, expected["tokens"]


def _stop_after(count: int, events: list[ProgressEvent], cancel: threading.Event) -> Any:
    def callback(event: ProgressEvent) -> None:
        events.append(event)
        if len(events) == count:
            cancel.set()

    return callback


def test_long_form_reports_each_window(long_whisper: Any, whisper_timestamps_dir: Path, reference: Any) -> None:
    audio, record, tokens = _clip(whisper_timestamps_dir, reference, 0)
    windows = len(chunk_spans(audio.size, *_SPANS))
    assert windows >= 2  # a 52 s clip is long-form
    events: list[ProgressEvent] = []
    got = long_whisper.run(audio, max_new_tokens=tokens, progress=events.append)
    assert got == {"text": record["chunked"]["text"]}  # the same answer as without progress
    assert long_whisper.run_progress is True
    assert [(e.stage, e.backend, e.done, e.total) for e in events] == [
        ("transcribe", "onnx", n, windows) for n in range(1, windows + 1)
    ]


def test_a_list_of_clips_counts_the_windows_of_the_whole_call(
    long_whisper: Any, whisper_timestamps_dir: Path, reference: Any
) -> None:
    clips = [_clip(whisper_timestamps_dir, reference, index)[0] for index in (1, 2)]
    total = sum(len(chunk_spans(clip.size, *_SPANS)) for clip in clips)
    events: list[ProgressEvent] = []
    long_whisper.run(clips, max_new_tokens=4, task="translate", progress=events.append)
    assert [(e.stage, e.done, e.total) for e in events] == [("translate", n, total) for n in range(1, total + 1)]


def test_cancel_after_the_first_window_raises_and_returns_nothing(
    long_whisper: Any, whisper_timestamps_dir: Path, reference: Any
) -> None:
    audio, record, tokens = _clip(whisper_timestamps_dir, reference, 2)
    cancel = threading.Event()
    events: list[ProgressEvent] = []
    result: Any = None
    with pytest.raises(AnyformerError) as caught:
        result = long_whisper.run(audio, max_new_tokens=tokens, progress=_stop_after(1, events, cancel), cancel=cancel)
    assert caught.value.code is ErrorCode.CANCELLED
    assert result is None
    assert [e.done for e in events] == [1] and events[0].total == len(chunk_spans(audio.size, *_SPANS)) > 1
    # The model is ready for the next call, and its answer is the whole one.
    assert long_whisper.run(audio, max_new_tokens=tokens) == {"text": record["chunked"]["text"]}


@pytest.fixture(scope="module", params=[False, True], ids=["in-process", "isolated"])
def minilm(request: Any, minilm_dir: Path) -> Iterator[anyformer.Loaded]:
    with anyformer.load(str(minilm_dir), backend="onnx", isolate=request.param) as loaded:
        yield loaded


def test_embeddings_report_each_batch(minilm: Any) -> None:
    texts = [f"sentence number {i}" for i in range(2 * BATCH + 5)]
    events: list[ProgressEvent] = []
    got = minilm.run(texts, progress=events.append)
    assert [(e.stage, e.done, e.total) for e in events] == [
        ("embed", BATCH, len(texts)),
        ("embed", 2 * BATCH, len(texts)),
        ("embed", len(texts), len(texts)),
    ]
    np.testing.assert_array_equal(np.asarray(got["embeddings"]), np.asarray(minilm.run(texts)["embeddings"]))


def test_embeddings_cancelled_after_the_first_batch_raise(minilm: Any) -> None:
    cancel = threading.Event()
    events: list[ProgressEvent] = []
    with pytest.raises(AnyformerError) as caught:
        minilm.run(["a text"] * (3 * BATCH), progress=_stop_after(1, events, cancel), cancel=cancel)
    assert caught.value.code is ErrorCode.CANCELLED
    assert [e.done for e in events] == [BATCH]
    assert len(minilm.run(["a text"])["embeddings"]) == 1


@pytest.fixture(scope="module", params=[False, True], ids=["in-process", "isolated"])
def text_classifier(request: Any, text_classifier_dir: Path) -> Iterator[anyformer.Loaded]:
    with anyformer.load(str(text_classifier_dir), backend="onnx", isolate=request.param) as loaded:
        yield loaded


def test_text_classification_reports_each_batch(text_classifier: Any) -> None:
    texts = [f"a review, number {i}" for i in range(BATCH + 3)]
    events: list[ProgressEvent] = []
    got = text_classifier.run(texts, top_k=None, progress=events.append)
    assert text_classifier.run_progress is True
    assert [(e.stage, e.backend, e.done, e.total) for e in events] == [
        ("classify", "onnx", BATCH, len(texts)),
        ("classify", "onnx", len(texts), len(texts)),
    ]
    assert got == text_classifier.run(texts, top_k=None)  # the same answer as without progress


def test_text_classification_cancelled_after_the_first_batch_raises(text_classifier: Any) -> None:
    cancel = threading.Event()
    events: list[ProgressEvent] = []
    with pytest.raises(AnyformerError) as caught:
        text_classifier.run(["a text"] * (2 * BATCH), progress=_stop_after(1, events, cancel), cancel=cancel)
    assert caught.value.code is ErrorCode.CANCELLED
    assert [e.done for e in events] == [BATCH]
    assert len(text_classifier.run(["a text", "another"])) == 2


def test_token_classification_reports_each_batch(token_classifier_dir: Path) -> None:
    texts = [f"Ada met Bob in Paris on day {i}" for i in range(BATCH + 1)]
    events: list[ProgressEvent] = []
    with anyformer.load(str(token_classifier_dir), backend="onnx") as loaded:
        got = loaded.run(texts, progress=events.append)
        assert got == loaded.run(texts)
    assert [(e.stage, e.done, e.total) for e in events] == [("tag", BATCH, len(texts)), ("tag", len(texts), len(texts))]


@pytest.mark.parametrize(("fixture", "stage"), [("vit_dir", "classify"), ("yolos_dir", "detect")])
def test_vision_tasks_report_each_image_and_stop_when_cancelled(
    request: Any, reference: Any, fixture: str, stage: str
) -> None:
    folder = request.getfixturevalue(fixture)
    paths = [str(folder / name) for name in reference(folder)["images"]]
    assert len(paths) >= 2
    events: list[ProgressEvent] = []
    with anyformer.load(str(folder), backend="onnx") as loaded:
        assert loaded.run_progress is True
        got = loaded.run(paths, progress=events.append)
        assert got == loaded.run(paths)
        want = [(stage, n, len(paths)) for n in range(1, len(paths) + 1)]
        assert [(e.stage, e.done, e.total) for e in events] == want
        cancel = threading.Event()
        stopped: list[ProgressEvent] = []
        with pytest.raises(AnyformerError) as caught:
            loaded.run(paths, progress=_stop_after(1, stopped, cancel), cancel=cancel)
        assert caught.value.code is ErrorCode.CANCELLED
        assert [e.done for e in stopped] == [1]
