"""qwen35moe's wgpu prompt steps of several tokens (lavapipe in CI: ``ANYFORMER_SOFTWARE_GPU=1``): every prompt row and
the greedy tokens after them as the CPU engine's and llama.cpp's, with every expert cached and with one layer's top-k,
on the fixture of three delta nets before one gated attention layer and on the alternating one (fused gate/up
experts); a step reads each expert at most once; prime() over several steps; the plan's prompt bytes cover the step
buffers (the delta nets' step rows too)."""

from __future__ import annotations

import numpy as np
import pytest
from diskformer_reference import CTX, PROMPT, assert_cache_within_budget, gpu_engine_for, greedy_steps
from test_gpu_engine import llama_and_cpu_steps

from anyformer_diskformer.arch.registry import read_moe_config
from anyformer_diskformer.plan import PROMPT_STEP
from anyformer_gguf_gpu.gguf_file import GGUFFile

#: The fixtures (F32 weights: test_gpu_engine's llama.cpp tolerance for them).
CASES = ["qwen35moe_f32", "qwen35moe_alternating"]
TOLERANCE = 1e-4


@pytest.mark.parametrize("fixture", CASES)
@pytest.mark.parametrize("step", [3, PROMPT_STEP])
@pytest.mark.parametrize("evicting", [False, True])
def test_qwen35moe_prompt_steps_match_the_cpu_engine_and_llama_cpp(request, gpu, fixture, step, evicting):
    """The 8-token prompt in steps of 3, 3 and 2 tokens (a delta net's state and convolution carried from step to
    step), or in one step: every prompt row and 32 greedy tokens within 1e-4 of the CPU engine and of llama.cpp, with
    every expert held and with a cache of one layer's top-k (smaller than a step's union)."""
    path = request.getfixturevalue(fixture)
    want, want_tokens, cpu, cpu_tokens = llama_and_cpu_steps(path)
    config = read_moe_config(GGUFFile(path).header)
    assert any(config.recurrent) and not all(config.recurrent)
    engine = gpu_engine_for(gpu, path, config.n_expert_used if evicting else None, prompt_step=step)
    try:
        assert engine.prompt is not None and engine.prompt_step == step
        got, tokens = greedy_steps(engine.forward)
        assert got.shape == want.shape == cpu.shape
        assert np.abs(got - cpu).max() < TOLERANCE
        assert np.abs(got - want).max() < TOLERANCE
        assert tokens == want_tokens == cpu_tokens
        assert_cache_within_budget(engine, config.n_expert_used, evicting)
    finally:
        engine.release()


def test_a_qwen35moe_step_resumes_a_sequence_and_gives_the_last_row_alone(gpu, qwen35moe_f32):
    """Steps of 3 from position 0, then the rest of the prompt from position 5 (a step that is not a sequence's
    first keeps the delta nets' states): the rows of one 8-token forward; the last row alone as the last of every
    row's."""
    engine = gpu_engine_for(gpu, qwen35moe_f32, None, prompt_step=3)
    other = gpu_engine_for(gpu, qwen35moe_f32, None, prompt_step=3)
    try:
        every = engine.forward(PROMPT, 0)
        split = np.concatenate([other.forward(PROMPT[:5], 0), other.forward(PROMPT[5:], 5)])
        np.testing.assert_allclose(split, every, atol=1e-5)
        last = other.forward(PROMPT, 0, every=False)  # position 0 again: the states start from zero
        assert last.shape[0] == 1
        np.testing.assert_allclose(last[0], every[-1], atol=1e-5)
    finally:
        engine.release()
        other.release()


def test_a_primed_qwen35moe_chat_over_several_steps_is_the_same_text(qwen35moe_f32):
    """prime() with steps of 4 tokens (the system prompt and the chat each span several steps): the same reply as a
    model that runs every prompt a token a step."""
    from test_prime import CHAT, SYSTEM, open_model, reply

    plain = open_model(qwen35moe_f32, device="gpu", prompt_step=1)
    try:
        assert plain.engine.prompt is None
        want = reply(plain, CHAT)
    finally:
        plain.dispose()
    primed = open_model(qwen35moe_f32, device="gpu", prime=SYSTEM, prompt_step=4)
    try:
        assert primed.engine.prompt_step == 4 and primed.engine.prompt is not None
        assert reply(primed, CHAT) == want
        assert primed.reused_positions > 4
    finally:
        primed.dispose()


@pytest.mark.parametrize("fixture", CASES)
def test_the_plan_counts_qwen35moes_prompt_steps_gpu_bytes(request, gpu, fixture):
    """What qwen35moe's steps of 32 tokens add to the engine's GPU buffers (over one token a step: the step's
    residual, q/k/v, attention and score rows, the delta nets' projection, convolution and output rows and their
    position block, the experts' step buffers) is within the plan's prompt_bytes, in the budget's fixed bytes; the
    summary's estimate covers it too; no prompt bytes on the CPU, none for steps of one token. The delta nets' step
    rows are 256 bytes apart (the most any device asks a storage binding's offset to be a multiple of)."""
    from anyformer.plugin import read_gguf_header
    from anyformer_diskformer.plan import plan_from_header, plan_from_summary

    path = request.getfixturevalue(fixture)
    header = read_gguf_header(path)
    plan = plan_from_header(header, CTX, "gpu")
    batched = gpu_engine_for(gpu, path, None)
    single = gpu_engine_for(gpu, path, None, prompt_step=1)
    try:
        assert batched.prompt_step == PROMPT_STEP
        # A delta rule's token rows are bound at offsets any WebGPU device takes (lavapipe asks only 32 bytes).
        assert all(4 * stride % 256 == 0 for stride in batched._strides)
        grown = batched.held_bytes - single.held_bytes
        one = plan_from_header(header, CTX, "gpu", 1)
        assert 0 < grown <= plan.prompt_bytes
        assert plan.fixed_bytes == one.fixed_bytes + plan.prompt_bytes
        assert grown <= plan_from_summary(header.summary(), CTX, "gpu").prompt_bytes
    finally:
        batched.release()
        single.release()
    assert plan_from_header(header, CTX, "cpu").prompt_bytes == 0
    assert plan_from_header(header, CTX, "gpu", 1).prompt_bytes == 0


def test_a_qwen35moe_prompt_compiles_nothing_after_load_in_a_gpus_shapes(gpu, tmp_path, monkeypatch):
    """Q4_K experts beside Q8_0 dense matrices, with the shapes a GPU gives each matrix (forced here: lavapipe keeps
    one thread a row): the pipelines of a prompt's steps (the delta nets' several-token projections and per-token
    delta rules, the gated attention over the step, the experts' products) were compiled at load."""
    from anyformer_diskformer.testing import TinyMoE, write_tiny_moe
    from anyformer_gguf_gpu import kernels as kernels_module
    from anyformer_gguf_gpu.testing import compiles_counted

    path = str(tmp_path / "tiny-qwen35moe-q8-q4k.gguf")
    spec = TinyMoE(
        architecture="qwen35moe",
        n_layer=4,
        n_embd=256,
        n_ff_exp=256,
        n_ff_shexp=64,
        n_rot=8,
        attention_interval=2,
        quant="Q8_0",
        expert_quant="Q4_K",
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
