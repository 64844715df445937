"""``anyformer caps``: what this machine can do."""

from __future__ import annotations

import argparse

from anyformer.cli._common import add_machine_arguments, caps_from_args, print_json
from anyformer.contract._sizes import format_size


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the subcommand."""
    parser = sub.add_parser(
        "caps",
        help="show this machine's capabilities (GPU, memory, store)",
        description="What the probe finds, with --caps and --ram applied (a budget is a question for check and run).",
    )
    add_machine_arguments(parser, budget=False)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run, fresh_probe=True)


def run(args: argparse.Namespace) -> int:
    """Print the capabilities."""
    caps = caps_from_args(args)
    if args.json:
        print_json(caps.to_dict())
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="anyformer caps", show_header=False)
    yes = lambda flag: "[green]yes[/]" if flag else "[red]no[/]"  # noqa: E731
    note = f"({caps.gpu_note})" if caps.gpu_note else ""
    table.add_row("GPU", f"{yes(caps.gpu)} {caps.gpu_name or ''} {note}")
    table.add_row("shader-f16", yes(caps.f16))
    table.add_row("subgroups", yes(caps.subgroups))
    table.add_row("GPU memory", format_size(caps.gpu_bytes))
    table.add_row("host RAM available", format_size(caps.ram_bytes))
    table.add_row("CPU cores", str(caps.cpu_count))
    table.add_row("store", f"{yes(caps.store)} {caps.store_path or ''}")
    table.add_row("disk free", format_size(caps.disk_free_bytes))
    Console().print(table)
    return 0
