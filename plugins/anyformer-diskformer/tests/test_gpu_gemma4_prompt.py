"""Gemma 4's wgpu prompt steps of several tokens (lavapipe in CI: ``ANYFORMER_SOFTWARE_GPU=1``): every prompt row and
the greedy tokens after them as the CPU engine's and llama.cpp's (as test_gpu_engine's Gemma 4 test compares), over a
prompt longer than the sliding window, with every expert cached and with one layer's top-k; a step reads each expert
at most once; prime() over several steps; the plan's prompt bytes cover the step buffers."""

from __future__ import annotations

import numpy as np
import pytest
from diskformer_reference import (
    CTX,
    EXACT_GELU_TOLERANCE,
    GEMMA4_CASES,
    PROMPT,
    assert_cache_within_budget,
    gpu_engine_for,
    greedy_steps,
)
from test_gpu_engine import llama_and_cpu_steps

from anyformer_diskformer.arch.registry import read_moe_config
from anyformer_diskformer.plan import PROMPT_STEP
from anyformer_gguf_gpu.gguf_file import GGUFFile


@pytest.mark.parametrize("fixture", GEMMA4_CASES)
@pytest.mark.parametrize("step", [3, PROMPT_STEP])
@pytest.mark.parametrize("evicting", [False, True])
def test_gemma4_prompt_steps_match_the_cpu_engine_and_llama_cpp(request, gpu, fixture, step, evicting):
    """The 8-token prompt (longer than the sliding window: 4 and 6) in steps of 3, 3 and 2 tokens, or in one step:
    every prompt row and 32 greedy tokens within 1e-4 of the CPU engine and within llama.cpp's f16 GELU rounding of
    llama.cpp, with every expert held and with a cache of one layer's top-k (smaller than a step's union)."""
    path = request.getfixturevalue(fixture)
    want, want_tokens, cpu, cpu_tokens = llama_and_cpu_steps(path)
    config = read_moe_config(GGUFFile(path).header)
    assert len(PROMPT) > config.n_swa and any(config.swa) and not all(config.swa)
    engine = gpu_engine_for(gpu, path, config.n_expert_used if evicting else None, prompt_step=step)
    try:
        assert engine.prompt is not None and engine.prompt_step == step
        got, tokens = greedy_steps(engine.forward)
        assert got.shape == want.shape == cpu.shape
        assert np.abs(got - cpu).max() < 1e-4
        assert np.abs(got - want).max() < EXACT_GELU_TOLERANCE
        assert tokens == want_tokens == cpu_tokens
        assert_cache_within_budget(engine, config.n_expert_used, evicting)
    finally:
        engine.release()


@pytest.mark.parametrize("fixture", GEMMA4_CASES)
def test_the_plan_counts_gemma4s_prompt_steps_gpu_bytes(request, gpu, fixture):
    """What Gemma 4's steps of 32 tokens add to the engine's GPU buffers (over one token a step) is within the plan's
    prompt_bytes and the growth of its sliding layers' rings (kv_bytes: n_swa + step - 1 rows), both in the budget's
    fixed bytes; no prompt bytes on the CPU, none for steps of one token."""
    from anyformer.plugin import read_gguf_header
    from anyformer_diskformer.plan import plan_from_header

    path = request.getfixturevalue(fixture)
    header = read_gguf_header(path)
    plan = plan_from_header(header, CTX, "gpu")
    batched = gpu_engine_for(gpu, path, None)
    single = gpu_engine_for(gpu, path, None, prompt_step=1)
    try:
        assert batched.prompt_step == PROMPT_STEP
        grown = batched.held_bytes - single.held_bytes
        one = plan_from_header(header, CTX, "gpu", 1)
        rings = plan.kv_bytes - one.kv_bytes
        assert rings > 0 and 0 < grown <= plan.prompt_bytes + rings
        assert plan.fixed_bytes == one.fixed_bytes + plan.prompt_bytes + rings
    finally:
        batched.release()
        single.release()
    assert plan_from_header(header, CTX, "cpu").prompt_bytes == 0
    assert plan_from_header(header, CTX, "gpu", 1).prompt_bytes == 0


def test_a_gemma4_prompt_compiles_nothing_after_load_in_a_gpus_shapes(gpu, tmp_path, monkeypatch):
    """Q4_K experts beside Q8_0 dense matrices (so no dense product shares the experts' pipelines), with the shapes a
    GPU gives each matrix (forced here: lavapipe keeps one thread a row): the pipelines of a prompt's steps — the
    experts' several-token products, GELU-gated, and the one-token ones of experts a single token routes to — were
    compiled at load: running the prompt compiles nothing."""
    from anyformer_diskformer.testing import TinyMoE, write_tiny_moe
    from anyformer_gguf_gpu import kernels as kernels_module
    from anyformer_gguf_gpu.testing import compiles_counted

    path = str(tmp_path / "tiny-gemma4-q8-q4k.gguf")
    spec = TinyMoE(
        architecture="gemma4", n_layer=4, n_embd=256, n_ff_exp=256, n_ff_shexp=64, quant="Q8_0", expert_quant="Q4_K"
    )
    write_tiny_moe(path, spec, seed=12)
    monkeypatch.setattr(kernels_module, "default_threads_per_row", lambda gpu: 32)
    engine = gpu_engine_for(gpu, path, None, prompt_step=4)
    try:
        assert engine.kernels.layout_per_matrix and engine.prompt is not None
        with compiles_counted(gpu.device) as made:
            engine.forward(PROMPT, 0, every=False)
        assert made == []
    finally:
        engine.release()
