"""``anyformer plugins``: every installed plugin, its version, its load error or why it is disabled, and the
load options each backend declares."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from anyformer import __version__
from anyformer._plugins import PluginManager, get_plugin_manager
from anyformer.cli._common import print_json

if TYPE_CHECKING:
    from rich.table import Table


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the subcommand."""
    parser = sub.add_parser("plugins", help="list installed backend plugins and their state")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the plugins; exit 0 even when some failed (they are listed with their error)."""
    manager = get_plugin_manager()
    infos = manager.plugins()
    disabled = manager.disabled()
    if args.json:
        loaded = [
            info.to_dict()
            | {"disabled": False, "load_options": [option.to_dict() for option in manager.load_options(info.name)]}
            for info in infos
        ]
        print_json(loaded + [info.to_dict() | {"disabled": True} for info in disabled])
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"anyformer {__version__}: plugins")
    for column in ("backend", "distribution", "version", "state"):
        table.add_column(column)
    for info in infos:
        state = "[green]ok[/]" if info.ok else f"[red]failed:[/] {info.error}"
        table.add_row(info.name, info.distribution or "-", info.version or "-", state)
    for info in disabled:
        table.add_row(info.name, info.distribution or "-", info.version or "-", f"[yellow]{info.error}[/]")
    console = Console()
    if not infos:
        console.print(f"anyformer {__version__}: {manager.why_no_backend()}")
        if not disabled:
            return 0
    console.print(table)
    options = _options_table(manager)
    if options is not None:
        console.print(options)
    return 0


def _options_table(manager: PluginManager) -> Table | None:
    """Each loaded backend's declared load options (``--option KEY=VALUE``), or None when none declares any."""
    from rich.table import Table

    table = Table(title="load options (--option KEY=VALUE)")
    for column in ("backend", "option", "type", "default", "what"):
        table.add_column(column)
    for backend in manager.backends():
        for option in manager.load_options(backend):
            default = "-" if option.default is None else str(option.default)
            table.add_row(backend, option.name, option.type_text(), default, option.help)
    return table if table.row_count else None
