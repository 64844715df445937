"""The schedule's invariants, on a numpy stand-in denoiser (fast) and on the tiny ONNX graphs."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from kohra_fixtures import MASK_ID, fixture_repo

from anyformer_kohra.denoiser import CachedBlockDenoiser, FullSequenceDenoiser, GraphRunner, inspect_graph
from anyformer_kohra.ort_session import open_session
from anyformer_kohra.sampler import SamplerSettings, SamplerState, block_steps, sample_blocks, sample_mdlm

VOCAB = 40
FAKE_MASK = VOCAB - 1


class HashDenoiser:
    """Logits that depend on the tokens only, like a non-time-conditioned model; counts its calls."""

    time_conditioned = False

    def __init__(self) -> None:
        self.calls = 0
        self.context: list[int] = []

    def logits(self, tokens: np.ndarray, sigma: float) -> np.ndarray:
        self.calls += 1
        digest = hashlib.sha256(np.asarray(self.context + tokens.tolist(), dtype=np.int64).tobytes()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        return rng.normal(scale=3.0, size=(len(tokens), VOCAB)).astype(np.float32)

    def commit(self, tokens: np.ndarray) -> None:
        self.calls += 1
        self.context += tokens.tolist()


def _check_mdlm_run(states: list[SamplerState], mask_id: int, length: int) -> None:
    assert states, "the sampler yielded no state"
    before = np.full(length, mask_id)
    masked_counts = []
    for state in states:
        was_final = before != mask_id
        assert np.array_equal(state.ids[was_final], before[was_final]), "a final token changed"
        masked_counts.append(int(np.count_nonzero(state.ids == mask_id)))
        before = state.ids
    assert masked_counts == sorted(masked_counts, reverse=True), f"masked count rose: {masked_counts}"
    assert masked_counts[-1] == 0, "positions stayed masked at the end"
    assert states[-1].settled == length


@pytest.mark.parametrize("method", ["ancestral", "confidence"])
@pytest.mark.parametrize(("length", "steps", "temperature"), [(16, 16, 0.0), (16, 5, 1.0), (7, 40, 0.7), (1, 1, 0.0)])
def test_mdlm_masks_fall_to_zero_and_final_tokens_never_change(
    method: str, length: int, steps: int, temperature: float
) -> None:
    settings = SamplerSettings(FAKE_MASK, steps, method, temperature=temperature, seed=5)
    _check_mdlm_run(list(sample_mdlm(HashDenoiser(), length, settings)), FAKE_MASK, length)


@pytest.mark.parametrize(("length", "steps"), [(12, 12), (12, 3), (5, 10)])
def test_confidence_unmasks_on_the_linear_schedule(length: int, steps: int) -> None:
    settings = SamplerSettings(FAKE_MASK, steps, "confidence")
    states = list(sample_mdlm(HashDenoiser(), length, settings))
    # The loop ends once nothing is masked: a step after that would copy every token.
    expected = [length * (steps - 1 - i) // steps for i in range(steps)]
    expected = expected[: expected.index(0) + 1]
    assert [int(np.count_nonzero(s.ids == FAKE_MASK)) for s in states] == expected


def test_steps_that_change_nothing_skip_the_model_call() -> None:
    """ddpm_cache: with 4x more steps than tokens most steps unmask nothing and reuse the last output."""
    cached, plain = HashDenoiser(), HashDenoiser()
    settings = SamplerSettings(FAKE_MASK, 32, "confidence")
    with_cache = list(sample_mdlm(cached, 8, settings))
    without = list(sample_mdlm(plain, 8, SamplerSettings(FAKE_MASK, 32, "confidence", cache=False)))
    assert with_cache[-1].ids.tolist() == without[-1].ids.tolist()
    assert plain.calls == len(without) > 24, "without the cache every step calls the model"
    assert cached.calls == 8, "with it, one call per step that changed a token"


def test_a_time_conditioned_denoiser_never_reuses_an_output() -> None:
    denoiser = HashDenoiser()
    denoiser.time_conditioned = True
    states = list(sample_mdlm(denoiser, 4, SamplerSettings(FAKE_MASK, 12, "confidence")))
    assert denoiser.calls == len(states) > 4, "every step calls a time-conditioned model"


@pytest.mark.parametrize("method", ["ancestral", "confidence"])
@pytest.mark.parametrize(("length", "block", "steps"), [(12, 4, 12), (10, 4, 7), (9, 3, 30)])
def test_block_boundaries_hold(method: str, length: int, block: int, steps: int) -> None:
    settings = SamplerSettings(FAKE_MASK, steps, method, temperature=1.0, seed=2, block_size=block)
    denoiser = HashDenoiser()
    states = list(sample_blocks(denoiser, length, settings))
    previous = np.full(length, FAKE_MASK)
    for state in states:
        start = state.block * block
        end = min(start + block, length)
        assert np.array_equal(state.ids[:start], previous[:start]), "an earlier block changed"
        assert not np.any(previous[:start] == FAKE_MASK), "a block started before the one before it was done"
        assert np.all(state.ids[end:] == FAKE_MASK), "a later block was touched"
        assert state.settled in (start, end)
        previous = state.ids
    assert not np.any(previous == FAKE_MASK)
    blocks = -(-length // block)
    per_block = block_steps(steps, length, block)
    # Each block takes its steps (fewer once it is fully unmasked) plus at most one noise-removal step.
    assert {s.block for s in states} == set(range(blocks))
    assert len(states) <= blocks * (per_block + 1)
    assert states[-1].block == blocks - 1


@pytest.mark.parametrize("method", ["ancestral", "confidence"])
def test_seeds_repeat_and_differ(method: str) -> None:
    def run(seed: int) -> list[int]:
        settings = SamplerSettings(FAKE_MASK, 24, method, temperature=1.0, seed=seed)
        return list(sample_mdlm(HashDenoiser(), 24, settings))[-1].ids.tolist()

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_greedy_confidence_needs_no_seed() -> None:
    def run(seed: int | None) -> list[int]:
        return list(sample_mdlm(HashDenoiser(), 20, SamplerSettings(FAKE_MASK, 20, seed=seed)))[-1].ids.tolist()

    assert run(None) == run(None) == run(5)


@pytest.mark.parametrize("kind", ["mdlm", "bd3lm"])
def test_the_invariants_hold_on_the_onnx_graphs(kind: str) -> None:
    session, _ = open_session(fixture_repo(kind) / "onnx" / "model.onnx")
    runner = GraphRunner(session, inspect_graph(session, {}))
    prompt = np.array([257, 72, 105, 258, 10, 257, 97, 10])
    settings = SamplerSettings(
        MASK_ID, 10, "ancestral", temperature=1.0, seed=1, block_size=4 if kind == "bd3lm" else None
    )
    if kind == "mdlm":
        states = list(sample_mdlm(FullSequenceDenoiser(runner, prompt), 10, settings))
        _check_mdlm_run(states, MASK_ID, 10)
    else:
        states = list(sample_blocks(CachedBlockDenoiser(runner, prompt), 10, settings))
        assert not np.any(states[-1].ids == MASK_ID)
    again = list(sample_mdlm(FullSequenceDenoiser(runner, prompt), 10, settings)) if kind == "mdlm" else None
    if again is not None:
        assert again[-1].ids.tolist() == states[-1].ids.tolist(), "the same seed gave another answer"


@pytest.mark.parametrize("method", ["ancestral", "confidence"])
def test_sampling_in_row_chunks_draws_the_same_as_one_block(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunking bounds memory without changing a single draw: the answer is the same for any chunk size."""
    import anyformer_kohra.sampler as sampler

    def run() -> list[int]:
        settings = SamplerSettings(FAKE_MASK, 9, method, temperature=0.8, seed=4)
        return list(sample_mdlm(HashDenoiser(), 30, settings))[-1].ids.tolist()

    whole = run()
    monkeypatch.setattr(sampler, "CHUNK_VALUES", VOCAB * 4)  # four rows a chunk
    assert run() == whole
