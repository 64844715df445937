"""Connections that would stop the server (docs/safety.md, H6): late heads, paused bodies, too many, two framings.

Each test speaks raw HTTP to a server on loopback run with the server's own h11 protocol, its
deadlines shortened; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

import anyformer
from anyformer import Caps
from anyformer.server import ModelPool, _app, create_app
from anyformer.server._connections import DescriptorShortageLog, guarded_protocol

from .server_support import PacedBackend, serve_in_thread

HEAD_SECONDS = 0.5
MAX_CONNECTIONS = 6


@pytest.fixture
def guarded(tmp_path: Any) -> Iterator[tuple[str, int]]:
    """A server over the paced backend with a 0.5 s head deadline and at most 6 connections: (host, port)."""
    backend = PacedBackend()
    manager = anyformer.PluginManager()
    manager.register(backend, backend.name)
    pool = ModelPool(isolate=False, plugins=manager, caps=Caps(ram_bytes=10**10))
    protocol = guarded_protocol(max_connections=MAX_CONNECTIONS, header_seconds=HEAD_SECONDS)
    with serve_in_thread(create_app(pool, allow_paths=[tmp_path]), http=protocol) as url:
        parts = urllib.parse.urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        yield parts.hostname, parts.port


def _connect(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=5)


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closes ``sock`` (reading whatever it sends first), None if it stays open."""
    started = time.monotonic()
    sock.settimeout(0.1)
    while time.monotonic() - started < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - started
    return None


def _health(address: tuple[str, int]) -> bytes:
    with _connect(address) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply


@pytest.mark.safety("H6")
def test_a_connection_that_sends_nothing_is_closed_at_the_head_deadline(guarded: tuple[str, int]) -> None:
    with _connect(guarded) as sock:
        closed = _closed_within(sock, 10 * HEAD_SECONDS)
    assert closed is not None, "an idle connection stayed open"
    assert HEAD_SECONDS * 0.8 <= closed < HEAD_SECONDS * 6


@pytest.mark.safety("H6")
def test_a_head_sent_a_byte_at_a_time_is_closed_at_the_deadline(guarded: tuple[str, int]) -> None:
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    with _connect(guarded) as sock:
        started = time.monotonic()
        closed_at = None
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed_at = time.monotonic() - started
                break
            if _closed_within(sock, 0.05) is not None:
                closed_at = time.monotonic() - started
                break
        assert closed_at is not None and closed_at < HEAD_SECONDS * 6, "a drip-fed head kept its connection"
    assert b"200 OK" in _health(guarded)


@pytest.mark.safety("H6")
def test_a_body_that_pauses_is_408(guarded: tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_app, "BODY_PAUSE_SECONDS", 0.5)
    with _connect(guarded) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": '
        )
        sock.settimeout(10)
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]


@pytest.mark.safety("H6")
def test_connections_past_the_cap_are_closed_and_the_server_still_answers(guarded: tuple[str, int]) -> None:
    held = [_connect(guarded) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.1)
        with _connect(guarded) as extra:
            assert _closed_within(extra, 2.0) is not None, "a connection past the cap stayed open"
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5
    while b"200 OK" not in _health(guarded):  # the held ones are gone once the server sees them close
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.safety("H6")
def test_content_length_with_chunked_transfer_encoding_is_400_and_closed(guarded: tuple[str, int]) -> None:
    with _connect(guarded) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"  # a smuggled second request
        )
        sock.settimeout(5)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400") and b"connection: close" in reply.lower()
    assert reply.count(b"HTTP/1.1 ") == 1, "the request after the ambiguous one was answered"


@pytest.mark.safety("H6")
def test_running_out_of_descriptors_is_one_log_line_per_period(caplog: pytest.LogCaptureFixture) -> None:
    handler = DescriptorShortageLog(period=60.0)
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="anyformer.server"):
            for _ in range(1000):
                handler(
                    loop,
                    {
                        "message": "socket.accept() out of system resource",
                        "exception": OSError(errno.EMFILE, "Too many open files"),
                    },
                )
        records = [r for r in caplog.records if r.name == "anyformer.server"]
        assert len(records) == 1 and records[0].exc_info is None
        assert "EMFILE" in records[0].getMessage()
        assert handler.suppressed == 999
    finally:
        loop.close()
