"""``ls`` lists what backends can run from every store, corrupted entries included (SAFETY D9); ``rm`` frees them."""

from __future__ import annotations

import os
import pathlib

import huggingface_hub
import pytest
from store_helpers import (
    FakeHub,
    StoreBackend,
    fake_hub,
    manager_with,
    random_bytes,
    repo_root,
    sha256,
)

import anyformer
from anyformer import Caps, StoreEntry
from anyformer._cache_listing import list_store
from anyformer._cache_removal import plan_removal
from anyformer.contract._errors import AnyformerError, ErrorCode

__all__ = ["fake_hub"]

CAPS = Caps(ram_bytes=10**10, store=True)
WEIGHTS = random_bytes(200 * 1024, seed=31)


@pytest.fixture
def home(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """``ANYFORMER_HOME`` for this test."""
    folder = tmp_path / "anyformer-home"
    monkeypatch.setenv("ANYFORMER_HOME", str(folder))
    return folder


def _add(hub: FakeHub, repo: str, seed: int) -> None:
    hub.add_repo(repo, {"model.safetensors": random_bytes(100 * 1024, seed=seed), "config.json": b"{}"})


def _by_repo(entries: list[StoreEntry]) -> dict[str, list[StoreEntry]]:
    found: dict[str, list[StoreEntry]] = {}
    for entry in entries:
        found.setdefault(entry.repo, []).append(entry)
    return found


@pytest.fixture
def stores(fake_hub: FakeHub, home: pathlib.Path) -> StoreBackend:
    """A cache with a pulled model, another tool's download, a model no backend runs, and two corrupted repos."""
    backend = StoreBackend()
    manager = manager_with(backend)
    for seed, repo in enumerate(("org/pulled", "org/other-tool", "org/dangling", "org/bad-ref")):
        _add(fake_hub, repo, seed)
    fake_hub.add_repo("org/not-a-model", {"README.md": b"# only a readme"})
    anyformer.pull("org/pulled", caps=CAPS, plugins=manager)
    huggingface_hub.snapshot_download("org/other-tool")
    huggingface_hub.snapshot_download("org/not-a-model")
    anyformer.pull("org/dangling", caps=CAPS, plugins=manager)
    blob = os.path.realpath(next((repo_root("org/dangling") / "snapshots").rglob("model.safetensors")))
    os.unlink(blob)  # the snapshot link now dangles
    anyformer.pull("org/bad-ref", caps=CAPS, plugins=manager)
    (repo_root("org/bad-ref") / "refs" / "main").write_text("0" * 40)  # a ref to a commit not in the cache
    derived = home / "storetest" / "org" / "pulled"
    derived.mkdir(parents=True)
    (derived / "layout.bin").write_bytes(b"\x01" * 5000)
    backend.stored = [StoreEntry("storetest", "org/pulled", None, str(derived), 5000)]
    return backend


@pytest.mark.safety("D9")
def test_ls_lists_runnable_cache_entries_from_any_tool_and_plugin_entries_and_corrupted_ones(
    stores: StoreBackend,
) -> None:
    entries, problems = list_store(manager_with(stores))
    found = _by_repo(entries)
    assert problems == []
    assert "org/not-a-model" not in found  # no backend runs it
    pulled = found["org/pulled"]
    assert {(e.backend, e.state) for e in pulled} == {("storetest", "ok")}
    assert len(pulled) == 2  # the Hub cache revision and the derived files
    cache_entry = next(e for e in pulled if "snapshots" in e.path)
    assert cache_entry.revision == "main" and cache_entry.bytes == 100 * 1024 + 2
    assert [(e.backend, e.state) for e in found["org/other-tool"]] == [("storetest", "ok")]
    [dangling] = found["org/dangling"]
    assert dangling.state.startswith("corrupted:") and "model.safetensors" in dangling.state
    bad_ref = {e.state.split(":")[0] for e in found["org/bad-ref"]}
    assert bad_ref == {"ok", "corrupted"}  # the snapshot is fine, the ref points nowhere
    assert any("ref main" in e.state for e in found["org/bad-ref"])


@pytest.mark.safety("D9")
def test_ls_survives_a_ref_file_huggingface_hub_cannot_read(stores: StoreBackend) -> None:
    (repo_root("org/bad-ref") / "refs" / "main").write_bytes(b"\xff\xfe\x00binary")
    entries, problems = list_store(manager_with(stores))
    found = _by_repo(entries)
    assert any("could not scan" in p for p in problems)  # huggingface_hub's scan gave up on the whole cache
    assert [e.state for e in found["org/pulled"] if "snapshots" in e.path] == ["ok"]
    assert any(e.state.startswith("corrupted") for e in found["org/bad-ref"])


def test_rm_frees_the_cache_revisions_and_derived_files_and_leaves_other_models(
    stores: StoreBackend, home: pathlib.Path
) -> None:
    manager = manager_with(stores)
    plan = plan_removal("org/pulled", manager)
    blobs = repo_root("org/pulled") / "blobs"
    expected = sum(p.stat().st_size for p in blobs.iterdir()) + 5000
    assert plan.bytes == expected
    assert repo_root("org/pulled").exists()  # planning deletes nothing
    assert plan.execute() == expected
    assert not repo_root("org/pulled").exists()
    assert not (home / "storetest" / "org" / "pulled").exists()
    other = next((repo_root("org/other-tool") / "snapshots").rglob("model.safetensors"))
    assert other.read_bytes() == random_bytes(100 * 1024, seed=1)


@pytest.mark.safety("D9")
def test_rm_removes_a_corrupted_repo_whole(stores: StoreBackend) -> None:
    plan = plan_removal("org/dangling", manager_with(stores))
    assert plan.bytes > 0
    plan.execute()
    assert not repo_root("org/dangling").exists()
    entries, _ = list_store(manager_with(stores))
    assert "org/dangling" not in _by_repo(entries)


def test_rm_of_one_revision_keeps_the_others(fake_hub: FakeHub, home: pathlib.Path) -> None:
    first = fake_hub.add_repo("org/two", {"model.safetensors": WEIGHTS, "config.json": b"{}"})
    huggingface_hub.snapshot_download("org/two")
    second = fake_hub.add_repo("org/two", {"model.safetensors": WEIGHTS[::-1], "config.json": b"{}"}, revision="v2")
    huggingface_hub.snapshot_download("org/two", revision="v2")
    plan = plan_removal("org/two@v2", manager_with())
    assert plan.commits == (second,) and plan.bytes == len(WEIGHTS)  # config.json's blob is shared
    plan.execute()
    assert (repo_root("org/two") / "snapshots" / first / "model.safetensors").read_bytes() == WEIGHTS
    assert not (repo_root("org/two") / "snapshots" / second).exists()
    assert sha256(WEIGHTS[::-1]) not in os.listdir(repo_root("org/two") / "blobs")


def test_rm_of_a_model_not_in_the_store_is_model_not_found(fake_hub: FakeHub, home: pathlib.Path) -> None:
    with pytest.raises(AnyformerError) as missing:
        plan_removal("org/never-pulled", manager_with())
    assert missing.value.code is ErrorCode.MODEL_NOT_FOUND
    with pytest.raises(AnyformerError) as bad:
        plan_removal("../no-such-folder/x", manager_with())
    assert bad.value.code is ErrorCode.BAD_REQUEST


@pytest.mark.safety("D9")
def test_rm_of_a_local_path_removes_only_what_backends_derived_from_it(
    home: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    local = tmp_path / "my-model"
    (local / "onnx").mkdir(parents=True)
    (local / "onnx" / "model.onnx").write_bytes(b"\x02" * 300)
    other = tmp_path / "other-model"
    other.mkdir()
    derived = home / "storetest" / "local" / "fused" / "k1"
    kept = home / "storetest" / "local" / "fused" / "k2"
    for folder in (derived, kept):
        folder.mkdir(parents=True)
        (folder / "model.onnx").write_bytes(b"\x01" * 700)
    outside = tmp_path / "outside-home"
    outside.mkdir()
    backend = StoreBackend()
    backend.stored = [
        StoreEntry("storetest", str(local / "onnx" / "model.onnx"), None, str(derived), 700),
        StoreEntry("storetest", str(other), None, str(kept), 700),
        StoreEntry("storetest", str(local), None, str(outside), 1),  # a path outside ANYFORMER_HOME is never removed
    ]
    manager = manager_with(backend)
    with pytest.raises(AnyformerError) as nothing:
        plan_removal(str(tmp_path / "outside-home"), manager)
    assert nothing.value.code is ErrorCode.MODEL_NOT_FOUND and "local model" in nothing.value.message
    plan = plan_removal(str(local), manager)
    assert plan.paths == (derived,) and plan.bytes == 700
    assert plan.execute() == 700
    assert not derived.exists() and kept.exists() and outside.exists()
    assert (local / "onnx" / "model.onnx").read_bytes() == b"\x02" * 300  # the local model itself stays
