"""A full disk (SAFETY D6): refused before the first byte when the sizes are known, else a clean DISK_FULL.

The mid-download case runs on a real 2 MiB tmpfs mounted for the test (root only; skipped elsewhere):
the disk fills up while the bytes arrive, as when another process writes, and the cache must stay
as it was: the partial file removed, the model already there intact and loadable.
"""

from __future__ import annotations

import contextlib
import pathlib
import subprocess
from collections.abc import Iterator

import pytest
from store_helpers import (
    FakeHub,
    MiB,
    assert_nothing_stored,
    blob_names,
    fake_hub,
    point_huggingface_hub_at,
    random_bytes,
    repo_root,
    sha256,
)

import anyformer
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._model import Model, ModelFile

__all__ = ["fake_hub"]

SMALL = random_bytes(300 * 1024, seed=2)
BIG = random_bytes(int(1.2 * MiB), seed=3)


@pytest.fixture
def small_disk(tmp_path: pathlib.Path, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """huggingface_hub's home on a 2 MiB tmpfs of its own."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); the preflight test still runs")
    try:
        point_huggingface_hub_at(monkeypatch, fake_hub.url, mount_point)
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)


@pytest.mark.safety("D6")
def test_the_disk_filling_up_mid_download_is_disk_full_with_the_partial_file_removed_and_other_models_intact(
    fake_hub: FakeHub, small_disk: pathlib.Path
) -> None:
    fake_hub.add_repo("org/small", {"model.safetensors": SMALL})
    fake_hub.add_repo("org/big", {"model.safetensors": BIG})
    fake_hub.slow["model.safetensors"] = 0.002  # bytes arrive in 64 KiB steps, like a network
    small_path = anyformer.fetch_files(anyformer.describe("org/small"), ["model.safetensors"])["model.safetensors"]
    filler = small_disk / "another-process.bin"

    def fill_the_disk(event: anyformer.ProgressEvent) -> None:
        if event.file and event.done and not filler.exists():
            with contextlib.suppress(OSError), filler.open("wb") as f:  # takes every byte left
                while True:
                    f.write(b"\0" * 65536)

    big = anyformer.describe("org/big")
    with pytest.raises(AnyformerError) as full:
        anyformer.fetch_files(big, ["model.safetensors"], fill_the_disk)
    assert full.value.code is ErrorCode.DISK_FULL and "filled up" in full.value.message, full.value
    assert_nothing_stored("org/big", "model.safetensors", BIG)
    assert not (repo_root("org/big") / "refs" / "main").exists()
    # The model already there is untouched, and found again without a request.
    assert sha256(small_path.read_bytes()) == sha256(SMALL)
    assert blob_names("org/small") == [sha256(SMALL)]
    filler.unlink()
    again = anyformer.fetch_files(anyformer.describe("org/small"), ["model.safetensors"])["model.safetensors"]
    assert again == small_path
    # With room again, the same pull succeeds.
    fake_hub.reset_faults()
    assert anyformer.fetch_files(big, ["model.safetensors"])["model.safetensors"].read_bytes() == BIG


@pytest.mark.safety("D6")
def test_files_larger_than_the_free_space_are_refused_before_the_first_byte(fake_hub: FakeHub) -> None:
    revision = fake_hub.add_repo("org/huge", {"model.safetensors": SMALL})
    # The listing's sizes are what the check trusts: a description claiming a petabyte is refused
    # before any request, on any disk.
    huge = Model(
        repo="org/huge",
        revision=revision,
        source="hub",
        files=(ModelFile("model.safetensors", size=10**15, sha256=sha256(SMALL)),),
    )
    with pytest.raises(AnyformerError) as full:
        anyformer.fetch_files(huge, ["model.safetensors"])
    assert full.value.code is ErrorCode.DISK_FULL and "nothing was downloaded" in full.value.message
    assert not fake_hub.requests_for("model.safetensors")
    assert not repo_root("org/huge").exists()


@pytest.mark.safety("D6")
def test_a_small_disk_refuses_a_listing_that_does_not_fit_before_any_get(
    fake_hub: FakeHub, small_disk: pathlib.Path
) -> None:
    fake_hub.add_repo("org/big", {"a.safetensors": BIG, "b.safetensors": BIG[::-1]})
    model = anyformer.describe("org/big")
    with pytest.raises(AnyformerError) as full:
        anyformer.fetch_files(model, ["a.safetensors", "b.safetensors"])
    assert full.value.code is ErrorCode.DISK_FULL
    assert not fake_hub.requests_for("a.safetensors", "GET") and not fake_hub.requests_for("b.safetensors", "GET")
