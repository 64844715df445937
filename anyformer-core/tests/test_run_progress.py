"""``Loaded.run(input, progress=, cancel=)``: progress events of a long run, and cancelling it part way.

The ``counts`` backend (:mod:`worker_engines`) declares ``run_progress`` and reports a ``units``
event after each unit of work; ``steady`` is an old-style handle whose ``run`` takes no progress.
Every behaviour is checked in this process and through an isolated worker, where events and the
cancel cross the pipe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import worker_engines

import anyformer
from anyformer import AnyformerError, Caps, ErrorCode, ProgressEvent


@pytest.fixture
def engines(distributions: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    distributions.add("aftest-engines", "1.0", worker_engines.ENTRY_POINTS)
    monkeypatch.setenv("ANYFORMER_PLUGINS", ",".join(worker_engines.ENTRY_POINTS))
    return distributions


@pytest.fixture(params=[False, True], ids=["in-process", "isolated"])
def load(request: Any, engines: Any, model_description: dict[str, Any]) -> Iterator[Callable[[str], Any]]:
    """Load the test model on a backend of :mod:`worker_engines`, in this process or in a worker."""
    opened: list[anyformer.Loaded] = []

    def open_(backend: str) -> anyformer.Loaded:
        loaded = anyformer.load(
            model_description, backend=backend, caps=Caps(ram_bytes=16 * 2**30), isolate=request.param
        )
        assert loaded.isolated is request.param
        opened.append(loaded)
        return loaded

    yield open_
    for loaded in opened:
        loaded.dispose()


def _units_done(loaded: anyformer.Loaded) -> int:
    return int(loaded.run("stats")["units"])


def test_events_arrive_in_order_one_per_unit(load: Any) -> None:
    loaded = load("counts")
    assert loaded.run_progress is True
    events: list[ProgressEvent] = []
    assert loaded.run({"units": 5}, progress=events.append) == {"done": [0, 1, 2, 3, 4]}
    assert [(e.stage, e.done, e.total) for e in events] == [("units", n, 5) for n in range(1, 6)]
    assert all(e.backend == "counts" and e.total is not None and e.done <= e.total for e in events)


def test_cancel_after_the_first_unit_raises_cancelled_and_returns_nothing(load: Any) -> None:
    loaded = load("counts")
    cancel = threading.Event()
    events: list[ProgressEvent] = []

    def stop_after_one(event: ProgressEvent) -> None:
        events.append(event)
        if event.done == 1:
            cancel.set()

    before = _units_done(loaded)
    with pytest.raises(AnyformerError) as caught:
        loaded.run({"units": 50}, progress=stop_after_one, cancel=cancel)
    assert caught.value.code is ErrorCode.CANCELLED
    assert [e.done for e in events] == [1]
    assert _units_done(loaded) - before == 1  # the engine stopped at the next unit, not at the end
    assert loaded.run({"units": 2}) == {"done": [0, 1]}  # and the model is ready for the next call


def test_cancel_from_another_thread_stops_a_long_run_part_way(load: Any) -> None:
    loaded = load("counts")
    cancel = threading.Event()
    timer = threading.Timer(0.3, cancel.set)
    timer.start()
    began = time.monotonic()
    try:
        with pytest.raises(AnyformerError) as caught:
            loaded.run({"units": 1000, "delay": 0.01}, cancel=cancel)
    finally:
        timer.cancel()
    assert caught.value.code is ErrorCode.CANCELLED
    assert time.monotonic() - began < 5.0  # the whole run would take 10 s
    assert 0 < _units_done(loaded) < 1000


def test_a_cancel_set_before_the_call_does_no_work(load: Any) -> None:
    loaded = load("counts")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(AnyformerError) as caught:
        loaded.run({"units": 3}, cancel=cancel)
    assert caught.value.code is ErrorCode.CANCELLED
    assert _units_done(loaded) == 0


def test_an_old_style_handle_without_the_parameter_still_runs(load: Any) -> None:
    loaded = load("steady")
    assert loaded.run_progress is False
    events: list[ProgressEvent] = []
    # The core passes no progress to a handle that does not declare run_progress: it is not an option.
    assert loaded.run("text", progress=events.append, normalize=True) == {
        "input": "text",
        "options": {"normalize": True},
    }
    assert events == []


def test_an_old_style_run_cancelled_meanwhile_gives_no_result(load: Any) -> None:
    loaded = load("steady")
    cancel = threading.Event()
    timer = threading.Timer(0.1, cancel.set)
    timer.start()
    try:
        with pytest.raises(AnyformerError) as caught:
            loaded.run("sleep", cancel=cancel)  # the handle cannot stop part way: it ends, its result is dropped
    finally:
        timer.cancel()
    assert caught.value.code is ErrorCode.CANCELLED
    assert loaded.run("again") == {"input": "again", "options": {}}


def test_an_event_that_is_not_a_progress_event_is_a_plugin_error(load: Any) -> None:
    loaded = load("counts")
    with pytest.raises(AnyformerError) as caught:
        loaded.run({"units": 2, "malformed": True}, progress=lambda event: None)
    assert caught.value.code is ErrorCode.PLUGIN_ERROR and "ProgressEvent" in caught.value.message


def test_a_raising_callback_stops_the_run_and_its_exception_reaches_the_caller(load: Any) -> None:
    loaded = load("counts")

    def fails(event: ProgressEvent) -> None:
        raise KeyError("display gone")

    with pytest.raises(KeyError):
        loaded.run({"units": 20}, progress=fails)
    assert _units_done(loaded) == 1
    assert loaded.run({"units": 1}) == {"done": [0]}


@pytest.mark.parametrize(("progress", "cancel"), [("not callable", None), (None, "not an event")])
def test_malformed_controls_are_bad_request(load: Any, progress: Any, cancel: Any) -> None:
    loaded = load("counts")
    with pytest.raises(AnyformerError) as caught:
        loaded.run({"units": 1}, progress=progress, cancel=cancel)
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_dispose_cancels_a_run_in_another_thread(load: Any) -> None:
    loaded = load("counts")
    events: list[ProgressEvent] = []
    outcome: list[BaseException | Any] = []

    def work() -> None:
        try:
            outcome.append(loaded.run({"units": 1000, "delay": 0.01}, progress=events.append))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    deadline = time.monotonic() + 10
    while not events and time.monotonic() < deadline:
        time.sleep(0.01)
    began = time.monotonic()
    loaded.dispose()
    worker.join(timeout=10)
    assert time.monotonic() - began < 5.0  # not the 10 s the whole run takes
    assert isinstance(outcome[0], AnyformerError) and outcome[0].code is ErrorCode.CANCELLED
    assert 0 < len(events) < 1000
