"""``anyformer check``: every backend's verdict on a model, and the one the policy chooses."""

from __future__ import annotations

import argparse

from anyformer._api import check
from anyformer._format import describe_estimate
from anyformer._selection import Selection
from anyformer.cli._common import (
    add_file_argument,
    add_machine_arguments,
    add_rpc_argument,
    caps_from_args,
    file_option,
    model_argument,
    print_json,
)
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._model import Model
from anyformer.contract._sizes import format_size
from anyformer.contract._verdict import Refusal

#: Exit status when no backend can run the model.
EXIT_NONE_CAN_RUN = 3


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the subcommand."""
    parser = sub.add_parser("check", help="ask every backend whether it can run a model; load nothing")
    parser.add_argument(
        "model", nargs="?", help="Hub repo id, local folder or file; `default` (or `smollm2`) is the embedded model"
    )
    parser.add_argument("--describe", metavar="FILE.json", help="a model description instead of MODEL")
    parser.add_argument("--task", help="the task to run (default: the model's)")
    parser.add_argument("--backend", help="ask only this backend")
    parser.add_argument("--prefer", help="backend ids to choose first, comma separated")
    add_file_argument(parser)
    add_machine_arguments(parser)
    add_rpc_argument(parser)
    parser.add_argument("--json", action="store_true", help='print {"model", "chosen", "verdicts"} as JSON')
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the verdicts; exit 0 when one backend can run the model, 3 when none can."""
    if bool(args.model) == bool(args.describe):
        raise AnyformerError(ErrorCode.BAD_REQUEST, "give a MODEL or --describe FILE.json (one of them)")
    ref = Model.from_json_file(args.describe) if args.describe else model_argument(args.model)
    model, selection = check(
        ref,
        task=args.task,
        budget=args.budget,
        caps=caps_from_args(args),
        prefer=args.prefer,
        backend=args.backend,
        rpc=args.rpc,
        options=file_option(args),
    )
    if args.json:
        verdicts = [v.to_dict() for v in selection.verdicts]
        print_json({"model": model.to_dict(), "chosen": selection.chosen_backend, "verdicts": verdicts})
    else:
        _print_table(model, selection)
    return 0 if selection.chosen is not None else EXIT_NONE_CAN_RUN


def _print_table(model: Model, selection: Selection) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    sizes = sum(f.size or 0 for f in model.files)
    console.print(
        f"[bold]{model.ref}[/]  architecture={model.architecture or '?'} task={model.task or '?'} "
        f"formats={','.join(model.formats) or '-'} files={len(model.files)} ({format_size(sizes)})"
    )
    table = Table()
    for column in ("", "backend", "verdict", "why / estimate"):
        table.add_column(column)
    for verdict in selection.verdicts:
        mark = "→" if verdict is selection.chosen else ""
        if verdict.ok:
            table.add_row(mark, verdict.backend, "[green]ok[/]", describe_estimate(verdict))
        else:
            need = f" (need {format_size(verdict.need)})" if verdict.need is not None else ""
            table.add_row(mark, verdict.backend, f"[red]{verdict.code}[/]", verdict.reason + need)
    from anyformer._known_backends import install_hint
    from anyformer._plugins import get_plugin_manager

    unread = all(v.code is Refusal.FORMAT for v in selection.verdicts)
    hint = install_hint(model.formats, [v.backend for v in selection.verdicts]) if unread else ""
    if not selection.verdicts:
        console.print(get_plugin_manager().why_no_backend(hint))
        return
    console.print(table)
    for broken in (info for info in get_plugin_manager().plugins() if not info.ok):  # never asked: say why
        console.print(f"[red]not asked[/] {broken.name}: {escape(broken.error or '')}", soft_wrap=True)
    if selection.chosen:
        console.print(f"chosen: [bold]{selection.chosen_backend}[/]")
    else:
        console.print("[red]no backend can run it[/]" + (f" ({hint})" if hint else ""))
