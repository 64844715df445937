"""fp16 and q4f16 graphs: every fixture graph converted to fp16 (inputs and outputs too) runs and answers like fp32.

The conversion is onnxruntime's own (``onnxruntime.transformers.float16``, ``keep_io_types=False``), so
``sigma``, the 4-D ``attention_mask``, the key/value cache and the logits are all fp16: kohra must feed
each input in the graph's type and read the logits back as float32.

How close fp16 can be: fp16 keeps 11 significant bits, so at the tiny models' logit magnitudes (up to
about 30, where fp16 values are 1/64 apart) one rounding is up to 0.008 and two layers of them give a
measured 0.013-0.014. :data:`LOGIT_TOLERANCE` allows 0.05. A sampled token then differs only when two
choices were within that much of each other in fp32; the ancestral sampler's Gumbel draws make that
rare, so its whole answers must be equal; the confidence sampler ranks positions whose confidences
can be nearly equal, so each of its steps must either agree or differ only at such a near tie.

The q4f16 graph (4-bit RTN weights, fp16 activations) is what kohra picks on the CPU when a repo has
one; 4-bit weights move the logits far more than fp16 does (measured: up to 1.3 on logits up to 28,
correlation 0.999, 95% of arg-max tokens the same), so it is checked for running end to end and for
logits that follow fp32's closely, not for fp32's tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import numpy as np
import pytest
from kohra_fixtures import BLOCK_SIZE, FP16_GRAPH, KINDS, MASK_ID, Q4F16_GRAPH, fixture_repo, q4f16_copy

import anyformer
from anyformer_kohra import plugin
from anyformer_kohra.denoiser import (
    CachedBlockDenoiser,
    FullSequenceDenoiser,
    GraphRunner,
    RecomputedBlockDenoiser,
    inspect_graph,
)
from anyformer_kohra.ort_session import open_session
from anyformer_kohra.sampler import SamplerSettings, confidence_update, sample_blocks, sample_mdlm, sigma_of

LOGIT_TOLERANCE = 0.05
PROMPTS = (
    np.array([257, 72, 105, 33, 258, 10, 257, 97, 10]),
    np.array([257, 117, 115, 101, 114, 10, 87, 104, 121, 63, 258, 10, 257, 97, 10]),
)
HELLO = [{"role": "user", "content": "Say something."}]


@functools.cache
def _runner(kind: str, graph: str) -> GraphRunner:
    session, _ = open_session(fixture_repo(kind) / graph)
    return GraphRunner(session, inspect_graph(session, {}))


def _denoiser(kind: str, graph: str, prompt: np.ndarray):  # type: ignore[no-untyped-def]
    runner = _runner(kind, graph)
    if not KINDS[kind].kv_cache and not KINDS[kind].mask_input:
        return FullSequenceDenoiser(runner, prompt)
    return CachedBlockDenoiser(runner, prompt) if runner.spec.has_cache else RecomputedBlockDenoiser(runner, prompt)


def _answer(kind: str, graph: str, prompt: np.ndarray, settings: SamplerSettings, length: int) -> list[int]:
    denoiser = _denoiser(kind, graph, prompt)
    if isinstance(denoiser, FullSequenceDenoiser):
        states = list(sample_mdlm(denoiser, length, settings))
    else:
        states = list(sample_blocks(denoiser, length, dataclasses.replace(settings, block_size=BLOCK_SIZE)))
    return states[-1].ids.tolist()


@pytest.mark.parametrize("kind", list(KINDS))
def test_fp16_inputs_and_outputs_are_fed_and_read_in_their_own_type(kind: str) -> None:
    spec = _runner(kind, FP16_GRAPH).spec
    config = KINDS[kind]
    assert _runner(kind, FP16_GRAPH).session.get_outputs()[0].type == "tensor(float16)"
    if config.time_conditioning:
        assert spec.time_dtype == np.float16
    if config.kv_cache:
        assert spec.cache_dtype == np.float16
    if config.mask_input:
        assert spec.mask_is_4d and spec.mask_dtype == np.float16
    prompt = PROMPTS[0]
    answer = np.array([65, MASK_ID, 66, MASK_ID])
    half, full = _denoiser(kind, FP16_GRAPH, prompt), _denoiser(kind, "onnx/model.onnx", prompt)
    if hasattr(half, "commit"):
        half.commit(np.arange(70, 74))
        full.commit(np.arange(70, 74))
    got, want = half.logits(answer, 1.5), full.logits(answer, 1.5)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=LOGIT_TOLERANCE, rtol=0)
    assert np.abs(got - want).max() > 0, "the fp16 graph gave fp32's exact logits: it is not computing in fp16"


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fp16_gives_the_fp32_answer_with_the_ancestral_sampler(kind: str, seed: int) -> None:
    settings = SamplerSettings(MASK_ID, 16, "ancestral", temperature=1.0, seed=seed)
    for prompt in PROMPTS:
        assert _answer(kind, FP16_GRAPH, prompt, settings, 12) == _answer(kind, "onnx/model.onnx", prompt, settings, 12)


def _near_tie(high: float, low: float, delta: float) -> bool:
    """True when fp32 values ``high`` > ``low`` may swap order under logit errors of at most ``delta``.

    Each logit moves by at most delta, so each softmax probability by a factor within exp(+-2 delta),
    and two probabilities can trade places only when their ratio is below exp(4 delta).
    """
    return high <= low * math.exp(4 * delta)


@pytest.mark.parametrize("kind", ["mdlm", "mdlm-tc"])
@pytest.mark.parametrize(("length", "steps"), [(16, 16), (32, 8), (8, 8)])
def test_fp16_confidence_steps_agree_with_fp32_but_at_near_ties(kind: str, length: int, steps: int) -> None:
    """Step by step from fp32's states: each fp16 choice equals fp32's, or fp32's choice was a near tie."""
    settings = SamplerSettings(MASK_ID, steps, "confidence")
    rng = np.random.default_rng(0)  # unused at temperature 0; the update's signature takes one
    for prompt in PROMPTS:
        half = FullSequenceDenoiser(_runner(kind, FP16_GRAPH), prompt)
        full = FullSequenceDenoiser(_runner(kind, "onnx/model.onnx"), prompt)
        x = np.full(length, MASK_ID)
        grid = np.linspace(1.0, 1e-5, steps + 1)
        for i in range(steps):
            sigma = sigma_of(float(grid[i]))
            logits32, logits16 = full.logits(x, sigma), half.logits(x, sigma)
            delta = float(np.abs(logits32 - logits16).max())
            assert delta <= LOGIT_TOLERANCE
            count = int(np.count_nonzero(x == MASK_ID)) - length * (steps - 1 - i) // steps
            a = confidence_update(x, logits32, count, settings, rng)
            b = confidence_update(x, logits16, count, settings, rng)
            probs = np.exp(logits32.astype(np.float64) - logits32.max(axis=-1, keepdims=True))
            probs[:, MASK_ID] = 0
            probs /= probs.sum(axis=-1, keepdims=True)
            confidence = probs.max(axis=-1)
            only32, only16 = np.flatnonzero((a != x) & (b == x)), np.flatnonzero((b != x) & (a == x))
            for kept, other in zip(only32, only16, strict=True):
                assert _near_tie(confidence[kept], confidence[other], delta), (kind, i, kept, other)
            both = np.flatnonzero((a != x) & (b != x))
            for position in both[a[both] != b[both]]:
                top = np.sort(probs[position])[::-1]
                assert _near_tie(top[0], top[1], delta), (kind, i, position)
            x = a


@pytest.mark.parametrize("kind", ["mdlm-tc", "bd3lm", "bd3lm-mask"])
def test_an_fp16_provider_loads_the_fp16_graph_and_answers_like_fp32(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo: Path = fixture_repo(kind)
    options = {"max_new_tokens": 12, "temperature": 1.0, "seed": 5}
    with anyformer.load(str(repo), backend="kohra") as on_cpu:
        # On the CPU provider the fp32 graph is chosen although the fp16 one sits beside it.
        assert on_cpu.handle.runner.session.get_outputs()[0].type == "tensor(float)"
        want = on_cpu.complete(HELLO, **options).text
    monkeypatch.setattr(plugin, "handles_fp16", lambda provider: True)
    with anyformer.load(str(repo), backend="kohra") as half:
        assert half.handle.runner.session.get_outputs()[0].type == "tensor(float16)"
        assert half.complete(HELLO, **options).text == want


@pytest.mark.parametrize("kind", ["mdlm", "bd3lm"])
def test_the_q4f16_graph_is_chosen_on_the_cpu_and_runs(kind: str, tmp_path: Path) -> None:
    folder = q4f16_copy(kind, tmp_path / kind)
    with anyformer.load(str(folder), backend="kohra") as loaded:
        runner = loaded.handle.runner
        assert runner.session.get_outputs()[0].type == "tensor(float16)"
        assert {i.type for i in runner.session.get_inputs()} <= {"tensor(int64)", "tensor(float16)"}
        options = {"max_new_tokens": 12, "temperature": 1.0, "seed": 2}
        first = loaded.complete(HELLO, **options)
        assert first.text == loaded.complete(HELLO, **options).text
        assert first.finish_reason in ("stop", "length") and 0 < first.tokens <= 12
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 256, 40)
    ids[rng.random(40) < 0.5] = MASK_ID
    quantized = _runner(kind, "onnx/model.onnx")
    session, _ = open_session(folder / Q4F16_GRAPH)
    q4 = GraphRunner(session, inspect_graph(session, {}))
    want, _ = quantized.run(ids, 1.0, None)
    got, _ = q4.run(ids, 1.0, None)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.99
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.8
