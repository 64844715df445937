"""Mutants of the template backend, for the kit's own regression suite (``test_mutants.py``).

:class:`TemplateBackend` is the template backend's hooks wrapped in an object: a correct backend,
registered in process under the template's id; its ``load`` wraps the template's handle in a
:class:`SeamedHandle` whose ``generate`` goes through the wrapper. Each mutant subclass breaks one
rule of the contract by overriding one of the wrapper's seams (the verdict, the engine's options,
the chunk stream, the handle, the store), never a hook itself, so pluggy still finds the hookimpls. The kit must fail
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
from anyformer import (
    Caps,
    Chunk,
    Estimate,
    GenerateOptions,
    Message,
    Model,
    Rank,
    Refusal,
    Request,
    StoreEntry,
    Verdict,
    hookimpl,
)
from anyformer.plugin import BackendModel, Features, anyformer_home
from anyformer_conformance import BackendConformance, RefusalCase
from anyformer_template import plugin as template
from anyformer_template.plugin import TemplateModel
from anyformer_template.sample import SAMPLE_ORDER, SAMPLE_TEXT, write_sample

#: Far more bytes than any machine offers: what the budget and memory mutants claim to need.
TERABYTE = 10**12
#: A sample whose greedy answer to anything is the end character alone (an order-1 table where
#: the end character is the most frequent): one token, no text.
WEAK_SAMPLE_TEXT = "x\n\n"
#: The can_run time limit of the slow-first-can-run mutant's kit (its first call sleeps past it).
SLOW_CAN_RUN_LIMIT_S = 1.0


class SeamedHandle(BackendModel):
    """The template's handle, its ``generate`` run through the seams of the backend object that loaded it."""

    def __init__(self, owner: TemplateBackend, inner: TemplateModel) -> None:
        self.owner = owner
        self.inner = inner
        self.backend = inner.backend
        self.task = inner.task
        self.features = inner.features

    def generate(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """The template's stream, as :meth:`TemplateBackend.generate_on` makes it."""
        return self.owner.generate_on(self.inner, messages, options)

    def dispose(self) -> None:
        """The template's dispose."""
        self.inner.dispose()


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
    def load(self, model: Model, request: Request, progress: Any) -> Any:
        """The template's load, its handle seamed (:class:`SeamedHandle`), through :meth:`handle`."""
        return self.handle(SeamedHandle(self, template.load(model, request, progress)))

    @hookimpl
    def store_list(self) -> list[StoreEntry]:
        """The template's store, through :meth:`entries`."""
        return self.entries()

    def generate_on(self, inner: TemplateModel, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """The template's stream, started with :meth:`engine_options` and passed through :meth:`stream`."""
        return self.stream(inner.generate(self.prompt_messages(messages), self.engine_options(options)), options)

    # ---- the seams ----------------------------------------------------------------------------------

    def verdict(self, model: Model, caps: Caps, request: Request) -> Verdict:
        """What ``can_run`` answers."""
        return template.can_run(model, caps, request)

    def engine_options(self, options: GenerateOptions) -> GenerateOptions:
        """The options the engine runs with."""
        return options

    def prompt_messages(self, messages: list[Message]) -> list[Message]:
        """The messages the engine reads."""
        return messages

    def handle(self, loaded: Any) -> Any:
        """The handle ``load`` returns."""
        return loaded

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
    """Correct, and declares ``parallel=2``: the template's streams keep no shared state, so two may run."""

    def handle(self, loaded: Any) -> Any:
        loaded.features = Features(parallel=2)
        return loaded


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


class IgnoresSeed(TemplateBackend):
    """Samples from fresh randomness: the seed makes nothing repeatable."""

    def engine_options(self, options: GenerateOptions) -> GenerateOptions:
        return dataclasses.replace(options, seed=None) if options.temperature > 0 else options


class AlwaysGreedy(TemplateBackend):
    """Ignores ``temperature``: every answer is the greedy one."""

    def engine_options(self, options: GenerateOptions) -> GenerateOptions:
        return dataclasses.replace(options, temperature=0.0)


class SamplesAtTemperatureZero(TemplateBackend):
    """Given a seed, samples even at temperature 0."""

    def engine_options(self, options: GenerateOptions) -> GenerateOptions:
        if options.temperature == 0 and options.seed is not None:
            return dataclasses.replace(options, temperature=1.0)
        return options


class StopsAtTheFirstCharacter(TemplateBackend):
    """Applies ``stop`` itself, but ends on the stop string's first character, not the whole string."""

    def stream(self, chunks: Iterator[Chunk], options: GenerateOptions) -> Iterator[Chunk]:
        firsts = {stop[0] for stop in options.stop}
        for chunk in chunks:
            if chunk.delta and chunk.delta[0] in firsts:
                yield Chunk(tokens=chunk.tokens, finish_reason="stop")
                return
            yield chunk


class LastDeltaRepeatsTheText(TemplateBackend):
    """The last chunk's delta carries the whole text again."""

    def stream(self, chunks: Iterator[Chunk], options: GenerateOptions) -> Iterator[Chunk]:
        text = ""
        for chunk in chunks:
            if chunk.finish_reason is not None:
                chunk = dataclasses.replace(chunk, delta=text + chunk.delta)
            text += chunk.delta
            yield chunk


class MarksTheLimit(TemplateBackend):
    """Puts a marker in place of the last character when ``max_new_tokens`` ends the stream."""

    def stream(self, chunks: Iterator[Chunk], options: GenerateOptions) -> Iterator[Chunk]:
        for chunk in chunks:
            yield dataclasses.replace(chunk, delta="~") if chunk.finish_reason == "length" else chunk


class TokensResetOnCancel(TemplateBackend):
    """The cancelled chunk reports ``tokens=0`` (the core's clamp hides it from callers)."""

    def stream(self, chunks: Iterator[Chunk], options: GenerateOptions) -> Iterator[Chunk]:
        for chunk in chunks:
            yield dataclasses.replace(chunk, tokens=0) if chunk.finish_reason == "cancelled" else chunk


class ChangesTheMessages(TemplateBackend):
    """Puts a system message into the caller's list."""

    def prompt_messages(self, messages: list[Message]) -> list[Message]:
        messages.insert(0, {"role": "system", "content": "You are a template."})
        return messages


class NeedOfferPlusOne(TemplateBackend):
    """A ``memory`` refusal names the offer plus one byte as its need."""

    def verdict(self, model: Model, caps: Caps, request: Request) -> Verdict:
        verdict = template.can_run(model, caps, request)
        if verdict.code is Refusal.MEMORY:
            return Verdict.refuse(verdict.backend, Refusal.MEMORY, verdict.reason, need=caps.ram_bytes + 1)
        return verdict


class EstimatesNoRam(TemplateBackend):
    """Accepts with ``ram_bytes=0``, though it refuses below its real need."""

    def verdict(self, model: Model, caps: Caps, request: Request) -> Verdict:
        verdict = template.can_run(model, caps, request)
        if not verdict.ok:
            return verdict
        return Verdict.accept(verdict.backend, dataclasses.replace(verdict.estimate, ram_bytes=0))


class EstimateFollowsTheOffer(TemplateBackend):
    """Accepts with ``ram_bytes`` equal to whatever host memory it is offered."""

    def verdict(self, model: Model, caps: Caps, request: Request) -> Verdict:
        verdict = template.can_run(model, caps, request)
        if not verdict.ok:
            return verdict
        return Verdict.accept(verdict.backend, dataclasses.replace(verdict.estimate, ram_bytes=caps.ram_bytes))


class ReadsTheWeights(TemplateBackend):
    """Reads ``ngram.json`` in ``can_run`` when the file is there."""

    def verdict(self, model: Model, caps: Caps, request: Request) -> Verdict:
        entry = model.file(template.MODEL_FILE)
        if entry is not None and entry.path and Path(entry.path).is_file():
            Path(entry.path).read_bytes()
        return template.can_run(model, caps, request)


class AcceptsATokenizer(TemplateBackend):
    """Accepts a repo holding a ``tokenizer.json`` and no ``ngram.json``."""

    def verdict(self, model: Model, caps: Caps, request: Request) -> Verdict:
        if model.file("tokenizer.json") is not None and model.file(template.MODEL_FILE) is None:
            return Verdict.accept(template.BACKEND, Estimate(ram_bytes=2**20, rank=Rank.SPECIALIST))
        return template.can_run(model, caps, request)


class TaskBeforeFormat(TemplateBackend):
    """Checks the task before the format."""

    def verdict(self, model: Model, caps: Caps, request: Request) -> Verdict:
        task = request.task or model.task or template.TASK
        if task != template.TASK:
            return Verdict.refuse(template.BACKEND, Refusal.TASK, f"runs {template.TASK} only, not {task}")
        return template.can_run(model, caps, request)


class AcceptsAnyTask(TemplateBackend):
    """Runs whatever task is asked for."""

    def verdict(self, model: Model, caps: Caps, request: Request) -> Verdict:
        return template.can_run(model, caps, dataclasses.replace(request, task=None))


class LeavesAThread(TemplateBackend):
    """Each load starts a thread that ``dispose`` never stops."""

    def handle(self, loaded: Any) -> Any:
        threading.Thread(target=threading.Event().wait, name="template-watchdog", daemon=True).start()
        return loaded


class LeavesAFileOpen(TemplateBackend):
    """Each load opens a file that ``dispose`` never closes."""

    def __init__(self, outside_store: Path) -> None:
        super().__init__(outside_store)
        self.kept: list[Any] = []

    def handle(self, loaded: Any) -> Any:
        self.kept.append((self.outside_store / "log.txt").open("a"))
        return loaded


class StoreBytesWrong(TemplateBackend):
    """Lists its store with ``bytes=1``, not the size of the file."""

    def entries(self) -> list[StoreEntry]:
        return [dataclasses.replace(entry, bytes=1) for entry in template.store_list()]


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
    "ignores-seed": IgnoresSeed,
    "always-greedy": AlwaysGreedy,
    "samples-at-temperature-zero": SamplesAtTemperatureZero,
    "stops-at-the-first-character": StopsAtTheFirstCharacter,
    "last-delta-repeats-the-text": LastDeltaRepeatsTheText,
    "marks-the-limit": MarksTheLimit,
    "tokens-reset-on-cancel": TokensResetOnCancel,
    "changes-the-messages": ChangesTheMessages,
    "need-offer-plus-one": NeedOfferPlusOne,
    "estimates-no-ram": EstimatesNoRam,
    "estimate-follows-the-offer": EstimateFollowsTheOffer,
    "reads-the-weights": ReadsTheWeights,
    "accepts-a-tokenizer": AcceptsATokenizer,
    "task-before-format": TaskBeforeFormat,
    "accepts-any-task": AcceptsAnyTask,
    "leaves-a-thread": LeavesAThread,
    "leaves-a-file-open": LeavesAFileOpen,
    "store-bytes-wrong": StoreBytesWrong,
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
    if name == "prints-at-import":
        from kit_print_mutant import PrintsAtImport

        return PrintsAtImport(outside_store)
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
    def backend_plugin(cls, tmp_path_factory: pytest.TempPathFactory) -> Any:
        """The mutant, registered in process under the template's id (a module for the slow first can_run)."""
        if cls.backend_name == "slow-first-can-run":
            import kit_slow_mutant

            return kit_slow_mutant
        return make_backend(cls.backend_name, tmp_path_factory.mktemp("outside-store"))


def mutant_kit(name: str) -> type[MutantKit]:
    """The kit's test class for the backend (or sample) mutant called ``name``."""
    attributes: dict[str, Any] = {"backend_name": name}
    if name == "weak-sample":
        attributes.update(sample_text=WEAK_SAMPLE_TEXT, sample_order=1)
    if name == "slow-first-can-run":
        attributes.update(can_run_time_limit_s=SLOW_CAN_RUN_LIMIT_S)
    return type("MutantKit_" + name.replace("-", "_"), (MutantKit,), attributes)
