"""``anyformer run``: load a model and stream its answer; without a prompt, a chat."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

from anyformer._api import load
from anyformer._default_model import default_model_path, is_default_model_name
from anyformer._loaded import Loaded
from anyformer.cli._common import (
    add_file_argument,
    add_machine_arguments,
    add_option_argument,
    add_rpc_argument,
    caps_from_args,
    file_option,
    model_argument,
)
from anyformer.cli._progress_display import ProgressPrinter
from anyformer.cli._run_file import FILE_TASKS, run_on_file
from anyformer.cli._sampling_args import add_sampling_arguments, sampling_options
from anyformer.contract._chunk import GenerateOptions
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._request import Request


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the subcommand."""
    parser = sub.add_parser(
        "run",
        help="run a model: stream the answer to PROMPT, or chat when no prompt is given",
        description=(
            "With two arguments: MODEL PROMPT. With one: a MODEL when it is an existing path, an org/name "
            "repo id or `default` (also `smollm2`, the embedded SmolLM2-135M-Instruct), otherwise a PROMPT for "
            "the embedded model. With none: a chat with the embedded model. In a chat, Ctrl-C stops an answer "
            "and returns to the prompt; Ctrl-C at the prompt, Ctrl-D or an empty line quits."
        ),
    )
    parser.add_argument(
        "model", nargs="?", help="Hub repo id, local folder or file; `default` or none: the embedded model"
    )
    parser.add_argument("prompt", nargs="?", help="the prompt; omit it to chat")
    parser.add_argument("--backend", help="run on this backend instead of the policy's choice")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy and repeatable (default)")
    parser.add_argument("--seed", type=int, help="sampling seed")
    parser.add_argument("--system", help="a system prompt")
    parser.add_argument("--context", type=int, help="context length in tokens")
    parser.add_argument("--think", action="store_true", help="let a reasoning model think first")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the engine in this process (default: in a worker process, so an engine crash is reported, not fatal)",
    )
    add_file_argument(parser)
    add_option_argument(parser)
    add_sampling_arguments(parser)
    add_machine_arguments(parser)
    add_rpc_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object per chunk")
    parser.add_argument(
        "--raw",
        action="store_true",
        help="continue PROMPT as written, with no chat template (a raw completion; base models, code)",
    )
    parser.set_defaults(handler=run)


class _Stopped(Exception):
    """Ctrl-C stopped an answer; ``text`` is what had been written of it."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _split_model_and_prompt(model: str | None, prompt: str | None) -> tuple[str, str | None]:
    if model is not None and prompt is None and not _is_model_ref(model):
        model, prompt = None, model
    if model is None:
        return str(default_model_path()), prompt
    return model_argument(model), prompt


def _is_model_ref(text: str) -> bool:
    if os.path.exists(os.path.expanduser(text)) or is_default_model_name(text):
        return True
    return "/" in text and not any(c.isspace() for c in text)


def _say_where(loaded: Loaded) -> None:
    """The backend on stderr, with where its estimate puts the model and its note for people, if any."""
    estimate = loaded.verdict.estimate if loaded.verdict is not None else None
    details = estimate.details if estimate is not None else {}
    placement = details.get("placement")
    where = f" ({placement})" if isinstance(placement, str) and placement else ""
    print(f"anyformer: {loaded.model.ref} on {loaded.backend}{where}", file=sys.stderr)
    note = details.get("note")
    if isinstance(note, str) and note:
        print(f"anyformer: {note}", file=sys.stderr)


def _check_options(args: argparse.Namespace) -> None:
    """Every option is checked before the model loads, so a typo costs no load (``BAD_REQUEST``)."""
    GenerateOptions.build(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        thinking=args.think,
        **sampling_options(args),
    )
    request = Request.build(budget=args.budget, context=args.context, rpc=args.rpc)
    if request.rpc and args.in_process:
        raise AnyformerError(ErrorCode.BAD_REQUEST, "--rpc runs the engine in a worker process: drop --in-process")
    if args.raw and (args.system or args.think):
        raise AnyformerError(ErrorCode.BAD_REQUEST, "--raw continues the prompt as written: no --system, no --think")


def run(args: argparse.Namespace) -> int:
    """Load the model and stream; Ctrl-C stops the answer in progress."""
    _check_options(args)
    model, prompt = _split_model_and_prompt(args.model, args.prompt)
    if args.raw and prompt is None:
        raise AnyformerError(ErrorCode.BAD_REQUEST, "--raw needs a PROMPT to continue (there is no raw chat)")
    with ProgressPrinter() as progress:
        loaded = load(
            model,
            backend=args.backend,
            budget=args.budget,
            caps=caps_from_args(args),
            context=args.context,
            progress=progress,
            isolate=not args.in_process,
            rpc=args.rpc,
            options=file_option(args),
        )
    with loaded:
        if not args.json:
            _say_where(loaded)
        if loaded.task in FILE_TASKS:
            return run_on_file(loaded, prompt, args)
        if args.raw:
            assert prompt is not None
            try:
                _stream(loaded, None, args, raw=prompt)
            except _Stopped:
                raise AnyformerError(ErrorCode.CANCELLED, "interrupted") from None
            return 0
        history: list[dict[str, object]] = [{"role": "system", "content": args.system}] if args.system else []
        if prompt is not None:
            history.append({"role": "user", "content": prompt})
            try:
                _stream(loaded, history, args)
            except _Stopped:
                raise AnyformerError(ErrorCode.CANCELLED, "interrupted") from None
            return 0
        return _chat(loaded, history, args)


def _chat(loaded: Loaded, history: list[dict[str, object]], args: argparse.Namespace) -> int:
    """One answer per line read; Ctrl-C stops an answer, and quits at the prompt (as do Ctrl-D and an empty line)."""
    interactive = sys.stdin.isatty()
    if interactive:
        print(
            "chat: type a message; Ctrl-C stops an answer; an empty line, Ctrl-D or Ctrl-C at the prompt quits",
            file=sys.stderr,
        )
    try:
        while True:
            try:
                line = input("> " if interactive else "")
            except EOFError:
                return 0
            if not line.strip():
                return 0
            history.append({"role": "user", "content": line})
            try:
                reply = _stream(loaded, history, args)
            except _Stopped as stopped:
                reply = stopped.text
                print("anyformer: stopped; type the next message (Ctrl-C again or Ctrl-D quits)", file=sys.stderr)
            if reply:
                history.append({"role": "assistant", "content": reply})
            else:  # stopped before a word: forget the question rather than keep an empty answer
                history.pop()
    except KeyboardInterrupt:
        print(file=sys.stderr)  # the prompt's line ends before the shell's
        return 0


def _stream(
    loaded: Loaded, messages: list[dict[str, object]] | None, args: argparse.Namespace, *, raw: str | None = None
) -> str:
    """Write the answer as it comes; Ctrl-C stops it (``_Stopped``) with the model free for the next one.

    With ``raw`` (and no messages) the text is continued as written, with no chat template.
    """
    cancel = threading.Event()
    text = ""
    stream = loaded.generate(
        messages,
        prompt=raw,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        thinking=args.think,
        cancel=cancel,
        **sampling_options(args),
    )
    try:
        for chunk in stream:
            text = chunk.text
            if args.json:
                print(
                    json.dumps(
                        {
                            "delta": chunk.delta,
                            "text": chunk.text,
                            "tokens": chunk.tokens,
                            "finish_reason": chunk.finish_reason,
                        }
                    ),
                    flush=True,
                )
            else:
                sys.stdout.write(chunk.delta)
                sys.stdout.flush()
    except KeyboardInterrupt:
        cancel.set()
        try:
            # The engine stops and the model is free again (a CoreStream closes); a second Ctrl-C here quits.
            getattr(stream, "close", lambda: None)()
        finally:
            if not args.json:
                sys.stdout.write("\n")  # what comes next starts on its own line
                sys.stdout.flush()
        raise _Stopped(text) from None
    if not args.json:
        sys.stdout.write("\n")
    return text
