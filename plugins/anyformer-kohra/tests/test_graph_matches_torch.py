"""One denoising step: the ONNX graph, fed by kohra's GraphRunner, gives the torch model's logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kohra_fixtures import BLOCK_SIZE, MASK_ID, VOCAB, fixture_repo, torch_model
from reference_sampler import block_causal_bias

from anyformer_kohra.attention_masks import block_causal, block_segments
from anyformer_kohra.denoiser import (
    CachedBlockDenoiser,
    FullSequenceDenoiser,
    GraphRunner,
    RecomputedBlockDenoiser,
    inspect_graph,
)
from anyformer_kohra.ort_session import open_session
from anyformer_kohra.sampler import SamplerSettings, sample_blocks

TOLERANCE = 1e-4


def _runner(kind: str) -> GraphRunner:
    session, provider = open_session(fixture_repo(kind) / "onnx" / "model.onnx")
    assert provider == "CPUExecutionProvider"
    return GraphRunner(session, inspect_graph(session, {}))


def _noisy(length: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 256, length)
    ids[rng.random(length) < 0.5] = MASK_ID
    return ids


@pytest.mark.parametrize("kind", ["mdlm", "mdlm-tc"])
def test_one_mdlm_step_matches_torch(kind: str) -> None:
    runner = _runner(kind)
    assert runner.time_conditioned == (kind == "mdlm-tc")
    prompt, answer = _noisy(9, 1), _noisy(11, 2)
    sigma = 2.5
    got = FullSequenceDenoiser(runner, prompt).logits(answer, sigma)
    with torch.no_grad():
        ids = torch.from_numpy(np.concatenate([prompt, answer]))[None]
        timed = torch.tensor([sigma], dtype=torch.float32) if kind == "mdlm-tc" else None
        want = torch_model(kind)(ids, timed)[0][0, len(prompt) :].numpy()
    assert got.shape == (11, VOCAB)
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)


def test_time_conditioning_changes_the_logits() -> None:
    """The time input is really fed: sigma moves the output of the time-conditioned graph."""
    denoiser = FullSequenceDenoiser(_runner("mdlm-tc"), _noisy(5, 3))
    answer = _noisy(6, 4)
    assert np.abs(denoiser.logits(answer, 0.1) - denoiser.logits(answer, 5.0)).max() > 1e-3


def test_one_block_step_against_the_cache_matches_torch() -> None:
    runner = _runner("bd3lm")
    assert runner.spec.has_cache and len(runner.spec.cache) == 2
    prompt, first, block = _noisy(7, 5), np.arange(65, 69), _noisy(4, 6)
    denoiser = CachedBlockDenoiser(runner, prompt)
    denoiser.commit(first)
    got = denoiser.logits(block, 1.0)
    assert denoiser.calls == 3
    with torch.no_grad():
        model = torch_model("bd3lm")
        _, cache = model(torch.from_numpy(prompt)[None])
        _, cache = model(torch.from_numpy(first)[None], None, cache)
        want = model(torch.from_numpy(block)[None], None, cache)[0][0].numpy()
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)


def test_the_block_graph_is_block_causal() -> None:
    """A finished block's logits do not depend on the later noisy block: the cache holds its clean states."""
    runner = _runner("bd3lm")
    prompt = _noisy(5, 7)
    one = CachedBlockDenoiser(runner, prompt)
    first = one.logits(np.arange(70, 74), 1.0)
    two = CachedBlockDenoiser(runner, prompt)
    two.commit(np.arange(70, 74))
    # The prompt's and first block's cached keys are the same whatever comes next.
    three = CachedBlockDenoiser(runner, prompt)
    three.commit(np.arange(70, 74))
    np.testing.assert_allclose(two.logits(np.full(4, MASK_ID), 1.0), three.logits(np.full(4, MASK_ID), 1.0))
    assert first.shape == (4, VOCAB)


def test_one_recomputed_block_step_matches_torch_and_the_cache() -> None:
    """A mask-only graph: the prompt, a finished block and the noisy block, run block-causally in one call."""
    runner = _runner("bd3lm-mask")
    assert not runner.spec.has_cache and runner.spec.can_recompute_blocks
    prompt, first, block = _noisy(7, 5), np.arange(65, 69), _noisy(4, 6)
    denoiser = RecomputedBlockDenoiser(runner, prompt)
    denoiser.commit(first)
    got = denoiser.logits(block, 1.0)
    assert denoiser.calls == 1, "the prompt and the commit cost no call without a cache"
    with torch.no_grad():
        ids = torch.from_numpy(np.concatenate([prompt, first, block]))[None]
        logits = torch_model("bd3lm-mask")(ids, None, None, block_causal_bias(7, [4, 4]))[0]
        want = logits[0, -4:].numpy()
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)
    cached = CachedBlockDenoiser(_runner("bd3lm"), prompt)
    cached.commit(first)
    np.testing.assert_allclose(got, cached.logits(block, 1.0), atol=TOLERANCE, rtol=0)


def test_the_mask_really_makes_attention_block_causal() -> None:
    """Without the mask the prompt would see the noisy block: changing the block must not move earlier logits."""
    runner = _runner("bd3lm-mask")
    prompt = _noisy(6, 8)
    denoiser = RecomputedBlockDenoiser(runner, prompt)
    denoiser.commit(np.arange(70, 74))
    a = denoiser.logits(np.full(4, MASK_ID), 1.0)
    b = denoiser.logits(np.arange(80, 84), 1.0)
    assert np.abs(a - b).max() > 1e-2, "the block's own tokens must move its logits"
    # The whole-sequence logits of the finished part do not depend on the current block.
    sequence = np.concatenate([prompt, np.arange(70, 74)])
    allowed = block_causal(block_segments(6, [4, 4]))
    one, _ = runner.run(np.concatenate([sequence, np.full(4, MASK_ID)]), 1.0, None, allowed)
    two, _ = runner.run(np.concatenate([sequence, np.arange(80, 84)]), 1.0, None, allowed)
    np.testing.assert_allclose(one[:10], two[:10], atol=TOLERANCE, rtol=0)
    full, _ = runner.run(np.concatenate([sequence, np.arange(80, 84)]), 1.0, None)
    assert np.abs(full[:10] - two[:10]).max() > 1e-2, "with every key visible the prompt sees the block"


class _Recording:
    """Wraps a block denoiser and keeps every logits array it returns."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner
        self.time_conditioned = inner.time_conditioned
        self.seen: list[np.ndarray] = []

    @property
    def calls(self) -> int:
        return self.inner.calls

    def logits(self, tokens: np.ndarray, sigma: float) -> np.ndarray:
        self.seen.append(self.inner.logits(tokens, sigma))
        return self.seen[-1]

    def commit(self, tokens: np.ndarray) -> None:
        self.inner.commit(tokens)


@pytest.mark.parametrize("method", ["ancestral", "confidence"])
def test_one_graph_with_both_a_cache_and_a_mask_gives_the_same_answer_either_way(method: str) -> None:
    runner = _runner("bd3lm-both")
    assert runner.spec.has_cache and runner.spec.can_recompute_blocks
    prompt = _noisy(9, 9)
    prompt[prompt == MASK_ID] = 10
    settings = SamplerSettings(
        MASK_ID, 24, method, temperature=1.0 if method == "ancestral" else 0.0, seed=11, block_size=BLOCK_SIZE
    )
    cached = _Recording(CachedBlockDenoiser(runner, prompt))
    recomputed = _Recording(RecomputedBlockDenoiser(runner, prompt))
    a = list(sample_blocks(cached, 14, settings))
    b = list(sample_blocks(recomputed, 14, settings))
    assert [s.ids.tolist() for s in a] == [s.ids.tolist() for s in b]
    assert len(cached.seen) == len(recomputed.seen) > 4
    for x, y in zip(cached.seen, recomputed.seen, strict=True):
        np.testing.assert_allclose(x, y, atol=TOLERANCE, rtol=0)
