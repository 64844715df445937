"""The sampler and the repetition penalty against references: numpy's softmax and transformers' processor."""

from __future__ import annotations

import numpy as np
import pytest

from anyformer_onnx.chat.sampling import Sampler, apply_repetition_penalty


def test_greedy_is_argmax_with_the_lowest_id_on_ties() -> None:
    logits = np.array([0.5, 2.0, -1.0, 2.0], dtype=np.float32)
    assert Sampler(0.0, 50, 1.0, None).choose(logits) == 1


def test_draws_follow_the_softmax_at_the_temperature() -> None:
    logits = np.array([1.0, 0.0, -1.0, 0.5, 2.0], dtype=np.float32)
    sampler = Sampler(0.7, 0, 1.0, seed=3)
    draws = np.bincount([sampler.choose(logits) for _ in range(20_000)], minlength=5) / 20_000
    expected = np.exp(logits / 0.7) / np.exp(logits / 0.7).sum()
    assert np.abs(draws - expected).max() < 0.015


def test_top_k_and_top_p_cut_the_tail() -> None:
    logits = np.array([3.0, 2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    top_k = {Sampler(1.0, 2, 1.0, seed=s).choose(logits) for s in range(200)}
    assert top_k == {0, 1}
    probabilities = np.exp(logits) / np.exp(logits).sum()  # 0.64, 0.23, 0.09, …
    top_p = {Sampler(1.0, 0, 0.8, seed=s).choose(logits) for s in range(200)}
    assert top_p == {0, 1}, probabilities


def test_the_same_seed_draws_the_same_tokens() -> None:
    logits = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    first = Sampler(1.0, 50, 0.9, seed=11)
    second = Sampler(1.0, 50, 0.9, seed=11)
    assert [first.choose(logits) for _ in range(50)] == [second.choose(logits) for _ in range(50)]


@pytest.mark.parametrize("penalty", [1.0, 1.3, 0.8])
def test_repetition_penalty_equals_transformers(penalty: float) -> None:
    import torch
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    rng = np.random.default_rng(1)
    logits = rng.normal(size=64).astype(np.float32)
    seen = [3, 5, 5, 60, 0]
    expected = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([seen]), torch.tensor(logits[None])).numpy()[0]
    mine = logits.copy()
    apply_repetition_penalty(mine, seen, penalty)
    assert np.array_equal(mine, expected)
