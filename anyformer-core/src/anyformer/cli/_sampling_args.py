"""``anyformer run``'s sampling and structured-output options, as ``generate`` takes them.

Each is passed only when given; the core checks them before the model loads and refuses, with
``BAD_REQUEST`` naming it, any the chosen backend does not honour (as the server does).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode

#: The flags that map one to one onto a sampling option, their types and help.
_NUMBERS: dict[str, tuple[type, str]] = {
    "top_p": (float, "keep the likeliest tokens whose probabilities add up to this"),
    "top_k": (int, "keep the k likeliest tokens; 0 keeps them all"),
    "min_p": (float, "drop tokens less likely than this times the likeliest"),
    "repeat_penalty": (float, "llama.cpp's repeat penalty over the reply's last 64 tokens (1 is off)"),
    "frequency_penalty": (float, "subtract this per occurrence of a token in the reply's last 64"),
    "presence_penalty": (float, "subtract this once for each token in the reply's last 64"),
}


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--top-p``, ``--top-k``, ``--min-p``, the penalties, ``--logit-bias``, ``--json-schema``, ``--regex``."""
    group = parser.add_argument_group("sampling and structured output")
    for name, (kind, text) in _NUMBERS.items():
        group.add_argument(f"--{name.replace('_', '-')}", type=kind, help=text)
    group.add_argument(
        "--logit-bias", action="append", metavar="TOKEN=BIAS", help="add BIAS (-100 bans) to token id TOKEN; repeatable"
    )
    group.add_argument("--json-schema", metavar="SCHEMA", help="hold the reply to a JSON schema: JSON text or @file")
    group.add_argument("--regex", help="hold the reply to a regular expression")


def _schema(text: str) -> Any:
    source = text
    if text.startswith("@"):
        try:
            source = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"--json-schema: cannot read {text[1:]}: {exc}") from None
    try:
        return json.loads(source)
    except (ValueError, RecursionError) as exc:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"--json-schema is not JSON: {exc}") from None


def sampling_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``generate`` options the flags ask for (none given: an empty dict)."""
    options: dict[str, Any] = {name: getattr(args, name) for name in _NUMBERS if getattr(args, name) is not None}
    if args.logit_bias:
        bias: dict[str, float] = {}
        for item in args.logit_bias:
            token, sep, value = item.partition("=")
            try:
                bias[token.strip()] = float(value)
            except ValueError:
                sep = ""
            if not sep:
                raise AnyformerError(ErrorCode.BAD_REQUEST, f"--logit-bias takes TOKEN=BIAS, got {item!r}")
        options["logit_bias"] = bias
    if args.json_schema is not None and args.regex is not None:
        raise AnyformerError(ErrorCode.BAD_REQUEST, "give --json-schema or --regex, not both")
    if args.json_schema is not None:
        options["constraint"] = {"type": "json_schema", "schema": _schema(args.json_schema)}
    if args.regex is not None:
        options["constraint"] = {"type": "regex", "regex": args.regex}
    return options
