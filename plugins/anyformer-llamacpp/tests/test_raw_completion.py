"""Raw completions (``generate(prompt=...)``): the text continued as written, checked against
llama-cpp-python's ``create_completion`` on the same GGUF."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_gguf import write_tiny_llama

import anyformer
from anyformer import AnyformerError, ErrorCode

PROMPT = "The capital of France is"


def _create_completion(path: Path, context: int, prompt: str, max_tokens: int) -> dict:  # type: ignore[type-arg]
    from llama_cpp import Llama

    reference = Llama(model_path=str(path), n_ctx=context, n_threads=2, flash_attn=True, verbose=False)
    try:
        return reference.create_completion(prompt, temperature=0.0, top_k=1, max_tokens=max_tokens)  # type: ignore[return-value]
    finally:
        reference.close()


@pytest.fixture(scope="module")
def base_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny base-style llama: no chat template, and its vocabulary asks for BOS."""
    return write_tiny_llama(
        tmp_path_factory.mktemp("base") / "tiny-base-F32.gguf", seed=3, chat_template=None, add_bos=True
    )


@pytest.fixture(scope="module")
def base(base_gguf: Path) -> Iterator[anyformer.Loaded]:
    with anyformer.load(base_gguf, backend="llamacpp") as loaded:
        yield loaded


def test_smollm2_raw_greedy_equals_create_completion(smollm2, smollm2_path) -> None:  # type: ignore[no-untyped-def]
    expected = _create_completion(smollm2_path, 2048, PROMPT, 20)
    ours = smollm2.complete(prompt=PROMPT, max_new_tokens=20)
    assert ours.text == expected["choices"][0]["text"]
    assert ours.tokens == expected["usage"]["completion_tokens"]
    assert ours.prompt_tokens == expected["usage"]["prompt_tokens"]


def test_raw_prompt_gets_no_chat_template(smollm2) -> None:  # type: ignore[no-untyped-def]
    tokens = smollm2.handle.raw_prompt_tokens(PROMPT)
    chat = smollm2.handle.prompt_tokens([{"role": "user", "content": PROMPT}], thinking=False)
    assert len(tokens) < len(chat)
    assert smollm2.handle._llama.detokenize(tokens).decode() == PROMPT


def test_template_less_base_model_raw_greedy_equals_create_completion(base, base_gguf) -> None:  # type: ignore[no-untyped-def]
    prompt = "hello there, t"
    expected = _create_completion(base_gguf, base.handle.context, prompt, 16)
    ours = base.complete(prompt=prompt, max_new_tokens=16)
    assert ours.text == expected["choices"][0]["text"]
    assert ours.tokens == expected["usage"]["completion_tokens"]
    # The vocabulary asks for BOS: it leads the prompt, and special tokens in the text are parsed.
    tokens = base.handle.raw_prompt_tokens("a<|im_end|>")
    assert tokens[0] == base.handle._llama.token_bos()
    assert tokens[-1] == base.handle._llama.token_eos()
    assert len(tokens) == 3


def test_tiny_without_bos_flag_adds_none(tiny) -> None:  # type: ignore[no-untyped-def]
    assert tiny.handle.raw_prompt_tokens("ab") == tiny.handle._llama.tokenize(b"ab", add_bos=False, special=True)


def test_raw_stop_strings_and_prefix_reuse_keep_greedy_text(smollm2) -> None:  # type: ignore[no-untyped-def]
    whole = smollm2.complete(prompt=PROMPT, max_new_tokens=12).text
    stop = whole.strip()[:3]
    cut = smollm2.complete(prompt=PROMPT, max_new_tokens=12, stop=stop)
    assert cut.text == whole[: whole.find(stop)]
    assert cut.finish_reason == "stop"
    assert smollm2.complete(prompt=PROMPT, max_new_tokens=12).text == whole  # again, from the cache


def test_raw_sampled_is_seeded(smollm2) -> None:  # type: ignore[no-untyped-def]
    one = smollm2.complete(prompt=PROMPT, max_new_tokens=12, temperature=0.9, seed=7).text
    two = smollm2.complete(prompt=PROMPT, max_new_tokens=12, temperature=0.9, seed=7).text
    assert one == two and one


def test_raw_and_messages_together_are_refused(smollm2) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AnyformerError) as caught:
        smollm2.complete("hi", prompt="hi")
    assert caught.value.code == ErrorCode.BAD_REQUEST


def test_raw_prompt_longer_than_context_is_refused(tiny) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AnyformerError) as caught:
        tiny.complete(prompt="ab " * 400)
    assert caught.value.code == ErrorCode.BAD_REQUEST


def test_isolated_worker_carries_the_raw_prompt(smollm2_path, smollm2) -> None:  # type: ignore[no-untyped-def]
    expected = smollm2.complete(prompt=PROMPT, max_new_tokens=8).text
    with anyformer.load(smollm2_path, backend="llamacpp", context=2048, isolate=True) as isolated:
        assert isolated.raw_text
        assert isolated.complete(prompt=PROMPT, max_new_tokens=8).text == expected


def test_cli_run_raw_continues_the_prompt(smollm2, smollm2_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess
    import sys

    expected = smollm2.complete(prompt=PROMPT, max_new_tokens=8).text
    command = [sys.executable, "-m", "anyformer", "run", str(smollm2_path), PROMPT, "--raw", "--in-process", "--json"]
    done = subprocess.run(
        [*command, "--max-new-tokens", "8", "--context", "2048"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["text"] == expected


def test_cli_run_raw_without_a_prompt_or_with_a_system_prompt_is_refused(smollm2_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    for extra in (["hi", "--system", "be brief"], []):
        done = subprocess.run(
            [sys.executable, "-m", "anyformer", "run", str(smollm2_path), *extra, "--raw"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0
        assert "BAD_REQUEST" in done.stderr and "--raw" in done.stderr
        assert "Traceback" not in done.stderr


def _reference_logprobs(path: Path, context: int, prompt: str, max_tokens: int, top: int) -> dict:  # type: ignore[type-arg]
    from llama_cpp import Llama

    reference = Llama(model_path=str(path), n_ctx=context, n_threads=2, verbose=False, logits_all=True, flash_attn=True)
    try:
        reply = reference.create_completion(prompt, temperature=0.0, top_k=1, max_tokens=max_tokens, logprobs=top)
        return reply["choices"][0]  # type: ignore[index,return-value]
    finally:
        reference.close()


@pytest.mark.parametrize("which", ["smollm2", "base"])
def test_logprobs_equal_llama_cpp_python(which, request) -> None:  # type: ignore[no-untyped-def]
    loaded = request.getfixturevalue(which)
    path = request.getfixturevalue(f"{which}_path" if which == "smollm2" else "base_gguf")
    # A prompt whose greedy reply holds no BOS: llama-cpp-python leaves BOS out of its logprobs, anyformer does not.
    prompt = PROMPT if which == "smollm2" else "the cat"
    expected = _reference_logprobs(path, loaded.handle.context, prompt, 6, 3)
    chunks = list(loaded.generate(prompt=prompt, max_new_tokens=6, logprobs=3))
    entries = [entry for chunk in chunks for entry in chunk.logprobs]
    assert chunks[-1].text == expected["text"]
    want = expected["logprobs"]
    assert len(entries) == chunks[-1].tokens == len(want["tokens"])
    assert [e.token for e in entries] == want["tokens"]
    assert [e.logprob for e in entries] == pytest.approx(want["token_logprobs"], abs=1e-4)
    for entry, top in zip(entries, want["top_logprobs"], strict=True):
        assert dict(entry.top) == pytest.approx(top, abs=1e-4)
    # Each entry sits where its token's text begins.
    assert [e.offset for e in entries] == [o - len(prompt) for o in want["text_offset"]]


def test_logprobs_past_a_stop_string_are_dropped(smollm2) -> None:  # type: ignore[no-untyped-def]
    whole = list(smollm2.generate(prompt=PROMPT, max_new_tokens=10, logprobs=0))
    entries = [e for c in whole for e in c.logprobs]
    assert len(entries) == whole[-1].tokens
    assert all(e.top == () for e in entries)
    # The first token (after the first) whose text is new: a stop string there cuts the reply before it.
    at = next(
        k
        for k in range(1, len(entries))
        if entries[k].token.strip() and entries[k].token not in whole[-1].text[: entries[k].offset]
    )
    cut = list(smollm2.generate(prompt=PROMPT, max_new_tokens=10, logprobs=0, stop=entries[at].token))
    assert cut[-1].text == whole[-1].text[: entries[at].offset]
    assert [e.token for c in cut for e in c.logprobs] == [e.token for e in entries[:at]]


def test_logprobs_cross_the_isolated_worker(smollm2_path, smollm2) -> None:  # type: ignore[no-untyped-def]
    local = [e for c in smollm2.generate(prompt=PROMPT, max_new_tokens=4, logprobs=2) for e in c.logprobs]
    with anyformer.load(smollm2_path, backend="llamacpp", context=2048, isolate=True) as isolated:
        remote = [e for c in isolated.generate(prompt=PROMPT, max_new_tokens=4, logprobs=2) for e in c.logprobs]
    assert remote == local


@pytest.fixture(scope="module")
def fim_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama whose vocabulary has fill-in-the-middle and repo-level tokens, and asks for BOS."""
    folder = tmp_path_factory.mktemp("fim")
    return write_tiny_llama(
        folder / "tiny-fim-F32.gguf", seed=5, chat_template=None, add_bos=True, fim=True, context=2048
    )


@pytest.fixture(scope="module")
def fim(fim_gguf: Path) -> Iterator[anyformer.Loaded]:
    with anyformer.load(fim_gguf, backend="llamacpp", context=2048) as loaded:
        yield loaded


def _ids(loaded: anyformer.Loaded, text: str, *, special: bool = False) -> list[int]:
    return list(loaded.handle._llama.tokenize(text.encode(), add_bos=False, special=special))  # type: ignore[attr-defined]


def test_fim_builds_llama_cpp_infill_sequence(fim) -> None:  # type: ignore[no-untyped-def]
    (pre,), (suf,), (mid,), (rep,), (sep,) = (
        _ids(fim, name, special=True)
        for name in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>")
    )
    bos = fim.handle._llama.token_bos()
    prefix, suffix = "def add(a, b):\n    return", "\n\nprint(add(1, 2))<|im_end|>"
    # llama.cpp's /infill: repo and file lines, BOS, then PRE prefix SUF suffix MID; special text stays plain.
    expected = [rep, *_ids(fim, "myproject\n"), sep, *_ids(fim, "filename\n"), bos, pre, *_ids(fim, prefix), suf]
    expected += [*_ids(fim, suffix), mid]
    assert fim.handle.infill_tokens(prefix, suffix, 16) == expected
    # A long prefix keeps its last 3/4 batch of tokens, a long suffix its first 1/4 batch less two; a reply that
    # needs the context leaves the repo lines out.
    batch = fim.handle._llama.n_batch
    long_prefix, long_suffix = "a" * (batch + 7), "b" * batch
    cut = fim.handle.infill_tokens(long_prefix, long_suffix, 1000)
    assert cut == [
        bos,
        pre,
        *_ids(fim, long_prefix)[-3 * batch // 4 :],
        suf,
        *_ids(fim, long_suffix)[: batch // 4 - 2],
        mid,
    ]


def test_fim_greedy_equals_create_completion_of_the_same_tokens(fim, fim_gguf) -> None:  # type: ignore[no-untyped-def]
    from llama_cpp import Llama

    prefix, suffix = "x = 1\ny = ", "\nprint(x + y)"
    tokens = fim.handle.infill_tokens(prefix, suffix, 12)
    reference = Llama(model_path=str(fim_gguf), n_ctx=2048, n_threads=2, flash_attn=True, verbose=False)
    try:
        expected = reference.create_completion(tokens, temperature=0.0, top_k=1, max_tokens=12)
    finally:
        reference.close()
    ours = fim.complete(prompt=prefix, suffix=suffix, max_new_tokens=12)
    assert ours.text and ours.text == expected["choices"][0]["text"]  # type: ignore[index]
    assert ours.prompt_tokens == len(tokens)


def test_fim_on_a_model_without_fim_tokens_is_refused(smollm2) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AnyformerError) as caught:
        smollm2.complete(prompt="def f(", suffix=")\n")
    assert caught.value.code == ErrorCode.BAD_REQUEST
    assert "fill-in-the-middle" in caught.value.message
