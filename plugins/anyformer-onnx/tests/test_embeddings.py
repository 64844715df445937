"""Embeddings through ``loaded.run`` on the real all-MiniLM-L6-v2 exported to ONNX, against torch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anyformer
from anyformer.plugin import AnyformerError, ErrorCode


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path) -> Iterator[anyformer.Loaded]:
    with anyformer.load(str(minilm_dir), backend="onnx") as loaded:
        yield loaded


def test_the_folder_is_feature_extraction_by_its_files(minilm: anyformer.Loaded) -> None:
    assert minilm.task == "feature-extraction"
    assert minilm.verdict is None or minilm.verdict.ok


def test_vectors_match_torch(minilm: anyformer.Loaded, minilm_dir: Path, reference: Any) -> None:
    expected = reference(minilm_dir)
    result = minilm.run(expected["sentences"])
    got = np.asarray(result["embeddings"], dtype=np.float64)
    want = np.asarray(expected["embeddings"], dtype=np.float64)
    assert got.shape == want.shape == (len(expected["sentences"]), 384)
    cosines = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosines.min() >= 0.9999, cosines
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert result["tokens"] > len(expected["sentences"])


def test_a_text_alone_gets_the_vector_it_gets_in_a_batch(
    minilm: anyformer.Loaded, minilm_dir: Path, reference: Any
) -> None:
    sentences = reference(minilm_dir)["sentences"]
    batch = np.asarray(minilm.run(sentences)["embeddings"])
    for i, sentence in enumerate(sentences):
        alone = np.asarray(minilm.run(sentence)["embeddings"][0])
        assert np.allclose(alone, batch[i], atol=1e-5)


def test_unnormalised_vectors_have_their_own_length(minilm: anyformer.Loaded) -> None:
    raw = np.asarray(minilm.run("A man is eating food.", normalize=False)["embeddings"][0])
    assert abs(np.linalg.norm(raw) - 1.0) > 1e-3


def test_sentence_similarity_scores_are_cosines(minilm_dir: Path, reference: Any) -> None:
    expected = reference(minilm_dir)
    want = np.asarray(expected["embeddings"])
    with anyformer.load(str(minilm_dir), backend="onnx", task="sentence-similarity") as loaded:
        scores = loaded.run({"source_sentence": expected["sentences"][0], "sentences": expected["sentences"][1:]})
    assert np.allclose(scores, want[1:] @ want[0], atol=1e-4)
    assert scores[0] == max(scores)  # the paraphrase scores highest


@pytest.mark.parametrize("bad", [[], [1, 2], None, {"text": "x"}])
def test_bad_input_is_bad_request(minilm: anyformer.Loaded, bad: Any) -> None:
    with pytest.raises(AnyformerError) as caught:
        minilm.run(bad)
    assert caught.value.code == ErrorCode.BAD_REQUEST


def test_generate_on_an_embedding_model_is_bad_request(minilm: anyformer.Loaded) -> None:
    with pytest.raises(AnyformerError) as caught:
        minilm.generate("hello")
    assert caught.value.code == ErrorCode.BAD_REQUEST
