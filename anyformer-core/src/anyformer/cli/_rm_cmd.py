"""``anyformer rm``: remove a model's Hub cache revisions and backend-derived files, after asking."""

from __future__ import annotations

import argparse
import sys

from anyformer.cli._common import os_errors_as_refusals
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._sizes import format_size


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the subcommand."""
    parser = sub.add_parser(
        "rm",
        help="remove a stored model and print the bytes freed",
        description=(
            "Remove org/name (every cached revision) or org/name@revision from the Hugging Face cache, with "
            "the files backends derived from it under ANYFORMER_HOME; for a local model's path, only the files "
            "backends derived from it (its own files stay). Asks first unless -y is given."
        ),
    )
    parser.add_argument("model", help="Hub repo id, org/name[@revision], or a local model's path")
    parser.add_argument("-y", "--yes", action="store_true", help="remove without asking")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Show what goes, ask (unless -y), remove, print the bytes freed."""
    from anyformer._cache_removal import plan_removal
    from anyformer._default_model import refuse_removing_default_model

    refuse_removing_default_model(args.model)
    with os_errors_as_refusals(f"looking for {args.model!r:.200}"):
        plan = plan_removal(args.model)
    for path in plan.paths:
        print(f"  {path}", file=sys.stderr)
    if not args.yes and not _confirmed(f"remove {args.model} ({format_size(plan.bytes)})? [y/N] "):
        print("anyformer: nothing removed", file=sys.stderr)
        return 1
    with os_errors_as_refusals(f"removing {args.model}"):
        freed = plan.execute()
    print(f"removed {args.model}: freed {format_size(freed)} ({freed} bytes)")
    return 0


def _confirmed(question: str) -> bool:
    """Ask on stderr, read the answer from stdin; no answer to read is a refusal to guess."""
    print(question, end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline() if sys.stdin is not None and not sys.stdin.closed else ""
    if not answer:
        print(file=sys.stderr)
        raise AnyformerError(ErrorCode.BAD_REQUEST, "no answer on stdin: pass -y to remove without asking")
    return answer.strip().lower() in ("y", "yes")
