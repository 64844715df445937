"""A Hub repo reaches LocalMind: plain Q4_0 first whatever the listing order, only that file downloaded,
the reply llama.cpp's; and LFM2.5's repo as a what-if without headers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import anyformer
from anyformer import Caps, Model

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "anyformer-core" / "tests"))
from hub_fixtures import fake_hub

from anyformer_gguf_gpu.testing import RandomModel, write_random_gguf

__all__ = ["fake_hub"]

REPO = "org/tiny-llama-GGUF"
MESSAGES = [{"role": "user", "content": "the sea is"}]
GB = 10**9
#: LiquidAI/LFM2.5-230M-GGUF's quants (names as on the Hub; sizes approximate, from a 230M model's bits per weight).
LFM25 = {
    "repo": "LiquidAI/LFM2.5-230M-GGUF",
    "architecture": "lfm2",
    "task": "text-generation",
    "files": [
        {"name": f"LFM2.5-230M-{quant}.gguf", "size": size}
        for quant, size in (
            ("BF16", 466_000_000),
            ("F16", 466_000_000),
            ("Q8_0", 249_000_000),
            ("Q6_K", 193_000_000),
            ("Q5_K_M", 170_000_000),
            ("Q4_K_M", 154_000_000),
            ("Q4_0", 143_000_000),
        )
    ],
}


def test_lfm25_as_a_what_if_without_headers_chooses_localmind_and_q4_0():
    caps = Caps(ram_bytes=8 * GB, store=True).with_flags(["gpu", "f16", "subgroups", "store"])
    _, selection = anyformer.check(Model.from_dict(LFM25), budget="4GB", caps=caps.replace(gpu_bytes=4 * GB))
    chosen = selection.chosen
    assert chosen is not None and chosen.backend == "localmind", [str(v) for v in selection.verdicts]
    assert chosen.estimate.details["file"] == "LFM2.5-230M-Q4_0.gguf" and chosen.estimate.details["estimated"] is True
    assert chosen.estimate.files == ("LFM2.5-230M-Q4_0.gguf",)


def test_a_budget_too_small_for_q4_0_gives_way_to_the_next_smaller_file_not_the_next_preferred():
    caps = Caps(ram_bytes=8 * GB, store=True).with_flags(["gpu", "f16", "store"])
    files = [*LFM25["files"], {"name": "LFM2.5-230M-UD-Q4_K_XL.gguf", "size": 100_000_000}]
    v = anyformer.check(Model.from_dict({**LFM25, "files": files}), budget="120MB", caps=caps, backend="localmind")[1]
    assert v.chosen is not None and v.chosen.estimate.details["file"] == "LFM2.5-230M-UD-Q4_K_XL.gguf"


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> dict[str, Path]:
    """A dense llama repo as publishers lay it out: BF16 listed first, then Q8_0 and Q4_0."""
    folder = tmp_path_factory.mktemp("llama-repo")
    files = {}
    for quant in ("BF16", "Q8_0", "Q4_0"):
        path = folder / f"tiny-llama-{quant}.gguf"
        write_random_gguf(str(path), RandomModel(quant=quant))
        files[path.name] = path
    return files


def test_run_on_a_hub_repo_takes_localmind_and_q4_0_downloads_only_it_and_replies_as_llama_cpp(
    fake_hub, layout, tmp_path, monkeypatch
):
    from huggingface_hub import constants

    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path / "home"))
    fake_hub.add_repo(REPO, layout, pipeline_tag="text-generation")
    with anyformer.load(REPO, context=128) as loaded:
        assert loaded.backend == "localmind" and loaded.verdict.estimate.details["file"] == "tiny-llama-Q4_0.gguf"
        stored = sorted(p.name for p in Path(constants.HF_HUB_CACHE).glob("models--*/snapshots/*/*.gguf"))
        assert stored == ["tiny-llama-Q4_0.gguf"]
        reply = "".join(c.delta for c in loaded.generate(MESSAGES, max_new_tokens=6))
    with anyformer.load(str(layout["tiny-llama-Q4_0.gguf"]), backend="llamacpp", context=128) as reference:
        theirs = "".join(c.delta for c in reference.generate(MESSAGES, max_new_tokens=6))
    assert reply == theirs and reply


def test_the_run_command_on_the_hub_repo_runs_localmind_on_q4_0_and_prints_llama_cpps_reply(
    fake_hub, layout, tmp_path, monkeypatch
):
    import subprocess

    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path / "home"))
    fake_hub.add_repo(REPO, layout, pipeline_tag="text-generation")
    command = [
        sys.executable,
        "-m",
        "anyformer",
        "run",
        REPO,
        "the sea is",
        "--max-new-tokens",
        "6",
        "--context",
        "128",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{REPO}" in done.stderr and "on localmind" in done.stderr
    with anyformer.load(str(layout["tiny-llama-Q4_0.gguf"]), backend="llamacpp", context=128) as reference:
        theirs = "".join(c.delta for c in reference.generate(MESSAGES, max_new_tokens=6))
    assert done.stdout.strip() == theirs.strip() and theirs.strip()


def test_the_file_option_reaches_the_choice_and_any_other_key_is_refused_by_the_core():
    caps = Caps(ram_bytes=8 * GB, store=True).with_flags(["gpu", "f16", "store"])
    files = [*LFM25["files"], {"name": "LFM2.5-230M-UD-Q4_K_XL.gguf", "size": 100_000_000}]
    model = Model.from_dict({**LFM25, "files": files})
    chosen = {"file": "LFM2.5-230M-UD-Q4_K_XL.gguf"}
    named = anyformer.check(model, budget="4GB", caps=caps, backend="localmind", options=chosen)[1]
    assert named.chosen is not None and named.chosen.estimate.files == ("LFM2.5-230M-UD-Q4_K_XL.gguf",)
    with pytest.raises(anyformer.AnyformerError) as caught:
        anyformer.check(model, caps=caps, backend="localmind", options={"threads": 2})
    assert caught.value.code is anyformer.ErrorCode.BAD_REQUEST and "localmind: file (str)" in caught.value.message
