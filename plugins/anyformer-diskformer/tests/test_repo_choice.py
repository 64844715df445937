"""A Hub repo reaches diskformer: which file it chooses, what it downloads, and that it replies as llama.cpp does.

The repos are laid out as the Hub lays them out (a BF16 split set listed first, then F16 and Q8_0),
served to the real huggingface_hub client by the core's Hub stand-in; the what-ifs are the original
library's pinned MoE repos with their file names and sizes and no header.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pinned_repos import PINNED_MOE_REPOS

import anyformer
from anyformer import Caps, Model

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "anyformer-core" / "tests"))
from hub_fixtures import fake_hub  # noqa: E402

from anyformer_diskformer.testing import TinyMoE, write_tiny_moe  # noqa: E402

__all__ = ["fake_hub"]

REPO = "org/tiny-qwen3moe-GGUF"
CPU = Caps(gpu=False, ram_bytes=16 * 10**9, store=True, cpu_count=2)
MESSAGES = [{"role": "user", "content": "the sea is"}]


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "cpu"])
@pytest.mark.parametrize("ram", [8, 16])
@pytest.mark.parametrize("key", list(PINNED_MOE_REPOS))
def test_the_pinned_moe_repos_choose_diskformer_at_a_4gb_budget_without_headers(key, ram, gpu):
    description, expected = PINNED_MOE_REPOS[key]
    caps = Caps(gpu=gpu, f16=gpu, subgroups=gpu, ram_bytes=ram * 10**9, store=True)
    _, selection = anyformer.check(Model.from_dict(description), budget="4GB", caps=caps)
    chosen = selection.chosen
    assert chosen is not None and chosen.backend == "diskformer", [str(v) for v in selection.verdicts]
    assert chosen.estimate.details["file"] == expected and chosen.estimate.details["estimated"] is True
    assert chosen.estimate.files[0] == expected and not any("mmproj" in f for f in chosen.estimate.files)
    for verdict in selection.verdicts:
        assert "\n" not in verdict.reason


def test_check_describe_names_the_file_and_says_the_estimate_is_rough(tmp_path):
    description, expected = PINNED_MOE_REPOS["ling-3.0-flash"]
    path = tmp_path / "ling.json"
    path.write_text(json.dumps(description), encoding="utf-8")
    command = [sys.executable, "-m", "anyformer", "check", "--describe", str(path), "--budget", "4GB", "--ram", "8GB"]
    wide = {**os.environ, "COLUMNS": "300"}  # rich wraps the table to the terminal's width
    table = subprocess.run([*command, "--caps", ""], capture_output=True, text=True, timeout=120, env=wide)
    assert table.returncode == 0, table.stderr
    assert f"file {expected}" in table.stdout and "rough estimate" in table.stdout
    out = subprocess.run([*command, "--caps", "", "--json"], capture_output=True, text=True, timeout=120)
    data = json.loads(out.stdout)
    chosen = next(v for v in data["verdicts"] if v["backend"] == data["chosen"])
    assert data["chosen"] == "diskformer"
    assert chosen["estimate"]["files"] == [expected, expected.replace("00001-of", "00002-of")]


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> dict[str, Path]:
    """A qwen3moe repo's files as a publisher lays them out: BF16 in a split set first, then F16 and Q8_0."""
    import gguf

    folder = tmp_path_factory.mktemp("qwen3moe-repo")
    spec = TinyMoE(n_layer=2, n_expert=8, n_expert_used=2)
    original = gguf.GGUFWriter.__init__

    def split_in_two(self, path, arch, **kw):  # the writer names the shards -00001-of-00002.gguf
        original(self, path, arch, split_max_tensors=20, **kw)

    gguf.GGUFWriter.__init__ = split_in_two
    try:
        write_tiny_moe(str(folder / "tiny-qwen3moe-BF16.gguf"), TinyMoE(**{**spec.__dict__, "quant": "BF16"}))
    finally:
        gguf.GGUFWriter.__init__ = original
    files = {f"BF16/{p.name}": p for p in sorted(folder.glob("tiny-qwen3moe-BF16-*.gguf"))}
    assert len(files) == 2, files
    for quant in ("F16", "Q8_0"):
        path = folder / f"tiny-qwen3moe-{quant}.gguf"
        write_tiny_moe(str(path), TinyMoE(**{**spec.__dict__, "quant": quant}))
        files[path.name] = path
    return files


def _snapshot_weights() -> list[str]:
    from huggingface_hub import constants

    cache = Path(constants.HF_HUB_CACHE)
    return sorted(p.name for p in cache.glob("models--*/snapshots/*/**/*.gguf"))


def test_run_on_a_hub_repo_takes_diskformer_and_q8_0_downloads_only_it_and_replies_as_llama_cpp(
    fake_hub, layout, tmp_path, monkeypatch
):
    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path / "home"))
    fake_hub.add_repo(REPO, layout, pipeline_tag="image-text-to-text", tags=["gguf", "image-text-to-text"])
    _, selection = anyformer.check(REPO, caps=CPU)
    assert selection.chosen_backend == "diskformer", [str(v) for v in selection.verdicts]
    assert selection.chosen.estimate.files == ("tiny-qwen3moe-Q8_0.gguf",)
    with anyformer.load(REPO, caps=CPU, options={"device": "cpu"}) as loaded:
        assert loaded.backend == "diskformer"
        assert _snapshot_weights() == ["tiny-qwen3moe-Q8_0.gguf"]
        reply = "".join(c.delta for c in loaded.generate(MESSAGES, max_new_tokens=6))
        with pytest.raises(anyformer.AnyformerError, match="backends that read them for it: |no installed backend"):
            list(loaded.generate([{"role": "user", "content": [{"type": "image", "image": "x.png"}]}]))
    with anyformer.load(str(layout["tiny-qwen3moe-Q8_0.gguf"]), backend="llamacpp", context=128) as reference:
        theirs = "".join(c.delta for c in reference.generate(MESSAGES, max_new_tokens=6))
    assert reply == theirs and reply


def test_an_unknown_file_option_is_a_bad_request_listing_the_weight_files(fake_hub, layout, tmp_path, monkeypatch):
    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path / "home"))
    fake_hub.add_repo(REPO, layout)
    with pytest.raises(anyformer.AnyformerError, match="its weight files: BF16/tiny-qwen3moe-BF16-00001") as caught:
        anyformer.load(REPO, caps=CPU, backend="diskformer", options={"file": "nope.gguf"})
    assert caught.value.code is anyformer.ErrorCode.BAD_REQUEST
