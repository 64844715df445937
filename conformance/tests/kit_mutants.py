"""Mutants of the template backend, for the kit's own regression suite (``test_mutants.py``).

:class:`TemplateBackend` is the template backend's hooks wrapped in an object: a correct backend,
registered in process under the template's id. Each mutant subclass breaks one rule of the
contract by overriding one of the wrapper's seams (the verdict, the engine's options, the chunk
stream, the store), never a hook itself, so pluggy still finds the hookimpls. The kit must fail
each mutant, and pass the wrapper and the installed template.

:class:`TemplateKit` is the kit set up for the template (sample, refusal cases, stored model);
:func:`mutant_kit` makes the test class that runs the kit against one mutant.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import anyformer
from anyformer import Caps, Chunk, GenerateOptions, Message, Model, Refusal, Request, StoreEntry, Verdict, hookimpl
from anyformer.plugin import anyformer_home
from anyformer_conformance import BackendConformance, RefusalCase
from anyformer_template import plugin as template
from anyformer_template.sample import SAMPLE_ORDER, SAMPLE_TEXT, write_sample

#: Far more bytes than any machine offers: what the budget and memory mutants claim to need.
TERABYTE = 10**12
#: A sample whose greedy answer to anything is the end character alone (an order-1 table where
#: the end character is the most frequent): one token, no text.
WEAK_SAMPLE_TEXT = "x\n\n"


class TemplateBackend:
    """The template backend, correct, as an object whose seams a mutant overrides.

    ``outside_store`` is a folder outside ``ANYFORMER_HOME`` that only the store mutant uses.
    """

    def __init__(self, outside_store: Path) -> None:
        self.outside_store = outside_store

    # ---- the hooks: each delegates to the template module through one seam -----------------------

    @hookimpl
    def can_run(self, model: Model, caps: Caps, request: Request) -> Verdict:
        """The template's verdict, through :meth:`verdict`."""
        return self.verdict(model, caps, request)

    @hookimpl
    def load(self, backend: str, model: Model, request: Request, progress: Any) -> Any:
        """The template's load."""
        return template.load(backend, model, request, progress)

    @hookimpl
    def generate(self, loaded: object, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk] | None:
        """The template's stream, started with :meth:`engine_options` and passed through :meth:`stream`."""
        chunks = template.generate(loaded, messages, self.engine_options(options))
        return None if chunks is None else self.stream(chunks, options)

    @hookimpl
    def store_list(self) -> list[StoreEntry]:
        """The template's store, through :meth:`entries`."""
        return self.entries()

    # ---- the seams ----------------------------------------------------------------------------------

    def verdict(self, model: Model, caps: Caps, request: Request) -> Verdict:
        """What ``can_run`` answers."""
        return template.can_run(model, caps, request)

    def engine_options(self, options: GenerateOptions) -> GenerateOptions:
        """The options the engine runs with."""
        return options

    def stream(self, chunks: Iterator[Chunk], options: GenerateOptions) -> Iterator[Chunk]:
        """The chunks ``generate`` yields."""
        yield from chunks

    def entries(self) -> list[StoreEntry]:
        """What ``store_list`` lists."""
        return template.store_list()

    def store_sample(self, home: Path) -> Path:
        """Put a model in this backend's store (``home`` is ``ANYFORMER_HOME``) and return its path."""
        return write_sample(home / template.BACKEND / "sample")


class IgnoresMaxNewTokens(TemplateBackend):
    """The raw stream runs to five times ``max_new_tokens`` (the core's clamp would hide it)."""

    def engine_options(self, options: GenerateOptions) -> GenerateOptions:
        return dataclasses.replace(options, max_new_tokens=5 * options.max_new_tokens)


class IgnoresCancel(TemplateBackend):
    """Never looks at ``options.cancel`` (the core's check between chunks would hide it)."""

    def engine_options(self, options: GenerateOptions) -> GenerateOptions:
        return dataclasses.replace(options, cancel=threading.Event())


class TokensStayZero(TemplateBackend):
    """``tokens`` is 0 on every chunk."""

    def stream(self, chunks: Iterator[Chunk], options: GenerateOptions) -> Iterator[Chunk]:
        for chunk in chunks:
            yield dataclasses.replace(chunk, tokens=0)


class TokensOvershoot(TemplateBackend):
    """``tokens`` counts double, past ``max_new_tokens``."""

    def stream(self, chunks: Iterator[Chunk], options: GenerateOptions) -> Iterator[Chunk]:
        for chunk in chunks:
            yield dataclasses.replace(chunk, tokens=2 * chunk.tokens)


class TokensAlwaysOne(TemplateBackend):
    """``tokens`` is 1 whatever the text: a count unrelated to the text."""

    def stream(self, chunks: Iterator[Chunk], options: GenerateOptions) -> Iterator[Chunk]:
        for chunk in chunks:
            yield dataclasses.replace(chunk, tokens=1)


class CumulativeDelta(TemplateBackend):
    """``delta`` carries the text so far instead of the new text."""

    def stream(self, chunks: Iterator[Chunk], options: GenerateOptions) -> Iterator[Chunk]:
        text = ""
        for chunk in chunks:
            text += chunk.delta
            yield dataclasses.replace(chunk, delta=text) if chunk.delta else chunk


class EarlyFinish(TemplateBackend):
    """The third chunk says ``stop``, and the stream goes on."""

    def stream(self, chunks: Iterator[Chunk], options: GenerateOptions) -> Iterator[Chunk]:
        for index, chunk in enumerate(chunks):
            yield dataclasses.replace(chunk, finish_reason="stop") if index == 2 else chunk


class OverBudget(TemplateBackend):
    """Accepts with a terabyte of accelerator memory, whatever the budget."""

    def verdict(self, model: Model, caps: Caps, request: Request) -> Verdict:
        verdict = template.can_run(model, caps, request)
        if not verdict.ok:
            return verdict
        return Verdict.accept(verdict.backend, dataclasses.replace(verdict.estimate, gpu_bytes=TERABYTE))


class OverRam(TemplateBackend):
    """Never refuses for memory: accepts with a terabyte of host memory, even when offered none."""

    def verdict(self, model: Model, caps: Caps, request: Request) -> Verdict:
        verdict = template.can_run(model, caps.replace(ram_bytes=10 * TERABYTE), request)
        if not verdict.ok:
            return verdict
        return Verdict.accept(verdict.backend, dataclasses.replace(verdict.estimate, ram_bytes=TERABYTE))


class UnrelatedStoreEntry(TemplateBackend):
    """Lists its store, plus an entry for a model that is not there."""

    def entries(self) -> list[StoreEntry]:
        made_up = anyformer_home() / template.BACKEND / "unrelated" / template.MODEL_FILE
        unrelated = StoreEntry(
            backend=template.BACKEND, repo="org/unrelated", revision=None, path=str(made_up), bytes=1
        )
        return [*template.store_list(), unrelated]


class StoreOutsideHome(TemplateBackend):
    """Keeps its store in a fixed folder, not under ``ANYFORMER_HOME``."""

    def entries(self) -> list[StoreEntry]:
        return [
            StoreEntry(backend=template.BACKEND, repo=p.parent.name, revision=None, path=str(p), bytes=p.stat().st_size)
            for p in sorted(self.outside_store.glob(f"*/{template.MODEL_FILE}"))
        ]

    def store_sample(self, home: Path) -> Path:
        return write_sample(self.outside_store / "sample")


class SwallowsGeneratorExit(TemplateBackend):
    """Catches the ``GeneratorExit`` that ``close()`` raises and keeps generating."""

    def stream(self, chunks: Iterator[Chunk], options: GenerateOptions) -> Iterator[Chunk]:
        for chunk in chunks:
            try:
                yield chunk
            except GeneratorExit:
                continue


class ServesTwo(TemplateBackend):
    """Correct, and declares ``parallel = 2``: the template's streams keep no shared state, so two may run."""

    @hookimpl
    def load(self, backend: str, model: Model, request: Request, progress: Any) -> Any:
        handle = template.load(backend, model, request, progress)
        handle.parallel = 2
        return handle


class SharedCancel(ServesTwo):
    """Serves two streams, but they share one cancel event: cancelling one stops the other too."""

    def __init__(self, outside_store: Path) -> None:
        super().__init__(outside_store)
        self.shared = threading.Event()

    def engine_options(self, options: GenerateOptions) -> GenerateOptions:
        if self.shared.is_set():
            self.shared = threading.Event()
        return dataclasses.replace(options, cancel=self.shared)

    def stream(self, chunks: Iterator[Chunk], options: GenerateOptions) -> Iterator[Chunk]:
        try:
            yield from chunks
        finally:
            if options.cancel.is_set():
                self.shared.set()


#: Backend mutants by name; ``heavy-import`` lives in its own module, imported only when asked for.
MUTANTS: dict[str, type[TemplateBackend]] = {
    "ignores-max-new-tokens": IgnoresMaxNewTokens,
    "ignores-cancel": IgnoresCancel,
    "tokens-stay-zero": TokensStayZero,
    "tokens-overshoot": TokensOvershoot,
    "tokens-always-one": TokensAlwaysOne,
    "cumulative-delta": CumulativeDelta,
    "early-finish": EarlyFinish,
    "over-budget": OverBudget,
    "over-ram": OverRam,
    "unrelated-store-entry": UnrelatedStoreEntry,
    "store-outside-home": StoreOutsideHome,
    "swallows-generator-exit": SwallowsGeneratorExit,
    "shared-cancel": SharedCancel,
}


def make_backend(name: str, outside_store: Path) -> TemplateBackend:
    """The backend called ``name``: ``correct``, a key of :data:`MUTANTS`, or ``heavy-import``."""
    if name == "correct" or name == "weak-sample":
        return TemplateBackend(outside_store)
    if name == "serves-two":
        return ServesTwo(outside_store)
    if name == "heavy-import":
        from kit_heavy_mutant import HeavyImport

        return HeavyImport(outside_store)
    return MUTANTS[name](outside_store)


_NGRAM = {"name": "ngram.json", "size": 20_000}


class TemplateKit(BackendConformance):
    """The kit set up for the template: its sample, refusal cases and store; a fixed what-if machine."""

    backend_id = "template"
    sample_text: ClassVar[str] = SAMPLE_TEXT
    sample_order: ClassVar[int] = SAMPLE_ORDER
    refusal_cases = (
        RefusalCase(
            {"repo": "org/gguf-model", "files": [{"name": "model.gguf", "size": 4096}]}, {}, {}, Refusal.FORMAT
        ),
        RefusalCase({"repo": "org/ngram", "files": [_NGRAM]}, {}, {"task": "image-classification"}, Refusal.TASK),
        RefusalCase({"repo": "org/ngram", "files": [_NGRAM]}, {"ram_bytes": 1_000_000}, {}, Refusal.MEMORY),
    )

    @pytest.fixture(scope="class")
    @classmethod
    def caps(cls) -> Caps:
        """A CPU machine with 8 GiB of memory and a writable store (probing the real one takes a second)."""
        return Caps(ram_bytes=8 * 2**30, store=True, cpu_count=2)

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tmp_path_factory: pytest.TempPathFactory) -> Model:
        """An ``ngram.json`` trained on ``sample_text``."""
        folder = tmp_path_factory.mktemp("ngram-sample")
        write_sample(folder, cls.sample_text, cls.sample_order)
        return anyformer.describe(folder)

    @pytest.fixture
    def stored_model(self, empty_anyformer_home: Path, backend_plugin: Any) -> Path:
        """A model in the backend's store."""
        if isinstance(backend_plugin, TemplateBackend):
            return backend_plugin.store_sample(empty_anyformer_home)
        return write_sample(empty_anyformer_home / template.BACKEND / "sample")


class MutantKit(TemplateKit):
    """The kit against the in-process backend named ``backend_name``."""

    backend_name: ClassVar[str] = "correct"

    @pytest.fixture(scope="class")
    @classmethod
    def backend_plugin(cls, tmp_path_factory: pytest.TempPathFactory) -> TemplateBackend:
        """The mutant, registered in process under the template's id."""
        return make_backend(cls.backend_name, tmp_path_factory.mktemp("outside-store"))


def mutant_kit(name: str) -> type[MutantKit]:
    """The kit's test class for the backend (or sample) mutant called ``name``."""
    attributes: dict[str, Any] = {"backend_name": name}
    if name == "weak-sample":
        attributes.update(sample_text=WEAK_SAMPLE_TEXT, sample_order=1)
    return type("MutantKit_" + name.replace("-", "_"), (MutantKit,), attributes)
