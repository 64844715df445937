"""Which GGUF of a described model a GGUF engine backend would load, and the refusals every such backend shares.

Nothing here opens a file: the core's ``describe`` already read the GGUF's header into
``model.metadata["gguf"]``. What is the backend's own (its architectures, devices, memory) stays in
the backend; this module answers only what they all ask first.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from anyformer.plugin import (
    AnyformerError,
    Caps,
    ErrorCode,
    Model,
    ModelFile,
    ProgressCallback,
    ProgressEvent,
    Refusal,
    Request,
    Verdict,
    fetch_files,
)

#: The one task the GGUF engines run.
TEXT_GENERATION = "text-generation"

_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class GgufChoice:
    """The GGUF a load would read and the header facts describe found in it."""

    file: ModelFile
    summary: dict[str, Any]


def choose_gguf(model: Model) -> GgufChoice | str:
    """The language-model GGUF described in ``model.metadata``, or a one-line reason there is none to run."""
    ggufs = [f for f in model.files_of("gguf") if "mmproj" not in f.name.lower()]
    if not ggufs:
        return "no language-model GGUF (only projectors)"
    name = model.metadata.get("gguf_file")
    chosen = model.file(name) if isinstance(name, str) else (ggufs[0] if len(ggufs) == 1 else None)
    summary = model.metadata.get("gguf")
    if chosen is None or not isinstance(summary, dict):
        return "the GGUF's header was not read (no header facts in the description)"
    if _SPLIT.search(chosen.name) or summary.get("split"):
        return f"{chosen.name} is one shard of a split set, which this engine does not read"
    return GgufChoice(chosen, summary)


def tokenizer_problem(summary: dict[str, object]) -> str | None:
    """Why the shared tokenizer (byte-level BPE, or Gemma 4's) does not read this GGUF's vocabulary, or None."""
    from anyformer_gguf_gpu.tokenizer import PRE_TOKENIZERS, pre_tokenizer_name

    model, pre = summary.get("tokenizer_model"), pre_tokenizer_name(summary.get("tokenizer_pre"))
    if model == "gemma4":
        return None  # its own split; the pre-tokenizer name is not read
    if model != "gpt2":
        return f"tokenizer model {model!r} (only byte-level BPE, 'gpt2', and Gemma 4's 'gemma4' are read)"
    if pre not in PRE_TOKENIZERS:
        return f"pre-tokenizer {pre!r} is not one this engine splits like llama.cpp"
    return None


def gguf_refusal(
    backend: str, model: Model, request: Request, header_problem: Callable[[dict[str, Any]], str | None]
) -> GgufChoice | Verdict:
    """The chosen GGUF, or the first refusal of ``format``, ``task`` or ``model`` (no file, or
    ``header_problem`` names what the backend's engine does not read), in that order."""
    if "gguf" not in model.formats:
        return Verdict.refuse(backend, Refusal.FORMAT, "no GGUF in the repo")
    task = request.task or model.task or TEXT_GENERATION
    if task != TEXT_GENERATION:
        return Verdict.refuse(backend, Refusal.TASK, f"runs {TEXT_GENERATION} only, not {task}")
    choice = choose_gguf(model)
    if not isinstance(choice, GgufChoice):
        return Verdict.refuse(backend, Refusal.MODEL, choice)
    problem = header_problem(choice.summary)
    if problem is not None:
        return Verdict.refuse(backend, Refusal.MODEL, f"{choice.file.name}: {problem}")
    return choice


def store_refusal(backend: str, model: Model, caps: Caps, file: ModelFile) -> Verdict | None:
    """A ``store`` refusal where the Hub file must be downloaded and the model store is not writable, else None."""
    if model.source == "hub" and file.path is None and not caps.store:
        return Verdict.refuse(
            backend, Refusal.STORE, f"{file.name} must be downloaded and the model store is not writable"
        )
    return None


def fetch_chosen_gguf(model: Model, progress: ProgressCallback, backend: str) -> tuple[str, Path]:
    """Choose the GGUF (``NO_BACKEND`` where there is none), fetch it and report the ``verify`` stage.

    Returns the file's name and its local path.
    """
    choice = choose_gguf(model)
    if not isinstance(choice, GgufChoice):
        raise AnyformerError(ErrorCode.NO_BACKEND, f"{model.ref}: {choice}")
    name = choice.file.name
    path = fetch_files(model, [name], progress, backend=backend)[name]
    progress(ProgressEvent(stage="verify", backend=backend, file=name))
    return name, path
