"""Real llama.cpp tools for the tests: ``anyformer rpc-server`` processes and the tools' presence.

The tools come from scripts/build-llama-tools (nox builds them before the llama.cpp backend's
tests). Where they or an RPC-enabled llama-cpp-python are missing, a test says so loudly and is
skipped on a developer's machine, and fails under CI (``CI`` set), where they must be.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from anyformer.rpc._server_binary import find_rpc_server, find_tool
from anyformer_llamacpp.rpc_devices import rpc_library

BUILD_HINT = (
    "run `bash scripts/build-llama-tools` (and install the -portable-rpc llama-cpp-python wheel: nox does both)"
)


def require(missing: str | None) -> None:
    """Skip (fail under CI) with a loud reason when something the test needs is ``missing``."""
    if missing is None:
        return
    message = f"NOT TESTED: {missing}; {BUILD_HINT}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def require_rpc_wheel() -> None:
    """A llama-cpp-python built with GGML_RPC (the backend refuses RPC servers without it)."""
    if rpc_library() is None:
        require("the installed llama-cpp-python was built without GGML_RPC")


def require_rpc() -> None:
    """llama.cpp's rpc-server and a llama-cpp-python built with GGML_RPC."""
    if find_rpc_server() is None:
        require("llama.cpp's ggml-rpc-server binary is not built")
    require_rpc_wheel()


def llama_server_binary() -> Path:
    """llama.cpp's llama-server, or a loud skip (a failure under CI)."""
    found = find_tool(("llama-server",))
    if found is None:
        require("llama.cpp's llama-server binary is not built")
    assert found is not None
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RpcServerProcess:
    """``anyformer rpc-server --mem`` on a loopback port, with what it prints collected."""

    def __init__(self, mem: str) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "anyformer", "rpc-server", "--port", str(self.port), "--mem", mem, "--threads", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + 30
        while not any("listening on" in line for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"anyformer rpc-server did not start: {self.lines[-5:]}")
            time.sleep(0.05)

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip())

    def peak_bytes(self) -> list[int]:
        """What each finished client's buffers took at most, from the relay's lines."""
        return [int(line.split("took at most ")[1].split()[0]) for line in self.lines if "took at most" in line]

    def kill(self) -> None:
        """End it as a host that goes away: the relay and llama.cpp's server both."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(10)


@contextmanager
def rpc_servers(count: int, mem: str) -> Iterator[list[RpcServerProcess]]:
    """``count`` loopback servers lending ``mem`` each, ended afterwards."""
    servers: list[RpcServerProcess] = []
    try:
        for _ in range(count):
            servers.append(RpcServerProcess(mem))
        yield servers
    finally:
        for server in servers:
            server.kill()
