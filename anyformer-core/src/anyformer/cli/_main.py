"""Entry point of the ``anyformer`` command: parses arguments and maps errors to exit codes.

No command prints a traceback for an ``AnyformerError``: the code and message go to stderr and the
exit status is non-zero (1, or 2 for a malformed request, 3 when no backend can run the model,
130 when interrupted or cancelled, as shells report Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from anyformer import __version__
from anyformer.contract._errors import AnyformerError, ErrorCode

#: Exit status when no backend can run the model (``check``, ``run``).
EXIT_NO_BACKEND = 3
#: Exit status when Ctrl-C interrupted a command or cancelled an answer.
EXIT_INTERRUPTED = 130
_EXIT_BY_CODE = {
    ErrorCode.BAD_REQUEST: 2,
    ErrorCode.NO_BACKEND: EXIT_NO_BACKEND,
    ErrorCode.BUDGET_TOO_SMALL: EXIT_NO_BACKEND,
    ErrorCode.CANCELLED: EXIT_INTERRUPTED,
}


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors carry the ``BAD_REQUEST`` code, like every other error."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"anyformer: {ErrorCode.BAD_REQUEST.value}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = _Parser(
        prog="anyformer",
        description="Run any Hugging Face model on this machine: every installed backend is asked, the best one runs.",
    )
    parser.add_argument("--version", action="version", version=f"anyformer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    # Imported here, not at the top: `anyformer run` starts its worker before importing them (see main).
    from anyformer.cli import (
        _caps_cmd,
        _check_cmd,
        _ls_cmd,
        _plugins_cmd,
        _ps_cmd,
        _pull_cmd,
        _rm_cmd,
        _rpc_server_cmd,
        _run_cmd,
        _serve_cmd,
    )

    for module in (
        _caps_cmd,
        _plugins_cmd,
        _check_cmd,
        _pull_cmd,
        _ls_cmd,
        _rm_cmd,
        _run_cmd,
        _serve_cmd,
        _ps_cmd,
        _rpc_server_cmd,
    ):
        module.add_parser(sub)
    return parser


#: Options whose value may look like a negative number with a unit (``--budget -5GB``): argparse would
#: take ``-5GB`` for an option and say "expected one argument"; joined, our size parser says what is wrong.
_SIZE_OPTIONS = ("--budget", "--ram", "--mem")
_NEGATIVE = re.compile(r"^-\.?\d")


def join_negative_values(argv: Sequence[str]) -> list[str]:
    """``--budget -5GB`` as ``--budget=-5GB``, so the value reaches the size parser."""
    joined: list[str] = []
    for arg in argv:
        if joined and joined[-1] in _SIZE_OPTIONS and _NEGATIVE.match(arg):
            joined[-1] = f"{joined[-1]}={arg}"
        else:
            joined.append(arg)
    return joined


def warn_about_plugin_filters() -> None:
    """One line on stderr for each name in ANYFORMER_PLUGINS / ANYFORMER_DISABLE_PLUGINS no plugin has."""
    if not (os.environ.get("ANYFORMER_PLUGINS") or os.environ.get("ANYFORMER_DISABLE_PLUGINS")):
        return  # the plugins load when a command needs them, not before
    from anyformer._plugins import get_plugin_manager

    manager = get_plugin_manager()
    installed = ", ".join(info.name for info in manager.plugins() + manager.disabled()) or "none"
    for variable, names in manager.unknown_filter_names().items():
        print(
            f"anyformer: warning: {variable} names {', '.join(names)}, but no installed plugin has that name "
            f"(installed: {installed})",
            file=sys.stderr,
        )


def runs_isolated(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is an ``anyformer run`` that will load its model in a worker process."""
    return bool(argv) and argv[0] == "run" and not {"--in-process", "-h", "--help"} & set(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (also used by ``python -m anyformer``)."""
    arguments = join_negative_values(sys.argv[1:] if argv is None else argv)
    if runs_isolated(arguments):
        # The worker's interpreter starts and imports anyformer while this process imports the
        # rest of the package, parses, describes and selects; `load` takes it (or it is ended below).
        from anyformer.isolation._worker_start import prestart

        prestart()
    try:
        parser = build_parser()
        args = parser.parse_args(arguments)
        warn_about_plugin_filters()
        return int(args.handler(args) or 0)
    except AnyformerError as exc:
        print(f"anyformer: {exc.code.value}: {exc.message}", file=sys.stderr)
        if exc.need is not None:
            from anyformer.contract._sizes import format_size

            print(f"anyformer: it would need {format_size(exc.need)}", file=sys.stderr)
        return _EXIT_BY_CODE.get(exc.code, 1)
    except KeyboardInterrupt:
        print("\nanyformer: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    finally:
        from anyformer.isolation._worker_start import discard_prestarted

        discard_prestarted()


if __name__ == "__main__":
    sys.exit(main())
