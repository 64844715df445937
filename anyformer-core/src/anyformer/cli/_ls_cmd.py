"""``anyformer ls``: the models on this machine, from every backend's store and the Hub cache."""

from __future__ import annotations

import argparse
import sys

from anyformer.cli._common import print_json
from anyformer.contract._sizes import format_size


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the subcommand."""
    parser = sub.add_parser(
        "ls",
        help="list stored models: backend, repo, revision, size, path",
        description=(
            "Every model an installed backend can run that is on this machine: the embedded default model "
            "(read-only: `anyformer run default`), the backends' own stores and the Hugging Face cache (whoever "
            "downloaded it). A damaged cache entry is listed as corrupted."
        ),
    )
    parser.add_argument("--json", action="store_true", help='print {"models": [...], "problems": [...]} as JSON')
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the stored models; exit 0 even when some entries are corrupted (they are listed as such)."""
    from anyformer._cache_listing import list_store
    from anyformer._default_model import EMBEDDED_STATE, default_model_entry
    from anyformer._plugins import get_plugin_manager

    manager = get_plugin_manager()
    entries, problems = list_store(manager)
    embedded = default_model_entry(manager)
    if embedded is not None:  # first: the model `anyformer run` uses when none is named
        entries.insert(0, embedded)
    if args.json:
        print_json({"models": [e.to_dict() for e in entries], "problems": problems})
        return 0
    for problem in problems:
        print(f"anyformer: {problem}", file=sys.stderr)
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not entries:
        console.print("no models stored: `anyformer pull org/name` downloads one")
        return 0
    table = Table()
    for column in ("backend", "repo", "revision", "size", "path"):
        table.add_column(column, overflow="fold")
    for entry in entries:
        if entry.state == EMBEDDED_STATE:
            repo = f"{entry.repo} [dim]({entry.state})[/]"
        else:
            repo = entry.repo if entry.state == "ok" else f"{entry.repo} [red]({entry.state})[/]"
        table.add_row(entry.backend, repo, entry.revision or "-", format_size(entry.bytes), entry.path)
    console.print(table)
    return 0
