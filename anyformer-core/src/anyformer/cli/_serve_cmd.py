"""``anyformer serve``: the OpenAI-compatible HTTP server and its chat page (the ``serve`` extra)."""

from __future__ import annotations

import argparse
import importlib.util
import os

from anyformer.contract._errors import AnyformerError, ErrorCode


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the subcommand."""
    parser = sub.add_parser(
        "serve",
        help="serve models over OpenAI's HTTP API, with a chat page at /",
        description=(
            "Models load on first use and stay loaded within the budget; the least recently used one is "
            "unloaded when a new one does not fit. Binds to 127.0.0.1 unless --host says otherwise."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument(
        "--budget", help="accelerator memory all loaded models may use, e.g. 8GB (default: the probe's)"
    )
    parser.add_argument("--preload", nargs="+", default=[], metavar="MODEL", help="models to load at start-up")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("ANYFORMER_API_KEY"),
        help="require Authorization: Bearer KEY on /v1/* and /api/* (default: $ANYFORMER_API_KEY, or none)",
    )
    parser.add_argument("--queue", type=int, default=8, help="requests that may wait for one busy model (default 8)")
    parser.add_argument("--context", type=int, help="context length in tokens for text models")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run engines in the server's process rather than one worker process each (less overhead; "
        "an engine crash then takes the server down)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C."""
    missing = [name for name in ("starlette", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise AnyformerError(
            ErrorCode.BAD_REQUEST,
            f"anyformer serve needs {' and '.join(missing)}: pip install 'anyformer[serve]'",
        )
    from anyformer.server import serve

    serve(
        args.host,
        args.port,
        budget=args.budget,
        preload=args.preload,
        api_key=args.api_key,
        queue_size=args.queue,
        context=args.context,
        isolate=False if args.in_process else None,
    )
    return 0
