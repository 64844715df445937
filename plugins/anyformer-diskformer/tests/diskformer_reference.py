"""llama.cpp's logits for one prompt and its greedy continuation: the reference every engine test compares with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from llama_cpp import Llama

PROMPT = [1, 60, 75, 82, 9, 100, 71, 12]
STEPS = 32
CTX = 64
#: The fixtures both engines are checked on, with their logit tolerances (test_cpu_engine says why: F32 weights differ
#: from llama.cpp only in summation order, F16 ones by llama.cpp rounding activations to f16).
WGPU_CASES = [
    ("moe_f32", 1e-4),
    ("moe_top4", 5e-3),
    ("qwen2moe_f32", 1e-4),
    ("bailingmoe_f32", 1e-4),
    ("bailingmoe2_f32", 1e-4),
    ("bailingmoe2_f16", 5e-3),
    ("qwen35moe_f32", 1e-4),
    ("qwen35moe_alternating", 1e-4),
]
#: The CPU engine's: the same.
CPU_CASES = WGPU_CASES
#: The Gemma 4 fixtures both engines are checked on (against llama.cpp with its f16 GELU table reproduced on the
#: CPU; on wgpu against the CPU engine and llama.cpp, see test_gpu_engine).
GEMMA4_CASES = ["gemma4_f32", "gemma4_dense_layer"]
#: How far the engines' exact GELU leaves the logits from llama.cpp's CPU build, which looks GELU up in a table of
#: f16 results by the input rounded to f16 (measured 3.3e-3 on gemma4_f32, 6.9e-3 on gemma4_dense_layer).
EXACT_GELU_TOLERANCE = 1e-2


def greedy_steps(forward: Callable[[list[int], int], np.ndarray], steps: int = STEPS) -> tuple[np.ndarray, list[int]]:
    """An engine's logits (``forward(ids, start)``) for the prompt and each of ``steps`` greedy tokens, and those
    tokens: the steps :func:`llama_steps` takes."""
    rows = [forward(PROMPT, 0)]
    tokens = []
    for step in range(steps):
        token = int(np.argmax(rows[-1][-1]))
        tokens.append(token)
        rows.append(forward([token], len(PROMPT) + step))
    return np.concatenate(rows), tokens


def llama_steps(path: str) -> tuple[np.ndarray, list[int]]:
    """llama.cpp's logits for the prompt and each of ``STEPS`` greedy tokens, and those tokens."""
    llm = Llama(path, n_ctx=CTX, logits_all=True, type_k=0, type_v=0, verbose=False, seed=0)
    llm.eval(PROMPT)
    rows = [np.array(llm.scores[: len(PROMPT)])]
    tokens = []
    for _ in range(STEPS):
        token = int(np.argmax(rows[-1][-1]))
        tokens.append(token)
        llm.eval([token])
        rows.append(np.array(llm.scores[llm.n_tokens - 1 : llm.n_tokens]))
    llm.close()
    return np.concatenate(rows), tokens


def open_or_skip(path: str, context: int = 64, **options: object) -> Any:
    """A :class:`~anyformer_diskformer.model.DiskformerModel` over ``path`` with load ``options``; a GPU load where
    wgpu finds no adapter skips the test (CI's lavapipe has one), any other failure raises."""
    import pytest

    import anyformer
    from anyformer import AnyformerError, ErrorCode, Request
    from anyformer_diskformer.model import DiskformerModel

    try:
        return DiskformerModel.open(anyformer.describe(path), Request(context=context, options=options), lambda e: None)
    except AnyformerError as exc:
        if options.get("device") == "gpu" and exc.code is ErrorCode.BACKEND_CRASHED:
            pytest.skip(f"no GPU adapter for wgpu: {exc}")
        raise


def gpu_engine_for(gpu: Any, path: str, slots: int | None, trace: Any = None, **kw: Any) -> Any:
    """The wgpu engine of ``path``'s architecture, its cache holding ``slots`` experts (None: every one)."""
    from anyformer_diskformer.arch.registry import read_moe_config
    from anyformer_diskformer.cache.expert_cache import ExpertCache
    from anyformer_diskformer.engine_choice import gpu_engine_class
    from anyformer_gguf_gpu.gguf_file import GGUFFile

    gguf = GGUFFile(path)
    config = read_moe_config(gguf.header)

    def make_cache(store: Any) -> Any:
        capacity = store.slot_bytes * (slots or config.n_layer * config.n_expert)
        return ExpertCache(path, gguf, config.n_layer, config.n_expert, capacity, store=store)

    try:
        return gpu_engine_class(config)(gpu, gguf, config, make_cache, CTX, trace, **kw)
    finally:
        gguf.close()


def assert_cache_within_budget(engine: Any, n_expert_used: int, evicting: bool) -> None:
    """After a run: the expert cache held no more than its capacity; a cache of one layer's top-k (``evicting``) made
    that many slots and evicted, a cache of every expert hit and never evicted."""
    stats = engine.cache.stats
    assert engine.cache.held_bytes <= engine.cache.capacity_bytes
    if evicting:
        assert len(engine.slots._slots) == n_expert_used
        assert stats.evictions > 0
    else:
        assert stats.evictions == 0 and stats.hits > 0
