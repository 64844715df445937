"""``anyformer pull``: download what the chosen backend needs to run a Hub model, verified, into the cache."""

from __future__ import annotations

import argparse
import sys

from anyformer.cli._common import add_machine_arguments, caps_from_args, os_errors_as_refusals, print_json
from anyformer.cli._progress_display import ProgressPrinter
from anyformer.contract._sizes import format_size


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the subcommand."""
    parser = sub.add_parser(
        "pull",
        help="download a Hub model's files for the backend that would run it",
        description=(
            "Choose the backend as `run` would (or take --backend), then download the files it loads plus the "
            "config and tokenizer files into huggingface_hub's cache, each checked against the Hub's sha256. "
            "An interrupted pull resumes where it stopped."
        ),
    )
    parser.add_argument("model", help="Hub repo id, org/name[@revision]")
    parser.add_argument("--backend", help="pull for this backend instead of the policy's choice")
    parser.add_argument("--task", help="the task to run (default: the model's)")
    add_machine_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print what was pulled as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Pull the files; print where they are and how much was downloaded."""
    from anyformer._pull import pull

    with ProgressPrinter() as progress, os_errors_as_refusals(f"pulling {args.model!r:.200}"):
        result = pull(
            args.model,
            backend=args.backend,
            task=args.task,
            budget=args.budget,
            caps=caps_from_args(args),
            progress=progress,
        )
    if args.json:
        print_json(result.to_dict())
        return 0
    for name, path in result.paths.items():
        mark = "downloaded" if name in result.downloaded else "cached"
        print(f"{mark:>10}  {name}  ({format_size(result.size_of(name))})  {path}")
    print(
        f"anyformer: {result.model.ref} for {result.backend}: {len(result.paths)} files, "
        f"{format_size(result.bytes)}; downloaded {format_size(result.downloaded_bytes)}",
        file=sys.stderr,
    )
    return 0
