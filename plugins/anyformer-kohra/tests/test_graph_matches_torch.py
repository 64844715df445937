"""One denoising step: the ONNX graph, fed by kohra's GraphRunner, gives the torch model's logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kohra_fixtures import MASK_ID, VOCAB, fixture_repo, torch_model

from anyformer_kohra.denoiser import CachedBlockDenoiser, FullSequenceDenoiser, GraphRunner, inspect_graph
from anyformer_kohra.ort_session import open_session

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
