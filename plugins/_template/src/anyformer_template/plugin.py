"""The template backend's three hooks and its handle (docs/hooks.md); the entry point ``template`` names this module.

- ``can_run`` decides from the description alone: no file is opened, no connection made.
- ``load`` gets a local path through the store, then reads and validates ``ngram.json``, and
  returns the handle, a :class:`TemplateModel`.
- ``TemplateModel.generate`` streams one character per token and checks ``options.cancel`` before
  each one: generation is the handle's method, not a hook.
- ``store_list`` lists models kept under ``ANYFORMER_HOME/template/<name>/ngram.json``.

Copy this module when you start a backend: keep the shape, swap the engine.
"""

from __future__ import annotations

from collections.abc import Iterator

from anyformer.plugin import (
    AnyformerError,
    BackendModel,
    Caps,
    Chunk,
    ErrorCode,
    Estimate,
    FinishReason,
    GenerateOptions,
    Message,
    Model,
    ProgressCallback,
    ProgressEvent,
    Rank,
    Refusal,
    Request,
    StoreEntry,
    Verdict,
    anyformer_home,
    fetch_files,
    files_to_download,
    format_size,
    hookimpl,
)
from anyformer_template.ngram import NgramFormatError, NgramModel, read_model

#: This backend's id: the name of its entry point.
BACKEND = "template"
#: The one file the engine reads.
MODEL_FILE = "ngram.json"
#: The only task it runs.
TASK = "text-generation"
#: Host bytes per byte of ``ngram.json``: parsed JSON takes several times its size as Python objects.
RAM_PER_FILE_BYTE = 8
#: Host bytes the engine takes besides its table.
RAM_OVERHEAD = 2**20


class TemplateModel(BackendModel):
    """The handle ``load`` returns: the engine, the backend id and the task; it generates.

    It declares no ``features``: a plain chat model serving one stream at a time, honouring no
    optional option (the core refuses those before ``generate`` is called).
    """

    def __init__(self, engine: NgramModel) -> None:
        self.backend = BACKEND
        self.task = TASK
        self.engine: NgramModel | None = engine

    def generate(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Start a stream.

        An image block is ``BAD_REQUEST`` here, before any work: the checks run when the method is
        called, and only the returned generator runs the engine.
        """
        if self.engine is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the model was disposed; load it again")
        return _stream(self.engine, _prompt(messages), options)

    def dispose(self) -> None:
        """Drop the table; a second call does nothing."""
        self.engine = None


@hookimpl
def can_run(model: Model, caps: Caps, request: Request) -> Verdict:
    """Accept a model with an ``ngram.json`` for text generation, if host memory holds it."""
    entry = model.file(MODEL_FILE)
    if entry is None:
        return Verdict.refuse(BACKEND, Refusal.FORMAT, f"no {MODEL_FILE} in {model.ref}")
    task = request.task or model.task or TASK
    if task != TASK:
        return Verdict.refuse(BACKEND, Refusal.TASK, f"runs {TASK} only, not {task}")
    download = sum(f.size or 0 for f in files_to_download(model, [MODEL_FILE]))  # 0: local or cached
    if download and not caps.store:
        return Verdict.refuse(
            BACKEND, Refusal.STORE, f"{MODEL_FILE} must be downloaded and the model store is not writable"
        )
    if download and caps.disk_free_bytes is not None and download > caps.disk_free_bytes:
        return Verdict.refuse(
            BACKEND,
            Refusal.STORE,
            f"{MODEL_FILE} ({format_size(download)}) must be downloaded and the store's disk has "
            f"{format_size(caps.disk_free_bytes)} free",
        )
    need = RAM_OVERHEAD + RAM_PER_FILE_BYTE * (entry.size or 0)
    if caps.ram_bytes < need:
        return Verdict.refuse(
            BACKEND,
            Refusal.MEMORY,
            f"needs {format_size(need)} of host memory for a {format_size(entry.size or 0)} table, "
            f"{format_size(caps.ram_bytes)} available",
            need=need,
        )
    # An engine written for exactly this format: it ranks as a specialist. No speed is measured.
    return Verdict.accept(
        BACKEND,
        Estimate(ram_bytes=need, disk_bytes=entry.size or 0, rank=Rank.SPECIALIST, details={"file": MODEL_FILE}),
    )


@hookimpl
def load(model: Model, request: Request, progress: ProgressCallback) -> TemplateModel:
    """Read and validate ``ngram.json`` (called only when this backend was chosen); a bad file is ``BAD_MODEL``."""
    path = fetch_files(model, [MODEL_FILE], progress, backend=BACKEND)[MODEL_FILE]
    entry = model.file(MODEL_FILE)
    size = entry.size if entry is not None else None
    progress(ProgressEvent(stage="load", backend=BACKEND, file=MODEL_FILE, done=0, total=size))
    try:
        engine = read_model(path)
    except NgramFormatError as exc:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{model.ref}: {exc}", cause=exc) from exc
    except OSError as exc:
        raise AnyformerError(ErrorCode.MODEL_NOT_FOUND, f"cannot read {path}: {exc.strerror}", cause=exc) from exc
    progress(ProgressEvent(stage="load", backend=BACKEND, file=MODEL_FILE, done=size or 0, total=size))
    return TemplateModel(engine)


def _prompt(messages: list[Message]) -> str:
    """The text the engine continues: every message's text, joined by spaces."""
    parts: list[str] = []
    for index, message in enumerate(messages):
        content = message["content"]
        if isinstance(content, str):
            parts.append(content)
            continue
        for block in content:
            if block["type"] != "text":
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST,
                    f"messages[{index}] has a {block['type']} block; the {BACKEND} backend reads text only",
                )
            parts.append(block["text"])
    return " ".join(parts)


def _stream(engine: NgramModel, prompt: str, options: GenerateOptions) -> Iterator[Chunk]:
    """One chunk per character; the end character finishes with ``stop`` and adds no text.

    The ``finally`` closes the engine's character generator however the stream ends (the
    limit, ``stop``, cancel, or the core closing this one early): a backend whose engine holds
    a cache or a KV state resets it there.
    """
    characters = engine.generate(prompt, temperature=options.temperature, seed=options.seed)
    tokens = 0
    try:
        while True:
            if options.cancel.is_set():
                yield Chunk(tokens=tokens, finish_reason=FinishReason.CANCELLED.value)
                return
            char = next(characters)
            tokens += 1
            if char == engine.end:
                yield Chunk(tokens=tokens, finish_reason=FinishReason.STOP.value)
                return
            finish = FinishReason.LENGTH.value if tokens >= options.max_new_tokens else None
            yield Chunk(delta=char, tokens=tokens, finish_reason=finish)
            if finish is not None:
                return
    finally:
        characters.close()


@hookimpl
def store_list() -> list[StoreEntry]:
    """Models kept under ``ANYFORMER_HOME/template``: one entry per ``<name>/ngram.json``."""
    root = anyformer_home() / BACKEND
    if not root.is_dir():
        return []
    entries = []
    for path in sorted(root.rglob(MODEL_FILE)):
        if path.parent == root or not path.is_file():
            continue
        entries.append(
            StoreEntry(
                backend=BACKEND,
                repo=path.parent.relative_to(root).as_posix(),
                revision=None,
                path=str(path),
                bytes=path.stat().st_size,
            )
        )
    return entries
