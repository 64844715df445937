"""Processes: two pulling one file at once (SAFETY D7) transfer it once; one killed mid-download (D1) is resumed."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import pytest
from store_helpers import FakeHub, MiB, blob_names, fake_hub, hf_env, random_bytes, repo_root, sha256

import anyformer

__all__ = ["fake_hub"]

WEIGHTS = random_bytes(2 * MiB, seed=7)

# Waits for "go" on stdin after the imports, so that both processes ask the Hub at the same moment.
_PULLER = """
import json, sys
import anyformer
model = anyformer.describe("org/shared")
print("ready", flush=True)
sys.stdin.readline()
paths = anyformer.fetch_files(model, ["model.safetensors"])
print(json.dumps({name: str(path) for name, path in paths.items()}), flush=True)
"""


@pytest.mark.safety("D7")
def test_two_processes_pulling_the_same_file_transfer_it_once_and_both_succeed(
    fake_hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    fake_hub.add_repo("org/shared", {"model.safetensors": WEIGHTS})
    fake_hub.slow["model.safetensors"] = 0.01  # ~0.3 s of transfer: the second process arrives mid-download
    home = tmp_path / "hf"
    env = hf_env(fake_hub, home)
    pullers = [
        subprocess.Popen(
            [sys.executable, "-c", _PULLER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(2)
    ]
    for puller in pullers:
        assert puller.stdout is not None and puller.stdout.readline().strip() == "ready"
    for puller in pullers:
        assert puller.stdin is not None
        puller.stdin.write("go\n")
        puller.stdin.flush()
    results = [puller.communicate(timeout=120) for puller in pullers]
    for puller, (out, err) in zip(pullers, results, strict=True):
        assert puller.returncode == 0, err
        assert "Traceback" not in err
        path = pathlib.Path(json.loads(out.strip().splitlines()[-1])["model.safetensors"])
        assert sha256(path.read_bytes()) == sha256(WEIGHTS)
    assert len(fake_hub.requests_for("model.safetensors", "HEAD")) == 2, "both processes asked the Hub"
    assert len(fake_hub.requests_for("model.safetensors", "GET")) == 1, "the bytes were transferred twice"
    assert blob_names("org/shared") == [sha256(WEIGHTS)], "a partial file or a second blob was left"


@pytest.mark.safety("D1")
def test_a_pull_killed_at_half_leaves_nothing_published_and_the_next_pull_resumes_it(
    fake_hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    fake_hub.add_repo("org/shared", {"model.safetensors": WEIGHTS})
    fake_hub.slow["model.safetensors"] = 0.02
    puller = subprocess.Popen(
        [sys.executable, "-c", _PULLER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=hf_env(fake_hub, tmp_path / "hf"),
        text=True,
    )
    assert puller.stdin is not None and puller.stdout is not None
    assert puller.stdout.readline().strip() == "ready"
    puller.stdin.write("go\n")
    puller.stdin.flush()
    partial = repo_root("org/shared") / "blobs" / f"{sha256(WEIGHTS)}.incomplete"
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size >= len(WEIGHTS) // 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    puller.kill()
    puller.communicate(timeout=30)
    kept = partial.stat().st_size
    assert len(WEIGHTS) // 2 <= kept < len(WEIGHTS)
    assert blob_names("org/shared") == [partial.name]  # nothing under a final name
    assert not (repo_root("org/shared") / "snapshots").exists() or not any(
        (repo_root("org/shared") / "snapshots").rglob("model.safetensors")
    )

    fake_hub.reset()
    model = anyformer.describe("org/shared")
    path = anyformer.fetch_files(model, ["model.safetensors"])["model.safetensors"]
    assert [h.get("range") for _, _, h in fake_hub.requests_for("model.safetensors", "GET")] == [f"bytes={kept}-"]
    assert sha256(path.read_bytes()) == sha256(WEIGHTS)
    assert blob_names("org/shared") == [sha256(WEIGHTS)]  # the partial file became the blob
