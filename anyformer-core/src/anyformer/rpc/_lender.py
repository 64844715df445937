"""A relay in front of llama.cpp's rpc-server that lends at most ``--mem`` bytes.

llama.cpp's rpc-server offers all of a host's memory and reports its free RAM. ``anyformer
rpc-server --mem 4GB`` runs it on a private loopback port and puts this relay on the public one:
every message passes through unchanged except three of protocol 7 (ggml-rpc.cpp), so a client
sees a host with ``--mem`` bytes:

- ``GET_DEVICE_MEMORY`` replies say at most what is left of the cap (clients split layers by it);
- an ``ALLOC_BUFFER`` that would go past the cap is answered here with a null buffer, which the
  client reports as a failed allocation (the server never sees it);
- ``FREE_BUFFER`` gives its buffer's bytes back to the cap.

The protocol is strictly request then reply on one connection (the client's dispatcher thread
waits for each reply before it sends the next request), so one loop per client can tell which
reply answers which request. ``HELLO``'s transport capabilities are zeroed both ways: the relay
speaks plain TCP.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
from collections.abc import Callable

from anyformer.rpc._protocol import (
    CMD_ALLOC_BUFFER,
    CMD_DEVICE_COUNT,
    CMD_FREE_BUFFER,
    CMD_GET_DEVICE_MEMORY,
    CMD_HELLO,
    CONN_CAPS,
    receive_exactly,
    reply_frame,
)

#: Protocol 7's commands the server answers (the others it only reads): ggml-rpc.cpp's server loop.
_ANSWERED = frozenset({0, 1, 2, 3, 7, 8, 9, 11, 13, CMD_HELLO, CMD_DEVICE_COUNT})
_COMMANDS = 19  # RPC_CMD_COUNT
#: Bytes relayed per read when a message is large (tensor data).
_CHUNK = 1 << 20
#: A request's data the relay reads whole; larger ones (tensor data) are relayed in chunks.
_SMALL = 4096


class _Client:
    """One client connection relayed to the server, with the bytes its buffers take."""

    def __init__(self, client: socket.socket, server: socket.socket, cap: int) -> None:
        self.client = client
        self.server = server
        self.cap = cap
        self.used = 0
        self.peak = 0
        self.buffers: dict[int, int] = {}
        #: Requests relayed, and how many of them waited for a reply (a network round trip each).
        self.requests = 0
        self.round_trips = 0

    def relay(self, source: socket.socket, target: socket.socket, size: int) -> None:
        while size > 0:
            chunk = source.recv(min(size, _CHUNK))
            if not chunk:
                raise EOFError
            target.sendall(chunk)
            size -= len(chunk)

    def run(self) -> None:
        while True:
            try:
                head = receive_exactly(self.client, 9)
            except EOFError:
                return
            cmd, size = struct.unpack("<BQ", head)
            if cmd >= _COMMANDS:
                raise ValueError(f"unknown command {cmd}")
            self.requests += 1
            self.round_trips += cmd in _ANSWERED
            if size > _SMALL:
                self.server.sendall(head)
                self.relay(self.client, self.server, size)
                data = b""
            else:
                data = receive_exactly(self.client, size)
            if cmd == CMD_ALLOC_BUFFER and len(data) == 12:
                _device, wanted = struct.unpack("<IQ", data)
                if self.used + wanted > self.cap:
                    self.client.sendall(reply_frame(struct.pack("<QQ", 0, 0)))  # the client's "out of memory"
                    continue
            if cmd == CMD_HELLO:
                data = bytes(CONN_CAPS)
            if size <= _SMALL:
                self.server.sendall(struct.pack("<BQ", cmd, len(data)) + data)
            if cmd == CMD_FREE_BUFFER and len(data) == 8:
                self.used -= self.buffers.pop(struct.unpack("<Q", data)[0], 0)
            if cmd not in _ANSWERED:
                continue
            (reply_size,) = struct.unpack("<Q", receive_exactly(self.server, 8))
            if cmd not in (CMD_ALLOC_BUFFER, CMD_GET_DEVICE_MEMORY, CMD_HELLO) or reply_size > _SMALL:
                self.client.sendall(struct.pack("<Q", reply_size))
                self.relay(self.server, self.client, reply_size)
                continue
            reply = receive_exactly(self.server, reply_size)
            if cmd == CMD_ALLOC_BUFFER and reply_size == 16:
                pointer, got = struct.unpack("<QQ", reply)
                if pointer:
                    self.buffers[pointer] = got
                    self.used += got
                    self.peak = max(self.peak, self.used)
            elif cmd == CMD_GET_DEVICE_MEMORY and reply_size == 16:
                free, total = struct.unpack("<QQ", reply)
                reply = struct.pack("<QQ", min(free, max(self.cap - self.used, 0)), min(total, self.cap))
            elif cmd == CMD_HELLO and reply_size == 4 + CONN_CAPS:
                reply = reply[:4] + bytes(CONN_CAPS)
            self.client.sendall(reply_frame(reply))


def serve_lender(
    listen: socket.socket,
    upstream: tuple[str, int],
    cap: int,
    *,
    report: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    stop: threading.Event | None = None,
) -> None:
    """Relay each client of ``listen`` (a bound, listening socket) to ``upstream`` with ``cap`` bytes, one at a time.

    Like the server behind it, clients are served in turn. Returns when ``stop`` is set (checked
    between clients and once a second while waiting) or the server behind it is gone.
    """
    listen.settimeout(1.0)
    while stop is None or not stop.is_set():
        try:
            client, address = listen.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        with client:
            client.settimeout(None)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                server = socket.create_connection(upstream)
            except OSError as exc:
                report(f"anyformer rpc-server: the llama.cpp rpc-server behind the relay is gone ({exc})")
                return
            with server:
                server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                relayed = _Client(client, server, cap)
                try:
                    relayed.run()
                except (OSError, EOFError, ValueError) as exc:
                    report(f"anyformer rpc-server: client {address[0]} dropped ({exc.__class__.__name__}: {exc})")
                if relayed.peak:  # a probe (version and memory only) allocates nothing: not worth a line
                    report(
                        f"anyformer rpc-server: client {address[0]} done; its buffers took at most "
                        f"{relayed.peak} bytes; {relayed.requests} requests, {relayed.round_trips} of them "
                        "waited for a reply"
                    )
