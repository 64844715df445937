"""``anyformer pull``, ``ls`` and ``rm`` in a subprocess, with the llama.cpp backend, against a FakeHub."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Callable

import pytest
from conftest import CliResult
from store_helpers import FakeHub, fake_hub, hf_env, make_gguf, repo_root

__all__ = ["fake_hub"]

pytest.importorskip("anyformer_llamacpp")


@pytest.fixture
def cli(fake_hub: FakeHub, tmp_path: pathlib.Path) -> Callable[..., CliResult]:
    """Run ``python -m anyformer ARGS`` against the FakeHub, with only the llama.cpp backend, stdin as given."""
    env = hf_env(fake_hub, tmp_path / "hf")
    env = {k: v for k, v in env.items() if not k.startswith("ANYFORMER_")}
    env.update({"ANYFORMER_HOME": str(tmp_path / "anyformer-home"), "ANYFORMER_PLUGINS": "llamacpp"})

    def run(*args: str, stdin: str | None = None, offline: bool = False) -> CliResult:
        done = subprocess.run(
            [sys.executable, "-m", "anyformer", *args],
            input=stdin,
            stdin=subprocess.DEVNULL if stdin is None else None,
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "HF_HUB_OFFLINE": "1" if offline else "0"},
            cwd=tmp_path,
            check=False,
        )
        assert "Traceback" not in done.stderr, done.stderr
        return CliResult(done.returncode, done.stdout, done.stderr)

    return run


@pytest.fixture
def gguf_repo(fake_hub: FakeHub, tmp_path: pathlib.Path) -> str:
    """``org/tiny-GGUF`` with two quants, a config and a README; returns the commit."""
    q4 = make_gguf(tmp_path / "q4.gguf")
    q8 = make_gguf(tmp_path / "q8.gguf", tensor_bytes=512 * 1024)
    files = {"tiny-Q4_0.gguf": q4, "tiny-Q8_0.gguf": q8, "config.json": b'{"model_type": "llama"}', "README.md": b"#"}
    return fake_hub.add_repo("org/tiny-GGUF", files, tags=["gguf"], pipeline_tag="text-generation")


def test_pull_fetches_the_quant_llamacpp_chose_then_ls_lists_it_and_rm_asks_then_frees_it(
    cli: Callable[..., CliResult], fake_hub: FakeHub, gguf_repo: str
) -> None:
    pulled = cli("pull", "org/tiny-GGUF", "--caps", "store", "--json")
    assert pulled.returncode == 0, pulled.stderr
    result = pulled.json()
    assert result["backend"] == "llamacpp" and result["revision"] == gguf_repo
    assert [f["name"] for f in result["files"]] == ["config.json", "tiny-Q4_0.gguf"]
    assert not fake_hub.requests_for("tiny-Q8_0.gguf", "GET") and not fake_hub.requests_for("README.md")
    again = cli("pull", "org/tiny-GGUF", "--caps", "store")
    assert again.returncode == 0 and "cached" in again.stdout and "downloaded 0 B" in again.stderr

    listed = cli("ls", "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = [m for m in listed.json()["models"] if m["repo"] == "org/tiny-GGUF"]
    assert (entry["backend"], entry["revision"], entry["state"]) == ("llamacpp", "main", "ok")
    assert entry["path"].endswith(f"snapshots/{gguf_repo}")

    refused = cli("rm", "org/tiny-GGUF")  # nobody to answer: refuse rather than guess
    assert refused.returncode == 2 and "-y" in refused.stderr and repo_root("org/tiny-GGUF").exists()
    declined = cli("rm", "org/tiny-GGUF", stdin="n\n")
    assert declined.returncode == 1 and "nothing removed" in declined.stderr and repo_root("org/tiny-GGUF").exists()
    removed = cli("rm", "org/tiny-GGUF", stdin="y\n")
    assert removed.returncode == 0 and "freed" in removed.stdout, removed.stderr
    assert not repo_root("org/tiny-GGUF").exists()
    assert cli("rm", "org/tiny-GGUF", "-y").returncode == 1  # MODEL_NOT_FOUND now


@pytest.mark.safety("D9")
def test_ls_shows_a_corrupted_entry_and_exits_zero(cli: Callable[..., CliResult], gguf_repo: str) -> None:
    assert cli("pull", "org/tiny-GGUF", "--caps", "store").returncode == 0
    link = repo_root("org/tiny-GGUF") / "snapshots" / gguf_repo / "tiny-Q4_0.gguf"
    os.unlink(os.path.realpath(link))
    table = cli("ls")
    assert table.returncode == 0 and "corrupted" in table.stdout
    [entry] = [m for m in cli("ls", "--json").json()["models"] if m["repo"] == "org/tiny-GGUF"]
    assert entry["state"].startswith("corrupted") and "tiny-Q4_0.gguf" in entry["state"]
    removed = cli("rm", "org/tiny-GGUF", "-y")
    assert removed.returncode == 0 and not repo_root("org/tiny-GGUF").exists()


@pytest.mark.safety("D5", "D8")
def test_pull_errors_are_one_line_with_their_code(
    cli: Callable[..., CliResult], fake_hub: FakeHub, gguf_repo: str
) -> None:
    missing = cli("pull", "org/no-such-model", "--caps", "store")
    assert missing.returncode == 1 and "MODEL_NOT_FOUND" in missing.stderr
    offline = cli("pull", "org/tiny-GGUF", "--caps", "store", offline=True)
    assert offline.returncode == 1 and "OFFLINE" in offline.stderr and "anyformer pull org/tiny-GGUF" in offline.stderr
    fake_hub.corrupt["tiny-Q4_0.gguf"] = 200_000  # in the tensor data: the header reads fine
    corrupt = cli("pull", "org/tiny-GGUF", "--caps", "store")
    assert corrupt.returncode == 1 and "DOWNLOAD_FAILED" in corrupt.stderr and "sha256" in corrupt.stderr
    assert not (repo_root("org/tiny-GGUF") / "snapshots" / gguf_repo / "tiny-Q4_0.gguf").exists()
    fake_hub.reset_faults()
    assert cli("pull", "org/tiny-GGUF", "--caps", "store").returncode == 0
    offline_cached = cli("pull", "org/tiny-GGUF", "--caps", "store", "--json", offline=True)
    assert offline_cached.returncode == 0 and offline_cached.json()["bytes"] > 0


def _read_only_mounts_work() -> bool:
    """Whether this machine lets an unprivileged user namespace bind-mount a folder read-only."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        done = subprocess.run(
            ["unshare", "-rm", "sh", "-c", 'mount --bind -o ro "$0" "$0" && ! touch "$0/x" 2>/dev/null', "/tmp"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.mark.skipif(not _read_only_mounts_work(), reason="needs unshare and a read-only bind mount")
def test_rm_on_a_read_only_store_is_one_line_not_a_traceback(
    cli: Callable[..., CliResult], gguf_repo: str, fake_hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    assert cli("pull", "org/tiny-GGUF").returncode == 0
    env = hf_env(fake_hub, tmp_path / "hf")
    env.update({"ANYFORMER_HOME": str(tmp_path / "anyformer-home"), "ANYFORMER_PLUGINS": "llamacpp"})
    read_only = ["unshare", "-rm", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(tmp_path / "hf")]
    done = subprocess.run(
        [*read_only, sys.executable, "-m", "anyformer", "rm", "-y", "org/tiny-GGUF"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert "Read-only file system" in done.stderr.strip().splitlines()[-1]
    assert repo_root("org/tiny-GGUF").name in os.listdir(tmp_path / "hf" / "hub")  # nothing was lost


@pytest.mark.parametrize("model", ["a" * 10_000, "org/" + "n" * 10_000, "org/name\n", "org/name\n@main"])
def test_pull_of_a_malformed_id_is_bad_request_in_one_short_line(cli: Callable[..., CliResult], model: str) -> None:
    result = cli("pull", model, offline=True)
    assert result.returncode == 2, result.stderr
    assert "BAD_REQUEST" in result.stderr and len(result.stderr) < 600, result.stderr
