"""Generation through ``anyformer.load`` against transformers' own ``generate`` on the same weights."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from tiny_models import reference_reply

import anyformer
from anyformer import AnyformerError, ErrorCode

PROMPTS = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
]
TOKENS = 24


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_greedy_text_equals_transformers_generate(
    tiny_model_dir: dict[str, Path], architecture: str, prompt: int
) -> None:
    folder = tiny_model_dir[architecture]
    messages = PROMPTS[prompt]
    expected = reference_reply(folder, messages, TOKENS)
    with anyformer.load(folder, backend="transformers", isolate=False) as model:
        chunks = list(model.generate(messages, max_new_tokens=TOKENS))
    assert chunks[-1].text == expected
    assert expected  # a random model's reply over printable characters is never empty at 24 tokens
    assert [c.tokens for c in chunks] == sorted(c.tokens for c in chunks)


def test_the_same_seed_gives_the_same_text_and_other_seeds_differ(tiny_llama_dir: Path) -> None:
    messages = PROMPTS[0]
    with anyformer.load(tiny_llama_dir, backend="transformers", isolate=False) as model:

        def sample(seed: int) -> str:
            return list(model.generate(messages, max_new_tokens=16, temperature=1.5, seed=seed))[-1].text

        first = sample(7)
        assert sample(7) == first
        greedy = list(model.generate(messages, max_new_tokens=16))[-1].text
        assert {sample(s) for s in range(4)} != {greedy}


def test_top_k_one_is_greedy_at_any_temperature(tiny_llama_dir: Path) -> None:
    messages = PROMPTS[1]
    with anyformer.load(tiny_llama_dir, backend="transformers", isolate=False) as model:
        greedy = list(model.generate(messages, max_new_tokens=12))[-1].text
        drawn = list(model.generate(messages, max_new_tokens=12, temperature=2.0, seed=3, top_k=1))[-1].text
    assert drawn == greedy


def test_cancel_ends_the_stream_and_the_model_answers_again(tiny_llama_dir: Path) -> None:
    messages = PROMPTS[0]
    with anyformer.load(tiny_llama_dir, backend="transformers", isolate=False) as model:
        cancel = threading.Event()
        stream = model.generate(messages, max_new_tokens=64, cancel=cancel)
        first = next(iter(stream))
        cancel.set()
        rest = list(stream)
        assert (rest[-1] if rest else first).finish_reason == "cancelled"
        again = list(model.generate(messages, max_new_tokens=TOKENS))[-1].text
    assert again == reference_reply(tiny_llama_dir, messages, TOKENS)


def test_a_bad_sampling_value_is_bad_request_before_any_work(tiny_llama_dir: Path) -> None:
    with anyformer.load(tiny_llama_dir, backend="transformers", isolate=False) as model:
        with pytest.raises(AnyformerError) as caught:
            list(model.generate(PROMPTS[0], max_new_tokens=4, repetition_penalty=-1.0))
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_an_isolated_load_streams_the_same_text(tiny_llama_dir: Path) -> None:
    messages = PROMPTS[0]
    with anyformer.load(tiny_llama_dir, backend="transformers", isolate=True) as model:
        text = list(model.generate(messages, max_new_tokens=TOKENS))[-1].text
    assert text == reference_reply(tiny_llama_dir, messages, TOKENS)
