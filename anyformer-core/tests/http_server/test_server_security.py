"""The server probed as an attacker would: each finding of the security review is one test here.

The server serves what its operator allows (the disk is not a client's to read), browsers on other
sites cannot drive it, a request's work and memory are bounded, and every failure has OpenAI's
error shape with no server path in it.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode, StoreEntry, hookimpl

from .server_support import PacedBackend, Reply, plain_request
from .test_server_faults import chat, open_stream, wait_for


def _check(url: str, ref: str, **headers: str) -> Reply:
    return plain_request("GET", f"{url}/api/check?model={urllib.parse.quote(ref)}", headers=headers)


@pytest.fixture
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder the operator did not allow, holding what an attacker wants to read."""
    folder = tmp_path_factory.mktemp("private")
    (folder / "secret-notes.txt").write_text("do not read")
    (folder / "sub").mkdir()
    (folder / "sub" / "id_rsa").write_text("KEY")
    (folder / "desc.json").write_text(json.dumps({"repo": "x/y", "files": [], "metadata": {"token": "hunter2"}}))
    return folder


# ---- 1. the disk is not the client's ------------------------------------------------------------


def test_a_folder_outside_the_allowed_ones_is_404_and_lists_nothing(paced_server: Any, outside: Path) -> None:
    url, backend, _pool = paced_server()
    listed = _check(url, str(outside))
    missing = _check(url, str(outside / "no-such-thing"))
    assert listed.status == missing.status == 404
    assert listed.json()["error"]["code"] == missing.json()["error"]["code"] == "MODEL_NOT_FOUND"
    for leak in (b"secret-notes", b"id_rsa", str(outside).encode()):
        assert leak not in listed.body
    assert not backend.handles


def test_a_description_file_outside_is_404_and_its_metadata_stays_private(paced_server: Any, outside: Path) -> None:
    url, _backend, _pool = paced_server()
    reply = _check(url, str(outside / "desc.json"))
    assert reply.status == 404 and b"hunter2" not in reply.body
    completion = plain_request("POST", f"{url}/v1/chat/completions", chat(str(outside / "desc.json")))
    assert completion.status == 404 and b"hunter2" not in completion.body


def test_a_link_inside_an_allowed_folder_to_a_file_outside_is_404(paced_server: Any, tmp_path: Path) -> None:
    url, _backend, _pool = paced_server()
    (tmp_path / "x.gguf").symlink_to("/etc/passwd")
    for reply in (
        _check(url, str(tmp_path / "x.gguf")),
        plain_request("POST", f"{url}/v1/chat/completions", chat(str(tmp_path / "x.gguf"))),
    ):
        assert reply.status == 404, reply.body
        assert b"root" not in reply.body and b"magic" not in reply.body


def test_a_folder_inside_an_allowed_one_holding_a_link_to_a_file_outside_is_404(
    paced_server: Any, tmp_path: Path, outside: Path
) -> None:
    """describe follows a folder's links: a folder is served only when each of them stays inside."""
    url, _backend, _pool = paced_server()
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.gguf").symlink_to(outside / "secret-notes.txt")
    reply = _check(url, str(folder))
    assert reply.status == 404, reply.body
    assert reply.json()["error"]["code"] == "MODEL_NOT_FOUND" and b"secret-notes" not in reply.body
    inside = tmp_path / "kept.gguf"
    inside.write_bytes(b"GGUF")
    (folder / "model.gguf").unlink()
    (folder / "model.gguf").symlink_to(inside)  # a link that stays inside the allowed folder is fine
    assert _check(url, str(folder)).status != 404


def test_without_allow_paths_no_local_path_is_served(paced_server: Any, model_folders: Any) -> None:
    url, backend, _pool = paced_server(app={"allow_paths": []})
    reply = plain_request("POST", f"{url}/v1/chat/completions", chat(model_folders("m")))
    assert reply.status == 404 and not backend.handles


def test_the_operators_models_and_the_stored_ones_are_served(paced_server: Any, tmp_path: Path) -> None:
    folder = tmp_path / "operator-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "paced"}')
    url, _backend, _pool = paced_server(app={"allow_paths": [], "models": [str(folder)]})
    ids = {m["id"] for m in plain_request("GET", f"{url}/v1/models").json()["data"]}
    assert {str(folder), "paced-org/stored-model"} <= ids
    reply = plain_request("POST", f"{url}/v1/chat/completions", chat(str(folder), max_tokens=2))
    assert reply.status == 200, reply.body


# ---- 3. no download for a client unless the operator allows it ------------------------------------


@pytest.fixture
def described(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every reference the pool asks ``anyformer.describe`` for (the Hub is never reached: OFFLINE)."""
    asked: list[str] = []
    real = anyformer.describe

    def spy(ref: Any) -> Any:
        asked.append(str(ref))
        if isinstance(ref, str) and not os.path.exists(ref):
            raise AnyformerError(ErrorCode.OFFLINE, "the test is offline")
        return real(ref)

    monkeypatch.setattr(anyformer, "describe", spy)
    yield asked


def test_a_client_cannot_make_the_server_download_a_hub_repo(paced_server: Any, described: list[str]) -> None:
    url, _backend, _pool = paced_server()
    for repo in ("org/one", "org/two@main", "three"):
        reply = plain_request("POST", f"{url}/v1/chat/completions", chat(repo))
        assert reply.status == 404, reply.body
    assert described == [], "the server reached for the Hub on a client's word"


def test_allow_pull_lets_clients_name_hub_repos(paced_server: Any, described: list[str]) -> None:
    url, _backend, _pool = paced_server(app={"allow_pull": True})
    reply = plain_request("POST", f"{url}/v1/chat/completions", chat("org/one"))
    assert reply.status == 503 and described == ["org/one"]  # asked, and offline in this test


# ---- 2. browsers on other sites ------------------------------------------------------------------


def test_a_cross_site_text_plain_post_is_refused_before_any_work(paced_server: Any, model_folders: Any) -> None:
    url, backend, _pool = paced_server()
    body = json.dumps(chat(model_folders("m"))).encode()
    reply = plain_request("POST", f"{url}/v1/chat/completions", body, headers={"Content-Type": "text/plain"})
    assert reply.status == 415 and reply.json()["error"]["code"] == "UNSUPPORTED_MEDIA_TYPE"
    evil = plain_request("POST", f"{url}/v1/chat/completions", body, headers={"Origin": "http://evil.example"})
    assert evil.status == 403 and evil.json()["error"]["code"] == "FORBIDDEN_ORIGIN"
    assert not backend.handles


def test_a_rebinding_host_is_refused(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server()
    port = urllib.parse.urlsplit(url).port
    rebound = f"attacker.example:{port}"
    listing = _check(url, model_folders("m"), Host=rebound)
    assert listing.status == 403 and listing.json()["error"]["code"] == "FORBIDDEN_HOST"
    assert plain_request("GET", f"{url}/v1/models", headers={"Host": rebound}).status == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert plain_request("GET", f"{url}/v1/models", headers={"Host": host}).status == 200, host


def test_the_pages_own_origin_passes_and_allowed_hosts_and_origins_too(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server(
        app={"allow_paths": [], "allowed_hosts": ["llm.lan"], "cors_origins": ["https://app.example"]}
    )
    port = urllib.parse.urlsplit(url).port
    own = plain_request("GET", f"{url}/v1/models", headers={"Origin": url})
    assert own.status == 200
    named = plain_request(
        "GET", f"{url}/v1/models", headers={"Host": f"llm.lan:{port}", "Origin": f"http://llm.lan:{port}"}
    )
    assert named.status == 200
    cors = plain_request("GET", f"{url}/v1/models", headers={"Origin": "https://app.example"})
    assert cors.status == 200 and cors.headers.get("access-control-allow-origin") == "https://app.example"
    preflight = plain_request(
        "OPTIONS",
        f"{url}/v1/chat/completions",
        headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status == 200
    assert plain_request("GET", f"{url}/v1/models", headers={"Origin": "https://other.example"}).status == 403


# ---- 6. bounded bodies and prompts ----------------------------------------------------------------


def _peak_rss_reset() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _peak_rss() -> int:
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024  # type: ignore[union-attr]


def _post_chunked(url: str, parts: Iterator[bytes]) -> int:
    """POST a body of unknown length (chunked); the status, or 0 when the server hung up first."""
    address = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    try:
        connection.request(
            "POST",
            "/v1/chat/completions",
            body=parts,
            headers={"Content-Type": "application/json"},
            encode_chunked=True,
        )
        return connection.getresponse().status
    except (BrokenPipeError, ConnectionResetError):
        return 0
    finally:
        connection.close()


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="resets the peak RSS through /proc")
def test_an_oversized_body_is_413_and_the_servers_memory_stays_bounded(paced_server: Any, model_folders: Any) -> None:
    url, backend, _pool = paced_server(app={"max_body": 2 * 2**20})
    declared = plain_request("POST", f"{url}/v1/chat/completions", b"x" * (3 * 2**20))
    assert declared.status == 413 and declared.json()["error"]["code"] == "REQUEST_TOO_LARGE"
    _peak_rss_reset()
    before = _peak_rss()
    head = b'{"model": "m", "messages": [{"role": "user", "content": "'
    status = _post_chunked(url, iter([head, *([b"a" * 2**20] * 200)]))  # 200 MB, no length given
    assert status in (413, 0)
    assert _peak_rss() - before < 64 * 2**20, f"the server grew by {(_peak_rss() - before) / 2**20:.0f} MiB"
    assert not backend.handles


# ---- 7. every failure in OpenAI's shape, every bad input a 4xx ------------------------------------


def _raw_post(url: str, body: bytes) -> Reply:
    return plain_request("POST", f"{url}/v1/chat/completions", body)


BAD_BODIES = {
    "nested 100k deep": b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "lone surrogate in content": b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
    "lone surrogate in model": b'{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}',
    "model over 4 KB": json.dumps({"model": "m" * 5000, "messages": [{"role": "user", "content": "x"}]}).encode(),
    "top_p a string": json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": "a"}).encode(),
    "top_p NaN": b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": NaN}',
    "top_k negative": json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_k": -1}).encode(),
    "10,000 stop strings": json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [f"s{i}" for i in range(10_000)]}
    ).encode(),
    "a stop string of 100 KB": json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["s" * 100_000]}
    ).encode(),
    "model with a newline": json.dumps(
        {"model": "org/name\n", "messages": [{"role": "user", "content": "x"}]}
    ).encode(),
}


@pytest.mark.parametrize("body", list(BAD_BODIES.values()), ids=list(BAD_BODIES))
def test_a_bad_input_is_400_in_openais_shape(paced_server: Any, body: bytes) -> None:
    url, backend, _pool = paced_server()
    reply = _raw_post(url, body)
    assert reply.status == 400, reply.body[:300]
    error = reply.json()["error"]
    assert error["code"] == "BAD_REQUEST" and error["type"] == "invalid_request_error"
    assert len(reply.body) < 2000, "the error echoes the input back"
    assert not backend.handles


def test_an_unexpected_exception_is_a_500_in_openais_shape_without_its_text(
    paced_server: Any, model_folders: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url, _backend, pool = paced_server()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"secret detail {tmp_path}")

    monkeypatch.setattr(pool, "check", broken)
    reply = _check(url, model_folders("m"))
    assert reply.status == 500
    assert reply.json()["error"]["code"] == "INTERNAL_ERROR" and b"secret" not in reply.body


def test_errors_carry_no_server_paths(paced_server: Any, tmp_path: Path) -> None:
    url, _backend, _pool = paced_server()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    reply = plain_request("POST", f"{url}/v1/chat/completions", chat(str(tmp_path / "broken")))
    assert reply.status == 422, reply.body
    with pytest.raises(AnyformerError) as direct:  # the same error, told to this process, names the path
        anyformer.describe(tmp_path / "broken")
    assert str(tmp_path) in direct.value.message
    assert str(tmp_path).encode() not in reply.body and b"config.json" in reply.body, reply.body


# ---- 4. abandoned requests -------------------------------------------------------------------------


def test_a_queued_request_whose_client_left_never_starts(paced_server: Any, model_folders: Any) -> None:
    url, backend, _pool = paced_server()
    model = model_folders("m")
    stream, _ = open_stream(url, chat(model, max_tokens=100_000))  # holds the model
    address = urllib.parse.urlsplit(url)
    queued = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    queued.request(
        "POST", "/v1/chat/completions", json.dumps(chat(model, max_tokens=3)), {"Content-Type": "application/json"}
    )
    time.sleep(0.3)  # it waits for the model now
    queued.sock.shutdown(2)  # type: ignore[union-attr]
    queued.close()
    time.sleep(0.3)  # the server has seen it leave
    stream.close()
    wait_for(lambda: backend.finished == ["cancelled"])
    time.sleep(0.3)
    assert backend.finished == ["cancelled"], "the abandoned request started a generation"
    after = plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=2))
    assert after.status == 200


# ---- 9. /health ------------------------------------------------------------------------------------


def test_health_lists_loaded_models_only_to_a_caller_with_the_key(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server(api_key="k")
    model = model_folders("m")
    key = {"Authorization": "Bearer k"}
    assert plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=2), headers=key).status == 200
    anonymous = plain_request("GET", f"{url}/health").json()
    assert anonymous == {"status": "ok"}
    assert plain_request("GET", f"{url}/health", headers=key).json()["loaded"] == [os.path.realpath(model)]


class CountingBackend(PacedBackend):
    """The paced backend, counting how often the store is listed."""

    def __init__(self) -> None:
        super().__init__()
        self.listings = 0

    @hookimpl
    def store_list(self) -> list[StoreEntry]:
        self.listings += 1
        return super().store_list()


def test_requests_reuse_one_listing_of_the_store(paced_server: Any) -> None:
    backend = CountingBackend()
    url, _backend, _pool = paced_server(backend=backend, app={"allow_paths": []})
    for _ in range(5):
        assert plain_request("GET", f"{url}/v1/models").status == 200
        assert plain_request("POST", f"{url}/v1/chat/completions", chat("org/unknown")).status == 404
    assert backend.listings == 1, "each request listed the store again"


# ---- 4. a hostile chat template behind the server ---------------------------------------------------


@pytest.mark.safety("G16")
def test_a_looping_template_is_422_quickly_and_does_not_hold_the_model(tmp_path: Path) -> None:
    pytest.importorskip("anyformer_llamacpp")
    pytest.importorskip("gguf")
    import sys

    from anyformer._chat_template import RENDER_SECONDS
    from anyformer.server import ModelPool, create_app

    from .conftest import REPO_ROOT
    from .server_support import serve_in_thread

    sys.path.insert(0, str(REPO_ROOT / "plugins" / "anyformer-llamacpp" / "tests"))
    try:
        from tiny_gguf import write_tiny_llama
    finally:
        sys.path.pop(0)
    loop = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}{{ messages[0].content }}"
    path = str(write_tiny_llama(tmp_path / "loop-F32.gguf", chat_template=loop))
    with serve_in_thread(create_app(ModelPool(context=512), models=[path])) as url:
        for _ in range(2):  # the second request is not stuck behind the first
            started = time.monotonic()
            reply = plain_request("POST", f"{url}/v1/chat/completions", chat(path, max_tokens=2))
            assert reply.status == 422 and reply.json()["error"]["code"] == "BAD_MODEL", reply.body
            assert time.monotonic() - started < RENDER_SECONDS + 30  # the first one loads the model too


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("/root/.cache/huggingface/hub/models--o--n/blobs/ab12: bad magic", "…/ab12: bad magic"),
        ("cannot read '/home/me/models/x.gguf'.", "cannot read '…/x.gguf'."),
        ("C:\\Users\\me\\m.gguf is short", "…/m.gguf is short"),
        ("~/models/m.gguf: no such file", "…/m.gguf: no such file"),
        ("GET /v1/models lists them; POST /v1/nope: Not Found", "GET /v1/models lists them; POST /v1/nope: Not Found"),
        (
            "org/name needs a 5/7 split, see https://hf.co/org/name",
            "org/name needs a 5/7 split, see https://hf.co/org/name",
        ),
    ],
)
def test_paths_are_cut_from_error_messages_and_nothing_else(message: str, expected: str) -> None:
    from anyformer.server._errors import redact_paths

    assert redact_paths(message) == expected
