"""Verified, resumable downloads into huggingface_hub's cache (SAFETY D1–D5), real client against a FakeHub."""

from __future__ import annotations

import os
import pathlib
import time

import huggingface_hub
import pytest
from hub_server import git_blob_sha1
from store_helpers import (
    FakeHub,
    MiB,
    assert_nothing_stored,
    blob_names,
    fake_hub,
    no_backoff,
    random_bytes,
    repo_root,
    sha256,
)

import anyformer
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.store import _download

__all__ = ["fake_hub", "no_backoff"]

WEIGHTS = random_bytes(3 * MiB + 123, seed=1)
NOTES = b"notes kept in git, not in LFS\n" * 100
CONFIG = b'{"model_type": "llama"}'


@pytest.fixture
def repo(fake_hub: FakeHub) -> str:
    """``org/m``: an LFS weight file, a regular text file and a config."""
    return fake_hub.add_repo(
        "org/m", {"model.safetensors": WEIGHTS, "notes.txt": NOTES, "config.json": CONFIG}, tags=["safetensors"]
    )


def _fetch(*names: str, events: list[anyformer.ProgressEvent] | None = None) -> dict[str, pathlib.Path]:
    model = anyformer.describe("org/m")
    return anyformer.fetch_files(model, list(names), events.append if events is not None else lambda e: None)


def test_files_land_in_the_hub_cache_layout_verified_and_shared_with_huggingface_hub(
    fake_hub: FakeHub, repo: str
) -> None:
    paths = _fetch("model.safetensors", "notes.txt")
    weights, notes = paths["model.safetensors"], paths["notes.txt"]
    root = repo_root("org/m")
    assert weights == root / "snapshots" / repo / "model.safetensors"
    assert os.readlink(weights) == f"../../blobs/{sha256(WEIGHTS)}"  # relative, as huggingface_hub links
    assert os.readlink(notes) == f"../../blobs/{git_blob_sha1(NOTES)}"
    assert weights.read_bytes() == WEIGHTS and notes.read_bytes() == NOTES
    assert (root / "refs" / "main").read_text() == repo
    assert not any(n.endswith(".incomplete") for n in blob_names("org/m"))
    # transformers & co. find the same files without a request.
    before = len(fake_hub.requests)
    cached = huggingface_hub.hf_hub_download("org/m", "model.safetensors", local_files_only=True)
    assert pathlib.Path(cached) == weights and len(fake_hub.requests) == before
    # A second fetch is served from the cache: no request at all.
    _fetch("model.safetensors")
    assert not fake_hub.requests_for("model.safetensors", "HEAD")[1:]


def test_progress_reports_each_file_and_the_total(fake_hub: FakeHub, repo: str) -> None:
    events: list[anyformer.ProgressEvent] = []
    _fetch("model.safetensors", "notes.txt", events=events)
    per_file = [e for e in events if e.file == "model.safetensors"]
    totals = [e for e in events if e.file is None]
    assert all(e.stage == "download" for e in events)
    assert per_file[-1].done == per_file[-1].total == len(WEIGHTS)
    assert [e.done for e in per_file] == sorted(e.done for e in per_file)
    assert totals[-1].done == totals[-1].total == len(WEIGHTS) + len(NOTES) and totals[-1].message == "total"


@pytest.mark.safety("D1", "D2")
def test_a_download_cut_at_half_and_run_again_resumes_with_a_range_from_the_cut(
    fake_hub: FakeHub, repo: str, no_backoff: None
) -> None:
    half = len(WEIGHTS) // 2
    fake_hub.cut_after["model.safetensors"] = half
    fake_hub.cut_always = True  # every retry is cut too: this run gives up (D2), keeping the partial file
    with pytest.raises(AnyformerError) as failed:
        _fetch("model.safetensors")
    assert failed.value.code is ErrorCode.DOWNLOAD_FAILED and "resume" in failed.value.message
    assert_nothing_stored("org/m", "model.safetensors", WEIGHTS, partial_allowed=True)
    partial = repo_root("org/m") / "blobs" / f"{sha256(WEIGHTS)}.incomplete"
    assert partial.stat().st_size == half

    fake_hub.reset()
    path = _fetch("model.safetensors")["model.safetensors"]
    gets = fake_hub.requests_for("model.safetensors", "GET")
    assert [headers.get("range") for _, _, headers in gets] == [f"bytes={half}-"]
    assert sha256(path.read_bytes()) == sha256(WEIGHTS)
    assert not partial.exists()


@pytest.mark.safety("D1")
def test_a_connection_cut_once_resumes_within_the_same_call(fake_hub: FakeHub, repo: str, no_backoff: None) -> None:
    fake_hub.cut_after["model.safetensors"] = MiB
    path = _fetch("model.safetensors")["model.safetensors"]
    ranges = [h.get("range") for _, _, h in fake_hub.requests_for("model.safetensors", "GET")]
    assert ranges == [None, f"bytes={MiB}-"]
    assert path.read_bytes() == WEIGHTS


@pytest.mark.safety("D1")
def test_an_orphan_left_by_a_killed_huggingface_hub_download_is_adopted_and_resumed(
    fake_hub: FakeHub, repo: str
) -> None:
    model = anyformer.describe("org/m")
    blobs = repo_root("org/m") / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    orphan = blobs / f"{sha256(WEIGHTS)}.0a1b2c3d.incomplete"  # huggingface_hub's per-process temp name
    orphan.write_bytes(WEIGHTS[: MiB + 7])
    stale = blobs / f"{sha256(WEIGHTS)}.deadbeef.incomplete"
    stale.write_bytes(WEIGHTS[:100])
    past = time.time() - 60
    os.utime(orphan, (past, past))
    os.utime(stale, (past, past))
    path = anyformer.fetch_files(model, ["model.safetensors"])["model.safetensors"]
    assert path.read_bytes() == WEIGHTS
    assert [h.get("range") for _, _, h in fake_hub.requests_for("model.safetensors", "GET")] == [f"bytes={MiB + 7}-"]
    assert not any(n.endswith(".incomplete") for n in blob_names("org/m"))


@pytest.mark.safety("D1", "D5")
def test_a_kept_partial_file_with_wrong_bytes_is_discarded_and_fetched_again_from_zero(
    fake_hub: FakeHub, repo: str
) -> None:
    model = anyformer.describe("org/m")
    blobs = repo_root("org/m") / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / f"{sha256(WEIGHTS)}.incomplete").write_bytes(b"\xff" * MiB)  # not the file's first MiB
    path = anyformer.fetch_files(model, ["model.safetensors"])["model.safetensors"]
    assert path.read_bytes() == WEIGHTS
    assert [h.get("range") for _, _, h in fake_hub.requests_for("model.safetensors", "GET")] == [f"bytes={MiB}-", None]


@pytest.mark.safety("D2")
def test_a_server_that_drops_every_connection_gives_download_failed_after_bounded_retries(
    fake_hub: FakeHub, repo: str, no_backoff: None
) -> None:
    fake_hub.cut_after["model.safetensors"] = 0
    fake_hub.cut_always = True
    with pytest.raises(AnyformerError) as failed:
        _fetch("model.safetensors")
    assert failed.value.code is ErrorCode.DOWNLOAD_FAILED
    assert len(fake_hub.requests_for("model.safetensors", "GET")) == len(_download.BACKOFF_SECONDS) + 1
    assert_nothing_stored("org/m", "model.safetensors", WEIGHTS)
    assert not (repo_root("org/m") / "refs" / "main").exists()


@pytest.mark.safety("D3")
def test_a_server_that_ignores_range_restarts_from_zero_without_duplicated_bytes(
    fake_hub: FakeHub, repo: str, no_backoff: None
) -> None:
    half = len(WEIGHTS) // 2
    fake_hub.cut_after["model.safetensors"] = half
    fake_hub.cut_always = True
    with pytest.raises(AnyformerError):
        _fetch("model.safetensors")
    fake_hub.reset()
    fake_hub.ignore_range = True
    path = _fetch("model.safetensors")["model.safetensors"]
    assert [h.get("range") for _, _, h in fake_hub.requests_for("model.safetensors", "GET")] == [f"bytes={half}-"]
    assert path.stat().st_size == len(WEIGHTS) and sha256(path.read_bytes()) == sha256(WEIGHTS)


@pytest.mark.safety("D4")
@pytest.mark.parametrize("fault", ["short_body", "long_body"])
def test_a_body_shorter_or_longer_than_announced_is_download_failed_and_nothing_is_stored(
    fake_hub: FakeHub, repo: str, fault: str
) -> None:
    getattr(fake_hub, fault)["model.safetensors"] = 1000
    with pytest.raises(AnyformerError) as failed:
        _fetch("model.safetensors")
    assert failed.value.code is ErrorCode.DOWNLOAD_FAILED
    assert_nothing_stored("org/m", "model.safetensors", WEIGHTS)


@pytest.mark.safety("D5")
@pytest.mark.parametrize(("name", "data"), [("model.safetensors", WEIGHTS), ("notes.txt", NOTES)])
def test_a_same_size_body_with_one_byte_flipped_is_download_failed_and_no_blob_is_kept(
    fake_hub: FakeHub, repo: str, name: str, data: bytes
) -> None:
    fake_hub.corrupt[name] = len(data) // 3
    with pytest.raises(AnyformerError) as failed:
        _fetch(name)
    assert failed.value.code is ErrorCode.DOWNLOAD_FAILED
    assert ("sha256" if name.endswith(".safetensors") else "git blob sha1") in failed.value.message
    assert_nothing_stored("org/m", name, data)
    fake_hub.reset_faults()
    assert _fetch(name)[name].read_bytes() == data  # the next pull stores it, verified


def test_a_server_answering_garbage_is_download_failed(fake_hub: FakeHub, repo: str) -> None:
    model = anyformer.describe("org/m")
    fake_hub.garbage = True
    with pytest.raises(AnyformerError) as failed:
        anyformer.fetch_files(model, ["model.safetensors"])
    assert failed.value.code is ErrorCode.DOWNLOAD_FAILED
    assert_nothing_stored("org/m", "model.safetensors", WEIGHTS)
    with pytest.raises(AnyformerError) as described:
        anyformer.describe("org/m")
    assert described.value.code is ErrorCode.DOWNLOAD_FAILED


def test_a_server_error_on_every_get_is_download_failed(fake_hub: FakeHub, repo: str, no_backoff: None) -> None:
    model = anyformer.describe("org/m")
    fake_hub.error_status = 503
    with pytest.raises(AnyformerError) as failed:
        anyformer.fetch_files(model, ["model.safetensors"])
    assert failed.value.code is ErrorCode.DOWNLOAD_FAILED and "503" in failed.value.message


def test_a_repo_that_does_not_exist_is_model_not_found(fake_hub: FakeHub) -> None:
    with pytest.raises(AnyformerError) as missing:
        anyformer.describe("org/no-such-model")
    assert missing.value.code is ErrorCode.MODEL_NOT_FOUND
    with pytest.raises(AnyformerError) as pulled:
        anyformer.pull("org/no-such-model")
    assert pulled.value.code is ErrorCode.MODEL_NOT_FOUND


@pytest.mark.parametrize("hostile", ["../evil.safetensors", "/etc/passwd", "a/../../evil.safetensors"])
def test_a_listing_naming_a_file_outside_the_repo_is_refused_and_nothing_is_written_outside(
    fake_hub: FakeHub, tmp_path: pathlib.Path, hostile: str
) -> None:
    fake_hub.add_repo("org/evil", {"model.safetensors": WEIGHTS, hostile: b"owned"})
    before = {p for p in tmp_path.rglob("*")}
    with pytest.raises(AnyformerError) as refused:
        anyformer.pull("org/evil")
    assert refused.value.code is ErrorCode.BAD_MODEL and hostile in refused.value.message
    written = {p for p in tmp_path.rglob("*")} - before
    assert not [p for p in written if "evil" in p.name or "passwd" in p.name]
    assert not fake_hub.requests_for(hostile.rsplit("/", 1)[-1])
    assert pathlib.Path("/etc/passwd").read_bytes() != b"owned"
    with pytest.raises(AnyformerError):
        anyformer.fetch_files(anyformer.Model(repo="org/evil", source="hub", revision="main"), [hostile])
