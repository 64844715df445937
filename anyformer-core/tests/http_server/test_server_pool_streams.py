"""The pool sizes a model for every stream it serves: a batching backend's KV per stream counts against memory."""

from __future__ import annotations

from typing import Any

from anyformer import Caps

from .server_support import PacedBackend, plain_request
from .test_server_faults import chat, open_stream

#: Weights of every paced model, and the KV region each of its streams adds (host memory).
WEIGHTS, PER_STREAM = 3 * 10**8, 10**8


def ask(url: str, model: str) -> Any:
    return plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=1))


def test_two_models_that_fit_at_one_stream_stay_loaded_together(paced_server: Any, model_folders: Any) -> None:
    # 4e8 each at one stream: two fit in 1 GB, as before streams were counted.
    backend = PacedBackend(ram_bytes=WEIGHTS, stream_bytes=PER_STREAM)
    url, _backend, pool = paced_server(backend=backend, caps=Caps(ram_bytes=10**9), parallel=1)
    first, second = model_folders("first"), model_folders("second")
    assert ask(url, first).status == 200 and ask(url, second).status == 200
    assert [h.disposed for h in backend.handles] == [False, False]
    assert [m["ram_bytes"] for m in pool.loaded()] == [WEIGHTS + PER_STREAM] * 2
    assert all("parallel" not in options for options in backend.checked_options)


def test_the_same_two_at_four_streams_evict_rather_than_over_commit(paced_server: Any, model_folders: Any) -> None:
    # 7e8 each at four streams: the second evicts the first.
    backend = PacedBackend(ram_bytes=WEIGHTS, stream_bytes=PER_STREAM)
    url, _backend, pool = paced_server(backend=backend, caps=Caps(ram_bytes=10**9), parallel=4)
    first, second = model_folders("first"), model_folders("second")
    assert ask(url, first).status == 200 and ask(url, second).status == 200
    assert [h.disposed for h in backend.handles] == [True, False]
    assert [(m["id"], m["ram_bytes"]) for m in pool.loaded()] == [(second, WEIGHTS + 4 * PER_STREAM)]
    # The check asked with the load's own options, so the estimate held the four streams' KV.
    assert backend.checked_options and all(options == {"parallel": 4} for options in backend.checked_options)


def test_four_streams_beside_a_busy_model_are_refused_with_busy(paced_server: Any, model_folders: Any) -> None:
    backend = PacedBackend(ram_bytes=WEIGHTS, stream_bytes=PER_STREAM)
    url, _backend, pool = paced_server(backend=backend, caps=Caps(ram_bytes=10**9), parallel=4)
    first, second = model_folders("first"), model_folders("second")
    connection, _response = open_stream(url, chat(first, max_tokens=100_000))
    try:
        reply = ask(url, second)
        assert reply.status == 503 and reply.json()["error"]["code"] == "BUSY"
        assert len(backend.handles) == 1  # refused before it loaded
    finally:
        connection.close()
    assert [m["id"] for m in pool.loaded()] == [first]


def test_auto_streams_counted_after_load_make_room(paced_server: Any, model_folders: Any) -> None:
    # "auto" is 2 streams once loaded, though the estimate counted 1: 4e8 + 4e8 fits in 9.5e8 before load,
    # 5e8 + 5e8 does not after it, so the first leaves once the second is sized for its two streams.
    backend = PacedBackend(ram_bytes=WEIGHTS, stream_bytes=PER_STREAM)
    url, _backend, pool = paced_server(backend=backend, caps=Caps(ram_bytes=95 * 10**7), parallel="auto")
    first, second = model_folders("first"), model_folders("second")
    assert ask(url, first).status == 200
    assert [m["ram_bytes"] for m in pool.loaded()] == [WEIGHTS + 2 * PER_STREAM]
    assert ask(url, second).status == 200
    assert [h.disposed for h in backend.handles] == [True, False]
    assert [(m["id"], m["ram_bytes"]) for m in pool.loaded()] == [(second, WEIGHTS + 2 * PER_STREAM)]
    assert backend.checked_options[-1] == {"parallel": 2}  # asked again for the streams it serves


def test_auto_streams_beside_a_busy_model_unload_the_newcomer(paced_server: Any, model_folders: Any) -> None:
    backend = PacedBackend(ram_bytes=WEIGHTS, stream_bytes=PER_STREAM)
    url, _backend, pool = paced_server(backend=backend, caps=Caps(ram_bytes=95 * 10**7), parallel="auto")
    first, second = model_folders("first"), model_folders("second")
    connection, _response = open_stream(url, chat(first, max_tokens=100_000))
    try:
        reply = ask(url, second)
        assert reply.status == 503 and reply.json()["error"]["code"] == "BUSY"
        # It loaded, was found to need two streams' KV beside a busy model, and left again.
        assert [h.disposed for h in backend.handles] == [False, True]
        assert [m["id"] for m in pool.loaded()] == [first]
    finally:
        connection.close()
