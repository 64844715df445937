"""``anyformer caps``: what this machine can do."""

from __future__ import annotations

import argparse
import dataclasses

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
    """Print the capabilities, and which installed backends would use the GPU."""
    from anyformer.cli._gpu_backends import gpu_backends, has_gpu

    caps = caps_from_args(args)
    users = gpu_backends(caps) if has_gpu(caps) else []
    if args.json:
        print_json({**caps.to_dict(), "gpu_backends": [dataclasses.asdict(use) for use in users]})
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="anyformer caps", show_header=False)
    yes = lambda flag: "[green]yes[/]" if flag else "[red]no[/]"  # noqa: E731
    note = f"({caps.gpu_note})" if caps.gpu_note else ""
    table.add_row("GPU", f"{yes(caps.gpu)} {caps.gpu_name or ''} {note}")
    table.add_row("shader-f16", yes(caps.f16))
    table.add_row("subgroups", yes(caps.subgroups))
    total = f" of {format_size(caps.gpu_total_bytes)}" if caps.gpu_total_bytes else ""
    source = f" (from {caps.gpu_memory_source})" if caps.gpu_memory_source else ""
    table.add_row("GPU memory free", f"{format_size(caps.gpu_bytes)}{total}{source}")
    table.add_row("host RAM available", format_size(caps.ram_bytes))
    table.add_row("CPU cores", str(caps.cpu_count))
    table.add_row("store", f"{yes(caps.store)} {caps.store_path or ''}")
    table.add_row("disk free", format_size(caps.disk_free_bytes))
    if has_gpu(caps):
        for use in users or ():
            table.add_row(f"GPU use: {use.backend}", f"{yes(use.gpu)} {use.why}")
        if not users:
            table.add_row("GPU use", "not asked (the embedded default model is not installed)")
    Console().print(table)
    return 0
