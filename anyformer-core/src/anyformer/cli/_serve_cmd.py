"""``anyformer serve``: the OpenAI-compatible HTTP server and its chat page (the ``serve`` extra)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Literal

from anyformer.cli._common import add_rpc_argument
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
        "--model",
        dest="models",
        action="append",
        default=[],
        metavar="MODEL",
        help="a model clients may use, loaded on first use (repeatable); the store's models are served too",
    )
    parser.add_argument(
        "--allow-paths",
        action="append",
        default=[],
        metavar="FOLDER",
        help="let clients name local model files and folders inside FOLDER (repeatable; links are resolved)",
    )
    parser.add_argument(
        "--allow-pull",
        action="store_true",
        help="let clients name any Hub model, which the server then downloads (default: only stored ones)",
    )
    parser.add_argument(
        "--allowed-host",
        dest="allowed_hosts",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name clients may use besides loopback names and the bound address (repeatable; * for any)",
    )
    parser.add_argument(
        "--cors-origin",
        dest="cors_origins",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web origin (https://app.example) whose pages may call the server, with CORS headers (repeatable)",
    )
    parser.add_argument(
        "--max-body",
        default="8MB",
        help="the largest request body, e.g. 8MB (default); a larger one is refused with 413",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("ANYFORMER_API_KEY"),
        help="require Authorization: Bearer KEY on /v1/* and /api/* (default: $ANYFORMER_API_KEY, or none)",
    )
    parser.add_argument(
        "--insecure-no-key",
        action="store_true",
        help="serve a non-loopback --host without --api-key (refused otherwise: anyone on the network could use it)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=512,
        help="connections open at once (default 512); one more is closed as it opens",
    )
    parser.add_argument(
        "--special-in-content",
        action="store_true",
        help="parse special tokens (<|im_start|>…) in message text as control tokens, as before; by default "
        "they are text, so a user cannot forge a turn",
    )
    parser.add_argument("--queue", type=int, default=8, help="requests that may wait for one busy model (default 8)")
    parser.add_argument("--context", type=int, help="context length in tokens for text models")
    parser.add_argument(
        "--parallel",
        default=None,
        metavar="N",
        help="requests one model serves at once, batched in one decode step, where its backend can "
        "(llama.cpp; each stream gets the whole context); 1 serves one at a time; default auto: as many "
        "as suit the machine (llama.cpp: 2 per decode thread, 2 to 16, as many as half the memory holds)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run engines in the server's process rather than one worker process each (less overhead; "
        "an engine crash then takes the server down)",
    )
    parser.add_argument(
        "--keep-alive",
        default=os.environ.get("ANYFORMER_KEEP_ALIVE", "5m"),
        metavar="DURATION",
        help="how long an idle model stays loaded before its memory is freed, e.g. 30s, 5m (default), 1h; "
        "-1 keeps it until another model needs the room, 0 unloads it after each request; a request's "
        "keep_alive overrides it, preloaded models stay (default: $ANYFORMER_KEEP_ALIVE, else 5m)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least severe lines logged, one per request at info (default info)",
    )
    parser.add_argument("--log-file", metavar="FILE", help="append the request lines to FILE (default: stderr)")
    add_rpc_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C."""
    missing = [name for name in ("starlette", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise AnyformerError(
            ErrorCode.BAD_REQUEST,
            f"anyformer serve needs {' and '.join(missing)}: pip install 'anyformer[serve]'",
        )
    from anyformer.contract._endpoints import RPC_ENV, parse_endpoints
    from anyformer.contract._sizes import parse_size
    from anyformer.server import serve
    from anyformer.server._keep_alive import parse_keep_alive
    from anyformer.server._pool import DEFAULT_PARALLEL
    from anyformer.server._run import check_bind

    parallel = _parallel(args.parallel, DEFAULT_PARALLEL)
    keep_alive = parse_keep_alive(args.keep_alive, "--keep-alive")
    check_bind(args.host, args.api_key, args.insecure_no_key)
    if args.max_connections < 1:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"--max-connections must be at least 1, got {args.max_connections}")

    rpc = parse_endpoints(args.rpc)
    if rpc:
        if args.in_process:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "--rpc runs each engine in a worker process: drop --in-process")
        os.environ[RPC_ENV] = ",".join(rpc)  # every load of this server spans them (anyformer.load reads it)

    if args.host in ("0.0.0.0", "::", "") and not args.allowed_hosts:
        print(
            "anyformer: listening on every address, but only loopback Host names are answered: "
            "list the names clients use with --allowed-host NAME",
            file=sys.stderr,
        )

    serve(
        args.host,
        args.port,
        budget=args.budget,
        preload=args.preload,
        api_key=args.api_key,
        queue_size=args.queue,
        context=args.context,
        parallel=parallel,
        isolate=False if args.in_process else None,
        models=args.models,
        allow_paths=args.allow_paths,
        allow_pull=args.allow_pull,
        allowed_hosts=args.allowed_hosts,
        cors_origins=args.cors_origins,
        max_body=parse_size(args.max_body),
        keep_alive=keep_alive,
        log_level=args.log_level,
        log_file=args.log_file,
        max_connections=args.max_connections,
        special_in_content=args.special_in_content,
        insecure_no_key=args.insecure_no_key,
    )
    return 0


def _parallel(value: str | None, default: int | Literal["auto"]) -> int | Literal["auto"]:
    """``--parallel``: ``auto`` or a whole number of streams from 1 (``default`` when not given)."""
    if value is None:
        return default
    if value == "auto":
        return "auto"
    if not value.isdigit() or int(value) < 1:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"--parallel must be auto or a number from 1, got {value}")
    return int(value)
