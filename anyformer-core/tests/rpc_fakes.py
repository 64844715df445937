"""A fake llama.cpp RPC server speaking protocol 7's framing, for the probe's and the relay's tests."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

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


class FakeRpcServer:
    """Answers HELLO with ``version``, one device with ``free``/``total`` bytes, and hands out buffers.

    ``silent`` accepts connections and never answers. ``log`` records (command, data) as received.
    """

    def __init__(
        self, version: tuple[int, int, int] = (7, 0, 0), free: int = 10**9, total: int = 2 * 10**9, port: int = 0
    ) -> None:
        self.version = version
        self.free = free
        self.total = total
        self.silent = False
        self.log: list[tuple[int, bytes]] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(4)
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self._next_pointer = 0x1000
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with client:
                try:
                    self._answer(client)
                except (EOFError, OSError):
                    pass

    def _answer(self, client: socket.socket) -> None:
        while True:
            cmd, size = struct.unpack("<BQ", receive_exactly(client, 9))
            data = receive_exactly(client, size)
            self.log.append((cmd, data))
            if self.silent:
                receive_exactly(client, 1)  # waits until the client gives up
            if cmd == CMD_HELLO:
                client.sendall(reply_frame(bytes(self.version) + b"\0" + bytes(CONN_CAPS)))
            elif cmd == CMD_DEVICE_COUNT:
                client.sendall(reply_frame(struct.pack("<I", 1)))
            elif cmd == CMD_GET_DEVICE_MEMORY:
                client.sendall(reply_frame(struct.pack("<QQ", self.free, self.total)))
            elif cmd == CMD_ALLOC_BUFFER:
                _device, wanted = struct.unpack("<IQ", data)
                self._next_pointer += 0x1000
                client.sendall(reply_frame(struct.pack("<QQ", self._next_pointer, wanted)))
            elif cmd == CMD_FREE_BUFFER:
                pass  # no reply, as the real server
            else:
                pass  # SET_TENSOR and the other commands without a reply

    def close(self) -> None:
        """Stop accepting connections (the port then refuses them)."""
        self.sock.close()


def main(argv: list[str]) -> None:
    """Run as llama.cpp's rpc-server would be (``-H HOST -p PORT [-t N]``), for the CLI's tests."""
    port = int(argv[argv.index("-p") + 1])
    print(f"fake rpc-server on {argv[argv.index('-H') + 1]}:{port}", flush=True)
    server = FakeRpcServer(port=port)
    server._thread.join()


@contextmanager
def fake_rpc_server(**kwargs: object) -> Iterator[FakeRpcServer]:
    """A :class:`FakeRpcServer` for the duration of a ``with``."""
    server = FakeRpcServer(**kwargs)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.close()


class RpcClient:
    """The client side of protocol 7's framing, for talking to a relay in tests."""

    def __init__(self, endpoint: str) -> None:
        host, port = endpoint.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)

    def ask(self, cmd: int, data: bytes, reply_size: int) -> bytes:
        self.sock.sendall(struct.pack("<BQ", cmd, len(data)) + data)
        (size,) = struct.unpack("<Q", receive_exactly(self.sock, 8))
        assert size == reply_size
        return receive_exactly(self.sock, size)

    def tell(self, cmd: int, data: bytes) -> None:
        self.sock.sendall(struct.pack("<BQ", cmd, len(data)) + data)

    def close(self) -> None:
        self.sock.close()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
