"""``anyformer ps`` and ``anyformer stop MODEL``: what a running ``anyformer serve`` holds, and unloading a model.

Both talk to the server over HTTP (``GET /api/ps``, ``POST /api/stop``) with the standard library:
its URL from ``--url`` or ``$ANYFORMER_URL``, its key from ``--api-key`` or ``$ANYFORMER_API_KEY``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from anyformer.cli._common import print_json
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._sizes import format_size

#: Where ``anyformer serve`` listens unless told.
DEFAULT_URL = "http://127.0.0.1:8000"
#: Seconds to wait for the server's answer.
_TIMEOUT = 30


def _add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("ANYFORMER_URL", DEFAULT_URL),
        help=f"the server's base URL (default: $ANYFORMER_URL, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--api-key", default=os.environ.get("ANYFORMER_API_KEY"), help="its API key (default: $ANYFORMER_API_KEY)"
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``ps`` and ``stop``."""
    ps = sub.add_parser(
        "ps",
        help="list the models a running server holds: backend, memory, context, streams, idle until",
        description="Asks a running `anyformer serve` (GET /api/ps) which models it has loaded.",
    )
    _add_server_arguments(ps)
    ps.add_argument("--json", action="store_true", help="print the server's answer as JSON")
    ps.set_defaults(handler=run_ps)
    stop = sub.add_parser(
        "stop",
        help="unload a model from a running server now (or once its running requests end)",
        description="Asks a running `anyformer serve` (POST /api/stop) to unload MODEL and free its memory.",
    )
    stop.add_argument("model", metavar="MODEL", help="the model's id, as `anyformer ps` lists it")
    _add_server_arguments(stop)
    stop.set_defaults(handler=run_stop)


def run_ps(args: argparse.Namespace) -> int:
    """Print the loaded models as a table (or JSON)."""
    answer = _call(args, "GET", "/api/ps")
    if args.json:
        print_json(answer)
        return 0
    models = answer.get("models", [])
    if not models:
        print("no models loaded")
        return 0
    rows: list[tuple[str, ...]] = [("MODEL", "BACKEND", "GPU", "RAM", "CONTEXT", "STREAMS", "IDLE UNTIL")]
    rows += [_row(model) for model in models]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def run_stop(args: argparse.Namespace) -> int:
    """Unload the model; say whether it left now or leaves when idle."""
    answer = _call(args, "POST", "/api/stop", {"model": args.model})
    for item in answer.get("stopped", []):
        task = f" ({item['task']})" if item.get("task") else ""
        state = "unloaded" if item.get("unloaded") else "busy: unloads when its running requests end"
        print(f"{item['id']}{task}: {state}")
    return 0


def _row(model: dict[str, Any]) -> tuple[str, ...]:
    streams = f"{model.get('active', 0)}/{model.get('parallel', 1)}"
    if model.get("waiting"):
        streams += f" +{model['waiting']} waiting"
    return (
        str(model["id"]),
        str(model.get("backend", "")),
        format_size(model.get("gpu_bytes") or 0),
        format_size(model.get("ram_bytes") or 0),
        str(model.get("context") or "default"),
        streams,
        _idle_until(model),
    )


def _idle_until(model: dict[str, Any]) -> str:
    if model.get("keep_alive") is None:
        return "forever"
    expires = model.get("expires_at")
    if expires is None:
        return "in use"
    left = max(0.0, expires - time.time())
    clock = time.strftime("%H:%M:%S", time.localtime(expires))
    return f"{clock} (in {left:.0f}s)"


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    """One request to the server; its errors as ``AnyformerError`` with the server's code."""
    url = args.url.rstrip("/") + path
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise _server_error(exc) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AnyformerError(
            ErrorCode.OFFLINE, f"no anyformer server answers at {args.url} ({reason}); start one with `anyformer serve`"
        ) from None
    except ValueError:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{url} did not answer JSON: is it an anyformer server?") from None


def _server_error(exc: urllib.error.HTTPError) -> AnyformerError:
    try:
        error = json.loads(exc.read()).get("error", {})
        code, message = str(error.get("code")), str(error.get("message"))
    except (ValueError, AttributeError):
        return AnyformerError(ErrorCode.PLUGIN_ERROR, f"the server answered HTTP {exc.code}")
    if code == "UNAUTHORIZED":
        return AnyformerError(ErrorCode.BAD_REQUEST, f"{message} (--api-key or $ANYFORMER_API_KEY)")
    known = {c.value for c in ErrorCode}
    return AnyformerError(code if code in known else ErrorCode.BAD_REQUEST, message)
