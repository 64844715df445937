"""Text and token classification through ``loaded.run`` against ``transformers.pipeline`` on the same weights.

The models are tiny random BERTs with a three-label and a five-label head (tiny_encoders.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode

TEXTS = [
    "Sarah lives in Paris, unbelievably.",
    "I love this movie",
    "The weather in Paris was awful on the mat.",
    "x",
]


def _pipeline(folder: Path, task: str) -> Any:
    import torch
    from transformers import pipeline

    build: Any = pipeline  # its overloads want a literal task name
    return build(task, model=str(folder), dtype=torch.float32, device="cpu")


def _plain(value: Any) -> Any:
    """A pipeline's output with numpy scalars as Python numbers."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value


def _same(got: Any, want: Any) -> None:
    """Equal structures, labels and offsets exactly, scores within 1e-6."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), (got, want)
        for key in want:
            _same(got[key], want[key])
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (got, want)
        for a, b in zip(got, want, strict=True):
            _same(a, b)
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=1e-6)
    else:
        assert got == want


@pytest.fixture(scope="module")
def text_classifier(tiny_encoder_dir: dict[str, Path]) -> Iterator[anyformer.Loaded]:
    with anyformer.load(tiny_encoder_dir["text-classifier"], backend="transformers", isolate=False) as model:
        yield model


@pytest.fixture(scope="module")
def token_classifier(tiny_encoder_dir: dict[str, Path]) -> Iterator[anyformer.Loaded]:
    with anyformer.load(tiny_encoder_dir["token-classifier"], backend="transformers", isolate=False) as model:
        yield model


def test_the_task_comes_from_the_architecture(
    text_classifier: anyformer.Loaded, token_classifier: anyformer.Loaded
) -> None:
    assert text_classifier.task == "text-classification"
    assert token_classifier.task == "token-classification"


@pytest.mark.parametrize(
    "options",
    [{}, {"top_k": None}, {"top_k": 2}, {"function_to_apply": "sigmoid"}, {"function_to_apply": "none", "top_k": 1}],
)
def test_text_classification_equals_the_pipeline(
    text_classifier: anyformer.Loaded, tiny_encoder_dir: dict[str, Path], options: dict[str, Any]
) -> None:
    reference = _pipeline(tiny_encoder_dir["text-classifier"], "text-classification")
    _same(text_classifier.run(TEXTS, **options), _plain(reference(TEXTS, **options)))
    _same(text_classifier.run(TEXTS[0], **options), _plain(reference(TEXTS[0], **options)))


def test_the_random_head_gives_more_than_one_label(text_classifier: anyformer.Loaded) -> None:
    assert len({result["label"] for result in text_classifier.run(TEXTS)}) > 1  # else the test above proves little


def test_token_classification_equals_the_pipeline(
    token_classifier: anyformer.Loaded, tiny_encoder_dir: dict[str, Path]
) -> None:
    reference = _pipeline(tiny_encoder_dir["token-classifier"], "token-classification")
    got = token_classifier.run(TEXTS)
    _same(got, _plain(reference(TEXTS)))
    assert sum(len(entities) for entities in got) > 0
    _same(token_classifier.run(TEXTS[0], ignore_labels=[]), _plain(reference(TEXTS[0], ignore_labels=[])))


def test_progress_is_per_batch(text_classifier: anyformer.Loaded, token_classifier: anyformer.Loaded) -> None:
    texts = [f"the movie {i}" for i in range(40)]
    for model, stage in ((text_classifier, "classify"), (token_classifier, "tag")):
        events: list[anyformer.ProgressEvent] = []
        model.run(texts, progress=events.append)
        assert [(e.stage, e.done, e.total) for e in events] == [(stage, 32, 40), (stage, 40, 40)]


@pytest.mark.parametrize(
    ("value", "options"),
    [
        ([], {}),
        ("x", {"top_k": 0}),
        ("x", {"top_k": True}),
        ("x", {"function_to_apply": "tanh"}),
        ("x", {"aggregation_strategy": "simple"}),
    ],
)
def test_bad_text_classification_input_is_bad_request(
    text_classifier: anyformer.Loaded, value: Any, options: dict[str, Any]
) -> None:
    with pytest.raises(AnyformerError) as caught:
        text_classifier.run(value, **options)
    assert caught.value.code is ErrorCode.BAD_REQUEST


@pytest.mark.parametrize("options", [{"ignore_labels": "O"}, {"aggregation_strategy": "simple"}, {"top_k": 1}])
def test_token_classification_refuses_what_it_does_not_honour(
    token_classifier: anyformer.Loaded, options: dict[str, Any]
) -> None:
    with pytest.raises(AnyformerError) as caught:
        token_classifier.run("x", **options)
    assert caught.value.code is ErrorCode.BAD_REQUEST
