"""Generation on real llama.cpp, checked against llama-cpp-python itself on the same GGUF and input."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _reference_llama(path: Path, context: int, flash: bool = True):  # type: ignore[no-untyped-def]
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=context, n_threads=2, flash_attn=flash, verbose=False)


def test_smollm2_greedy_text_equals_llama_cpp_python_chat_completion(smollm2, smollm2_path) -> None:  # type: ignore[no-untyped-def]
    reference = _reference_llama(smollm2_path, 2048)
    try:
        expected = reference.create_chat_completion(QUESTION, temperature=0.0, top_k=1, max_tokens=24)
    finally:
        reference.close()
    ours = smollm2.complete(QUESTION, max_new_tokens=24)
    assert ours.text == expected["choices"][0]["message"]["content"]
    assert ours.tokens == expected["usage"]["completion_tokens"]


@pytest.mark.parametrize("flash", [True, False])
def test_the_flash_attention_option_reaches_llama_cpp(smollm2, smollm2_path, flash: bool) -> None:  # type: ignore[no-untyped-def]
    """Flash attention is on unless ``flash_attention=False``; each setting's greedy text is llama-cpp-python's
    with the same setting, on a question whose 64-token replies differ between the two (a near-tie)."""
    question = [{"role": "user", "content": "Name three colours."}]
    replies = {}
    for setting in (True, False):
        reference = _reference_llama(smollm2_path, 2048, setting)
        try:
            reply = reference.create_chat_completion(question, temperature=0.0, top_k=1, max_tokens=64)
        finally:
            reference.close()
        replies[setting] = reply["choices"][0]["message"]["content"]
    assert replies[True] != replies[False]  # else this question could not tell the settings apart
    if flash:  # the default
        assert smollm2.complete(question, max_new_tokens=64).text == replies[True]
        return
    with anyformer.load(smollm2_path, backend="llamacpp", context=2048, options={"flash_attention": False}) as off:
        assert off.complete(question, max_new_tokens=64).text == replies[False]


@pytest.mark.parametrize("value", [2, "maybe", 0.5])  # 1, 0 and "on" are the core's yes/no
def test_a_bad_flash_attention_option_is_bad_request(smollm2_path, value) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(smollm2_path, backend="llamacpp", context=512, options={"flash_attention": value})
    assert caught.value.code is ErrorCode.BAD_REQUEST and "flash_attention" in caught.value.message


def test_tiny_greedy_tokens_equal_a_raw_eval_argmax_loop(tiny, tiny_gguf) -> None:  # type: ignore[no-untyped-def]
    import llama_cpp

    messages = [{"role": "user", "content": "hello there"}]
    prompt = tiny.handle.prompt_tokens(messages, thinking=False)
    reference = _reference_llama(tiny_gguf, tiny.handle.context)
    try:
        reference.eval(prompt)
        expected = []
        for _ in range(12):
            logits = np.ctypeslib.as_array(
                llama_cpp.llama_get_logits_ith(reference._ctx.ctx, -1), shape=(reference.n_vocab(),)
            )
            token = int(logits.argmax())
            if llama_cpp.llama_vocab_is_eog(reference._model.vocab, token):
                break
            expected.append(token)
            reference.eval([token])
        expected_text = reference.detokenize(expected).decode("utf-8", "replace")
    finally:
        reference.close()
    assert tiny.complete(messages, max_new_tokens=12).text == expected_text


def test_thinking_flag_reaches_the_template(tiny) -> None:  # type: ignore[no-untyped-def]
    messages = [{"role": "user", "content": "hi"}]
    off = tiny.handle.prompt_tokens(messages, thinking=False)
    on = tiny.handle.prompt_tokens(messages, thinking=True)
    think_open = tiny.handle._llama.tokenize(b"<think>", add_bos=False, special=True)
    assert think_open[0] in off and think_open[0] not in on


def test_seeded_sampling_is_repeatable_and_seed_dependent(smollm2) -> None:  # type: ignore[no-untyped-def]
    first = smollm2.complete(QUESTION, max_new_tokens=16, temperature=1.0, seed=7).text
    again = smollm2.complete(QUESTION, max_new_tokens=16, temperature=1.0, seed=7).text
    others = {smollm2.complete(QUESTION, max_new_tokens=16, temperature=1.0, seed=s).text for s in (1, 2, 3)}
    assert first == again
    assert len(others | {first}) > 1


def test_stop_string_ends_the_reply_before_it(smollm2) -> None:  # type: ignore[no-untyped-def]
    full = smollm2.complete(QUESTION, max_new_tokens=24).text
    stop = full[8:12]
    cut = smollm2.complete(QUESTION, max_new_tokens=24, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text == full[: full.index(stop)]


def test_cancelled_generation_leaves_the_cache_right_for_the_next_call(smollm2) -> None:  # type: ignore[no-untyped-def]
    other = [{"role": "user", "content": "Tell me about the ocean."}]
    expected = smollm2.complete(QUESTION, max_new_tokens=20).text
    cancel = threading.Event()
    for chunk in smollm2.generate(other, max_new_tokens=50, cancel=cancel):
        if chunk.tokens >= 5:
            cancel.set()
    assert chunk.finish_reason == "cancelled"
    assert smollm2.complete(QUESTION, max_new_tokens=20).text == expected


def test_continuing_a_chat_reuses_the_cache_exactly_as_llama_cpp_python_would(smollm2, smollm2_path) -> None:  # type: ignore[no-untyped-def]
    first = smollm2.complete(QUESTION, max_new_tokens=12).text
    follow_up = [*QUESTION, {"role": "assistant", "content": first}, {"role": "user", "content": "And Spain?"}]
    warm = smollm2.complete(follow_up, max_new_tokens=12).text
    with anyformer.load(smollm2_path, backend="llamacpp", context=2048) as fresh:
        cold = fresh.complete(follow_up, max_new_tokens=12).text
    assert warm == cold  # the cache is reused only where it was computed as a fresh model computes it


def test_image_block_without_a_projector_is_bad_request(tiny) -> None:  # type: ignore[no-untyped-def]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "what is this"}, {"type": "image", "image": b"\x89PNG"}]}
    ]
    with pytest.raises(AnyformerError) as info:
        tiny.generate(messages)
    assert info.value.code is ErrorCode.BAD_REQUEST and "projector" in info.value.message


def test_prompt_longer_than_the_context_is_bad_request(tiny) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AnyformerError) as info:
        tiny.generate([{"role": "user", "content": "word " * 2000}])
    assert info.value.code is ErrorCode.BAD_REQUEST and "context" in info.value.message


def test_reply_stops_with_length_when_the_context_fills(tiny_gguf) -> None:  # type: ignore[no-untyped-def]
    # The tiny random llama answers "hello there" greedily without an end token for longer than the
    # context holds, so only the full context can end this reply.
    messages = [{"role": "user", "content": "hello there"}]
    with anyformer.load(tiny_gguf, backend="llamacpp", context=64) as small:
        prompt_length = len(small.handle.prompt_tokens(messages, thinking=False))
        last = small.complete(messages, max_new_tokens=500)
    assert (last.finish_reason, last.tokens) == ("length", 64 - prompt_length)


def test_thread_count_uses_every_usable_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from anyformer_llamacpp.engine import pick_threads

    monkeypatch.delenv("ANYFORMER_LLAMACPP_THREADS", raising=False)
    assert pick_threads() == anyformer.probe(gpu=False).cpu_count
    monkeypatch.setenv("ANYFORMER_LLAMACPP_THREADS", "3")
    assert pick_threads() == 3


def test_a_split_set_loads_as_one_model_and_answers_like_the_whole_file(tmp_path: Path, tiny_gguf: Path) -> None:
    from tiny_gguf import write_tiny_llama

    folder = tmp_path / "split"
    folder.mkdir()
    write_tiny_llama(folder / "tiny-llama-F32.gguf", split_max_tensors=8)
    shards = sorted(p.name for p in folder.iterdir())
    assert shards == [f"tiny-llama-F32-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    messages = [{"role": "user", "content": "hello there"}]
    with anyformer.load(folder, backend="llamacpp") as split, anyformer.load(tiny_gguf, backend="llamacpp") as whole:
        assert split.verdict.estimate.details["shards"] == 3
        assert split.complete(messages, max_new_tokens=10).text == whole.complete(messages, max_new_tokens=10).text


def test_a_split_set_with_a_swapped_shard_is_bad_model(tmp_path: Path) -> None:
    from tiny_gguf import write_tiny_llama

    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    write_tiny_llama(one / "m-F32.gguf", split_max_tensors=8, seed=1)
    write_tiny_llama(two / "m-F32.gguf", split_max_tensors=6, seed=2)
    (one / "m-F32-00002-of-00003.gguf").write_bytes((two / "m-F32-00002-of-00004.gguf").read_bytes())
    with pytest.raises(AnyformerError) as info:
        anyformer.load(one, backend="llamacpp")
    assert info.value.code is ErrorCode.BAD_MODEL and "00002" in info.value.message
