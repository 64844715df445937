"""Every pipeline is compiled and every bind group and buffer made at load (with progress): generating makes none.

After an engine is built, the wgpu device's shader-module, compute-pipeline, bind-group and buffer
constructors are counted while the engine prefills and decodes: greedy and sampled (temperature,
top-k, top-p), prompts of whole and partial ``max_batch`` steps (1, 7, 63, 64, 65 and 130 tokens
with steps of 64), decode steps alone and several in one submission, every token's logits, and
attention split along the sequence. ``SPLIT_FROM`` is lowered before the load (an engine reads it
when built) so that short contexts reach the split steps. The load's ``compile`` progress is
checked against the pipelines it actually compiles, as they are compiled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from anyformer_gguf_gpu import kernels, lfm2, transformer
from anyformer_gguf_gpu.decode import greedy, sampled
from anyformer_gguf_gpu.engines import open_engine
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.gpu import GPU
from anyformer_gguf_gpu.testing import BINDERS, COMPILERS, RandomModel, compiles_counted, write_random_gguf
from anyformer_gguf_gpu.testing_lfm2 import RandomLfm2, write_random_lfm2_gguf
from anyformer_gguf_gpu.transformer import TransformerEngine

#: One engine of each kind of step program: llama (rotary in the q/k/v projection), llama with heads of 10
#: (scalar attention, a rotary dispatch of its own), qwen3 (q/k norms, rotary inside attention), lfm2.
MODELS: dict[str, Callable[[str], None]] = {
    "llama": lambda path: write_random_gguf(path, RandomModel()),
    "llama-headdim10-f32": lambda path: write_random_gguf(path, RandomModel(quant="F32", head_dim=10)),
    "qwen3": lambda path: write_random_gguf(path, RandomModel(architecture="qwen3")),
    "lfm2": lambda path: write_random_lfm2_gguf(path, RandomLfm2()),
    # A GPU's one-token products take a layout per matrix (forced on lavapipe in _load), the head's own too.
    "llama@gpu-layouts": lambda path: write_random_gguf(path, RandomModel(n_vocab=kernels.WIDE_ROWS + 5)),
    "lfm2@gpu-layouts": lambda path: write_random_lfm2_gguf(path, RandomLfm2()),
}
#: What generating must not call: compilers, and the constructors of bind groups and buffers.
MADE = (*COMPILERS, *BINDERS)
CTX = 48
MAX_BATCH = 4
#: Keys past which attention splits, for these engines: decode steps cross it, and so does a 20-token prompt.
SPLIT_AT = 16
#: 11 tokens: prefill steps of 4, 4 and 3 tokens, none split; 12 new tokens then cross SPLIT_AT.
PROMPT = [5, 77, 100, 3, 250, 9, 1, 40, 41, 42, 7]
#: 20 tokens: five steps of 4, the last (20 keys) split.
LONG_PROMPT = [*PROMPT, 60, 61, 62, 63, 64, 65, 66, 67, 68]
#: Prompt lengths for the engines' own step of 64 tokens: one token, a partial step, a whole one, one past it...
LENGTHS = (1, 7, 63, 64, 65, 130)
#: ...in a context that holds the longest and a few new tokens, split from 100 keys (130's last steps split).
LONG_CTX, LONG_SPLIT_AT = 140, 100

Events = list[tuple[str, int, int, int]]


def _load(
    kind: str, gpu: GPU, path: str, monkeypatch: pytest.MonkeyPatch, *, ctx: int, max_batch: int, split_at: int
) -> tuple[TransformerEngine, Events]:
    """An engine loaded with ``split_at``, and its progress events with the pipelines compiled when each came."""
    MODELS[kind](path)
    monkeypatch.setattr(transformer, "SPLIT_FROM", split_at)
    monkeypatch.setattr(lfm2, "SPLIT_FROM", split_at)
    if kind.endswith("@gpu-layouts"):
        monkeypatch.setattr(kernels, "default_threads_per_row", lambda gpu: 32)
    events: Events = []
    with compiles_counted(gpu.device) as made:

        def report(what: str, done: int, total: int) -> None:
            events.append((what, done, total, sum(m.startswith("create_compute_pipeline(") for m in made)))

        with GGUFFile(path) as gguf:
            engine = open_engine(gpu, gguf, ctx=ctx, max_batch=max_batch, kv_f16=False, progress=report)
    return engine, events


@pytest.fixture(params=list(MODELS))
def loaded(
    request: pytest.FixtureRequest, gpu: GPU, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[TransformerEngine, Events]]:
    """An engine of steps of MAX_BATCH loaded with SPLIT_AT, and the progress events its load reported."""
    path = str(tmp_path / f"{request.param}.gguf")
    engine, events = _load(request.param, gpu, path, monkeypatch, ctx=CTX, max_batch=MAX_BATCH, split_at=SPLIT_AT)
    yield engine, events
    engine.release()


def test_the_load_reports_each_compile_as_it_happens(loaded):
    """Each ``compile`` event comes after exactly ``done`` pipelines were compiled, and the last one's total is
    every pipeline the load compiled (lfm2's convolution included)."""
    _, events = loaded
    compiles = [(done, total, made) for what, done, total, made in events if what == "compile"]
    assert compiles, "the load reports its compilation"
    assert [made for _, _, made in compiles] == [done for done, _, _ in compiles]
    done, total, _ = compiles[-1]
    pipelines = events[-1][3]
    assert done == total == pipelines > 0, f"{done}/{total} reported, {pipelines} compiled"
    binds = [(done, total) for what, done, total, _ in events if what == "bind"]
    assert binds and binds[-1][0] == binds[-1][1], "the load reports its binding to the end"


def test_generating_compiles_and_binds_nothing_after_load(loaded, gpu, monkeypatch):
    engine, _ = loaded
    assert engine.split_from == SPLIT_AT
    steps: set[tuple[bool, bool, bool]] = set()  # (several tokens, split, sampled at a temperature) of each step
    program = engine.program

    def spy(tokens: int, **kw: Any) -> Any:
        steps.add((tokens > 1, bool(kw.get("split")), engine.stochastic))
        return program(tokens, **kw)

    monkeypatch.setattr(engine, "program", spy)
    with compiles_counted(gpu.device, MADE) as made:
        for prompt, new in ((PROMPT, 12), (LONG_PROMPT, 5)):
            assert len(list(greedy(engine, prompt, new))) == new
            drawn = sampled(engine, prompt, new, temperature=0.8, seed=5, top_k=20, top_p=0.9)
            assert len(list(drawn)) == new
        engine.all_logits(PROMPT)  # every token's logits (the checks' path): the head over several tokens

    assert made == [], f"made after load: {made}"
    every = {(several, split, hot) for several in (False, True) for split in (False, True) for hot in (False, True)}
    assert steps >= every, f"steps not reached: {every - steps}"


def _one_token_logits(engine: TransformerEngine, ids: list[int]) -> np.ndarray:
    """Every position's logits from one-token steps (programs bound at load in their own shape)."""
    engine.set_ids(ids)
    rows = []
    for pos in range(len(ids)):
        engine.submit_step(pos, 1, head=True, sample=False)
        rows.append(engine.read_logits()[0])
    return np.stack(rows)


@pytest.mark.parametrize("kind", list(MODELS))
def test_prompts_of_any_length_make_nothing_and_keep_the_logits(kind, gpu, tmp_path, monkeypatch):
    """Steps of 64 tokens: prompts of 1, 7, 63, 64, 65 and 130 tokens, greedy, sampled and every token's logits,
    create no shader, pipeline, bind group or buffer; every shape's logits equal one-token steps'."""
    path = str(tmp_path / f"{kind}.gguf")
    engine, _ = _load(kind, gpu, path, monkeypatch, ctx=LONG_CTX, max_batch=64, split_at=LONG_SPLIT_AT)
    try:
        rng = np.random.default_rng(3)
        prompts = {n: [int(i) for i in rng.integers(3, engine.config.n_vocab, size=n)] for n in LENGTHS}
        every_token: dict[int, np.ndarray] = {}
        with compiles_counted(gpu.device, MADE) as made:
            for n, prompt in prompts.items():
                assert len(list(greedy(engine, prompt, 4))) == 4
                assert len(list(sampled(engine, prompt, 4, temperature=0.7, seed=n, top_k=10, top_p=0.9))) == 4
                every_token[n] = engine.all_logits(prompt)
        assert made == [], f"made after load: {made}"
        # The rewritten uniform blocks are right: each shape's logits equal those of one-token steps.
        reference = _one_token_logits(engine, prompts[max(LENGTHS)])
        bound = 3e-5 * float(np.abs(reference).max()) + 1e-5
        for n in (7, 63, 130):
            ours = every_token[n]
            assert ours.shape == (n, engine.config.n_vocab)
            exact = reference if n == max(LENGTHS) else _one_token_logits(engine, prompts[n])
            np.testing.assert_allclose(ours, exact, rtol=0, atol=bound, err_msg=f"{n} tokens")
        for n in (63, 65, 130):  # prefill's last step: the head over its last token (a step of 63, 1 and 2)
            engine.prefill(prompts[n])
            np.testing.assert_allclose(engine.read_logits()[0], every_token[n][-1], rtol=0, atol=bound)
    finally:
        engine.release()
