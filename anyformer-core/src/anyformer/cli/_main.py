"""Entry point of the ``anyformer`` command: parses arguments and maps errors to exit codes.

No command prints a traceback for an ``AnyformerError``: the code and message go to stderr and the
exit status is non-zero (1, or 2 for a malformed request, 3 when no backend can run the model,
130 when interrupted or cancelled, as shells report Ctrl-C).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from anyformer.cli import _caps_cmd, _check_cmd, _ls_cmd, _plugins_cmd, _pull_cmd, _rm_cmd, _run_cmd, _serve_cmd
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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in (_caps_cmd, _plugins_cmd, _check_cmd, _pull_cmd, _ls_cmd, _rm_cmd, _run_cmd, _serve_cmd):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (also used by ``python -m anyformer``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
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


if __name__ == "__main__":
    sys.exit(main())
