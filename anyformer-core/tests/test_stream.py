"""The core's streaming enforcement (docs/contract.md, "Streaming"), whatever the backend yields.

Every test loads an in-process :class:`ScriptedBackend` (conftest) registered with
``PluginManager.register``, so only the core's own guarantees are under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from anyformer import AnyformerError, Chunk, ErrorCode
from anyformer.plugin import Features


def chunks(*deltas: str, finish: str | None = None) -> list[Chunk]:
    """One chunk per delta, one token each; the last carries ``finish``."""
    out = [Chunk(delta=d, tokens=i + 1) for i, d in enumerate(deltas)]
    if finish is not None:
        out[-1] = Chunk(delta=deltas[-1], tokens=len(deltas), finish_reason=finish)
    return out


def assert_well_formed(stream: list[Chunk], max_new_tokens: int = 256) -> None:
    """The invariants every stream keeps: cumulative text, monotone bounded tokens, one final reason."""
    __tracebackhide__ = True
    assert stream, "the stream yielded nothing"
    previous = Chunk()
    for index, chunk in enumerate(stream):
        assert chunk.text == previous.text + chunk.delta, f"chunk {index}: text is not the previous text plus delta"
        assert previous.tokens <= chunk.tokens <= max_new_tokens, (
            f"chunk {index}: tokens went {previous.tokens} -> {chunk.tokens} (max_new_tokens={max_new_tokens})"
        )
        previous = chunk
    assert all(c.finish_reason is None for c in stream[:-1]), "only the last chunk carries finish_reason"
    assert stream[-1].finish_reason in ("stop", "length", "cancelled")


# ---- text and tokens -----------------------------------------------------------------------------


def test_text_is_rebuilt_from_deltas_whatever_the_backend_puts_in_text(load_scripted: Any) -> None:
    script = [
        Chunk(text="garbage", delta="Hel", tokens=1),
        Chunk(text="", delta="lo", tokens=2),
        Chunk(text="Hello world and more", delta=" world", tokens=3, finish_reason="stop"),
    ]
    loaded, _ = load_scripted(script)
    stream = list(loaded.generate("hi"))
    assert_well_formed(stream)
    assert [c.text for c in stream] == ["Hel", "Hello", "Hello world"]
    assert stream[-1].finish_reason == "stop"


def test_a_backend_that_just_ends_finishes_with_stop(load_scripted: Any) -> None:
    loaded, _ = load_scripted(chunks("a", "b"))
    stream = list(loaded.generate("hi"))
    assert_well_formed(stream)
    assert (stream[-1].text, stream[-1].finish_reason) == ("ab", "stop")


def test_tokens_never_decrease_and_never_pass_max_new_tokens(load_scripted: Any) -> None:
    script = [
        Chunk(delta="a", tokens=1),
        Chunk(delta="b", tokens=3),
        Chunk(delta="c", tokens=2),
        Chunk(delta="d", tokens=50),
        Chunk(delta="e", tokens=51),
    ]
    loaded, backend = load_scripted(script)
    stream = list(loaded.generate("hi", max_new_tokens=10))
    assert_well_formed(stream, max_new_tokens=10)
    assert [c.tokens for c in stream] == [1, 3, 3, 10]
    assert stream[-1].finish_reason == "length"
    assert backend.yielded == 4 and backend.closed == 1


def test_max_new_tokens_ends_an_endless_backend_with_length(load_scripted: Any, endless_script: Any) -> None:
    loaded, backend = load_scripted(endless_script)
    stream = list(loaded.generate("hi", max_new_tokens=5))
    assert_well_formed(stream, max_new_tokens=5)
    assert stream[-1].tokens == 5 and stream[-1].finish_reason == "length"
    assert stream[-1].text == "w1 w2 w3 w4 w5 "
    assert backend.yielded == 5 and backend.closed == 1


def test_the_backend_sees_the_validated_options(load_scripted: Any) -> None:
    loaded, backend = load_scripted(chunks("x"))
    list(loaded.generate("hi", max_new_tokens=7, temperature=0.5, seed=3, stop="END", top_p=0.9))
    options = backend.last_options
    assert (options.max_new_tokens, options.temperature, options.seed, options.stop) == (7, 0.5, 3, ("END",))
    assert options.extra == {"top_p": 0.9}
    assert backend.last_messages == [{"role": "user", "content": "hi"}]


def test_a_backend_yielding_something_else_than_chunks_is_a_plugin_error(load_scripted: Any) -> None:
    loaded, backend = load_scripted(["not a chunk"])
    with pytest.raises(AnyformerError) as caught:
        list(loaded.generate("hi"))
    assert caught.value.code is ErrorCode.PLUGIN_ERROR
    assert backend.closed == 1
    loaded.generate("hi").close()  # the model is free again: no BUSY


# ---- stop strings --------------------------------------------------------------------------------


def test_a_stop_string_cuts_the_text_and_finishes_with_stop(load_scripted: Any) -> None:
    loaded, backend = load_scripted(chunks("Hello", " wor", "ld END here", "never seen"))
    stream = list(loaded.generate("hi", stop=["END"]))
    assert_well_formed(stream)
    assert (stream[-1].text, stream[-1].finish_reason) == ("Hello world ", "stop")
    assert not any("END" in c.text for c in stream)
    assert backend.yielded == 3 and backend.closed == 1


def test_a_stop_string_split_across_chunks_is_cut_and_never_shown(load_scripted: Any) -> None:
    loaded, _ = load_scripted(chunks("abc<", "|e", "nd", "|>tail"))
    stream = list(loaded.generate("hi", stop="<|end|>"))
    assert_well_formed(stream)
    assert stream[-1].text == "abc" and stream[-1].finish_reason == "stop"
    assert not any("<" in c.text for c in stream), [c.text for c in stream]


def test_held_back_text_that_is_not_a_stop_is_released(load_scripted: Any) -> None:
    loaded, _ = load_scripted(chunks("x<", "|eX", "yz"))
    stream = list(loaded.generate("hi", stop="<|end|>"))
    assert_well_formed(stream)
    assert [c.text for c in stream][:2] == ["x", "x<|eX"]
    assert stream[-1].text == "x<|eXyz"


def test_held_back_text_at_the_end_of_the_stream_is_not_lost(load_scripted: Any) -> None:
    loaded, _ = load_scripted(chunks("answer <|e"))
    stream = list(loaded.generate("hi", stop=["<|end|>"]))
    assert_well_formed(stream)
    assert stream[-1].text == "answer <|e" and stream[-1].finish_reason == "stop"


def test_the_earliest_of_several_stop_strings_wins(load_scripted: Any) -> None:
    loaded, _ = load_scripted(chunks("one TWO three ONE"))
    assert loaded.complete("hi", stop=["ONE", "TWO"]).text == "one "


def test_nothing_leaks_into_the_next_call(load_scripted: Any) -> None:
    loaded, _ = load_scripted(chunks("first STOP", " rest"))
    assert loaded.complete("hi", stop="STOP").text == "first "
    second = list(loaded.generate("again"))
    assert_well_formed(second)
    assert second[0].text == "first STOP" and second[-1].text == "first STOP rest"


# ---- cancel and close ----------------------------------------------------------------------------


@pytest.mark.safety("R1")
def test_cancel_ends_the_stream_within_two_chunks_and_closes_the_backend(
    load_scripted: Any, endless_script: Any
) -> None:
    loaded, backend = load_scripted(endless_script)
    cancel = threading.Event()
    stream = []
    after_cancel = 0
    for chunk in loaded.generate("hi", max_new_tokens=10**6, cancel=cancel):
        stream.append(chunk)
        if cancel.is_set():
            after_cancel += 1
        if len(stream) == 3:
            cancel.set()
    assert after_cancel <= 2
    assert stream[-1].finish_reason == "cancelled"
    assert_well_formed(stream, max_new_tokens=10**6)
    assert backend.closed == 1 and backend.yielded <= 5
    assert loaded.complete("again", max_new_tokens=2).finish_reason == "length"  # still usable


def test_cancel_set_before_the_call_does_no_work(load_scripted: Any, endless_script: Any) -> None:
    loaded, backend = load_scripted(endless_script)
    cancel = threading.Event()
    cancel.set()
    stream = list(loaded.generate("hi", cancel=cancel))
    assert [(c.text, c.finish_reason) for c in stream] == [("", "cancelled")]
    assert backend.yielded == 0


@pytest.mark.safety("R1")
def test_cancel_from_another_thread_stops_the_stream(load_scripted: Any) -> None:
    def slow(options: Any) -> Iterator[Chunk]:
        for n in range(1, 10**6):
            time.sleep(0.001)
            yield Chunk(delta=".", tokens=n)

    loaded, backend = load_scripted(slow)
    cancel = threading.Event()
    threading.Timer(0.05, cancel.set).start()
    last = loaded.complete("hi", max_new_tokens=10**5, cancel=cancel)
    assert last.finish_reason == "cancelled" and backend.closed == 1


@pytest.mark.safety("R1", "R3")
def test_closing_the_iterator_early_closes_the_backend_and_releases_busy(
    load_scripted: Any, endless_script: Any
) -> None:
    loaded, backend = load_scripted(endless_script)
    stream = loaded.generate("hi")
    next(stream)
    next(stream)
    stream.close()
    assert backend.closed == 1
    assert loaded.complete("again", max_new_tokens=3).text == "w1 w2 w3 "
    stream.close()  # a second close does nothing


@pytest.mark.safety("R3")
def test_breaking_out_of_a_for_loop_releases_the_model_without_waiting_for_gc(
    load_scripted: Any, endless_script: Any
) -> None:
    loaded, backend = load_scripted(endless_script)
    gc.disable()
    try:
        for chunk in loaded.generate("hi"):
            if chunk.tokens == 2:
                break
        assert backend.closed == 1
        assert loaded.complete("again", max_new_tokens=1).text == "w1 "
    finally:
        gc.enable()


def test_a_stream_dropped_before_its_first_chunk_releases_the_model(load_scripted: Any) -> None:
    loaded, _ = load_scripted(chunks("a"))
    gc.disable()
    try:
        stream = loaded.generate("hi")
        del stream
        assert loaded.complete("again").text == "a"
    finally:
        gc.enable()


@pytest.mark.safety("R2")
def test_a_second_generate_while_one_is_open_is_busy(load_scripted: Any, endless_script: Any) -> None:
    loaded, backend = load_scripted(endless_script)
    first = loaded.generate("hi")
    next(first)
    with pytest.raises(AnyformerError) as caught:
        loaded.generate("again")
    assert caught.value.code is ErrorCode.BUSY
    with pytest.raises(AnyformerError) as caught:
        loaded.complete("again")
    assert caught.value.code is ErrorCode.BUSY
    assert backend.started == 1
    assert next(first).text == "w1 w2 "  # the open stream is untouched
    first.close()


@pytest.mark.safety("R2")
def test_busy_from_another_thread_never_interleaves(load_scripted: Any) -> None:
    def slow(options: Any) -> Iterator[Chunk]:
        for n in range(1, 6):
            time.sleep(0.01)
            yield Chunk(delta=str(n), tokens=n)

    loaded, _ = load_scripted(slow)
    results: list[Any] = []

    def call() -> None:
        try:
            results.append(loaded.complete("hi").text)
        except AnyformerError as exc:
            results.append(exc.code)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert "12345" in results
    assert all(r in ("12345", ErrorCode.BUSY) for r in results)


# ---- malformed requests --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages",
    [
        [],
        42,
        b"hello",
        [{"role": "robot", "content": "hi"}],
        [{"role": "user"}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": []}],
        [{"role": "user", "content": [{"type": "video", "video": "x.mp4"}]}],
        [{"role": "user", "content": [{"type": "text"}]}],
        [{"role": "user", "content": [{"type": "image", "image": ""}]}],
        [{"role": "user", "content": [{"type": "image", "image": 3.5}]}],
        [{"role": "user", "content": [{"type": "audio", "audio": ""}]}],
        [{"role": "user", "content": [{"type": "audio", "audio": 3.5}]}],
        [{"role": "user", "content": [{"type": "audio", "audio": {"raw": [0.0], "sampling_rate": "16k"}}]}],
        [{"role": "user", "content": [{"type": "audio", "audio": {"sampling_rate": 16000}}]}],
        ["hi"],
    ],
    ids=lambda m: repr(m)[:40],
)
def test_malformed_messages_are_bad_request_before_the_backend_is_called(load_scripted: Any, messages: Any) -> None:
    loaded, backend = load_scripted(chunks("ok"))
    with pytest.raises(AnyformerError) as caught:
        loaded.generate(messages)
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert backend.started == 0
    assert loaded.complete("hi").text == "ok"  # no lock was left held


@pytest.mark.parametrize(
    "options",
    [
        {"max_new_tokens": 0},
        {"max_new_tokens": -1},
        {"max_new_tokens": "8"},
        {"max_new_tokens": True},
        {"max_new_tokens": 8.0},
        {"temperature": -1},
        {"temperature": "hot"},
        {"temperature": float("nan")},
        {"seed": -1},
        {"seed": 2**32},
        {"seed": "1"},
        {"stop": [""]},
        {"stop": ""},
        {"stop": 5},
        {"stop": ["ok", 3]},
        {"thinking": "yes"},
        {"cancel": object()},
    ],
    ids=repr,
)
def test_malformed_options_are_bad_request_before_the_backend_is_called(load_scripted: Any, options: Any) -> None:
    loaded, backend = load_scripted(chunks("ok"))
    with pytest.raises(AnyformerError) as caught:
        loaded.generate("hi", **options)
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert backend.started == 0
    assert loaded.complete("hi").text == "ok"


def test_content_blocks_pass_through_validated(load_scripted: Any) -> None:
    loaded, backend = load_scripted(chunks("ok"))
    blocks = [{"type": "text", "text": "what is it?"}, {"type": "image", "image": b"\x89PNG"}]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": blocks}]
    loaded.complete(messages)
    assert backend.last_messages == messages


def test_audio_blocks_reach_only_a_handle_that_reads_audio(load_scripted: Any) -> None:
    loaded, backend = load_scripted(chunks("ok"))
    clip = {"raw": [0.0, 0.5], "sampling_rate": 16000}
    messages = [{"role": "user", "content": [{"type": "audio", "audio": clip}, {"type": "text", "text": "?"}]}]
    assert not loaded.audio_input
    with pytest.raises(AnyformerError) as caught:
        loaded.generate(messages)
    assert caught.value.code is ErrorCode.BAD_REQUEST and "audio" in caught.value.message
    assert backend.started == 0
    loaded, backend = load_scripted(chunks("ok"), features=Features(audio_input=True))
    assert loaded.audio_input
    loaded.complete(messages)
    assert backend.last_messages == messages


# ---- lifetime ------------------------------------------------------------------------------------


@pytest.mark.safety("R3")
def test_dispose_twice_disposes_the_handle_once(load_scripted: Any) -> None:
    loaded, backend = load_scripted(chunks("ok"))
    loaded.dispose()
    loaded.dispose()
    assert backend.handles[0].disposed == 1
    with pytest.raises(AnyformerError) as caught:
        loaded.generate("hi")
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_the_context_manager_disposes_on_exit_and_on_error(load_scripted: Any) -> None:
    loaded, backend = load_scripted(chunks("ok"))
    with loaded as same:
        assert same is loaded
        assert same.complete("hi").text == "ok"
    assert backend.handles[0].disposed == 1
    loaded, backend = load_scripted(chunks("ok"))
    with pytest.raises(KeyError), loaded:
        raise KeyError("boom")
    assert backend.handles[0].disposed == 1


def test_run_on_a_handle_without_run_is_bad_request(load_scripted: Any) -> None:
    loaded, _ = load_scripted(chunks("ok"))
    with pytest.raises(AnyformerError, match="no run") as caught:
        loaded.run("some text")
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_run_passes_input_and_options_to_the_handle(load_scripted: Any) -> None:
    loaded, _ = load_scripted(runnable=True)
    assert loaded.run("some text", normalize=True) == {"input": "some text", "options": {"normalize": True}}
    loaded.dispose()
    with pytest.raises(AnyformerError) as caught:
        loaded.run("after dispose")
    assert caught.value.code is ErrorCode.BAD_REQUEST


# ---- the async twin ------------------------------------------------------------------------------


def test_agenerate_yields_the_same_chunks_as_generate(load_scripted: Any) -> None:
    loaded, _ = load_scripted(chunks("Hello", " wor", "ld <|e", "nd|> more"))
    expected = list(loaded.generate("hi", stop="<|end|>"))

    async def collect() -> list[Chunk]:
        return [chunk async for chunk in loaded.agenerate("hi", stop="<|end|>")]

    assert asyncio.run(collect()) == expected
    assert expected[-1].text == "Hello world "


def test_agenerate_validates_before_any_work(load_scripted: Any) -> None:
    loaded, backend = load_scripted(chunks("ok"))

    async def collect() -> list[Chunk]:
        return [chunk async for chunk in loaded.agenerate([{"role": "robot", "content": "x"}])]

    with pytest.raises(AnyformerError) as caught:
        asyncio.run(collect())
    assert caught.value.code is ErrorCode.BAD_REQUEST and backend.started == 0


def _slow_endless(options: Any) -> Iterator[Chunk]:
    for n in range(1, 10**7):
        time.sleep(0.002)
        yield Chunk(delta="x", tokens=n)


@pytest.mark.safety("R1")
def test_cancelling_the_agenerate_task_stops_the_backend(load_scripted: Any) -> None:
    loaded, backend = load_scripted(_slow_endless)
    seen: list[Chunk] = []

    async def consume(three: asyncio.Event) -> None:
        async for chunk in loaded.agenerate("hi", max_new_tokens=10**6):
            seen.append(chunk)
            if len(seen) == 3:
                three.set()

    async def main() -> None:
        three = asyncio.Event()
        task = asyncio.create_task(consume(three))
        await three.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert backend.closed == 1 and backend.last_options.cancel.is_set()
    stopped_at = backend.yielded
    time.sleep(0.05)
    assert backend.yielded == stopped_at
    assert loaded.complete("again", max_new_tokens=2).text == "xx"


def test_closing_the_agenerate_iterator_stops_the_backend(load_scripted: Any) -> None:
    loaded, backend = load_scripted(_slow_endless)

    async def main() -> None:
        async with contextlib.aclosing(loaded.agenerate("hi", max_new_tokens=10**6)) as stream:
            async for chunk in stream:
                if chunk.tokens >= 2:
                    break

    asyncio.run(main())
    assert backend.closed == 1
    assert loaded.complete("again", max_new_tokens=1).text == "x"


@pytest.mark.safety("R3")
def test_dispose_while_streaming_stops_the_stream_first(load_scripted: Any, endless_script: Any) -> None:
    loaded, backend = load_scripted(endless_script)
    stream = loaded.generate("hi", max_new_tokens=1000)
    next(stream)
    loaded.dispose()
    assert backend.closed == 1, "the backend's iterator must be closed before its model is freed"
    assert backend.handles[0].disposed == 1
    with pytest.raises(StopIteration):
        next(stream)


@pytest.mark.safety("R3")
def test_dispose_from_another_thread_waits_for_the_running_generation(load_scripted: Any) -> None:
    loaded, backend = load_scripted(_slow_endless)
    seen: list[Chunk] = []

    def consume() -> None:
        seen.extend(loaded.generate("hi", max_new_tokens=1000))

    worker = threading.Thread(target=consume)
    worker.start()
    while backend.yielded < 2:
        time.sleep(0.001)
    loaded.dispose()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert seen[-1].finish_reason == "cancelled"
    assert backend.closed == 1 and backend.handles[0].disposed == 1


@pytest.mark.safety("R3")
def test_dispose_never_frees_the_model_under_an_engine_call_that_outlives_the_wait(
    load_scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from anyformer import _loaded

    monkeypatch.setattr(_loaded, "_DISPOSE_WAIT_SECONDS", 0.05)
    in_engine, engine_returns = threading.Event(), threading.Event()

    def stuck(options: Any) -> Iterator[Chunk]:
        yield Chunk(delta="a", tokens=1)
        in_engine.set()
        engine_returns.wait(10)  # an engine call that ignores cancel until it returns
        yield Chunk(delta="b", tokens=2)

    loaded, backend = load_scripted(stuck)
    seen: list[Chunk] = []
    worker = threading.Thread(target=lambda: seen.extend(loaded.generate("hi", max_new_tokens=1000)))
    worker.start()
    assert in_engine.wait(10)
    loaded.dispose()
    handle = backend.handles[0]
    assert handle.disposed == 0, "dispose freed the model while an engine call was still running on it"
    engine_returns.set()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert seen[-1].finish_reason == "cancelled"
    assert handle.disposed == 1, "the model must be freed once the stream lets go of it"
    loaded.dispose()
    assert handle.disposed == 1


def test_a_backend_exception_while_streaming_is_plugin_error_naming_it(load_scripted: Any) -> None:
    def broken(options: Any) -> Iterator[Chunk]:
        yield Chunk(delta="a", tokens=1)
        raise KeyError("kv slot")

    loaded, _backend = load_scripted(broken)
    with pytest.raises(AnyformerError) as caught:
        list(loaded.generate("hi"))
    assert caught.value.code is ErrorCode.PLUGIN_ERROR and "fake" in caught.value.message
    assert isinstance(caught.value.__cause__, KeyError)
    after = list(loaded.generate("hi", max_new_tokens=1))  # BUSY here if the error kept the lock
    assert after[-1].finish_reason == "length" and after[-1].text == "a"


def test_an_unknown_finish_reason_is_plugin_error(load_scripted: Any) -> None:
    loaded, _ = load_scripted([Chunk(delta="a", tokens=1, finish_reason="eos")])
    with pytest.raises(AnyformerError) as caught:
        list(loaded.generate("hi"))
    assert caught.value.code is ErrorCode.PLUGIN_ERROR and "'eos'" in caught.value.message


def test_the_prompt_count_a_backend_reports_rides_on_every_later_chunk(load_scripted: Any) -> None:
    script = [Chunk(delta="a", tokens=1, prompt_tokens=7), Chunk(delta="b", tokens=2), Chunk(delta="c", tokens=3)]
    loaded, _ = load_scripted(script)
    chunks = list(loaded.generate("hi"))
    assert [c.prompt_tokens for c in chunks] == [7] * len(chunks)


def test_no_prompt_count_means_none(load_scripted: Any) -> None:
    loaded, _ = load_scripted(chunks("a", "b"))
    assert {c.prompt_tokens for c in loaded.generate("hi")} == {None}


def test_a_preview_rides_on_its_own_chunk_and_never_on_the_last(load_scripted: Any) -> None:
    script = [
        Chunk(tokens=0, preview="[M] [M]"),
        Chunk(delta="a", tokens=1, preview="a [M]"),
        Chunk(delta=" b", tokens=2, finish_reason="length", preview="a b"),
    ]
    loaded, _ = load_scripted(script)
    stream = list(loaded.generate("hi", max_new_tokens=2))
    assert_well_formed(stream, max_new_tokens=2)
    assert [(c.text, c.preview) for c in stream] == [("", "[M] [M]"), ("a", "a [M]"), ("a b", None)]


def test_a_preview_that_is_not_text_is_dropped(load_scripted: Any) -> None:
    loaded, _ = load_scripted([Chunk(delta="a", tokens=1, preview=3), Chunk(delta="b", tokens=2)])  # type: ignore[arg-type]
    assert {c.preview for c in loaded.generate("hi")} == {None}


def test_generate_returns_a_generator_that_close_and_throw_end_cleanly(load_scripted: Any, endless_script: Any) -> None:
    import collections.abc

    loaded, backend = load_scripted(endless_script)
    stream = loaded.generate("hi", max_new_tokens=1000)
    assert isinstance(stream, collections.abc.Generator)
    first = stream.send(None)
    assert first.tokens == 1
    with pytest.raises(KeyError):
        stream.throw(KeyError("stop here"))
    assert backend.closed == 1, "throwing into the stream must close the backend's iterator"
    assert loaded.complete("hi", max_new_tokens=2).finish_reason == "length", "the model is free again"
