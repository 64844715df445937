"""Several streams on one loaded model: a handle that declares ``parallel`` > 1, in this process and isolated.

The backend is :data:`worker_engines.triple` (three at once, each reply's words written with its
prompt's first letter); :data:`worker_engines.steady` declares nothing and keeps one stream and ``BUSY``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import worker_engines

import anyformer
from anyformer import AnyformerError, Caps, ErrorCode


@pytest.fixture
def engines(distributions: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    distributions.add("aftest-engines", "1.0", worker_engines.ENTRY_POINTS)
    monkeypatch.setenv("ANYFORMER_PLUGINS", ",".join(worker_engines.ENTRY_POINTS))
    return distributions


@pytest.fixture(params=[False, True], ids=["in-process", "isolated"])
def load(
    request: pytest.FixtureRequest, engines: Any, model_description: dict[str, Any]
) -> Iterator[Callable[..., Any]]:
    """Load the test model on an engine, in this process or in a worker; disposed afterwards."""
    opened: list[anyformer.Loaded] = []

    def open_model(backend: str) -> anyformer.Loaded:
        loaded = anyformer.load(
            model_description, backend=backend, caps=Caps(ram_bytes=16 * 2**30), isolate=request.param
        )
        opened.append(loaded)
        return loaded

    yield open_model
    for loaded in opened:
        loaded.dispose()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_handle_declares_how_many_streams(load: Any) -> None:
    assert load("triple").parallel == 3
    assert load("steady").parallel == 1


def test_interleaved_streams_give_the_texts_they_give_alone(load: Any) -> None:
    loaded = load("triple")
    alone = {prompt: loaded.complete(prompt, max_new_tokens=n).text for prompt, n in (("apple", 5), ("berry", 8))}
    first, second = loaded.generate("apple", max_new_tokens=5), loaded.generate("berry", max_new_tokens=8)
    last: dict[str, Any] = {}
    pending = {"apple": first, "berry": second}
    while pending:
        for prompt, stream in list(pending.items()):
            try:
                last[prompt] = next(stream)
            except StopIteration:
                del pending[prompt]
    assert (
        {prompt: chunk.text for prompt, chunk in last.items()}
        == alone
        == {
            "apple": "a1 a2 a3 a4 a5 ",
            "berry": "b1 b2 b3 b4 b5 b6 b7 b8 ",
        }
    )
    assert last["apple"].finish_reason == last["berry"].finish_reason == "length"


def test_one_stream_more_than_parallel_is_busy_until_one_ends(load: Any) -> None:
    loaded = load("triple")
    streams = [loaded.generate(word, max_new_tokens=50) for word in ("a", "b", "c")]
    for stream in streams:
        next(stream)
    with pytest.raises(AnyformerError) as caught:
        loaded.generate("d")
    assert caught.value.code is ErrorCode.BUSY and "3 streams" in caught.value.message
    streams[1].close()
    assert loaded.complete("dog", max_new_tokens=2).text == "d1 d2 "
    assert next(streams[0]).text.startswith("a1 a2")


def test_a_single_stream_backend_is_still_busy(load: Any) -> None:
    loaded = load("steady")
    stream = loaded.generate("hi")
    next(stream)
    with pytest.raises(AnyformerError) as caught:
        loaded.generate("again")
    assert caught.value.code is ErrorCode.BUSY
    stream.close()


def test_cancel_of_one_stream_leaves_the_others_running(load: Any) -> None:
    loaded = load("triple")
    cancel = threading.Event()
    stopped = loaded.generate("apple", max_new_tokens=1000, cancel=cancel)
    running = loaded.generate("berry", max_new_tokens=6)
    next(stopped), next(running)
    cancel.set()
    assert list(stopped)[-1].finish_reason == "cancelled"
    rest = list(running)
    assert rest[-1].text == "b1 b2 b3 b4 b5 b6 " and rest[-1].finish_reason == "length"


def test_stop_strings_and_limits_belong_to_each_stream(load: Any) -> None:
    loaded = load("triple")
    cut = loaded.generate("apple", max_new_tokens=20, stop="a4")
    short = loaded.generate("berry", max_new_tokens=2)
    long = loaded.generate("cherry", max_new_tokens=9)
    ends = [list(stream)[-1] for stream in (cut, short, long)]
    assert [(c.text, c.finish_reason, c.tokens) for c in ends] == [
        ("a1 a2 a3 ", "stop", 4),
        ("b1 b2 ", "length", 2),
        ("c1 c2 c3 c4 c5 c6 c7 c8 c9 ", "length", 9),
    ]


def test_streams_in_threads_run_at_the_same_time(load: Any) -> None:
    loaded = load("triple")
    texts: dict[str, str] = {}
    started = threading.Barrier(3)

    def consume(word: str) -> None:
        stream = loaded.generate(word, max_new_tokens=40)
        started.wait(timeout=10)  # all three are open before any reads on
        texts[word] = list(stream)[-1].text

    threads = [threading.Thread(target=consume, args=(word,)) for word in ("x", "y", "z")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert texts == {word: "".join(f"{word}{n} " for n in range(1, 41)) for word in "xyz"}
    stats = loaded.run("stats")
    assert stats["peak"] == 3, "the engine never had the three streams open together"


def test_dispose_ends_every_open_stream(load: Any) -> None:
    loaded = load("triple")
    pid = loaded.worker_pid
    streams = [loaded.generate(word, max_new_tokens=1000) for word in ("a", "b", "c")]
    for stream in streams:
        next(stream)
    loaded.dispose()
    for stream in streams:
        with pytest.raises(StopIteration):
            next(stream)
    if pid is not None:
        assert not _alive(pid)
    with pytest.raises(AnyformerError) as caught:
        loaded.generate("d")
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_dispose_waits_for_streams_running_in_other_threads(load: Any) -> None:
    loaded = load("triple")
    ends: list[str | None] = []
    opened = threading.Barrier(4)

    def consume(word: str) -> None:
        stream = loaded.generate(word, max_new_tokens=100_000)
        last = next(stream)
        opened.wait(timeout=10)
        for chunk in stream:  # dispose cancels it mid-read, or closes it between two reads
            last = chunk
        ends.append(last.finish_reason)

    threads = [threading.Thread(target=consume, args=(word,)) for word in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    opened.wait(timeout=10)
    loaded.dispose()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert len(ends) == 3 and set(ends) <= {"cancelled", None}, ends
