"""The wgpu engine's prompt steps of several tokens (lavapipe in CI: ``ANYFORMER_SOFTWARE_GPU=1``): every prompt
position's logits and the greedy tokens after them equal llama.cpp's, whether the cache holds every expert or fewer
than a step's union; a step reads each expert at most once; a prompt longer than one step; prime() on top."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from diskformer_reference import CTX, PROMPT, assert_cache_within_budget, gpu_engine_for, greedy_steps, llama_steps

from anyformer import AnyformerError, ErrorCode
from anyformer_diskformer.arch.registry import read_moe_config
from anyformer_diskformer.engines.gpu.moe import GpuMoEEngine
from anyformer_diskformer.trace import TraceWriter
from anyformer_gguf_gpu.gguf_file import GGUFFile

#: The fixtures checked (qwen3moe, qwen2moe with its gated shared expert and q/k/v biases, bailingmoe2 with a leading
#: dense layer and expert groups) and llama.cpp tolerances, as test_gpu_engine's.
CASES = [("moe_f32", 1e-4), ("qwen2moe_f32", 1e-4), ("bailingmoe2_f32", 1e-4)]


def count_reads(engine: GpuMoEEngine) -> Counter:
    """Every (layer, expert) the cache reads from the file from now on, counted."""
    reads: Counter = Counter()
    reader = engine.cache.reader
    read = reader.read

    def counted(layer: int, expert: int):
        reads[layer, expert] += 1
        return read(layer, expert)

    reader.read = counted  # type: ignore[method-assign]
    return reads


@pytest.mark.parametrize(("fixture", "tolerance"), CASES)
@pytest.mark.parametrize("evicting", [False, True])
def test_prompt_steps_of_three_tokens_match_llama_cpp(request, gpu, fixture, tolerance, evicting):
    """The 8-token prompt in steps of 3, 3 and 2 tokens: every prompt row and 32 greedy tokens as llama.cpp's, with
    every expert held and with a cache of one layer's top-k (smaller than a step's union: groups evict in a step)."""
    path = request.getfixturevalue(fixture)
    want, want_tokens = llama_steps(path)
    config = read_moe_config(GGUFFile(path).header)
    engine = gpu_engine_for(gpu, path, config.n_expert_used if evicting else None, prompt_step=3)
    try:
        assert engine.prompt is not None
        got, tokens = greedy_steps(engine.forward)
        assert got.shape == want.shape
        assert np.abs(got - want).max() < tolerance
        assert tokens == want_tokens
        assert_cache_within_budget(engine, config.n_expert_used, evicting)
    finally:
        engine.release()


@pytest.mark.parametrize("fixture", ["moe_f32", "qwen2moe_f32"])
def test_a_prompt_step_reads_each_expert_at_most_once_even_when_its_union_outgrows_the_cache(request, gpu, fixture):
    """The 8-token prompt in one step with a cache of one layer's top-k: a layer's union is larger than the cache, yet
    each (layer, expert) is read once; one token a step reads again every expert a later token of the layer uses."""
    path = request.getfixturevalue(fixture)
    config = read_moe_config(GGUFFile(path).header)
    engine = gpu_engine_for(gpu, path, config.n_expert_used)
    try:
        reads = count_reads(engine)
        engine.forward(PROMPT, 0)
        assert max(Counter(layer for layer, _ in reads).values()) > config.n_expert_used  # a union beyond the cache
        assert max(reads.values()) == 1
        assert engine.cache.stats.misses == sum(reads.values())
    finally:
        engine.release()


@pytest.mark.parametrize("fixture", ["gemma4_f32", "gemma4_dense_layer", "qwen35moe_f32", "qwen35moe_alternating"])
def test_a_step_reads_each_expert_once_and_fewer_than_one_token_a_step_with_the_same_rows(request, gpu, fixture):
    """Gemma 4's and qwen35moe's engines: the 8-token prompt in one step with a cache of one layer's top-k — a
    layer's union outgrows the cache, yet each (layer, expert) is read once, fewer than one token a step reads, and
    the rows are the same."""
    path = request.getfixturevalue(fixture)
    config = read_moe_config(GGUFFile(path).header)
    batched = gpu_engine_for(gpu, path, config.n_expert_used)
    single = gpu_engine_for(gpu, path, config.n_expert_used, prompt_step=1)
    try:
        assert single.prompt is None and batched.prompt is not None
        reads, single_reads = count_reads(batched), count_reads(single)
        np.testing.assert_allclose(batched.forward(PROMPT, 0), single.forward(PROMPT, 0), atol=1e-4)
        assert max(Counter(layer for layer, _ in reads).values()) > config.n_expert_used  # a union beyond the cache
        assert max(reads.values()) == 1
        assert batched.cache.stats.misses == sum(reads.values())
        assert sum(reads.values()) < sum(single_reads.values())
    finally:
        batched.release()
        single.release()


@pytest.mark.parametrize("fixture", ["moe_f32", "gemma4_f32"])
def test_a_prompt_longer_than_a_step_writes_one_trace_line_a_step_and_the_last_row_alone(
    request, gpu, fixture, tmp_path
):
    """Steps of 3 over 8 tokens: three trace lines (each step's lookups, an expert at most once a layer), and the last
    row alone (``every=False``) equal to the last of every row's; the generic engine and Gemma 4's."""
    path = request.getfixturevalue(fixture)
    trace_path = tmp_path / "trace.jsonl"
    engine = gpu_engine_for(gpu, path, None, TraceWriter(str(trace_path)), prompt_step=3)
    engine.cache.take_accesses()
    other = gpu_engine_for(gpu, path, None, prompt_step=3)
    try:
        every = engine.forward(PROMPT, 0)
        last = other.forward(PROMPT, 0, every=False)
        assert every.shape[0] == len(PROMPT) and last.shape[0] == 1
        np.testing.assert_array_equal(last[0], every[-1])
        engine.trace.close()
        lines = [json.loads(line)["accesses"] for line in trace_path.read_text().splitlines()]
        assert len(lines) == 3
        for accesses in lines:
            assert len(accesses) == len({tuple(a) for a in accesses})
        assert sum(map(len, lines)) == engine.cache.stats.lookups
    finally:
        engine.release()
        other.release()


def test_a_prompt_step_of_no_tokens_is_refused(gpu, moe_f32):
    with pytest.raises(AnyformerError) as caught:
        gpu_engine_for(gpu, moe_f32, None, prompt_step=0)
    assert caught.value.code is ErrorCode.BAD_REQUEST


@pytest.mark.parametrize("fixture", ["qwen2moe_f32", "gemma4_dense_layer"])
def test_a_primed_chat_over_several_steps_is_the_same_text(request, fixture):
    """prime() with steps of 4 tokens (the system prompt and the chat each span several steps, past Gemma 4's window,
    the chat resumes inside one): the same reply as a model that runs every prompt a token a step."""
    from test_prime import CHAT, SYSTEM, open_model, reply

    path = request.getfixturevalue(fixture)
    plain = open_model(path, device="gpu", prompt_step=1)
    try:
        assert plain.engine.prompt is None
        want = reply(plain, CHAT)
    finally:
        plain.dispose()
    primed = open_model(path, device="gpu", prime=SYSTEM, prompt_step=4)
    try:
        assert primed.engine.prompt_step == 4
        assert reply(primed, CHAT) == want
        assert primed.reused_positions > 4
    finally:
        primed.dispose()


@pytest.mark.parametrize("fixture", ["moe_f32", "qwen2moe_f32", "bailingmoe2_f32"])
def test_the_plan_counts_the_prompt_steps_gpu_bytes(request, gpu, fixture):
    """What steps of 32 tokens add to the engine's GPU buffers (over one token a step) is within the plan's
    prompt_bytes, which the budget's fixed bytes include; none on the CPU, none for steps of one token."""
    from anyformer.plugin import read_gguf_header
    from anyformer_diskformer.plan import PROMPT_STEP, plan_from_header

    path = request.getfixturevalue(fixture)
    header = read_gguf_header(path)
    plan = plan_from_header(header, CTX, "gpu")
    batched = gpu_engine_for(gpu, path, None)
    single = gpu_engine_for(gpu, path, None, prompt_step=1)
    try:
        assert batched.prompt_step == PROMPT_STEP
        grown = batched.held_bytes - single.held_bytes
        assert 0 < grown <= plan.prompt_bytes
        assert plan.fixed_bytes == plan_from_header(header, CTX, "gpu", 1).fixed_bytes + plan.prompt_bytes
    finally:
        batched.release()
        single.release()
    assert plan_from_header(header, CTX, "cpu").prompt_bytes == 0
    assert plan_from_header(header, CTX, "gpu", 1).prompt_bytes == 0


@pytest.mark.parametrize("fixture", ["moe_f32", "qwen2moe_f32"])
def test_a_prompt_compiles_nothing_after_load_in_a_gpus_shapes(request, gpu, fixture, monkeypatch):
    """With the shapes a GPU gives each matrix (forced here: lavapipe keeps one thread a row), the pipelines of a
    prompt's steps — the experts' several-token products and the one-token ones of experts a single token routes to
    — were compiled at load: running the prompt compiles nothing."""
    from anyformer_gguf_gpu import kernels as kernels_module
    from anyformer_gguf_gpu.testing import compiles_counted

    monkeypatch.setattr(kernels_module, "default_threads_per_row", lambda gpu: 32)
    engine = gpu_engine_for(gpu, request.getfixturevalue(fixture), None, prompt_step=4)
    try:
        assert engine.kernels.layout_per_matrix and engine.prompt is not None
        with compiles_counted(gpu.device) as made:
            engine.forward(PROMPT, 0, every=False)
        assert made == []
    finally:
        engine.release()
