"""Prompt-token log-probabilities (``generate(prompt=..., logprobs=N, prompt_logprobs=True)``), checked
against llama.cpp's own logits for every prompt position (llama-cpp-python with ``logits_all=True``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anyformer import AnyformerError, ErrorCode

PROMPTS = ["The capital of France is Paris, and the capital of Italy is", "def add(a, b):\n    return"]
TOP = 3


def _reference(path: Path, prompt: str, max_tokens: int) -> tuple[list[str], list[float], list[dict[str, float]], str]:
    """Each prompt token's text, log-probability and top alternatives from llama.cpp's logits at every
    position, and the greedy continuation's ``max_tokens`` tokens after them."""
    from llama_cpp import Llama

    llama = Llama(model_path=str(path), n_ctx=2048, n_threads=2, logits_all=True, flash_attn=True, verbose=False)
    try:
        tokens = llama.tokenize(prompt.encode(), add_bos=True, special=True)
        continuation = ""
        if max_tokens:  # llama-cpp-python reads max_tokens=0 as "up to the context"
            completion: Any = llama.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, top_k=1)
            continuation = completion["choices"][0]["text"]
        llama.reset()
        llama.eval(tokens)
        rows = Llama.logits_to_logprobs(llama.scores[: len(tokens)].astype(np.float64))
        texts = [llama.detokenize([t]).decode("utf-8", "ignore") for t in tokens[1:]]
        values = [float(rows[i][tokens[i + 1]]) for i in range(len(tokens) - 1)]
        tops = []
        for i in range(len(tokens) - 1):
            best = np.argsort(-rows[i], kind="stable")[:TOP]
            tops.append({llama.detokenize([int(b)]).decode("utf-8", "ignore"): float(rows[i][b]) for b in best})
        first = llama.detokenize(tokens[:1]).decode("utf-8", "ignore")
        return [first, *texts], [float("nan"), *values], [{}, *tops], continuation
    finally:
        llama.close()


@pytest.mark.parametrize(("prompt", "max_tokens"), [(PROMPTS[0], 0), (PROMPTS[1], 4)])
def test_prompt_logprobs_equal_llama_cpp_logits(smollm2, smollm2_path, prompt: str, max_tokens: int) -> None:  # type: ignore[no-untyped-def]
    texts, values, tops, continuation = _reference(smollm2_path, prompt, max_tokens)
    chunks = list(smollm2.generate(prompt=prompt, max_new_tokens=max_tokens, logprobs=TOP, prompt_logprobs=True))
    entries = [e for chunk in chunks for e in chunk.prompt_logprobs]
    assert sum(len(c.prompt_logprobs) > 0 for c in chunks) == 1  # on one chunk, the first
    assert chunks[0].prompt_logprobs
    assert [e.token for e in entries] == texts
    assert entries[0].logprob is None and entries[0].top == ()
    ours = [e.logprob for e in entries[1:]]
    assert np.allclose(ours, values[1:], atol=1e-4, rtol=0)
    for entry, top in zip(entries[1:], tops[1:], strict=True):
        assert dict(entry.top[:TOP]) == pytest.approx(top, abs=1e-4)
    assert "".join(e.token for e in entries) == prompt
    assert [e.offset for e in entries] == [sum(len(x) for x in texts[:i]) for i in range(len(texts))]
    assert chunks[-1].text == continuation
    assert chunks[-1].tokens == max_tokens
    assert chunks[-1].finish_reason == "length"
    # The generated tokens' entries come too, one each.
    assert sum(len(c.logprobs) for c in chunks) == max_tokens


def test_prompt_logprobs_keep_the_next_greedy_reply_unchanged(smollm2) -> None:  # type: ignore[no-untyped-def]
    plain = smollm2.complete(prompt=PROMPTS[0], max_new_tokens=8)
    scored = smollm2.complete(prompt=PROMPTS[0], max_new_tokens=8, logprobs=1, prompt_logprobs=True)
    again = smollm2.complete(prompt=PROMPTS[0], max_new_tokens=8)
    assert plain.text == scored.text == again.text


def test_prompt_logprobs_need_logprobs_and_a_raw_prompt(smollm2) -> None:  # type: ignore[no-untyped-def]
    for options in (
        {"prompt": "x", "prompt_logprobs": True},
        {"messages": [{"role": "user", "content": "x"}], "logprobs": 1, "prompt_logprobs": True},
        {"prompt": "x", "max_new_tokens": 0, "logprobs": 1},
        {"prompt": "x", "logprobs": 1, "prompt_logprobs": "yes"},
    ):
        with pytest.raises(AnyformerError) as caught:
            smollm2.complete(**options)
        assert caught.value.code is ErrorCode.BAD_REQUEST


def test_an_isolated_worker_carries_prompt_logprobs(smollm2, smollm2_path) -> None:  # type: ignore[no-untyped-def]
    import anyformer

    options: dict[str, Any] = {"prompt": PROMPTS[1], "max_new_tokens": 2, "logprobs": 2, "prompt_logprobs": True}
    here = list(smollm2.generate(**options))
    with anyformer.load(smollm2_path, backend="llamacpp", context=2048, isolate=True) as isolated:
        assert isolated.isolated and isolated.prompt_logprobs
        there = list(isolated.generate(**options))
    assert [c.prompt_logprobs for c in there] == [c.prompt_logprobs for c in here]
    assert [c.logprobs for c in there] == [c.logprobs for c in here]
    assert there[-1].text == here[-1].text


def test_a_model_serving_several_streams_scores_prompts_as_one_stream_does(smollm2, smollm2_path) -> None:  # type: ignore[no-untyped-def]
    """``parallel=N`` (the server's default) has its own scheduler: it must give the same entries and reply."""
    import anyformer

    def run(loaded: Any, prompt: str, max_tokens: int) -> tuple[list[Any], str]:
        chunks = list(loaded.generate(prompt=prompt, max_new_tokens=max_tokens, logprobs=TOP, prompt_logprobs=True))
        return [e for chunk in chunks for e in chunk.prompt_logprobs], "".join(c.text for c in chunks)

    with anyformer.load(smollm2_path, backend="llamacpp", context=512, options={"parallel": 2}) as batched:
        assert batched.prompt_logprobs
        for prompt, max_tokens in [(PROMPTS[0], 0), (PROMPTS[1], 4), (PROMPTS[0], 3)]:
            alone, alone_text = run(smollm2, prompt, max_tokens)
            together, together_text = run(batched, prompt, max_tokens)
            assert [e.token for e in together] == [e.token for e in alone]
            assert together[0].logprob is None
            assert np.allclose([e.logprob for e in together[1:]], [e.logprob for e in alone[1:]], atol=1e-4, rtol=0)
            assert together_text == alone_text
