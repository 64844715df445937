"""Faults and limits: disconnects, the bounded queue, crashes, eviction, budget and auth, on the paced backend."""

from __future__ import annotations

import dataclasses
import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from anyformer import AnyformerError, Caps, Chunk, ErrorCode, hookimpl
from anyformer.server._pool import ModelPool

from .server_support import CRASH_PROMPT, DRAFT_PROMPT, PacedBackend, PacedHandle, plain_request


def chat(model: str, text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


def wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def open_stream(url: str, body: dict[str, Any]) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Start a streamed chat and read its first event; the caller closes the connection."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    connection.request(
        "POST",
        "/v1/chat/completions",
        json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    return connection, response


def test_a_client_that_disconnects_mid_stream_frees_the_model(paced_server: Any, model_folders: Any) -> None:
    url, backend, _pool = paced_server()
    model = model_folders("a")
    connection, response = open_stream(url, chat(model, max_tokens=100_000))
    for _ in range(3):
        response.readline()
    connection.sock.shutdown(2)  # type: ignore[union-attr]
    connection.close()
    wait_for(lambda: backend.finished == ["cancelled"])
    started = time.monotonic()
    reply = plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=5))
    assert reply.status == 200, reply.body
    assert reply.json()["choices"][0]["message"]["content"] == "w1 w2 w3 w4 w5 "
    assert time.monotonic() - started < 2.0


@pytest.mark.safety("R2")
def test_a_full_queue_answers_503_with_retry_after(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server(queue_size=1)
    model = model_folders("a")
    connection, _response = open_stream(url, chat(model, max_tokens=100_000))
    waiting: list[Any] = []
    waiter = threading.Thread(
        target=lambda: waiting.append(plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=3)))
    )
    waiter.start()
    try:
        time.sleep(0.3)  # the second request is now queued behind the stream
        overflow = plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=3))
        assert overflow.status == 503
        assert overflow.json()["error"]["code"] == "BUSY"
        assert overflow.headers["retry-after"].isdigit()
    finally:
        connection.close()
    waiter.join(10)
    assert waiting and waiting[0].status == 200  # the queued one ran once the stream was gone


def test_the_queue_feeds_every_slot_of_a_parallel_model(paced_server: Any, model_folders: Any) -> None:
    url, backend, _pool = paced_server(queue_size=1, parallel=3)
    model = model_folders("p")
    # Three streams run at once (each answers its headers once its first chunk came): the model's three slots.
    streams = [open_stream(url, chat(model, max_tokens=100_000)) for _ in range(3)]
    assert backend.handles[0].parallel == 3 and len(backend.handles) == 1
    waiting: list[Any] = []
    waiter = threading.Thread(
        target=lambda: waiting.append(plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=3)))
    )
    waiter.start()
    try:
        time.sleep(0.3)  # the fourth request waits in the queue for a slot
        assert not waiting
        overflow = plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=3))
        assert overflow.status == 503 and overflow.json()["error"]["code"] == "BUSY"
        streams[0][0].close()  # one slot frees: the queued request takes it
        waiter.join(10)
        assert waiting and waiting[0].status == 200
    finally:
        for connection, _response in streams:
            connection.close()


def test_parallel_auto_is_the_backends_to_decide(paced_server: Any, model_folders: Any) -> None:
    url, backend, _pool = paced_server(parallel="auto")
    streams = [open_stream(url, chat(model_folders("p"), max_tokens=100_000)) for _ in range(2)]
    try:
        # The pool asked for "auto" and gives the model as many slots as the backend chose (2 here).
        assert [(h.asked_parallel, h.parallel) for h in backend.handles] == [("auto", 2)]
    finally:
        for connection, _response in streams:
            connection.close()


@pytest.mark.parametrize("value", [0, "4", "many", True])
def test_a_bad_parallel_is_bad_request(value: Any) -> None:
    with pytest.raises(AnyformerError) as caught:
        ModelPool(parallel=value, isolate=False)
    assert caught.value.code is ErrorCode.BAD_REQUEST and "parallel" in caught.value.message


def test_the_serve_command_reads_parallel() -> None:
    from anyformer.cli._serve_cmd import _parallel
    from anyformer.server._pool import DEFAULT_PARALLEL

    assert DEFAULT_PARALLEL == "auto" and _parallel(None, DEFAULT_PARALLEL) == "auto"
    assert (_parallel("auto", 4), _parallel("3", "auto")) == ("auto", 3)
    for bad in ("0", "-1", "x"):
        with pytest.raises(AnyformerError):
            _parallel(bad, "auto")


def test_a_crashed_engine_is_a_500_and_the_next_request_reloads(paced_server: Any, model_folders: Any) -> None:
    url, backend, _pool = paced_server()
    model = model_folders("a")
    crashed = plain_request("POST", f"{url}/v1/chat/completions", chat(model, CRASH_PROMPT, max_tokens=10))
    assert crashed.status == 500 and crashed.json()["error"]["code"] == "BACKEND_CRASHED"
    wait_for(lambda: backend.handles[0].disposed)
    after = plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=2))
    assert after.status == 200
    assert len(backend.handles) == 2


def test_a_crash_mid_stream_ends_the_stream_with_an_error_event(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server()
    model = model_folders("a")
    reply = plain_request("POST", f"{url}/v1/chat/completions", chat(model, CRASH_PROMPT, max_tokens=10, stream=True))
    events = [line[6:] for line in reply.body.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "BACKEND_CRASHED"


@pytest.mark.parametrize("asked", [True, False])
def test_previews_reach_a_client_that_asks_for_them(paced_server: Any, model_folders: Any, asked: bool) -> None:
    url, _backend, _pool = paced_server()
    body = chat(model_folders("a"), DRAFT_PROMPT, max_tokens=3, stream=True)
    if asked:
        body["anyformer_preview"] = True
    reply = plain_request("POST", f"{url}/v1/chat/completions", body)
    events = [json.loads(line[6:]) for line in reply.body.decode().split("\n\n")[:-2] if line.startswith("data: ")]
    deltas = [event["choices"][0]["delta"] for event in events]
    previews = [d["anyformer_preview"] for d in deltas if "anyformer_preview" in d]
    assert previews == (["w1 \u2591\u2591", "w1 w2 \u2591"] if asked else [])
    assert "".join(d.get("content", "") for d in deltas) == "w1 w2 w3 "


def test_the_least_recently_used_model_leaves_when_a_new_one_does_not_fit(
    paced_server: Any, model_folders: Any
) -> None:
    backend = PacedBackend(ram_bytes=6 * 10**8)  # two of them do not fit in 1 GB
    url, _backend, pool = paced_server(backend=backend, caps=Caps(ram_bytes=10**9))
    first, second = model_folders("first"), model_folders("second")
    for model in (first, second, first):
        assert plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=1)).status == 200
    assert [h.disposed for h in backend.handles] == [True, True, False]
    loaded = {item["id"]: item["loaded"] for item in plain_request("GET", f"{url}/v1/models").json()["data"]}
    assert loaded.get(first) is True and loaded.get(second) is not True
    assert [m["id"] for m in pool.loaded()] == [first]


def test_models_lists_loaded_then_stored_models(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server()
    model = model_folders("a")
    assert plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=1)).status == 200
    listed = plain_request("GET", f"{url}/v1/models").json()["data"]
    assert listed[0]["id"] == model and listed[0]["loaded"] is True and listed[0]["object"] == "model"
    stored = [m for m in listed if m["id"] == "paced-org/stored-model"]
    assert stored and stored[0]["stored"] is True and stored[0]["loaded"] is False


def test_models_that_fit_together_stay_loaded(paced_server: Any, model_folders: Any) -> None:
    url, backend, pool = paced_server()
    for name in ("a", "b", "c"):
        assert (
            plain_request("POST", f"{url}/v1/chat/completions", chat(model_folders(name), max_tokens=1)).status == 200
        )
    assert len(pool.loaded()) == 3 and not any(h.disposed for h in backend.handles)


def test_budget_too_small_is_507_with_the_need(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server(backend=PacedBackend(refuse={"huge": "budget"}))
    reply = plain_request("POST", f"{url}/v1/chat/completions", chat(model_folders("huge")))
    assert reply.status == 507
    error = reply.json()["error"]
    assert error["code"] == "BUDGET_TOO_SMALL" and error["need"] == 5 * 10**9
    assert error["verdicts"][0]["code"] == "budget"


def test_no_backend_is_400_with_every_verdict(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server(backend=PacedBackend(refuse={"odd": "format"}))
    reply = plain_request("POST", f"{url}/v1/chat/completions", chat(model_folders("odd")))
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["code"] == "NO_BACKEND" and error["verdicts"][0]["reason"] == "refused on cue (format)"


def test_embeddings_go_through_run_on_a_model_loaded_for_feature_extraction(
    paced_server: Any, model_folders: Any
) -> None:
    url, backend, _pool = paced_server()
    model = model_folders("embedder")
    reply = plain_request("POST", f"{url}/v1/embeddings", {"model": model, "input": ["a b", "c"]})
    assert reply.status == 200, reply.body
    body = reply.json()
    assert [item["index"] for item in body["data"]] == [0, 1] and body["usage"]["prompt_tokens"] == 3
    assert backend.handles[-1].task == "feature-extraction"
    encoded = plain_request(
        "POST", f"{url}/v1/embeddings", {"model": model, "input": "a b", "encoding_format": "base64"}
    ).json()
    assert isinstance(encoded["data"][0]["embedding"], str)


def test_an_embeddings_client_that_disconnects_cancels_its_run(paced_server: Any, model_folders: Any) -> None:
    url, backend, _pool = paced_server()
    model = model_folders("embedder")
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    body = {"model": model, "input": ["slow"] * 400}  # 20 s of work
    connection.request("POST", "/v1/embeddings", json.dumps(body).encode(), {"Content-Type": "application/json"})
    wait_for(lambda: bool(backend.handles) and backend.handles[-1].task == "feature-extraction")
    time.sleep(0.3)
    connection.sock.shutdown(2)  # type: ignore[union-attr]
    connection.close()
    handle = backend.handles[-1]
    wait_for(lambda: bool(handle.runs))
    code, embedded = handle.runs[0]
    assert code == "CANCELLED" and 0 < embedded < 400
    reply = plain_request("POST", f"{url}/v1/embeddings", {"model": model, "input": ["a b"]})
    assert reply.status == 200, reply.body  # the model is free again at once


def test_a_wrong_api_key_is_401_and_the_right_one_passes(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server(api_key="s3cret")
    model = model_folders("a")
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        reply = plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=1), headers)
        assert reply.status == 401 and reply.json()["error"]["code"] == "UNAUTHORIZED"
    assert plain_request("GET", f"{url}/api/check?model=x", headers={"Authorization": "Bearer no"}).status == 401
    ok = plain_request(
        "POST", f"{url}/v1/chat/completions", chat(model, max_tokens=1), {"Authorization": "Bearer s3cret"}
    )
    assert ok.status == 200
    assert plain_request("GET", url + "/").status == 200  # the page itself is public; its calls carry the key


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": "hello"}, "messages"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [""]}, "stop"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "anyformer_preview": 1}, "anyformer_preview"),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}],
            },
            "messages[0].content[0]",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "input_audio", "input_audio": {"data": "AA==", "format": "mp3"}}],
                    }
                ],
            },
            "messages[0].content[0]",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": "x"}]}]},
            "messages[0].content[0]",
        ),
    ],
)
def test_malformed_requests_are_400_naming_the_field(paced_server: Any, body: dict[str, Any], param: str) -> None:
    url, backend, _pool = paced_server()
    reply = plain_request("POST", f"{url}/v1/chat/completions", body)
    assert reply.status == 400
    assert reply.json()["error"]["param"] == param
    assert not backend.handles  # refused before any model was loaded


def test_input_audio_parts_reach_the_backend_as_audio_blocks_of_the_files_bytes() -> None:
    import base64

    from anyformer.server._schemas import parse_chat

    wav = b"RIFF\x24\x00\x00\x00WAVEfmt "
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "?"}, part]}]}
    request = parse_chat(body)
    assert request.messages == [
        {"role": "user", "content": [{"type": "text", "text": "?"}, {"type": "audio", "audio": wav}]}
    ]


class _RawPacedBackend(PacedBackend):
    """Continues raw text but does not score a prompt's tokens."""

    @hookimpl
    def load(self, model: Any, request: Any) -> PacedHandle:
        handle = super().load(model, request)
        handle.features = dataclasses.replace(handle.features, raw_text=True)
        return handle

    def generate_on(self, loaded: Any, messages: Any, options: Any) -> Iterator[Chunk]:
        return self._words(options.prompt, options)


def test_echo_with_logprobs_on_a_backend_that_cannot_score_the_prompt_is_a_400(
    paced_server: Any, model_folders: Any
) -> None:
    url, backend, _pool = paced_server(backend=_RawPacedBackend())
    model = model_folders("a")
    body = {"model": model, "prompt": "hi", "max_tokens": 2, "logprobs": 1}
    assert plain_request("POST", f"{url}/v1/completions", {**body, "logprobs": None}).status == 200
    reply = plain_request("POST", f"{url}/v1/completions", {**body, "echo": True, "max_tokens": 0})
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "BAD_REQUEST"
    assert "log-probabilities" in reply.json()["error"]["message"]
    assert backend.finished == ["length"]  # the refused request never reached the backend
