"""Every pipeline is compiled at load (with ``compile`` progress): generating compiles nothing.

After an engine is built, the wgpu device's shader-module and compute-pipeline constructors are
counted while the engine prefills and decodes: greedy and sampled (temperature, top-k, top-p),
prompts of whole and partial ``max_batch`` steps, decode steps alone and several in one
submission, and attention split along the sequence. ``SPLIT_FROM`` is lowered before the load (an
engine reads it when built) so that a context of 48 reaches the split steps with a few tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from anyformer_gguf_gpu import lfm2, transformer
from anyformer_gguf_gpu.decode import greedy, sampled
from anyformer_gguf_gpu.engines import open_engine
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.gpu import GPU
from anyformer_gguf_gpu.testing import RandomModel, compiles_counted, write_random_gguf
from anyformer_gguf_gpu.testing_lfm2 import RandomLfm2, write_random_lfm2_gguf
from anyformer_gguf_gpu.transformer import TransformerEngine

#: One engine of each kind of step program: llama (rotary in the q/k/v projection), llama with heads of 10
#: (scalar attention, a rotary dispatch of its own), qwen3 (q/k norms, rotary inside attention), lfm2.
MODELS: dict[str, Callable[[str], None]] = {
    "llama": lambda path: write_random_gguf(path, RandomModel()),
    "llama-headdim10-f32": lambda path: write_random_gguf(path, RandomModel(quant="F32", head_dim=10)),
    "qwen3": lambda path: write_random_gguf(path, RandomModel(architecture="qwen3")),
    "lfm2": lambda path: write_random_lfm2_gguf(path, RandomLfm2()),
}
CTX = 48
MAX_BATCH = 4
#: Keys past which attention splits, for these engines: decode steps cross it, and so does a 20-token prompt.
SPLIT_AT = 16
#: 11 tokens: prefill steps of 4, 4 and 3 tokens, none split; 12 new tokens then cross SPLIT_AT.
PROMPT = [5, 77, 100, 3, 250, 9, 1, 40, 41, 42, 7]
#: 20 tokens: five steps of 4, the last (20 keys) split.
LONG_PROMPT = [*PROMPT, 60, 61, 62, 63, 64, 65, 66, 67, 68]


@pytest.fixture(params=list(MODELS))
def loaded(
    request: pytest.FixtureRequest, gpu: GPU, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[TransformerEngine, list[tuple[str, int, int]]]]:
    """An engine loaded with SPLIT_AT, and the progress events its load reported."""
    path = str(tmp_path / f"{request.param}.gguf")
    MODELS[request.param](path)
    monkeypatch.setattr(transformer, "SPLIT_FROM", SPLIT_AT)
    monkeypatch.setattr(lfm2, "SPLIT_FROM", SPLIT_AT)
    events: list[tuple[str, int, int]] = []

    def report(what: str, done: int, total: int) -> None:
        events.append((what, done, total))

    with GGUFFile(path) as gguf:
        engine = open_engine(gpu, gguf, ctx=CTX, max_batch=MAX_BATCH, progress=report)
    yield engine, events
    engine.release()


def test_generating_compiles_nothing_after_load(loaded, gpu, monkeypatch):
    engine, events = loaded
    assert engine.split_from == SPLIT_AT
    compiles = [(done, total) for what, done, total in events if what == "compile"]
    assert compiles and compiles[-1][0] == compiles[-1][1] > 0, "the load reports its compilation to the end"

    steps: set[tuple[bool, bool, bool]] = set()  # (several tokens, split, sampled at a temperature) of each step
    program = engine.program

    def spy(tokens: int, **kw: Any) -> Any:
        steps.add((tokens > 1, bool(kw.get("split")), engine.stochastic))
        return program(tokens, **kw)

    monkeypatch.setattr(engine, "program", spy)
    with compiles_counted(gpu.device) as made:
        for prompt, new in ((PROMPT, 12), (LONG_PROMPT, 5)):
            assert len(list(greedy(engine, prompt, new))) == new
            drawn = sampled(engine, prompt, new, temperature=0.8, seed=5, top_k=20, top_p=0.9)
            assert len(list(drawn)) == new
        engine.all_logits(PROMPT)  # every token's logits (the checks' path): the head over several tokens

    assert made == [], f"compiled after load: {made}"
    every = {(several, split, hot) for several in (False, True) for split in (False, True) for hot in (False, True)}
    assert steps >= every, f"steps not reached: {every - steps}"
