"""kohra through anyformer: verdicts, load, streaming as text settles, on_step, cancel, options, hostile graphs."""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from kohra_fixtures import BLOCK_SIZE, MODEL_LENGTH

import anyformer
from anyformer import AnyformerError, ErrorCode, Refusal
from anyformer_kohra import DiffusionStep, plugin
from anyformer_kohra.chat_prompt import render_prompt, visible_reply
from anyformer_kohra.ort_providers import CUDA
from anyformer_kohra.text_codec import load_codec

HELLO = [{"role": "user", "content": "Say something."}]


def _caps(**changes: object) -> anyformer.Caps:
    return anyformer.Caps(ram_bytes=64 * 2**30, store=True, cpu_count=2).replace(**changes)


def _describe(files: list[dict[str, object]], tags: tuple[str, ...] = ("text-diffusion",)) -> anyformer.Model:
    return anyformer.Model.from_dict({"repo": "org/dlm", "tags": list(tags), "files": files})


# ---- can_run ----------------------------------------------------------------------------------------


def test_the_fp16_graph_is_chosen_only_where_the_provider_computes_fp16(monkeypatch: pytest.MonkeyPatch) -> None:
    files = [
        {"name": "onnx/model_fp16_fused.onnx", "size": 10_000},
        {"name": "onnx/model_q4f16_rtn_sym.onnx", "size": 5_000},
        {"name": "onnx/model.onnx", "size": 40_000},
    ]
    request = anyformer.Request()
    on_cpu = plugin.can_run(_describe(files), _caps(), request)
    assert on_cpu.ok and on_cpu.estimate is not None
    assert on_cpu.estimate.details["graph"] == "onnx/model_q4f16_rtn_sym.onnx"
    monkeypatch.setattr(plugin, "planned_provider", lambda caps: CUDA)
    on_gpu = plugin.can_run(_describe(files), _caps(gpu=True, gpu_bytes=2**30), request)
    assert on_gpu.ok and on_gpu.estimate is not None
    assert on_gpu.estimate.details["graph"] == "onnx/model_fp16_fused.onnx"
    assert on_gpu.estimate.gpu_bytes > 10_000
    assert on_gpu.estimate.rank == anyformer.Rank.SPECIALIST


def test_external_data_counts_toward_memory_and_is_listed() -> None:
    files = [{"name": "onnx/model.onnx", "size": 1_000}, {"name": "onnx/model.onnx_data", "size": 3 * 2**30}]
    verdict = plugin.can_run(_describe(files), _caps(ram_bytes=4 * 2**30), anyformer.Request())
    assert verdict.code == Refusal.MEMORY
    assert verdict.need is not None and verdict.need > 6 * 2**30
    ok = plugin.can_run(_describe(files), _caps(), anyformer.Request())
    assert ok.estimate is not None and ok.estimate.files[:2] == ("onnx/model.onnx", "onnx/model.onnx_data")


def test_a_budget_too_small_for_the_gpu_graph_is_budget_with_need(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "planned_provider", lambda caps: CUDA)
    files = [{"name": "onnx/model_fp16_fused.onnx", "size": 500 * 2**20}]
    verdict = plugin.can_run(_describe(files), _caps(gpu=True, gpu_bytes=8 * 2**30), anyformer.Request(budget=2**29))
    assert verdict.code == Refusal.BUDGET
    assert verdict.need is not None and verdict.need > 2**29


def test_without_onnxruntime_it_is_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "onnxruntime_installed", lambda: False)
    verdict = plugin.can_run(_describe([{"name": "onnx/model.onnx", "size": 9}]), _caps(), anyformer.Request())
    assert verdict.code == Refusal.RUNTIME
    assert "pip install onnxruntime" in verdict.reason


def test_a_folder_is_chosen_for_kohra_from_its_model_card(mdlm_repo: Path) -> None:
    model = anyformer.describe(mdlm_repo)
    assert "text-diffusion" in model.tags
    verdict = plugin.can_run(model, _caps(), anyformer.Request())
    assert verdict.ok, verdict.reason


# ---- generation ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mdlm(mdlm_repo: Path):  # type: ignore[no-untyped-def]
    with anyformer.load(str(mdlm_repo), backend="kohra") as loaded:
        yield loaded


@pytest.fixture(scope="module")
def bd3lm(bd3lm_repo: Path):  # type: ignore[no-untyped-def]
    with anyformer.load(str(bd3lm_repo), backend="kohra") as loaded:
        yield loaded


def test_mdlm_streams_the_settled_prefix_and_on_step_sees_every_state(mdlm) -> None:  # type: ignore[no-untyped-def]
    steps: list[DiffusionStep] = []
    chunks = list(mdlm.generate(HELLO, max_new_tokens=16, temperature=1.0, seed=4, on_step=steps.append))
    assert [s.step for s in steps] == list(range(1, len(steps) + 1))
    assert "[MASK]" in steps[0].text and steps[0].masked > 0
    assert steps[-1].masked == 0
    assert all(a.masked >= b.masked for a, b in itertools.pairwise(steps))
    assert steps[-1].model_calls <= len(steps)
    # The streamed text never runs ahead of what has settled: each chunk's text is a prefix of the final one.
    final = chunks[-1].text
    assert final
    assert all(final.startswith(c.text) for c in chunks)
    tokens = [c.tokens for c in chunks]
    assert tokens == sorted(tokens) and tokens[-1] <= 16
    assert chunks[-1].finish_reason in ("stop", "length")


def test_the_ddpm_cache_saves_model_calls_end_to_end(mdlm) -> None:  # type: ignore[no-untyped-def]
    def calls(cache: bool) -> tuple[str, int]:
        steps: list[DiffusionStep] = []
        text = mdlm.complete(HELLO, max_new_tokens=8, steps=32, ddpm_cache=cache, on_step=steps.append).text
        return text, steps[-1].model_calls

    with_cache, without = calls(True), calls(False)
    assert with_cache[0] == without[0]
    assert with_cache[1] <= 8 < without[1]


def test_seeds_repeat(mdlm) -> None:  # type: ignore[no-untyped-def]
    texts = [mdlm.complete(HELLO, max_new_tokens=12, temperature=1.0, seed=s).text for s in (1, 1, 2, 3)]
    assert texts[0] == texts[1]
    assert len(set(texts[1:])) > 1, "three seeds gave one answer"


def test_bd3lm_streams_a_chunk_per_finished_block(bd3lm) -> None:  # type: ignore[no-untyped-def]
    steps: list[DiffusionStep] = []
    chunks = list(bd3lm.generate(HELLO, max_new_tokens=12, on_step=steps.append))
    assert {s.block for s in steps} <= set(range(3))
    with_text = [c for c in chunks if c.delta]
    assert with_text
    for chunk in with_text[:-1]:
        assert chunk.tokens % BLOCK_SIZE == 0, f"a chunk arrived mid-block at {chunk.tokens} tokens"


def test_a_block_diffusion_graph_without_a_cache_runs_by_recomputing(  # type: ignore[no-untyped-def]
    bd3lm, bd3lm_mask_repo: Path
) -> None:
    """The same weights exported without a cache give the cached graph's answer, a chunk per block, no extra calls."""
    with anyformer.load(str(bd3lm_mask_repo), backend="kohra") as recomputing:
        assert not recomputing.handle.runner.spec.has_cache
        for options in ({}, {"temperature": 1.0, "seed": 3}):
            steps: dict[str, list[DiffusionStep]] = {"cached": [], "recomputed": []}
            chunks = {
                name: list(model.generate(HELLO, max_new_tokens=12, on_step=steps[name].append, **options))
                for name, model in (("cached", bd3lm), ("recomputed", recomputing))
            }
            assert [c.text for c in chunks["cached"]] == [c.text for c in chunks["recomputed"]]
            assert [s.text for s in steps["cached"]] == [s.text for s in steps["recomputed"]]
            with_text = [c for c in chunks["recomputed"] if c.delta]
            assert with_text and all(c.tokens % BLOCK_SIZE == 0 for c in with_text[:-1])
            # Without a cache there is no prompt call and no commit call: one call per step at most.
            assert steps["recomputed"][-1].model_calls < steps["cached"][-1].model_calls


def test_cancel_stops_between_steps(mdlm) -> None:  # type: ignore[no-untyped-def]
    cancel = threading.Event()
    seen: list[int] = []

    def on_step(step: DiffusionStep) -> None:
        seen.append(step.step)
        if step.step == 2:
            cancel.set()

    chunks = list(mdlm.generate(HELLO, max_new_tokens=16, cancel=cancel, on_step=on_step))
    assert chunks[-1].finish_reason == "cancelled"
    assert seen == [1, 2]
    assert mdlm.complete(HELLO, max_new_tokens=4).finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    "options",
    [{"steps": 0}, {"steps": "many"}, {"sampler": "euler"}, {"on_step": 3}, {"ddpm_cache": "yes"}, {"block_size": 4}],
)
def test_bad_options_are_bad_request_before_any_chunk(mdlm, options: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AnyformerError) as raised:
        mdlm.generate(HELLO, max_new_tokens=4, **options)
    assert raised.value.code == ErrorCode.BAD_REQUEST


def test_an_answer_whose_attention_mask_would_not_fit_is_bad_request_before_any_chunk(  # type: ignore[no-untyped-def]
    bd3lm_mask_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a cache the mask grows with the square of the sequence: kohra refuses before allocating it."""
    with anyformer.load(str(bd3lm_mask_repo), backend="kohra") as loaded:
        # The fixture reads 512 tokens; a lower limit stands in for a model that reads a million.
        monkeypatch.setattr(plugin, "MASK_LIMIT", 40 * 40 * 5)
        assert loaded.complete(HELLO, max_new_tokens=4).text is not None
        with pytest.raises(AnyformerError) as raised:
            loaded.generate(HELLO, max_new_tokens=64)
        assert raised.value.code == ErrorCode.BAD_REQUEST and "attention mask" in raised.value.message


def test_a_prompt_longer_than_the_model_reads_is_bad_request(mdlm) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AnyformerError) as raised:
        mdlm.generate([{"role": "user", "content": "x" * MODEL_LENGTH}], max_new_tokens=4)
    assert raised.value.code == ErrorCode.BAD_REQUEST


def test_the_answer_is_cut_to_the_models_length(mdlm) -> None:  # type: ignore[no-untyped-def]
    """A prompt near model_length leaves fewer positions; the answer gets what is left, no more."""
    steps: list[DiffusionStep] = []
    mdlm.complete([{"role": "user", "content": "x" * (MODEL_LENGTH - 40)}], max_new_tokens=64, on_step=steps.append)
    assert steps and len(steps[0].text.split("[MASK]")) - 1 <= 40 - 1


# ---- pieces --------------------------------------------------------------------------------------


def test_the_conversation_goes_through_chatml_when_the_model_has_no_template(mdlm_repo: Path) -> None:
    codec = load_codec({n: mdlm_repo / n for n in ("tokenizer.json", "tokenizer_config.json", "config.json")})
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = codec.decode(render_prompt(codec, messages, thinking=False))
    # Special tokens are left out of decode: the roles and contents remain, in order.
    assert text == "system\nBe brief.\nuser\nHi\nassistant\n"
    assert codec.mask_id == 259 and 258 in codec.stop_ids


def test_masked_positions_show_as_the_mask_token(mdlm_repo: Path) -> None:
    codec = load_codec({"tokenizer.json": mdlm_repo / "tokenizer.json", "config.json": mdlm_repo / "config.json"})
    h, i = codec.encode("H") + codec.encode("i")
    assert codec.decode_with_masks([h, 259, 259, i]) == "H[MASK][MASK]i"


@pytest.mark.parametrize(
    ("text", "final", "shown"),
    [
        ("Hello", False, "Hello"),
        ("<think>hmm</think>\nHello", True, "Hello"),
        ("<think>still thinking", False, ""),
        ("Hi <thi", False, "Hi "),
        ("Hi <thi", True, "Hi <thi"),
        ("A\ufffd", False, "A"),
    ],
)
def test_reasoning_is_left_out_and_an_unfinished_tail_held_back(text: str, final: bool, shown: str) -> None:
    assert visible_reply(text, final=final) == shown


def test_a_graph_whose_external_data_leaves_its_folder_is_refused_before_onnxruntime(
    mdlm_repo: Path, tmp_path: Path
) -> None:
    import onnx
    from onnx.external_data_helper import convert_model_to_external_data

    folder = tmp_path / "repo"
    shutil.copytree(mdlm_repo, folder)
    graph = onnx.load(str(folder / "onnx" / "model.onnx"))
    convert_model_to_external_data(graph, location="weights.bin", size_threshold=0)
    onnx.save(graph, str(folder / "onnx" / "model.onnx"))
    secret = tmp_path / "secret.bin"
    secret.write_bytes((folder / "onnx" / "weights.bin").read_bytes())
    raw = (folder / "onnx" / "model.onnx").read_bytes().replace(b"weights.bin", b"../../s.bin")
    (folder / "onnx" / "model.onnx").write_bytes(raw)
    files = [
        {"name": p.relative_to(folder).as_posix(), "size": p.stat().st_size, "path": str(p)}
        for p in folder.rglob("*")
        if p.is_file()
    ]
    model = anyformer.Model.from_dict(
        {"repo": str(folder), "tags": ["text-diffusion"], "source": "local", "files": files}
    )
    with pytest.raises(AnyformerError) as raised:
        anyformer.load(model, backend="kohra")
    assert raised.value.code == ErrorCode.BAD_MODEL
    assert "outside" in raised.value.message or "climbs" in raised.value.message


def test_a_block_diffusion_graph_with_neither_a_cache_nor_a_4d_mask_is_bad_model(mdlm_repo: Path) -> None:
    model = anyformer.describe(mdlm_repo)
    model = dataclasses.replace(model, tags=(*model.tags, "block-diffusion"))
    with pytest.raises(AnyformerError) as raised:
        anyformer.load(model, backend="kohra")
    assert raised.value.code == ErrorCode.BAD_MODEL
    assert "past_key_values" in raised.value.message and "attention_mask" in raised.value.message


def test_dispose_then_generate_is_bad_request(mdlm_repo: Path) -> None:
    loaded = anyformer.load(str(mdlm_repo), backend="kohra")
    handle = loaded.handle
    loaded.dispose()
    handle.dispose()
    with pytest.raises(AnyformerError):
        handle.generate(HELLO, anyformer.GenerateOptions())
    assert np is not None


def test_importing_the_plugin_and_can_run_import_no_heavy_library(mdlm_repo: Path) -> None:
    """``anyformer check`` imports every plugin and asks can_run: numpy and onnxruntime wait for load."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys, anyformer\n"
        "from anyformer_kohra import plugin\n"
        f"model = anyformer.describe({str(mdlm_repo)!r})\n"
        "verdict = plugin.can_run(model, anyformer.Caps(ram_bytes=2**34), anyformer.Request())\n"
        "assert verdict.ok, verdict.reason\n"
        "heavy = ('numpy', 'onnxruntime', 'tokenizers', 'torch')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
