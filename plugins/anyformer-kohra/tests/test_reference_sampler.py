"""Whole generations: kohra's numpy loop on the ONNX graph equals the torch port of the reference sampler."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from kohra_fixtures import BLOCK_SIZE, MASK_ID, fixture_repo, torch_model
from reference_sampler import bd3lm_recompute_sample, bd3lm_sample, mdlm_sample

from anyformer_kohra.denoiser import (
    CachedBlockDenoiser,
    FullSequenceDenoiser,
    GraphRunner,
    RecomputedBlockDenoiser,
    inspect_graph,
)
from anyformer_kohra.ort_session import open_session
from anyformer_kohra.sampler import SamplerSettings, block_steps, sample_blocks, sample_mdlm

PROMPT = [257, 117, 115, 101, 114, 10, 72, 105, 33, 258, 10, 257, 97, 10]


@functools.cache
def _runner(kind: str) -> GraphRunner:
    session, _ = open_session(fixture_repo(kind) / "onnx" / "model.onnx")
    return GraphRunner(session, inspect_graph(session, {}))


@functools.cache
def _torch(kind: str):  # type: ignore[no-untyped-def]
    return torch_model(kind)


def _last(states) -> tuple[list[int], int]:  # type: ignore[no-untyped-def]
    last = list(states)[-1]
    return last.ids.tolist(), last.model_calls


@pytest.mark.parametrize("kind", ["mdlm", "mdlm-tc"])
@pytest.mark.parametrize(("seed", "length", "steps"), [(0, 12, 12), (7, 10, 4), (3, 6, 20)])
def test_mdlm_ancestral_matches_the_reference_with_and_without_the_cache(
    kind: str, seed: int, length: int, steps: int
) -> None:
    want = mdlm_sample(_torch(kind), PROMPT, length, steps, MASK_ID, seed)
    results = {}
    for cache in (True, False):
        settings = SamplerSettings(MASK_ID, steps, "ancestral", temperature=1.0, seed=seed, cache=cache)
        denoiser = FullSequenceDenoiser(_runner(kind), np.array(PROMPT))
        results[cache] = _last(sample_mdlm(denoiser, length, settings))
    assert results[True][0] == want
    assert results[False][0] == want
    if kind == "mdlm-tc":
        assert results[True][1] == results[False][1], "a time-conditioned graph can never reuse an output"
    elif steps > length:
        assert results[True][1] < results[False][1], "steps that unmask nothing must skip the model call"


@pytest.mark.parametrize(("seed", "length", "steps"), [(0, 12, 12), (3, 10, 30)])
def test_bd3lm_ancestral_matches_the_reference(seed: int, length: int, steps: int) -> None:
    per_block = block_steps(steps, length, BLOCK_SIZE)
    want = bd3lm_sample(_torch("bd3lm"), PROMPT, length, per_block, BLOCK_SIZE, MASK_ID, seed)
    settings = SamplerSettings(MASK_ID, steps, "ancestral", temperature=1.0, seed=seed, block_size=BLOCK_SIZE)
    got, _ = _last(sample_blocks(CachedBlockDenoiser(_runner("bd3lm"), np.array(PROMPT)), length, settings))
    assert got == want


@pytest.mark.parametrize(("seed", "length", "steps"), [(0, 12, 12), (3, 10, 18), (5, 9, 3)])
def test_bd3lm_without_a_cache_matches_the_reference_and_the_cached_graph(seed: int, length: int, steps: int) -> None:
    """The recompute path (mask-only graph) equals the torch recompute reference and the key/value path."""
    per_block = block_steps(steps, length, BLOCK_SIZE)
    want = bd3lm_recompute_sample(_torch("bd3lm-mask"), PROMPT, length, per_block, BLOCK_SIZE, MASK_ID, seed)
    settings = SamplerSettings(MASK_ID, steps, "ancestral", temperature=1.0, seed=seed, block_size=BLOCK_SIZE)
    got, calls = _last(
        sample_blocks(RecomputedBlockDenoiser(_runner("bd3lm-mask"), np.array(PROMPT)), length, settings)
    )
    assert got == want
    # The same weights with a key/value cache (test_bd3lm_ancestral_matches_the_reference checks that path).
    cached, cached_calls = _last(
        sample_blocks(CachedBlockDenoiser(_runner("bd3lm"), np.array(PROMPT)), length, settings)
    )
    assert cached == want
    # Recomputing costs no prompt call and no commit calls: the cached path makes one of each, per block.
    blocks = -(-length // BLOCK_SIZE)
    assert cached_calls == calls + 1 + (blocks - 1)
