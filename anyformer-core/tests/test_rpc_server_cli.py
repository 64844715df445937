"""``anyformer rpc-server``: finding the binary, the no-authentication warning, the --mem relay.

A stand-in for llama.cpp's binary (rpc_fakes.py run as a script, named by
``ANYFORMER_RPC_SERVER_BIN``) speaks the protocol's framing; the real binary is exercised by the
llama.cpp backend's tests.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anyformer.rpc._protocol import RpcServerError, probe

HERE = Path(__file__).parent


@pytest.fixture
def fake_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "fake-rpc-server"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} {HERE / "rpc_fakes.py"} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("ANYFORMER_RPC_SERVER_BIN", str(script))
    return script


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "anyformer", "rpc-server", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(HERE)},
    )


def _wait_for(endpoint: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            probe(endpoint, timeout=1)
            return
        except RpcServerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_without_a_binary_it_says_how_to_build_one(tmp_path: Path) -> None:
    env = {**os.environ, "ANYFORMER_RPC_SERVER_BIN": str(tmp_path / "missing"), "PATH": "/nonexistent"}
    done = subprocess.run(
        [sys.executable, "-m", "anyformer", "rpc-server"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 3
    assert "NO_BACKEND" in done.stderr and "scripts/build-llama-tools" in done.stderr


def test_mem_caps_what_clients_are_told_and_sigterm_ends_the_server_behind(fake_binary: Path) -> None:
    port = _port()
    process = _start("--port", str(port), "--mem", "100MB")
    try:
        _wait_for(f"127.0.0.1:{port}")
        info = probe(f"127.0.0.1:{port}")
        assert [(d.free, d.total) for d in info.devices] == [(100_000_000, 100_000_000)]
    finally:
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=20)
    assert process.returncode == 0
    assert "lending at most 100 MB" in err
    with pytest.raises(RpcServerError):
        probe(f"127.0.0.1:{port}", timeout=1)


def test_without_mem_the_binary_takes_the_port_itself(fake_binary: Path) -> None:
    port = _port()
    process = _start("--port", str(port))
    try:
        _wait_for(f"127.0.0.1:{port}")
        assert probe(f"127.0.0.1:{port}").devices[0].total == 2 * 10**9  # the fake's own figure, uncapped
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    assert f"127.0.0.1:{port}" in out
    assert "WARNING" not in err


def test_listening_beyond_loopback_warns_that_there_is_no_authentication(fake_binary: Path) -> None:
    process = _start("--host", "0.0.0.0", "--port", str(_port()), "--mem", "1GB")
    try:
        deadline = time.monotonic() + 20
        assert process.stderr is not None
        line = process.stderr.readline()
        while "WARNING" not in line and time.monotonic() < deadline:
            line = process.stderr.readline()
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=20)
    assert "no authentication" in line and "SSH tunnel" in line


def test_bad_options_are_bad_requests(fake_binary: Path) -> None:
    for args in (["--port", "0"], ["--mem", "0"], ["--threads", "0"], ["--mem", "lots"]):
        done = subprocess.run(
            [sys.executable, "-m", "anyformer", "rpc-server", *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2 and "BAD_REQUEST" in done.stderr, args


def test_the_binary_is_looked_for_where_scripts_build_llama_tools_puts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from anyformer.rpc._server_binary import tools_dir

    script = HERE.parents[1] / "scripts" / "llama_build.py"
    env = {**os.environ, "ANYFORMER_WHEELHOUSE": str(tmp_path)}
    built = subprocess.run([sys.executable, str(script), "tools-dir"], capture_output=True, text=True, env=env)
    version = subprocess.run([sys.executable, str(script), "version"], capture_output=True, text=True, env=env)
    monkeypatch.setenv("ANYFORMER_WHEELHOUSE", str(tmp_path))
    assert Path(built.stdout.strip()) == tools_dir(version.stdout.strip())


@pytest.mark.parametrize(
    "args",
    [
        ["run", "Hello", "--rpc", "no-port"],
        ["run", "Hello", "--rpc", "127.0.0.1:50052", "--in-process"],
        ["serve", "--rpc", "127.0.0.1:50052", "--in-process"],
        ["check", "default", "--rpc", "a:1,a:1"],
    ],
)
def test_rpc_options_are_checked_before_anything_loads(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "anyformer", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "BAD_REQUEST" in done.stderr, done.stderr
