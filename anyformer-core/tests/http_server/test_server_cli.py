"""``anyformer serve`` from the command line, and keeping the server out of ``import anyformer``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .server_support import plain_request


def test_import_anyformer_and_the_cli_do_not_import_the_server() -> None:
    code = (
        "import sys, anyformer, anyformer.cli._main as m; m.build_parser(); "
        "print(sorted(n for n in ('starlette', 'uvicorn', 'anyformer.server') if n in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_serve_help_lists_its_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "anyformer", "serve", "--help"], capture_output=True, text=True, check=True
    )
    for option in ("--host", "--port", "--budget", "--preload", "--api-key", "127.0.0.1"):
        assert option in done.stdout


def test_serve_starts_with_an_api_key_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = {**os.environ, "ANYFORMER_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    environment.pop("ANYFORMER_API_KEY", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "anyformer", "serve", "--port", str(port), "--api-key", "k"],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                reply = plain_request("GET", f"http://127.0.0.1:{port}/health")
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
                time.sleep(0.1)
        assert reply.status == 200
        assert plain_request("GET", f"http://127.0.0.1:{port}/v1/models").status == 401
        listed = plain_request("GET", f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer k"})
        assert listed.status == 200 and listed.json()["object"] == "list"
    finally:
        server.send_signal(signal.SIGINT)
        output, _ = server.communicate(timeout=30)
    assert server.returncode == 0, output
