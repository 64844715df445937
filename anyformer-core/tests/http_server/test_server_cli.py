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
    for option in (
        "--host",
        "--port",
        "--budget",
        "--preload",
        "--api-key",
        "127.0.0.1",
        "--model",
        "--allow-paths",
        "--allow-pull",
        "--allowed-host",
        "--cors-origin",
        "--max-body",
        "--keep-alive",
        "--log-level",
        "--log-file",
    ):
        assert option in done.stdout


#: The operator's rules: one named model, one extra Host name, a 1 KB body limit.
SECURITY_FLAGS = ["--model", "org/served-model", "--allowed-host", "llm.lan", "--max-body", "1KB"]


def test_serve_starts_with_an_api_key_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = {**os.environ, "ANYFORMER_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    environment.pop("ANYFORMER_API_KEY", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "anyformer", "serve", "--port", str(port), "--api-key", "k", *SECURITY_FLAGS],
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
        assert reply.status == 200 and reply.json() == {"status": "ok"}  # no key: nothing about the models
        base, key = f"http://127.0.0.1:{port}", {"Authorization": "Bearer k"}
        assert plain_request("GET", f"{base}/v1/models").status == 401
        listed = plain_request("GET", f"{base}/v1/models", headers=key)
        assert listed.status == 200 and listed.json()["object"] == "list"
        assert "org/served-model" in {m["id"] for m in listed.json()["data"]}
        assert plain_request("GET", f"{base}/v1/models", headers={**key, "Host": f"llm.lan:{port}"}).status == 200
        assert plain_request("GET", f"{base}/v1/models", headers={**key, "Host": f"evil.example:{port}"}).status == 403
        big = plain_request("POST", f"{base}/v1/chat/completions", b"x" * 2048, headers=key)
        assert big.status == 413
    finally:
        server.send_signal(signal.SIGINT)
        output, _ = server.communicate(timeout=30)
    assert server.returncode == 0, output
