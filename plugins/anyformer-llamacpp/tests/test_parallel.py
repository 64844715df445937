"""Several streams batched in one llama.cpp context (``options={"parallel": N}``), on the real SmolLM2.

The reference for every text is the same model's reply to the same prompt alone. The kit's
parallel tests run on the tiny llama in ``test_conformance.py``; these check what needs a real
model: greedy texts under load, chunked prompts, per-slot prefix reuse, the isolated worker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode
from anyformer_llamacpp._batch import PREFILL_TOKENS_PER_STEP
from anyformer_llamacpp.estimate import kv_cache_bytes
from anyformer_llamacpp.plugin import can_run

#: A fixed set of prompts: every one's greedy reply among three others must be its reply alone.
PROMPTS = (
    "Name three colours.",
    "Hello, who are you?",
    "Write a haiku about the sea.",
    "What is 2+2?",
    "Tell me a story about a dragon.",
    "List some fruits.",
    "Explain gravity in one sentence.",
    "What is Python?",
)
TOKENS = 32
SYSTEM = "You are a helpful assistant who answers briefly. " * 12  # over two prompt blocks of shared prefix


@pytest.fixture(scope="module")
def batched(smollm2_path: Path) -> Iterator[anyformer.Loaded]:
    """SmolLM2 serving four streams at once."""
    with anyformer.load(smollm2_path, backend="llamacpp", context=2048, options={"parallel": 4}) as loaded:
        yield loaded


def _together(loaded: anyformer.Loaded, requests: list[dict[str, Any]]) -> list[Any]:
    """Run every request in its own thread, all streams open at once; the last chunk of each."""
    results: list[Any] = [None] * len(requests)
    opened = threading.Barrier(len(requests))

    def one(index: int) -> None:
        options = dict(requests[index])
        messages = options.pop("messages")
        stream = loaded.generate(messages, **options)
        opened.wait(timeout=30)
        for chunk in stream:
            results[index] = chunk

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return results


def test_the_handle_declares_its_streams(batched: anyformer.Loaded) -> None:
    assert batched.parallel == 4
    assert type(batched.handle).__name__ == "ParallelLlamaCppModel"


def test_concurrent_greedy_replies_are_the_replies_alone(batched: anyformer.Loaded) -> None:
    alone = [batched.complete(prompt, max_new_tokens=TOKENS).text for prompt in PROMPTS]
    together: list[str] = []
    for start in range(0, len(PROMPTS), 4):
        group = [{"messages": prompt, "max_new_tokens": TOKENS} for prompt in PROMPTS[start : start + 4]]
        together += [chunk.text for chunk in _together(batched, group)]
    flipped = [prompt for prompt, a, b in zip(PROMPTS, alone, together, strict=True) if a != b]
    # On the CPU build every sequence has a KV region of its own, so its sums run in the same order
    # beside others as alone, with flash attention (the default) as without: no near-tie flips here
    # (docs/backends/llamacpp.md says so).
    assert not flipped, f"replies changed under load: {flipped}"


def test_flash_attention_off_reaches_the_batched_context(smollm2_path: Path, smollm2: anyformer.Loaded) -> None:
    """The batched context takes the load's flash attention setting, so under load as alone a stream gets the
    one-stream engine's reply of the same setting (a question whose replies differ between the settings)."""
    question, tokens = "Name three colours.", 64
    on = smollm2.complete(question, max_new_tokens=tokens).text
    off_options = {"flash_attention": False}
    with anyformer.load(smollm2_path, backend="llamacpp", context=2048, options=off_options) as one:
        off = one.complete(question, max_new_tokens=tokens).text
    assert off != on
    with anyformer.load(smollm2_path, backend="llamacpp", context=2048, options={**off_options, "parallel": 2}) as two:
        group = [{"messages": question, "max_new_tokens": tokens}, {"messages": PROMPTS[1], "max_new_tokens": tokens}]
        assert _together(two, group)[0].text == off


def test_stop_strings_and_limits_belong_to_each_stream(batched: anyformer.Loaded) -> None:
    alone = batched.complete(PROMPTS[0], max_new_tokens=TOKENS).text
    cut_at = alone.split()[3]
    ends = _together(
        batched,
        [
            {"messages": PROMPTS[0], "max_new_tokens": TOKENS, "stop": cut_at},
            {"messages": PROMPTS[1], "max_new_tokens": 3},
            {"messages": PROMPTS[2], "max_new_tokens": 9},
            {"messages": PROMPTS[3], "max_new_tokens": TOKENS},
        ],
    )
    assert ends[0].text == alone[: alone.index(cut_at)] and ends[0].finish_reason == "stop"
    assert (ends[1].tokens, ends[1].finish_reason) == (3, "length")
    assert (ends[2].tokens, ends[2].finish_reason) == (9, "length")
    assert ends[3].text == batched.complete(PROMPTS[3], max_new_tokens=TOKENS).text


def test_a_long_prompt_is_read_in_steps_beside_a_decoding_stream(batched: anyformer.Loaded) -> None:
    long_prompt = "Summarise: " + "the quick brown fox jumps over the lazy dog. " * 60
    alone = [batched.complete(p, max_new_tokens=16).text for p in (PROMPTS[0], long_prompt)]
    ends = _together(
        batched, [{"messages": PROMPTS[0], "max_new_tokens": 16}, {"messages": long_prompt, "max_new_tokens": 16}]
    )
    assert ends[1].prompt_tokens > 2 * PREFILL_TOKENS_PER_STEP
    assert [chunk.text for chunk in ends] == alone


def test_tokens_waiting_for_a_slow_reader_come_as_one_chunk(batched: anyformer.Loaded) -> None:
    prompt = "Once upon a time, in a small village by the sea,"
    read_at_once = list(batched.generate(prompt=prompt, max_new_tokens=TOKENS, logprobs=1))
    stream = batched.generate(prompt=prompt, max_new_tokens=TOKENS, logprobs=1)
    chunks = [next(stream)]
    time.sleep(2.0)  # the scheduler runs on: the tokens wait in the stream's queue
    chunks += list(stream)
    assert len(chunks) < TOKENS // 2, f"{len(chunks)} chunks for {TOKENS} tokens: nothing was gathered"
    assert chunks[-1].text == read_at_once[-1].text and chunks[-1].tokens == read_at_once[-1].tokens == TOKENS

    def entries(stream: list[Any]) -> list[tuple[str, float | None]]:
        return [(entry.token, entry.logprob) for chunk in stream for entry in chunk.logprobs]

    assert len(entries(chunks)) == TOKENS and entries(chunks) == entries(read_at_once)
    assert [chunk.tokens for chunk in chunks] == sorted({chunk.tokens for chunk in chunks})  # counts only grow


def test_cancel_of_one_stream_leaves_the_others(batched: anyformer.Loaded) -> None:
    alone = batched.complete(PROMPTS[1], max_new_tokens=TOKENS).text
    cancel = threading.Event()
    stopped = batched.generate(PROMPTS[0], max_new_tokens=1000, cancel=cancel)
    running = batched.generate(PROMPTS[1], max_new_tokens=TOKENS)
    next(stopped)
    first = next(running)
    cancel.set()
    assert list(stopped)[-1].finish_reason == "cancelled"
    assert [first, *running][-1].text == alone


def test_a_slot_keeps_its_prefix_for_the_next_prompt(batched: anyformer.Loaded) -> None:
    def ask(question: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]

    first = batched.complete(ask("Name a colour."), max_new_tokens=4)
    cold = batched.handle.last_prompt_evaluated
    second = batched.complete(ask("Name a fruit."), max_new_tokens=4)
    warm = batched.handle.last_prompt_evaluated
    assert first.prompt_tokens is not None and cold == first.prompt_tokens
    assert warm < cold - 64, f"the shared system prompt was evaluated again ({warm} of {second.prompt_tokens})"
    fresh = batched.complete(ask("Name a fruit."), max_new_tokens=4)
    assert fresh.text == second.text


def test_a_slot_keeps_a_short_system_prompt_up_to_the_new_question(batched: anyformer.Loaded, smollm2) -> None:  # type: ignore[no-untyped-def]
    """A prefix shorter than a block is kept up to where the question's text begins (the prompt's marks), as
    the one-stream engine keeps it, and the greedy text is the one-stream engine's."""

    def ask(question: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]

    batched.complete(ask("Name a colour."), max_new_tokens=4)
    smollm2.complete(ask("Name a colour."), max_new_tokens=4)
    second = batched.complete(ask("Name a fruit."), max_new_tokens=8)
    warm = batched.handle.last_prompt_evaluated
    alone = smollm2.complete(ask("Name a fruit."), max_new_tokens=8)
    assert second.prompt_tokens is not None and second.prompt_tokens < 32  # within the first block
    assert warm == smollm2.handle.last_prompt_evaluated < second.prompt_tokens - 8
    assert second.text == alone.text


def test_dispose_with_streams_open_ends_them(smollm2_path: Path) -> None:
    loaded = anyformer.load(smollm2_path, backend="llamacpp", context=512, options={"parallel": 2})
    streams = [loaded.generate(prompt, max_new_tokens=1000) for prompt in PROMPTS[:2]]
    for stream in streams:
        next(stream)
    loaded.dispose()
    for stream in streams:
        assert list(stream) == []  # closed by dispose: nothing more comes
    with pytest.raises(AnyformerError) as caught:
        loaded.generate("hi")
    assert caught.value.code is ErrorCode.BAD_REQUEST


@pytest.mark.parametrize("value", [0, -1, "four", "Auto", 2.5, True, 65])  # "4" is 4: text as the CLI sends it
def test_a_bad_parallel_option_is_bad_request(smollm2_path: Path, value: Any) -> None:
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(smollm2_path, backend="llamacpp", context=512, options={"parallel": value})
    assert caught.value.code is ErrorCode.BAD_REQUEST and "parallel" in caught.value.message


def test_the_estimate_counts_a_kv_region_per_stream(smollm2_path: Path) -> None:
    model = anyformer.describe(smollm2_path)
    caps = anyformer.Caps(ram_bytes=16 * 2**30)

    def estimate(options: dict[str, Any]) -> Any:
        verdict = can_run(model, caps, anyformer.Request.build(context=2048, options=options))
        assert verdict.ok and verdict.estimate is not None
        return verdict.estimate

    one, four = estimate({}), estimate({"parallel": 4})
    kv = kv_cache_bytes(dict(model.metadata["gguf"]), 2048, 0)
    assert four.ram_bytes - one.ram_bytes == 3 * kv > 0
    assert (one.details["parallel"], four.details["parallel"]) == (1, 4)
    assert one.details["context"] == four.details["context"] == 2048
    # Where four streams do not fit the host memory, as many as fit are planned (never a refusal one stream avoids).
    two = can_run(
        model,
        anyformer.Caps(ram_bytes=one.ram_bytes + kv + kv // 2),
        anyformer.Request.build(context=2048, options={"parallel": 4}),
    )
    assert two.ok and two.estimate is not None and two.estimate.details["parallel"] == 2


def test_streams_in_an_isolated_worker(smollm2_path: Path, batched: anyformer.Loaded) -> None:
    alone = [batched.complete(prompt, max_new_tokens=12).text for prompt in PROMPTS[:2]]
    with anyformer.load(
        smollm2_path, backend="llamacpp", context=2048, options={"parallel": 2}, isolate=True
    ) as isolated:
        assert isolated.isolated and isolated.parallel == 2
        ends = _together(isolated, [{"messages": prompt, "max_new_tokens": 12} for prompt in PROMPTS[:2]])
        assert [chunk.text for chunk in ends] == alone
        streams = [isolated.generate(prompt, max_new_tokens=1000) for prompt in PROMPTS[:2]]
        with pytest.raises(AnyformerError) as caught:
            isolated.generate(PROMPTS[2])
        assert caught.value.code is ErrorCode.BUSY
        for stream in streams:
            stream.close()


def test_a_decode_step_lists_its_sequences_in_ascending_order(batched: anyformer.Loaded) -> None:
    # llama.cpp computes a step whose sequences come out of order ~20 % slower (one KV region each).
    engine = batched.handle._engine
    real = engine._lib
    steps: list[list[int]] = []

    class RecordingDecode:
        """llama_cpp, recording the sequence of every token of each decoded batch."""

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        @staticmethod
        def llama_decode(context: Any, batch: Any) -> int:
            steps.append([batch.seq_id[i][0] for i in range(batch.n_tokens)])
            return int(real.llama_decode(context, batch))

    for slot in engine.slots:
        slot.last_used = -slot.seq_id  # the least recently used is the last: prompts take the slots from 3 down
    engine._lib = RecordingDecode()
    try:
        ends = _together(batched, [{"messages": f"Count to {n}, please.", "max_new_tokens": 8} for n in (3, 4, 5, 6)])
    finally:
        engine._lib = real
    assert all(end.tokens > 1 for end in ends)
    shared = [seq_ids for seq_ids in steps if len(set(seq_ids)) > 1]
    assert any(len(seq_ids) == 4 for seq_ids in shared), steps
    assert all(seq_ids == sorted(seq_ids) for seq_ids in shared), shared


def test_a_failed_decode_step_ends_its_streams_and_the_next_one_works(smollm2_path: Path) -> None:
    with anyformer.load(smollm2_path, backend="llamacpp", context=512, options={"parallel": 2}) as loaded:
        alone = loaded.complete(PROMPTS[0], max_new_tokens=6).text
        engine = loaded.handle._engine
        real = engine._lib

        class FailingDecode:
            """llama_cpp, except that every decode fails as a broken context would."""

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            @staticmethod
            def llama_decode(context: Any, batch: Any) -> int:
                return 2

        engine._lib = FailingDecode()
        with pytest.raises(AnyformerError) as caught:
            loaded.complete(PROMPTS[0], max_new_tokens=6)
        assert caught.value.code is ErrorCode.PLUGIN_ERROR and "status 2" in caught.value.message
        engine._lib = real
        assert loaded.complete(PROMPTS[0], max_new_tokens=6).text == alone  # the slot's cache was emptied


class _Recorder:
    """llama_cpp with ``llama_decode`` recorded: the ``(seq_id, position)`` of every row of each decoded batch."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.batches: list[list[tuple[int, int]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def llama_decode(self, context: Any, batch: Any) -> int:
        self.batches.append([(batch.seq_id[i][0], batch.pos[i]) for i in range(batch.n_tokens)])
        return int(self._real.llama_decode(context, batch))


def _mixed(batches: list[list[tuple[int, int]]]) -> list[list[tuple[int, int]]]:
    """The decoded batches holding several sequences, one of them with more than one row (a prompt block)."""
    found = []
    for rows in batches:
        counts = [sum(1 for seq, _ in rows if seq == one) for one in {seq for seq, _ in rows}]
        if len(counts) > 1 and max(counts) > 1:
            found.append(rows)
    return found


def _beside_a_decoding_stream(loaded: anyformer.Loaded, **options: Any) -> tuple[list[Any], _Recorder]:
    """Open a long stream, and once it decodes, run ``options`` (a second request) to its end; record the decodes."""
    engine = loaded.handle._engine
    recorder = _Recorder(engine._lib)
    engine._lib = recorder
    try:
        running = loaded.generate(PROMPTS[4], max_new_tokens=1000)
        next(running)  # it decodes: the next prompt is admitted beside it
        chunks = list(loaded.generate(**options))
        running.close()
    finally:
        engine._lib = recorder._real
    return chunks, recorder


def test_a_prompt_admitted_while_another_stream_decodes_shares_its_decode(
    batched: anyformer.Loaded, smollm2: anyformer.Loaded
) -> None:
    """The prompt's blocks go into the step's one ``llama_decode`` beside the decoding stream's token (as llama-server
    batches them), every block of the plan whole, and the reply is the one-stream engine's (which the batched engine
    has not cached: its slots hold no more of the long prompt than the chat header)."""
    long_prompt = "Count these, please: " + "one two three four five six seven eight nine ten. " * 12  # several blocks
    alone = [smollm2.complete(prompt, max_new_tokens=12).text for prompt in (PROMPTS[2], long_prompt)]
    for prompt, text in zip((PROMPTS[2], long_prompt), alone, strict=True):
        chunks, recorder = _beside_a_decoding_stream(batched, messages=prompt, max_new_tokens=12)
        assert chunks[-1].text == text
        mixed = _mixed(recorder.batches)
        assert mixed and batched.handle._engine.merge_prompts, recorder.batches
        # One decode per step: while both streams run, no batch holds prompt rows alone.
        first_mixed = recorder.batches.index(mixed[0])
        alone_blocks = [rows for rows in recorder.batches[first_mixed:] if len({seq for seq, _ in rows}) == 1]
        assert all(len(rows) == 1 for rows in alone_blocks), alone_blocks
    # The long prompt (over 4 blocks) was read beside the other stream: every position past the slot's reused
    # prefix once, in order, up to the last, several blocks a step.
    reader = max({seq for rows in mixed for seq, _ in rows}, key=lambda seq: sum(s == seq for s, _ in mixed[0]))
    positions = [pos for rows in mixed for seq, pos in rows if seq == reader]
    end = chunks[-1].prompt_tokens
    assert positions[: positions.index(end - 1) + 1] == list(range(positions[0], end)) and end - positions[0] > 4 * 32
    assert max(sum(seq == reader for seq, _ in rows) for rows in mixed) > 32


def test_a_scored_prompt_beside_a_decoding_stream_scores_as_alone(batched: anyformer.Loaded) -> None:
    prompt = "The capital of France is Paris, and the capital of Italy is Rome. " * 3
    options: dict[str, Any] = {"prompt": prompt, "max_new_tokens": 6, "logprobs": 3, "prompt_logprobs": True}

    def scored(chunks: list[Any]) -> list[Any]:
        return [(e.token, e.logprob, e.top) for chunk in chunks for e in chunk.prompt_logprobs]

    alone = list(batched.generate(**options))
    chunks, recorder = _beside_a_decoding_stream(batched, **options)
    assert _mixed(recorder.batches), recorder.batches
    assert len(scored(chunks)) == chunks[-1].prompt_tokens > 32  # every prompt token (the first without a value)
    assert scored(chunks) == scored(alone)
    assert chunks[-1].text == alone[-1].text


def test_a_prompt_cancelled_while_read_beside_a_decoding_stream_ends_and_leaves_the_other(
    batched: anyformer.Loaded,
) -> None:
    long_prompt = "Summarise: " + "the quick brown fox jumps over the lazy dog. " * 150  # ~1,500 positions
    alone = batched.complete(PROMPTS[1], max_new_tokens=TOKENS).text
    cancel = threading.Event()
    running = batched.generate(PROMPTS[1], max_new_tokens=TOKENS)
    first = next(running)
    stopped = batched.generate(long_prompt, max_new_tokens=8, cancel=cancel)
    threading.Timer(0.05, cancel.set).start()  # within the prompt's first steps
    ends = list(stopped)
    assert ends[-1].finish_reason == "cancelled" and ends[-1].tokens == 0
    assert batched.handle.last_prompt_evaluated < ends[-1].prompt_tokens
    assert [first, *running][-1].text == alone


def test_with_flash_attention_off_prompt_blocks_are_decoded_apart(smollm2_path: Path) -> None:
    """There a row's numbers depend on the batch shape (bench/bench_merge.py): each block keeps a decode of its own,
    and the reply under load is the one-stream engine's."""
    options = {"flash_attention": False}
    with anyformer.load(smollm2_path, backend="llamacpp", context=1024, options=options) as one:
        wanted = one.complete(PROMPTS[2], max_new_tokens=12).text
    with anyformer.load(smollm2_path, backend="llamacpp", context=1024, options={**options, "parallel": 2}) as two:
        assert not two.handle._engine.merge_prompts
        chunks, recorder = _beside_a_decoding_stream(two, messages=PROMPTS[2], max_new_tokens=12)
    assert not _mixed(recorder.batches) and chunks[-1].text == wanted


@pytest.mark.safety("H2")
def test_a_stream_whose_token_choice_fails_ends_alone_and_the_batch_goes_on(
    batched: anyformer.Loaded, monkeypatch: pytest.MonkeyPatch
) -> None:
    from anyformer_llamacpp.sampling import Sampler

    alone = batched.complete(PROMPTS[1], max_new_tokens=TOKENS).text
    real = Sampler.choose

    def choose(self: Sampler, logits: Any) -> int:
        if self.temperature == 0.7:  # the hostile stream's numbers: as "Probabilities contain NaN" once did
            raise ValueError("probabilities contain NaN")
        return real(self, logits)

    monkeypatch.setattr(Sampler, "choose", choose)
    running = batched.generate(PROMPTS[1], max_new_tokens=TOKENS)
    first = next(running)  # decoding in the batch while the other stream fails beside it
    failing = batched.generate(PROMPTS[0], max_new_tokens=TOKENS, temperature=0.7, seed=7)
    with pytest.raises(AnyformerError) as caught:
        list(failing)
    assert caught.value.code is ErrorCode.PLUGIN_ERROR and "NaN" in caught.value.message
    assert [first, *running][-1].text == alone


@pytest.mark.safety("H2")
@pytest.mark.parametrize("temperature", [5e-324, 1e-310, 1e-4, -0.0])
def test_a_subnormal_or_negative_zero_temperature_is_greedy(batched: anyformer.Loaded, temperature: float) -> None:
    greedy = batched.complete(PROMPTS[2], max_new_tokens=8).text
    assert batched.complete(PROMPTS[2], max_new_tokens=8, temperature=temperature, seed=1).text == greedy
