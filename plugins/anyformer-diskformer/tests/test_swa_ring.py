"""Gemma 4's sliding layers hold a ring of KV rows, not the context: the buffers each engine holds, the plan's count
of them, and checkpoints (``prime``'s) restored after the rings have wrapped.

That the rings give llama.cpp's logits and greedy tokens is test_cpu_engine's and test_gpu_engine's Gemma 4 tests
(a prompt of 8 and 32 steps: 40 positions, 10 and 6.7 windows of the two fixtures).
"""

from __future__ import annotations

import numpy as np
import pytest
from diskformer_reference import CTX, GEMMA4_CASES, gpu_engine_for

from anyformer.plugin import read_gguf_header
from anyformer_diskformer.arch.gemma4_config import Gemma4Config
from anyformer_diskformer.arch.registry import read_moe_config
from anyformer_diskformer.cache.expert_cache import ExpertCache
from anyformer_diskformer.engine_choice import cpu_engine_class
from anyformer_diskformer.plan import PROMPT_STEP, plan_from_header
from anyformer_gguf_gpu.gguf_file import GGUFFile

#: 20 positions: five windows of gemma4_f32 (4), over three of gemma4_dense_layer (6).
SEQUENCE = [(7 * i + 3) % 250 + 1 for i in range(20)]
#: Tokens after them, a step of several and then one at a time.
TAIL = [17, 90, 41, 5, 66, 120]


def cpu_engine(path: str):
    gguf = GGUFFile(path)
    config = read_moe_config(gguf.header)
    cache = ExpertCache(path, gguf.header, config.n_layer, config.n_expert, 10**9)
    try:
        return cpu_engine_class(config)(gguf, config, cache, CTX)
    finally:
        gguf.close()


def open_engine(request: pytest.FixtureRequest, path: str, device: str, **gpu_options: object):
    if device == "cpu":
        return cpu_engine(path)
    return gpu_engine_for(request.getfixturevalue("gpu"), path, None, **gpu_options)


def close(engine) -> None:
    engine.cache.close()
    if hasattr(engine, "release"):
        engine.release()


def kv_buffer_bytes(engine, device: str) -> tuple[list[int], int]:
    """Each layer's K rows as the engine holds them, and the bytes of all its K and V buffers."""
    c: Gemma4Config = engine.config
    if device == "cpu":
        rows = [k.shape[0] for k in engine._keys]
        assert [v.shape[0] for v in engine._values] == rows
        return rows, sum(k.nbytes + v.nbytes for k, v in zip(engine._keys, engine._values, strict=True))
    # A GPU buffer is the bytes asked for plus 4, rounded up to 16 (GPU.buffer): less than one row of these heads.
    width = [4 * c.kv_heads[i] * c.head_dims[i] for i in range(c.n_layer)]
    rows = [(int(engine.k_cache[i].size) - 4) // width[i] for i in range(c.n_layer)]
    assert [(int(engine.v_cache[i].size) - 4) // width[i] for i in range(c.n_layer)] == rows
    return rows, 2 * sum(r * w for r, w in zip(rows, width, strict=True))


@pytest.mark.parametrize("fixture", GEMMA4_CASES)
@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_a_sliding_layer_holds_a_ring_and_the_plan_counts_what_the_engine_holds(request, fixture, device):
    """A sliding layer holds n_swa rows on the CPU (its engine reads its ring before a step stores into it) and
    n_swa + prompt_step - 1 on the GPU (a step stores its keys before it attends), a full layer the context's; the
    plan's KV bytes are the engine's buffers exactly (they were the context's rows for every layer before the rings)."""
    path = request.getfixturevalue(fixture)
    engine = open_engine(request, path, device)
    try:
        c: Gemma4Config = engine.config
        assert any(c.swa) and not all(c.swa) and c.n_swa < CTX
        step = 1 if device == "cpu" else engine.prompt_step
        assert step == (1 if device == "cpu" else PROMPT_STEP)
        rows, held = kv_buffer_bytes(engine, device)
        assert rows == [min(CTX, c.n_swa + step - 1) if sliding else CTX for sliding in c.swa]
        plan = plan_from_header(read_gguf_header(path), CTX, device)
        assert plan.kv_bytes == held
    finally:
        close(engine)


def test_a_ring_for_steps_of_several_tokens_keeps_their_first_tokens_window(gemma4_f32):
    c = read_moe_config(read_gguf_header(gemma4_f32))
    assert isinstance(c, Gemma4Config) and c.n_swa == 4
    assert c.kv_rows(CTX, 8) == tuple(4 + 8 - 1 if s else CTX for s in c.swa)
    assert c.kv_rows(3, 8) == (3,) * c.n_layer  # never past the context
    # f32 K and V: three sliding layers of 2 KV heads of 16, one full layer of 1 KV head of 32.
    assert c.kv_bytes(CTX) == 2 * 4 * (3 * 4 * 2 * 16 + CTX * 32)


@pytest.mark.parametrize("fixture", GEMMA4_CASES)
@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_a_checkpoint_past_the_window_resumes_where_its_rings_hold_the_window(request, fixture, device):
    """A checkpoint after 20 positions, put back over a live cache another sequence has filled, continues as a
    single run of the whole sequence does (a step of several tokens, then one at a time) at each position the rings
    still hold the window before; earlier positions are refused (``resumes_at``) and only position 0 is free."""
    path = request.getfixturevalue(fixture)
    # GPU prompt steps of 3 tokens: rings of n_swa + 2 rows, which the 20 positions wrap.
    engine = open_engine(request, path, device, prompt_step=3)
    try:
        c: Gemma4Config = engine.config
        step = 1 if device == "cpu" else engine.prompt_step
        ring = min(r for r, s in zip(c.kv_rows(CTX, step), c.swa, strict=True) if s)
        length = len(SEQUENCE)
        assert length > 3 * c.n_swa
        everything = SEQUENCE + TAIL
        want = engine.forward(everything, 0)
        engine.forward(SEQUENCE, 0, every=False)
        saved = engine.checkpoint(length)
        resumable = [n for n in range(length + 1) if engine.resumes_at(length, n)]
        # The ring of the last `ring` positions holds the n_swa - 1 before n from n = length - ring + n_swa - 1.
        assert resumable == [0, *range(length - ring + c.n_swa - 1, length + 1)]
        for n in resumable[1:]:
            engine.forward(TAIL * 4, 0, every=False)  # other keys in every row of every cache
            engine.restore(saved, n)
            got = [engine.forward(everything[n : length + 2], n)]
            got += [engine.forward([t], p) for p, t in enumerate(everything[length + 2 :], start=length + 2)]
            np.testing.assert_allclose(np.concatenate(got), want[n:], rtol=0, atol=1e-4)
        if device == "gpu":
            engine.forget(saved)
    finally:
        close(engine)
