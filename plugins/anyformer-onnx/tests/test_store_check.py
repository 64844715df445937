"""The core's store check reaches the ONNX backend, which has no copy of it: a Hub repo through the stand-in."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "anyformer-core" / "tests"))

from hub_fixtures import point_huggingface_hub_at
from hub_server import FakeHub

import anyformer
from anyformer import Caps, Refusal

ROOMY = Caps(ram_bytes=8 * 10**9, store=True, disk_free_bytes=10**12, cpu_count=2)


@pytest.fixture
def classifier_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text_classifier_dir: Path) -> Iterator[str]:
    """``org/tiny-classifier`` on the Hub stand-in: the tiny text classifier's files, ``onnx/model.onnx`` among them."""
    with FakeHub() as hub:
        point_huggingface_hub_at(monkeypatch, hub.url, tmp_path / "hf")
        monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path / "home"))
        files = {
            str(path.relative_to(text_classifier_dir)): path
            for path in text_classifier_dir.rglob("*")
            if path.is_file() and path.name != "reference.json"
        }
        hub.add_repo("org/tiny-classifier", files, pipeline_tag="text-classification")
        yield "org/tiny-classifier"


def _onnx_verdict(repo: str, caps: Caps) -> anyformer.Verdict:
    _, selection = anyformer.check(repo, backend="onnx", caps=caps)
    (verdict,) = selection.verdicts
    return verdict


def test_a_hub_graph_that_must_be_downloaded_into_a_read_only_store_is_a_store_refusal(classifier_repo: str) -> None:
    accepted = _onnx_verdict(classifier_repo, ROOMY)
    assert accepted.ok and "onnx/model.onnx" in accepted.estimate.files
    refused = _onnx_verdict(classifier_repo, ROOMY.replace(store=False, store_path="/ro/hub"))
    assert refused.code is Refusal.STORE and refused.need is None
    assert "must be downloaded and the model store (/ro/hub) is not writable" in refused.reason


def test_a_store_disk_without_room_for_the_download_is_a_store_refusal(classifier_repo: str) -> None:
    refused = _onnx_verdict(classifier_repo, ROOMY.replace(disk_free_bytes=1000))
    assert refused.code is Refusal.STORE and "the store's disk has 1 KB free" in refused.reason


def test_once_the_files_are_cached_a_read_only_store_is_no_refusal(classifier_repo: str) -> None:
    with anyformer.load(classifier_repo, backend="onnx", caps=ROOMY) as loaded:
        assert loaded.backend == "onnx"  # the load downloaded what the estimate names
    assert _onnx_verdict(classifier_repo, ROOMY.replace(store=False, disk_free_bytes=0)).ok
