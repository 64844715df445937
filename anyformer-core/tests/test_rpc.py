"""llama.cpp RPC servers from the core's side: endpoints, the probe, the --mem relay, selection."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from rpc_fakes import FakeRpcServer, RpcClient, fake_rpc_server

import anyformer
from anyformer import AnyformerError, ErrorCode, Estimate, Rank, Request, Verdict
from anyformer._api import _only_rpc_capable
from anyformer.contract._endpoints import RPC_ENV, parse_endpoints
from anyformer.contract._verdict import Refusal
from anyformer.rpc._lender import serve_lender
from anyformer.rpc._protocol import (
    CMD_ALLOC_BUFFER,
    CMD_FREE_BUFFER,
    CMD_GET_DEVICE_MEMORY,
    CMD_HELLO,
    CONN_CAPS,
    RpcServerError,
    probe,
)


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


# ---- endpoints ------------------------------------------------------------------------------------


def test_endpoints_parse_from_a_string_or_a_list() -> None:
    assert parse_endpoints("10.0.0.2:50052, host-b:50053") == ("10.0.0.2:50052", "host-b:50053")
    assert parse_endpoints(["127.0.0.1:7", "a.b:0080"]) == ("127.0.0.1:7", "a.b:80")
    assert parse_endpoints("") == () and parse_endpoints(None) == ()


@pytest.mark.parametrize(
    "bad", ["host", "host:", "host:0", "host:70000", ":50052", "ho st:1", "a:1,a:1", "[::1]:50052", "::1:50052"]
)
def test_a_malformed_endpoint_is_a_bad_request(bad: str) -> None:
    with pytest.raises(AnyformerError) as info:
        Request.build(rpc=bad)
    assert info.value.code is ErrorCode.BAD_REQUEST


def test_load_takes_the_servers_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RPC_ENV, "nonsense")
    with pytest.raises(AnyformerError) as info:
        anyformer.load("default")  # refused before anything is described or loaded
    assert info.value.code is ErrorCode.BAD_REQUEST and "nonsense" in info.value.message


# ---- the probe ------------------------------------------------------------------------------------


def test_the_probe_reads_version_and_memory() -> None:
    with fake_rpc_server(free=123_000_000, total=456_000_000) as server:
        info = probe(server.endpoint)
    assert info.version == (7, 0, 0)
    assert [(d.free, d.total) for d in info.devices] == [(123_000_000, 456_000_000)]
    assert info.free_bytes == 123_000_000


def test_another_protocol_version_is_named() -> None:
    with fake_rpc_server(version=(8, 0, 0)) as server, pytest.raises(RpcServerError) as info:
        probe(server.endpoint)
    assert server.endpoint in str(info.value) and "8.0.0" in str(info.value) and "7.0.0" in str(info.value)


def test_a_closed_port_is_refused_at_once() -> None:
    endpoint = _closed_port()
    started = time.monotonic()
    with pytest.raises(RpcServerError) as info:
        probe(endpoint)
    assert time.monotonic() - started < 1.0
    assert endpoint in str(info.value) and "cannot be reached" in str(info.value)


def test_a_server_that_never_answers_is_given_up_within_the_timeout() -> None:
    with fake_rpc_server() as server:
        server.silent = True
        started = time.monotonic()
        with pytest.raises(RpcServerError) as info:
            probe(server.endpoint, timeout=0.5)
    assert time.monotonic() - started < 2.0
    assert "did not answer within 0.5 s" in str(info.value)


def test_a_server_of_another_protocol_that_hangs_up_is_a_clean_error() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def hang_up() -> None:
        client, _ = listener.accept()
        client.recv(64)
        client.close()

    threading.Thread(target=hang_up, daemon=True).start()
    endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
    with pytest.raises(RpcServerError) as info:
        probe(endpoint)
    listener.close()
    assert "closed the connection during the handshake" in str(info.value)


# ---- the --mem relay ------------------------------------------------------------------------------


@pytest.fixture
def relay() -> Iterator[tuple[FakeRpcServer, str, list[str]]]:
    """A fake server behind the relay with a 100 MB cap: (server, the relay's endpoint, the relay's report)."""
    server = FakeRpcServer(free=10**9, total=2 * 10**9)
    listen = socket.socket()
    listen.bind(("127.0.0.1", 0))
    listen.listen(4)
    host, port = server.endpoint.split(":")
    stop = threading.Event()
    lines: list[str] = []
    thread = threading.Thread(
        target=serve_lender,
        args=(listen, (host, int(port)), 100_000_000),
        kwargs={"stop": stop, "report": lines.append},
    )
    thread.start()
    yield server, f"127.0.0.1:{listen.getsockname()[1]}", lines
    stop.set()
    thread.join(5)
    listen.close()
    server.close()


def test_the_relay_reports_the_cap_as_the_memory(relay: tuple[FakeRpcServer, str, list[str]]) -> None:
    _server, endpoint, _lines = relay
    info = probe(endpoint)
    assert [(d.free, d.total) for d in info.devices] == [(100_000_000, 100_000_000)]


def test_the_relay_refuses_allocations_past_the_cap_and_counts_frees(
    relay: tuple[FakeRpcServer, str, list[str]],
) -> None:
    server, endpoint, lines = relay
    client = RpcClient(endpoint)
    hello = client.ask(CMD_HELLO, b"\x01" * CONN_CAPS, 4 + CONN_CAPS)
    assert hello[4:] == bytes(CONN_CAPS)  # the relay speaks plain TCP whatever the client offers
    first = struct.unpack("<QQ", client.ask(CMD_ALLOC_BUFFER, struct.pack("<IQ", 0, 70_000_000), 16))
    assert first[0] != 0 and first[1] == 70_000_000
    refused = struct.unpack("<QQ", client.ask(CMD_ALLOC_BUFFER, struct.pack("<IQ", 0, 40_000_000), 16))
    assert refused == (0, 0)  # the client's "could not allocate"; the server never saw it
    assert [cmd for cmd, _ in server.log].count(CMD_ALLOC_BUFFER) == 1
    free, total = struct.unpack("<QQ", client.ask(CMD_GET_DEVICE_MEMORY, struct.pack("<I", 0), 16))
    assert (free, total) == (30_000_000, 100_000_000)
    client.tell(CMD_FREE_BUFFER, struct.pack("<Q", first[0]))
    again = struct.unpack("<QQ", client.ask(CMD_ALLOC_BUFFER, struct.pack("<IQ", 0, 40_000_000), 16))
    assert again[0] != 0
    client.tell(6, b"x" * 10_000)  # SET_TENSOR, larger than the relay reads whole: passed through in pieces
    free, _ = struct.unpack("<QQ", client.ask(CMD_GET_DEVICE_MEMORY, struct.pack("<I", 0), 16))
    assert free == 60_000_000
    assert server.log[-2] == (6, b"x" * 10_000)
    client.close()
    deadline = time.monotonic() + 5
    while not any("at most 70000000 bytes" in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("at most 70000000 bytes; 8 requests, 6 of them waited for a reply" in line for line in lines)


# ---- selection ------------------------------------------------------------------------------------


def test_a_backend_that_does_not_plan_for_rpc_is_turned_into_a_refusal() -> None:
    request = Request.build(rpc="10.0.0.2:50052")
    plain = Verdict.accept("plain", Estimate(ram_bytes=1, rank=Rank.GENERAL))
    spans = Verdict.accept("spans", Estimate(ram_bytes=1, rank=Rank.FALLBACK, details={"rpc": {}}))
    refused = Verdict.refuse("other", Refusal.FORMAT, "no GGUF")
    out = _only_rpc_capable([plain, spans, refused], request)
    assert not out[0].ok and out[0].code is Refusal.RUNTIME and "10.0.0.2:50052" in out[0].reason
    assert out[1] is spans and out[2] is refused
    assert _only_rpc_capable([plain], Request.build()) == [plain]
