"""Arguments several subcommands share, and turning them into caps and requests."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import sys
from collections.abc import Iterator
from typing import Any

from anyformer.contract._caps import Caps
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._sizes import parse_size
from anyformer.machine._probe import probe


def add_machine_arguments(parser: argparse.ArgumentParser, *, budget: bool = True) -> None:
    """``--caps``, ``--ram`` and (unless ``budget=False``) ``--budget``: the what-if overrides of the probe."""
    if budget:
        parser.add_argument("--budget", help="accelerator memory allowed, e.g. 4GB (default: what the probe found)")
    parser.add_argument(
        "--caps",
        help="capabilities to assume instead of probing the GPU: a list of gpu,f16,subgroups,store ('' for none)",
    )
    parser.add_argument("--ram", help="host memory to assume, e.g. 16GB (default: available now)")


def add_file_argument(parser: argparse.ArgumentParser) -> None:
    """``--file NAME``: the repo's weight file to load instead of the one the backend would choose."""
    parser.add_argument(
        "--file",
        help="the repo's weight file to load (a GGUF, or a split set's first shard); default: the backend's choice",
    )


def file_option(args: argparse.Namespace) -> dict[str, Any] | None:
    """The load options ``--file`` gives (``{"file": NAME}``), or None."""
    name = getattr(args, "file", None)
    return {"file": name} if name else None


def add_rpc_argument(parser: argparse.ArgumentParser) -> None:
    """``--rpc HOST:PORT,...``: llama.cpp RPC servers whose memory the model may span (docs/rpc.md)."""
    parser.add_argument(
        "--rpc",
        metavar="HOST:PORT,...",
        help="llama.cpp RPC servers (`anyformer rpc-server`) to spread the model over (default: $ANYFORMER_RPC)",
    )


def caps_from_args(args: argparse.Namespace) -> Caps:
    """The probe's answer with ``--caps`` and ``--ram`` applied; ``--caps`` skips the GPU probe."""
    overrides: dict[str, Any] = {}
    if getattr(args, "ram", None) is not None:
        overrides["ram_bytes"] = parse_size(args.ram)
    flags = getattr(args, "caps", None)
    # `anyformer caps` is the command that asks the driver: it never answers from the adapter cache.
    caps = probe(gpu=flags is None, refresh=getattr(args, "fresh_probe", False))
    if flags is not None:
        caps = caps.with_flags(flags.split(","))
    return caps.replace(**overrides) if overrides else caps


def print_json(data: Any) -> None:
    """Stable JSON for programs: sorted keys, one document."""
    json.dump(data, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def model_argument(ref: str) -> str:
    """A MODEL argument as the library takes it: ``default`` or ``smollm2`` become the embedded model's path."""
    from anyformer._default_model import resolve_model_name

    return resolve_model_name(ref)


@contextlib.contextmanager
def os_errors_as_refusals(doing: str) -> Iterator[None]:
    """An ``OSError`` while ``doing`` becomes one line with a code (a read-only store, a long name), no traceback."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            code = ErrorCode.DISK_FULL
        elif exc.errno == errno.ENAMETOOLONG:
            code = ErrorCode.BAD_REQUEST
        else:
            code = ErrorCode.PLUGIN_ERROR if exc.errno is None else ErrorCode.BAD_REQUEST
        where = f" ({exc.filename})" if exc.filename and len(str(exc.filename)) < 300 else ""
        raise AnyformerError(code, f"{doing} failed: {exc.strerror or exc}{where}") from None
