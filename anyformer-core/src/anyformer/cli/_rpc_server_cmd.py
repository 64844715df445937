"""``anyformer rpc-server``: lend this host's memory to llama.cpp loads on other hosts."""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._sizes import format_size, parse_size

DEFAULT_PORT = 50052
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Seconds the llama.cpp server behind the relay has to start listening.
_START_SECONDS = 30.0
NO_AUTH_WARNING = (
    "anyformer rpc-server: WARNING: listening on {host}, beyond this machine. llama.cpp's RPC protocol has no "
    "authentication or encryption: anyone who reaches this port can read and run what it holds. Keep it on a "
    "private network or reach it through an SSH tunnel (docs/rpc.md)."
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the subcommand."""
    parser = sub.add_parser(
        "rpc-server",
        help="lend this host's memory to llama.cpp loads elsewhere (llama.cpp's RPC server)",
        description=(
            "Run llama.cpp's rpc-server, built from the llama.cpp the llama.cpp backend uses, so that "
            "`anyformer run --rpc HOST:PORT` on another machine puts model layers here. It binds to loopback "
            "unless --host says otherwise; the protocol has no authentication (docs/rpc.md)."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT})")
    parser.add_argument(
        "--mem", help="the most memory lent (e.g. 4GB); clients see this much and no allocation goes past it"
    )
    parser.add_argument("--threads", type=int, help="CPU threads for the computations run here")
    parser.add_argument(
        "--build",
        action="store_true",
        help="build llama.cpp's rpc-server for the installed llama-cpp-python (its version and GPU backend), "
        "print its path and exit; needs CMake and a C++ compiler",
    )
    parser.add_argument(
        "--sdist",
        type=Path,
        metavar="FILE",
        help="with --build: the llama-cpp-python sdist to build from (else pip downloads it)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Start the server (and the relay that caps its memory with --mem); returns when it ends."""
    from anyformer.rpc._server_binary import build_hint, find_rpc_server

    if args.sdist is not None and not args.build:
        raise AnyformerError(ErrorCode.BAD_REQUEST, "--sdist goes with --build")
    if args.build:
        from anyformer.rpc._server_build import build_rpc_server

        print(build_rpc_server(args.sdist, jobs=args.threads))
        return 0
    if not 0 < args.port < 65536:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"--port must be 1-65535, got {args.port}")
    if args.threads is not None and args.threads <= 0:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"--threads must be positive, got {args.threads}")
    cap = parse_size(args.mem) if args.mem is not None else None
    if cap is not None and cap <= 0:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"--mem must be more than 0, got {args.mem}")
    binary = find_rpc_server()
    if binary is None:
        raise AnyformerError(ErrorCode.NO_BACKEND, f"llama.cpp's rpc-server is not installed: {build_hint()}")
    # Printed once SIGTERM is handled: a supervisor that stops the server on seeing it ends it cleanly.
    warning = NO_AUTH_WARNING.format(host=args.host) if args.host not in _LOOPBACK else None
    threads = ["-t", str(args.threads)] if args.threads else []
    if cap is None:
        command = [str(binary), "-H", args.host, "-p", str(args.port), *threads]
        return _run_until_signal(command, lambda process: None, f"{args.host}:{args.port}", None, warning)
    # With --mem, llama.cpp listens on a private loopback port and the relay takes the public one.
    listen = _listen(args.host, args.port)
    inner = _free_loopback_port()
    command = [str(binary), "-H", "127.0.0.1", "-p", str(inner), *threads]

    def relay(process: subprocess.Popen[bytes]) -> None:
        from anyformer.rpc._lender import serve_lender

        _wait_listening(("127.0.0.1", inner), process)
        stop = threading.Event()
        thread = threading.Thread(
            target=serve_lender, args=(listen, ("127.0.0.1", inner), cap), kwargs={"stop": stop}, daemon=True
        )
        thread.start()

    try:
        return _run_until_signal(command, relay, f"{args.host}:{args.port}", cap, warning)
    finally:
        listen.close()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"cannot listen on {host}:{port} ({exc.strerror or exc})") from exc
    sock.listen(4)
    return sock


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(address: tuple[str, int], process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AnyformerError(
                ErrorCode.PLUGIN_ERROR, f"llama.cpp's rpc-server exited with status {process.returncode}"
            )
        # A bare connect would take the server's one client slot for a moment: it only checks the port is bound.
        with contextlib.suppress(OSError), socket.create_connection(address, timeout=0.5):
            return
        time.sleep(0.1)
    raise AnyformerError(ErrorCode.PLUGIN_ERROR, f"llama.cpp's rpc-server did not listen within {_START_SECONDS:g} s")


def _parent_death_signal() -> None:
    """In the child: end with SIGTERM when this process dies, so no server outlives the command (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _run_until_signal(
    command: list[str],
    started: Callable[[subprocess.Popen[bytes]], None],
    where: str,
    cap: int | None,
    warning: str | None = None,
) -> int:
    """Run the server; SIGTERM and Ctrl-C end it; returns its exit status (0 when ended by a signal).

    ``warning`` goes to stderr once SIGTERM is handled, before the server starts listening."""
    process = subprocess.Popen(command, preexec_fn=_parent_death_signal if sys.platform == "linux" else None)
    ended = threading.Event()

    def end(signum: int, frame: FrameType | None) -> None:
        ended.set()
        process.terminate()

    previous = signal.signal(signal.SIGTERM, end)
    try:
        if warning is not None:
            print(warning, file=sys.stderr, flush=True)
        started(process)
        lent = f", lending at most {format_size(cap)}" if cap is not None else ""
        print(f"anyformer rpc-server: listening on {where}{lent}", file=sys.stderr, flush=True)
        status = process.wait()
    except KeyboardInterrupt:
        ended.set()
        process.terminate()
        status = process.wait()
    except BaseException:
        process.terminate()
        process.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0 if ended.is_set() else status
