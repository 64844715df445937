"""The server's second security round: no request hurts another client's, and nothing waits for ever.

Each test is one attack of issue 28 (docs/safety.md, rows H1 to H8), repeated against a server on
loopback; every loop is bounded and every test stops by itself. A second client is told apart by
its address: it connects from 127.0.0.2 (Linux routes all of 127.0.0.0/8 to loopback).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from anyformer import AnyformerError, ErrorCode, hookimpl
from anyformer.server import _limits
from anyformer.server._limits import (
    MAX_EMBEDDING_CHARS,
    MAX_EMBEDDING_INPUTS,
    MAX_JSON_VALUES,
    MAX_MESSAGES,
    MAX_PARTS,
    MAX_PARTS_PER_MESSAGE,
    json_value_bound,
    sampling_options,
)

from .server_support import PacedBackend, Reply, plain_request
from .test_server_faults import chat, open_stream, wait_for

OTHER_CLIENT = "127.0.0.2"


def _post(url: str, path: str, body: Any, source: str | None = None, timeout: float = 60) -> Reply:
    """A POST from ``source`` (an address of this machine) when given."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(
        parts.hostname, parts.port, timeout=timeout, source_address=(source, 0) if source else None
    )
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        connection.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


def _timed_health(url: str) -> float:
    started = time.monotonic()
    assert plain_request("GET", f"{url}/health").status == 200
    return time.monotonic() - started


# ---- H1: a body's cost is bounded before any work ----------------------------------------------


@pytest.mark.safety("H1")
def test_the_json_value_count_is_bounded_on_the_bytes_without_parsing() -> None:
    prose = json.dumps({"text": 'a, b: [c], "d" \\ ' * 60_000}).encode()  # structure-like bytes inside one string
    assert prose.count(b",") > MAX_JSON_VALUES
    assert json_value_bound(prose) <= 3
    values = json.dumps([{"k": [1, "x,y"]}] * 30_000).encode()  # an object, a key, an array, 1 and a string each
    assert json_value_bound(values) >= 5 * 30_000 + 1
    assert json_value_bound(json.dumps(["a"] * (MAX_JSON_VALUES + 1)).encode()) > MAX_JSON_VALUES
    for escaped in (b'["\\\\", ",", 3]', b'["\\"", ",", 3]'):  # an array and three items
        assert json_value_bound(escaped) >= 4


@pytest.mark.safety("H1")
def test_an_8_mb_body_of_empty_objects_is_400_and_health_answers_meanwhile(
    paced_server: Any, model_folders: Any
) -> None:
    url, backend, _pool = paced_server()
    model = model_folders("a")
    bomb = b'{"model": "' + model.encode() + b'", "messages": [' + b",".join([b"{}"] * 2_700_000) + b"]}"
    assert len(bomb) < 8 * 1024 * 1024
    replies: list[Reply] = []
    attackers = [
        threading.Thread(target=lambda: replies.append(_post(url, "/v1/chat/completions", bomb))) for _ in range(4)
    ]
    for attacker in attackers:
        attacker.start()
    slowest = max(_timed_health(url) for _ in range(10))
    for attacker in attackers:
        attacker.join(60)
    assert [r.status for r in replies] == [400] * 4
    assert "JSON values" in replies[0].json()["error"]["message"]
    assert slowest < 1.0, f"/health took {slowest:.2f} s while 8 MB bodies were refused"
    assert not backend.handles  # refused before any model was loaded


@pytest.mark.safety("H1")
def test_another_clients_stream_does_not_stall_while_large_bodies_arrive(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server()
    model = model_folders("a")
    connection, response = open_stream(url, chat(model, max_tokens=400))
    # Large but within every limit: 90,000 values in about 7 MB, parsed in threads, two at a time.
    text = "x" * 70
    heavy = {"model": model, "messages": [{"role": "user", "content": text}] * 2000, "max_tokens": 1}
    heavy["messages"].append({"role": "user", "content": "y" * (7 * 2**20 - 2000 * 100)})
    heavy_bytes = json.dumps(heavy).encode()  # once: the attackers share this process's GIL with the server
    stop = threading.Event()

    def attack() -> None:
        for _ in range(5):
            if stop.is_set():
                return
            _post(url, "/v1/chat/completions", heavy_bytes)

    attackers = [threading.Thread(target=attack) for _ in range(4)]
    for attacker in attackers:
        attacker.start()
    gaps = []
    last = time.monotonic()
    try:
        for _ in range(150):
            line = response.readline()
            if not line or b"[DONE]" in line:
                break
            now = time.monotonic()
            gaps.append(now - last)
            last = now
    finally:
        stop.set()
        connection.close()
        for attacker in attackers:
            attacker.join(120)
    assert len(gaps) > 100
    assert max(gaps) < 1.0, f"the other client's stream stalled for {max(gaps):.2f} s"


@pytest.mark.safety("H1")
@pytest.mark.parametrize(
    ("messages", "words"),
    [
        ([{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1), "messages"),
        ([{"role": "user", "content": [{"type": "text", "text": "a"}] * (MAX_PARTS_PER_MESSAGE + 1)}], "per message"),
        ([{"role": "user", "content": [{"type": "text", "text": "a"}] * MAX_PARTS_PER_MESSAGE}] * 9, "in all"),
    ],
)
def test_too_many_messages_or_parts_are_400(paced_server: Any, model_folders: Any, messages: Any, words: str) -> None:
    assert MAX_PARTS_PER_MESSAGE * 9 > MAX_PARTS
    url, backend, _pool = paced_server()
    reply = plain_request("POST", f"{url}/v1/chat/completions", {"model": model_folders("a"), "messages": messages})
    assert reply.status == 400 and words in reply.json()["error"]["message"], reply.body
    assert not backend.handles


@pytest.mark.safety("H1")
def test_a_body_over_the_value_limit_is_400(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server()
    body = chat(model_folders("a"))
    body["extra"] = [0] * MAX_JSON_VALUES
    reply = plain_request("POST", f"{url}/v1/chat/completions", body)
    assert reply.status == 400 and "JSON values" in reply.json()["error"]["message"]


@pytest.mark.safety("H1")
def test_one_client_holds_at_most_its_share_of_a_model_and_another_still_gets_in(
    paced_server: Any, model_folders: Any
) -> None:
    url, _backend, pool = paced_server(parallel=1, queue_size=4)
    model = model_folders("a")
    assert plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=1)).status == 200  # loaded
    share = 1 + 4 // 2
    opened = [open_stream(url, chat(model, max_tokens=100_000))]  # holds the slot
    replies: list[Reply] = []
    waiting = [
        threading.Thread(target=lambda: replies.append(_post(url, "/v1/chat/completions", chat(model, max_tokens=1))))
        for _ in range(share - 1)
    ]
    for thread in waiting:
        thread.start()
    entry = next(iter(pool._entries.values()))
    wait_for(lambda: entry.users == share)
    refused = plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=1))
    assert refused.status == 503 and "share" in refused.json()["error"]["message"]
    other: list[Reply] = []
    other_thread = threading.Thread(
        target=lambda: other.append(_post(url, "/v1/chat/completions", chat(model, max_tokens=1), OTHER_CLIENT))
    )
    other_thread.start()
    wait_for(lambda: entry.users == share + 1)  # queued, not refused
    for connection, _response in opened:
        connection.close()
    other_thread.join(30)
    for thread in waiting:
        thread.join(30)
    assert other and other[0].status == 200
    assert [r.status for r in replies] == [200] * (share - 1)


# ---- H2: sampling numbers at their edges ---------------------------------------------------------


@pytest.mark.safety("H2")
def test_edge_sampling_values_are_given_one_safe_meaning() -> None:
    assert sampling_options({"temperature": 5e-324})["temperature"] == 0.0
    assert str(sampling_options({"temperature": -0.0})["temperature"]) == "0.0"
    assert sampling_options({"temperature": 0.7})["temperature"] == 0.7
    assert sampling_options({"top_p": 5e-324})["top_p"] == _limits.LEAST_TOP_P
    assert sampling_options({"top_k": 10**30})["top_k"] == _limits.LARGEST_TOP_K
    assert sampling_options({"max_new_tokens": 10**30})["max_new_tokens"] == _limits.LARGEST_MAX_TOKENS
    assert sampling_options({"temperature": -1})["temperature"] == -1  # left for the core to refuse


@pytest.mark.safety("H2")
@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 5e-324},
        {"temperature": -0.0},
        {"temperature": 1e-310, "top_p": 5e-324},
        {"top_k": 10**30},
        {"max_tokens": 10**30},
        {"temperature": 100, "top_p": 1, "top_k": 0},
    ],
)
def test_accepted_edge_values_are_answered(paced_server: Any, model_folders: Any, fields: dict[str, Any]) -> None:
    url, _backend, _pool = paced_server(backend=PacedBackend(honours=frozenset({"top_p", "top_k"})))
    body = {**chat(model_folders("a")), "max_tokens": 3, **fields}
    if "max_tokens" in fields:
        body["stream"] = True  # a huge limit: read the first events and leave
        connection, _response = open_stream(url, body)
        connection.close()
        return
    reply = plain_request("POST", f"{url}/v1/chat/completions", body)
    assert reply.status == 200, reply.body


@pytest.mark.safety("H2")
@pytest.mark.parametrize(
    "raw",
    [
        b'"temperature": 1e400',
        b'"top_p": 1e400',
        b'"top_p": -0.0',
        b'"top_k": -1',
        b'"max_tokens": 1e400',
        b'"temperature": -1e-320',
    ],
)
def test_out_of_range_sampling_values_are_400(paced_server: Any, model_folders: Any, raw: bytes) -> None:
    url, _backend, _pool = paced_server()
    model = json.dumps(model_folders("a")).encode()
    body = b'{"model": ' + model + b', "messages": [{"role": "user", "content": "hi"}], ' + raw + b"}"
    reply = plain_request("POST", f"{url}/v1/chat/completions", body)
    assert reply.status == 400, reply.body


# ---- H5: embeddings ------------------------------------------------------------------------------


def _embed(model: str, inputs: Any) -> dict[str, Any]:
    return {"model": model, "input": inputs}


@pytest.mark.safety("H5")
@pytest.mark.parametrize(
    "inputs",
    ["", ["a", ""], ["a"] * (MAX_EMBEDDING_INPUTS + 1), ["x" * (MAX_EMBEDDING_CHARS // 2 + 1)] * 2],
    ids=["empty", "one-empty", "too-many", "too-long"],
)
def test_bad_embedding_inputs_are_400(paced_server: Any, model_folders: Any, inputs: Any) -> None:
    url, backend, _pool = paced_server()
    reply = plain_request("POST", f"{url}/v1/embeddings", _embed(model_folders("a"), inputs))
    assert reply.status == 400 and reply.json()["error"]["param"] == "input", reply.body
    assert not backend.handles


@pytest.mark.safety("H5")
def test_a_long_embedding_request_takes_turns_with_another_clients(paced_server: Any, model_folders: Any) -> None:
    url, backend, _pool = paced_server()
    model = model_folders("a")
    assert plain_request("POST", f"{url}/v1/embeddings", _embed(model, ["warm"])).status == 200
    long: list[Reply] = []
    hog = threading.Thread(target=lambda: long.append(_post(url, "/v1/embeddings", _embed(model, ["slow"] * 96))))
    hog.start()
    handle = backend.handles[0]
    wait_for(lambda: len(handle.runs) >= 2)  # its first turn is done: the second runs
    asked = time.monotonic()
    short = _post(url, "/v1/embeddings", _embed(model, ["quick"]), OTHER_CLIENT)
    waited = time.monotonic() - asked
    hog.join(60)
    assert short.status == 200 and long and long[0].status == 200
    assert len(long[0].json()["data"]) == 96
    # A turn is 32 inputs of 50 ms: the short request waits for one turn, not for the whole 4.8 s.
    assert waited < 2.5, f"the one-input request waited {waited:.2f} s behind a 96-input one"
    assert [count for _, count in handle.runs[1:]].count(32) == 3


@pytest.mark.safety("H5")
def test_an_embedding_request_stops_when_its_client_leaves(paced_server: Any, model_folders: Any) -> None:
    url, backend, _pool = paced_server()
    model = model_folders("a")
    assert plain_request("POST", f"{url}/v1/embeddings", _embed(model, ["warm"])).status == 200
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    connection.request(
        "POST",
        "/v1/embeddings",
        json.dumps(_embed(model, ["slow"] * 320)).encode(),
        {"Content-Type": "application/json"},
    )
    time.sleep(0.4)
    connection.close()
    handle = backend.handles[0]
    time.sleep(2.0)
    embedded = sum(count for _, count in handle.runs[1:])
    assert embedded < 96, f"{embedded} of 320 inputs were embedded after the client left"
    assert any(code == "CANCELLED" for code, _ in handle.runs[1:])


# ---- H4: files that block, loads that hang -------------------------------------------------------


def _finishes(work: Any, seconds: float = 5.0) -> Any:
    """``work()``'s result (or the exception it raised), failing when it is still running after ``seconds``."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still blocked after {seconds} s"
    return outcome[0]


def _unblock(fifo: Path) -> None:
    """Open the FIFO for writing, which frees a reader stuck in open() (when the fix has regressed)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


@pytest.mark.safety("H4")
@pytest.mark.parametrize("name", ["model.gguf", "config.json", "README.md"])
def test_a_model_file_swapped_for_a_fifo_is_refused_at_once(tmp_path: Path, name: str) -> None:
    from anyformer.files._byte_source import read_file_prefix

    fifo = tmp_path / name
    os.mkfifo(fifo)
    try:
        outcome = _finishes(lambda: read_file_prefix(fifo, 64))
        assert isinstance(outcome, OSError) and "regular file" in str(outcome)
        if name == "model.gguf":
            import anyformer

            refused = _finishes(lambda: anyformer.describe(str(fifo)))
            assert isinstance(refused, anyformer.AnyformerError) and refused.code is anyformer.ErrorCode.BAD_MODEL
    finally:
        _unblock(fifo)


@pytest.mark.safety("H4")
def test_a_model_file_that_is_a_fifo_is_422_at_once_and_other_models_still_load(
    paced_server: Any, model_folders: Any
) -> None:
    url, _backend, _pool = paced_server()
    swapped, other = Path(model_folders("swapped")), model_folders("other")
    os.mkfifo(swapped / "model.gguf")
    try:
        reply = _finishes(lambda: plain_request("POST", f"{url}/v1/chat/completions", chat(str(swapped))), 10)
        assert reply.status == 422 and reply.json()["error"]["code"] == "BAD_MODEL", reply.body
        assert plain_request("POST", f"{url}/v1/chat/completions", chat(other, max_tokens=2)).status == 200
    finally:
        _unblock(swapped / "model.gguf")


@pytest.mark.safety("H4")
def test_a_gguf_swapped_for_a_fifo_right_after_its_header_was_read_does_not_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import anyformer.files._gguf_header as gguf_header

    sys.path.insert(0, str(Path(__file__).parents[1]))
    try:
        from hostile_files import valid_gguf
    finally:
        sys.path.pop(0)
    path = tmp_path / "model.gguf"
    path.write_bytes(valid_gguf())
    read = gguf_header.read_header

    def read_then_swap(*args: Any) -> Any:
        header = read(*args)
        path.unlink()
        os.mkfifo(path)  # the attacker's swap, between the check and the next open
        return header

    monkeypatch.setattr(gguf_header, "read_header", read_then_swap)
    try:
        header = _finishes(lambda: gguf_header.read_gguf_header(path))
        assert isinstance(header, gguf_header.GGUFHeader)  # read before the swap; the swap was not waited on
    finally:
        _unblock(path)


class _StuckLoad(PacedBackend):
    """The paced backend, whose load of a folder named ``stuck`` waits until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    @hookimpl
    def load(self, model: Any, request: Any) -> Any:
        if Path(model.ref).name == "stuck":
            self.release.wait(30)
        return super().load(model, request)


@pytest.mark.safety("H4")
def test_a_load_that_hangs_does_not_hold_other_models_loads(paced_server: Any, model_folders: Any) -> None:
    backend = _StuckLoad()
    url, _backend, _pool = paced_server(backend=backend)
    stuck, other = model_folders("stuck"), model_folders("other")
    first: list[Reply] = []
    waiting = threading.Thread(
        target=lambda: first.append(plain_request("POST", f"{url}/v1/chat/completions", chat(stuck, max_tokens=1)))
    )
    waiting.start()
    try:
        time.sleep(0.3)  # the stuck load is under way
        reply = _finishes(lambda: plain_request("POST", f"{url}/v1/chat/completions", chat(other, max_tokens=1)))
        assert reply.status == 200, reply.body
    finally:
        backend.release.set()
        waiting.join(30)
    assert first and first[0].status == 200


# ---- H8: the operator's defaults -----------------------------------------------------------------


@pytest.mark.safety("H8")
def test_model_default_serves_the_embedded_model(paced_server: Any) -> None:
    import anyformer

    url, backend, _pool = paced_server(app={"models": ["default"]})
    reply = plain_request("POST", f"{url}/v1/chat/completions", chat("default", max_tokens=1))
    assert reply.status == 200, reply.body
    assert backend.handles[0].ref == str(anyformer.default_model_path())


@pytest.mark.safety("H8")
def test_a_model_removed_from_disk_is_unloaded_and_not_listed_as_loaded(paced_server: Any, model_folders: Any) -> None:
    url, backend, _pool = paced_server()
    model = model_folders("gone")
    assert plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=1)).status == 200
    listed = plain_request("GET", f"{url}/v1/models").json()["data"]
    assert any(m["id"] == model and m["loaded"] for m in listed)
    shutil.rmtree(model)
    listed = plain_request("GET", f"{url}/v1/models").json()["data"]
    assert not any(m["id"] == model for m in listed)
    assert backend.handles[0].disposed


@pytest.mark.safety("H8")
def test_the_page_sends_a_strict_policy_that_runs_only_its_own_files(paced_server: Any) -> None:
    url, _backend, _pool = paced_server()
    reply = plain_request("GET", f"{url}/")
    policy = reply.headers["content-security-policy"]
    assert reply.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy and "unsafe-inline" not in policy
    script_sources = policy.split("script-src", 1)[1].split(";", 1)[0].split()
    page = reply.body.decode()
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, re.DOTALL)
    assert scripts, "the page has scripts"
    for attributes, body in scripts:
        if body.strip():  # an inline script runs only by its hash
            digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
            assert f"'sha256-{digest}'" in script_sources
        else:  # a file: only from the server's own /static/
            assert re.search(r'src="/static/[^"]+"', attributes), attributes
    assert [source for source in script_sources if not source.startswith("'sha256-")] == ["'self'"]


@pytest.mark.safety("H8")
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", ""])
def test_a_non_loopback_host_without_a_key_is_refused(host: str) -> None:
    from anyformer.server._run import check_bind

    with pytest.raises(AnyformerError) as caught:
        check_bind(host, None)
    assert caught.value.code is ErrorCode.BAD_REQUEST and "--insecure-no-key" in caught.value.message
    check_bind(host, "a-key")
    check_bind(host, None, insecure_no_key=True)
    for loopback in ("127.0.0.1", "localhost", "::1", "[::1]"):
        check_bind(loopback, None)


@pytest.mark.safety("H8")
def test_serve_on_every_address_without_a_key_exits_with_the_reason(tmp_path: Path) -> None:
    environment = {**os.environ, "ANYFORMER_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    environment.pop("ANYFORMER_API_KEY", None)
    done = subprocess.run(
        [sys.executable, "-m", "anyformer", "serve", "--host", "0.0.0.0", "--port", "9"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "--insecure-no-key" in done.stderr + done.stdout


# ---- H3 on a real engine: a cancel storm beside one user ------------------------------------------


def _open_and_drop(url: str, body: dict[str, Any]) -> None:
    """Start a streamed chat, read its status line and maybe an event, and leave."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        connection.request(
            "POST",
            "/v1/chat/completions",
            json.dumps({**body, "stream": True}).encode(),
            {"Content-Type": "application/json"},
        )
        response = connection.getresponse()
        if response.status == 200:
            response.readline()
    finally:
        connection.close()


@pytest.mark.safety("H3")
def test_a_storm_of_dropped_streams_beside_a_real_user_keeps_the_worker_and_the_users_reply(
    real_server: Any, smollm2_path: Path
) -> None:
    url, pool = real_server
    model = str(smollm2_path)
    body = chat(model, "Name three colours.", max_tokens=24, temperature=0)
    alone = _post(url, "/v1/chat/completions", body, OTHER_CLIENT)
    assert alone.status == 200, alone.body
    pids = {m["worker_pid"] for m in pool.loaded() if m["id"] == model}
    user: list[Reply] = []
    thread = threading.Thread(target=lambda: user.append(_post(url, "/v1/chat/completions", body, OTHER_CLIENT)))
    thread.start()
    for _ in range(16):
        _open_and_drop(url, chat(model, "Tell me a very long story.", max_tokens=200))
    thread.join(120)
    assert user and user[0].status == 200, user[0].body if user else "no reply"
    assert user[0].json()["choices"][0]["message"]["content"] == alone.json()["choices"][0]["message"]["content"]
    assert {m["worker_pid"] for m in pool.loaded() if m["id"] == model} == pids, "the worker was replaced"
