"""The few messages of llama.cpp's RPC protocol anyformer speaks itself: handshake and memory.

Before llama.cpp connects to a server (where a refused connection or a version mismatch aborts the
whole process), the backend asks each one here, over a socket with a timeout: ``HELLO`` (the
version), ``DEVICE_COUNT`` and ``GET_DEVICE_MEMORY`` for each device. The wire format (ggml-rpc.cpp,
protocol 7): a request is ``cmd (1 byte) | size (8 bytes) | data``, a reply ``size (8 bytes) |
data``, packed little-endian structs; a server serves one client at a time, so a probe connects,
asks and closes before the engine connects.
"""

from __future__ import annotations

import dataclasses
import socket
import struct

from anyformer.contract._endpoints import split_endpoint

#: The protocol version of the llama.cpp this release builds (ggml-rpc.h, RPC_PROTO_*_VERSION).
PROTOCOL = (7, 0, 0)
#: Command numbers of protocol 7 (ggml-rpc.cpp's ``enum rpc_cmd``; HELLO is 14 in every version).
CMD_ALLOC_BUFFER = 0
CMD_FREE_BUFFER = 4
CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
#: Bytes of the transport capabilities a HELLO carries both ways (all zero: plain TCP).
CONN_CAPS = 24
#: Seconds a probe waits to connect and for each reply: a server on the network answers in milliseconds.
PROBE_TIMEOUT = 3.0
_MAX_DEVICES = 64


class RpcServerError(Exception):
    """An RPC server that cannot be used: unreachable, silent, or speaking another protocol version."""

    def __init__(self, endpoint: str, why: str) -> None:
        super().__init__(f"RPC server {endpoint} {why}")
        self.endpoint = endpoint


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """One device a server lends: free and total bytes, as the server reports them."""

    free: int
    total: int


@dataclasses.dataclass(frozen=True)
class RpcServerInfo:
    """What a server answered: its protocol version and its devices' memory."""

    endpoint: str
    version: tuple[int, int, int]
    devices: tuple[DeviceMemory, ...]

    @property
    def free_bytes(self) -> int:
        """Free bytes over all the server's devices."""
        return sum(d.free for d in self.devices)


def request_frame(cmd: int, data: bytes = b"") -> bytes:
    """A request as it goes on the wire."""
    return struct.pack("<BQ", cmd, len(data)) + data


def reply_frame(data: bytes) -> bytes:
    """A reply as it goes on the wire."""
    return struct.pack("<Q", len(data)) + data


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``sock``; ``EOFError`` when the peer closes first."""
    parts = bytearray()
    while len(parts) < size:
        chunk = sock.recv(size - len(parts))
        if not chunk:
            raise EOFError
        parts += chunk
    return bytes(parts)


def _ask(sock: socket.socket, cmd: int, data: bytes, reply_size: int) -> bytes:
    sock.sendall(request_frame(cmd, data))
    (size,) = struct.unpack("<Q", receive_exactly(sock, 8))
    if size != reply_size:
        raise ValueError(f"a {size}-byte reply where protocol {PROTOCOL[0]} sends {reply_size}")
    return receive_exactly(sock, size)


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT) -> RpcServerInfo:
    """Connect to ``endpoint``, check its protocol version and read its devices' memory.

    Raises :class:`RpcServerError` naming the endpoint when it refuses the connection, does not
    answer within ``timeout`` seconds (each step), or answers another protocol version.
    """
    host, port = split_endpoint(endpoint)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except TimeoutError:
        raise RpcServerError(endpoint, f"did not accept a connection within {timeout:g} s") from None
    except OSError as exc:
        raise RpcServerError(endpoint, f"cannot be reached ({exc.strerror or exc})") from None
    with sock:
        try:
            hello = _ask(sock, CMD_HELLO, bytes(CONN_CAPS), 4 + CONN_CAPS)
            version = (hello[0], hello[1], hello[2])
            if version[0] != PROTOCOL[0] or version[1] > PROTOCOL[1]:
                raise RpcServerError(
                    endpoint,
                    f"speaks RPC protocol {'.'.join(map(str, version))}; this llama.cpp speaks "
                    f"{'.'.join(map(str, PROTOCOL))}: run the rpc-server built from the same llama.cpp "
                    "(`anyformer rpc-server` on that host, with the same anyformer release)",
                )
            (count,) = struct.unpack("<I", _ask(sock, CMD_DEVICE_COUNT, b"", 4))
            if not 0 < count <= _MAX_DEVICES:
                raise RpcServerError(endpoint, f"reports {count} devices")
            devices = []
            for device in range(count):
                free, total = struct.unpack("<QQ", _ask(sock, CMD_GET_DEVICE_MEMORY, struct.pack("<I", device), 16))
                devices.append(DeviceMemory(free=free, total=total))
        except TimeoutError:
            raise RpcServerError(
                endpoint, f"did not answer within {timeout:g} s (is it serving another client? it serves one at a time)"
            ) from None
        except EOFError:
            raise RpcServerError(
                endpoint,
                "closed the connection during the handshake (another RPC protocol version, or not an RPC server)",
            ) from None
        except ValueError as exc:
            raise RpcServerError(endpoint, f"answered outside the RPC protocol ({exc})") from None
        except OSError as exc:
            raise RpcServerError(endpoint, f"failed during the handshake ({exc.strerror or exc})") from None
    return RpcServerInfo(endpoint=endpoint, version=version, devices=tuple(devices))


def reachable(endpoint: str, timeout: float = 1.0) -> bool:
    """True when ``endpoint`` accepts a TCP connection within ``timeout`` seconds (nothing is sent)."""
    host, port = split_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
