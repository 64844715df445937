"""text-classification and token-classification through ``loaded.run``, against transformers' pipelines.

The fixtures recorded ``transformers.pipeline(task)`` on tiny random BERTs before exporting them;
here the exported graphs run through the backend on the same texts: labels, words and offsets
must be equal, scores within 1e-4.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer.plugin import AnyformerError, ErrorCode


def _same(got: Any, want: Any) -> None:
    """Equal structure and values; floats within 1e-4."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (got, want)
        for key in want:
            _same(got[key], want[key])
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (got, want)
        for a, b in zip(got, want, strict=True):
            _same(a, b)
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=1e-4)
    else:
        assert got == want


def test_text_classification_equals_the_pipeline(text_classifier_dir: Path, reference: Any) -> None:
    expected = reference(text_classifier_dir)
    with anyformer.load(str(text_classifier_dir), backend="onnx") as loaded:
        assert loaded.task == "text-classification"
        texts = expected["texts"]
        _same(loaded.run(texts[0]), expected["single"])
        _same(loaded.run(texts), expected["batch"])
        _same(loaded.run(texts, top_k=None), expected["top_k_none"])
        _same(loaded.run(texts[0], top_k=2), expected["single_top_k_2"])
        assert len({row["label"] for row in expected["batch"]}) > 1, "the fixture should not give one label for all"
        for bad in ({"top_k": 0}, {"function_to_apply": "tanh"}, {"colour": "red"}):
            with pytest.raises(AnyformerError) as caught:
                loaded.run(texts[0], **bad)
            assert caught.value.code == ErrorCode.BAD_REQUEST


def test_token_classification_equals_the_pipeline(token_classifier_dir: Path, reference: Any) -> None:
    expected = reference(token_classifier_dir)
    with anyformer.load(str(token_classifier_dir), backend="onnx") as loaded:
        assert loaded.task == "token-classification"
        texts = expected["texts"]
        _same(loaded.run(texts[0]), expected["single"])
        _same(loaded.run(texts), expected["batch"])
        assert any(entity["word"].startswith("##") for row in expected["batch"] for entity in row), "no word piece"
        everything = loaded.run(texts[0], ignore_labels=[])
        assert len(everything) >= len(expected["single"])
        with pytest.raises(AnyformerError) as caught:
            loaded.run(texts[0], ignore_labels="O")
        assert caught.value.code == ErrorCode.BAD_REQUEST
