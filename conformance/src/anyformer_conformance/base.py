"""``BackendConformance``: the standard tests every anyformer backend passes.

Subclass it in a test module whose name pytest collects, name the class ``Test…``, and supply
what the kit cannot guess::

    pytest_plugins = ["anyformer_conformance.plugin"]

    class TestMyBackend(BackendConformance):
        backend_id = "mybackend"              # the entry point's name

        @pytest.fixture(scope="class")
        @classmethod                          # class-scoped fixtures are classmethods (pytest 9)
        def sample_model(cls, tmp_path_factory):
            return "org/tiny-model"           # a ref or anyformer.Model this backend runs

Capabilities and declarations are typed properties with strict defaults (conformance/README.md,
"What you supply", lists them all); they (never backend names) decide which tests run. Override
a standard test only to mark it ``@pytest.mark.xfail(reason=...)``: the plugin refuses to
collect any other override.

Every test's docstring ends with a *Troubleshooting* part saying what to fix when it fails.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
import json
import os
import struct
import threading
import time
import types
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest

import anyformer
from anyformer import (
    AnyformerError,
    Caps,
    Chunk,
    ErrorCode,
    GenerateOptions,
    Model,
    ModelFile,
    Refusal,
    Request,
    StoreEntry,
)
from anyformer_conformance import checks, fresh_interpreter
from anyformer_conformance.backend_hooks import BackendHooks, BackendStream, read_backend_stream
from anyformer_conformance.io_spy import IOSpy
from anyformer_conformance.process_resources import ProcessResources, left_behind

__all__ = ["BackendConformance", "RefusalCase"]

#: Engines a plugin module must not import at import time (it is imported on every ``anyformer check``).
HEAVY_MODULES = ("jax", "llama_cpp", "onnxruntime", "tensorflow", "torch", "transformers", "wgpu")
#: The fewest tokens ``max_new_tokens_for_tests`` may ask for: below it the stream rules check next to nothing.
MIN_TOKENS_FOR_TESTS = 4

#: The plugin module that must be active for the kit's fixtures and override guard.
PLUGIN_MODULE = "anyformer_conformance.plugin"


_T = TypeVar("_T")


def _model_paths(model: Model) -> list[str]:
    """The local paths of a description's files: what ``can_run`` must never open."""
    return [f.path for f in model.files if f.path]


def _refusal_text(verdict: Any) -> str:
    """A verdict as a failure message shows it: ``ok``, or the code and reason."""
    return "ok" if verdict.ok else f"{verdict.code.value!r} ({verdict.reason})"


def _plugin_reference(entry_point: str | None, backend_plugin: Any) -> str | None:
    """What a fresh interpreter imports to get the plugin: the entry point's value, a module's name, or None."""
    if entry_point is not None:
        return entry_point
    if isinstance(backend_plugin, types.ModuleType):
        return backend_plugin.__name__
    return None


def _handle_run(loaded: anyformer.Loaded) -> Any:
    """The backend's own handle's ``run``, called with nothing of the core in between."""
    handle: Any = loaded.handle
    return handle.run


class _MissingBackendId(LookupError):
    """Raised by the default ``backend_id``: a subclass must name the backend it tests."""


def _is_within(path: str | os.PathLike[str], folder: Path) -> bool:
    """``path`` is ``folder`` or lies inside it (after resolving links and ``..``)."""
    try:
        return Path(path).resolve().is_relative_to(folder.resolve())
    except (OSError, ValueError, TypeError):
        return False


def _same_or_nested(listed: str, stored: str) -> bool:
    """An entry's path names what was stored: the same path, a folder holding it, or a file inside it."""
    return _is_within(stored, Path(listed)) or _is_within(listed, Path(stored))


def run_tests_skip_reason(sample: Any, run_sample: Any) -> str | None:
    """Why the ``run`` tests skip, naming the fixture(s) left at None; None when both are supplied."""
    missing = [name for name, value in (("sample_model", sample), ("run_sample", run_sample)) if value is None]
    if not missing:
        return None
    if len(missing) == 2:
        return "no sample_model and no run_sample: the run tests need both"
    supplied = "run_sample" if missing[0] == "sample_model" else "sample_model"
    return f"no {missing[0]} (only {supplied} is supplied): the run tests need both"


def _cancelled_after_first_chunk(stream: Any, cancel: threading.Event) -> Iterator[Any]:
    """Pass ``stream`` through, setting ``cancel`` once its first chunk has come; closing this closes it."""
    try:
        for chunk in stream:
            yield chunk
            cancel.set()
    finally:
        close = getattr(stream, "close", None)
        if callable(close):
            close()


def _entry_point(backend_id: str) -> importlib.metadata.EntryPoint | None:
    """The installed entry point named ``backend_id`` in the ``anyformer`` group, or None."""
    group = anyformer.hookspecs.PROJECT
    return next((ep for ep in importlib.metadata.entry_points(group=group) if ep.name == backend_id), None)


class RefusalCase(NamedTuple):
    """A model a backend must refuse, and the code it must refuse with.

    ``description`` is a model description as docs/contract.md writes it (``Model.from_dict``);
    ``caps`` overrides fields of the ``caps`` fixture (``{"ram_bytes": 0}``); ``request`` holds
    ``anyformer.check`` keywords (``task``, ``budget``, ``context``); ``code`` the expected
    :class:`anyformer.Refusal`.
    """

    description: Mapping[str, Any]
    caps: Mapping[str, Any]
    request: Mapping[str, Any]
    code: Refusal | str


def _tiny_png() -> bytes:
    """A valid 1×1 grey PNG, built here so the kit ships no binary file."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\x80")) + chunk(b"IEND", b"")
    )


#: Malformed ``messages`` a backend never sees: the core (or the backend) raises ``BAD_REQUEST``.
MALFORMED_MESSAGES: dict[str, Any] = {
    "not a list": 42,
    "empty list": [],
    "missing role": [{"content": "hello"}],
    "bad role": [{"role": "wizard", "content": "hello"}],
    "missing content": [{"role": "user"}],
    "content an int": [{"role": "user", "content": 42}],
    "unknown block type": [{"role": "user", "content": [{"type": "video", "video": "clip.mp4"}]}],
    "audio block of a number": [{"role": "user", "content": [{"type": "audio", "audio": 42}]}],
    "text block without text": [{"role": "user", "content": [{"type": "text"}]}],
}

#: A description in a format no backend reads: every backend refuses it with ``format`` or ``model``.
FOREIGN_MODEL: dict[str, Any] = {
    "repo": "anyformer-conformance/foreign-format",
    "architecture": "conformance-foreign",
    "task": "text-generation",
    "files": [
        {"name": "README.md", "size": 1024},
        {"name": "weights.conformance-foreign", "size": 123_456_789},
    ],
}

#: The files most repos hold besides their weights: the foreign-format probes add them.
FOREIGN_EXTRA_FILES = ("config.json", "tokenizer.json", "model.safetensors")
#: The sizes the foreign-format probes give the extra files.
_EXTRA_FILE_SIZES = {"config.json": 700, "tokenizer.json": 2_000_000, "model.safetensors": 500_000_000}
#: A task no backend runs: the sample asked for it is refused with ``task``.
UNKNOWN_TASK = "conformance-no-such-task"
#: The temperature of the sampling tests, and the seeds they draw with.
SAMPLING_TEMPERATURE = 1.0
SAMPLING_SEEDS = (1, 2, 3, 4, 5, 6, 7, 8)

#: Files a typical model repo holds, for the "reads no weights" test.
_TYPICAL_FILES = (
    ModelFile("config.json", 700),
    ModelFile("tokenizer.json", 2_000_000),
    ModelFile("model.safetensors", 500_000_000),
    ModelFile("model-Q4_0.gguf", 400_000_000),
    ModelFile("model.onnx", 100_000_000),
)
#: A Hub repo id that does not exist.
_MISSING_REPO = "anyformer-conformance/no-such-model-3f9a2c"


class BackendConformance:
    """The standard tests for one backend. Subclass it as ``Test<YourBackend>`` and fill in the blanks.

    **Supply** (as class attributes or properties):

    - :attr:`backend_id` (required): the entry point's name.
    - :attr:`refusal_cases`: models this backend must refuse, with the code (:class:`RefusalCase`).
    - the capabilities below, where your backend differs from the defaults.

    **Fixtures** you may override (define a method of the same name with ``@pytest.fixture``):

    - ``sample_model`` (class scope): a model ref or :class:`anyformer.Model` this backend runs, or
      None (the default) when none runs in CI; the load and generate tests then skip.
    - ``backend_plugin`` (class scope): the object holding the backend's hookimpls; by default its
      installed entry point, loaded. Override it to test an in-process plugin object (the
      isolated-worker test then skips: a worker loads backends from entry points). The kit calls
      these hooks directly too, since the core's clamps would hide the bugs it looks for.
    - ``plugin_manager`` (class scope): a fresh manager holding ``backend_plugin``, through its
      entry point when it is the installed one (exactly as users get it), else registered.
    - ``caps`` (class scope): the machine, ``anyformer.probe()``; override for a what-if machine.
    - ``stored_model`` (function scope): called with ``ANYFORMER_HOME`` at ``empty_anyformer_home``,
      a fresh empty folder; store a model under it and return the path you wrote, and the store
      tests require ``store_list`` to list it and nothing else.
    """

    # ---- what the implementer supplies ------------------------------------------------------------

    @property
    def backend_id(self) -> str:
        """The backend under test: its entry point's name in the ``anyformer`` group. Required."""
        raise _MissingBackendId(f"{type(self).__name__} must set backend_id = '<your entry point name>'")

    @property
    def refusal_cases(
        self,
    ) -> Sequence[RefusalCase | tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any], Any]]:
        """Models this backend must refuse: ``(description, caps overrides, request kwargs, Refusal)``. Default none."""
        return ()

    @property
    def supports_generate(self) -> bool:
        """The sample model is a text-generation model: the streaming tests run. Default True."""
        return True

    @property
    def supports_images(self) -> bool:
        """``generate`` accepts image blocks. Default False: an image must be ``BAD_REQUEST`` before any work."""
        return False

    @property
    def supports_store(self) -> bool:
        """The backend implements ``store_list``. Default True."""
        return True

    @property
    def max_new_tokens_for_tests(self) -> int:
        """The ``max_new_tokens`` the streaming tests ask for: small, since each test generates. Default 8.

        At least 4, and the sample must generate that many tokens on one of ``prompts``
        (``test_sample_answers_long_enough_to_test_the_stream``).
        """
        return 8

    @property
    def generate_time_limit_s(self) -> float:
        """How long the kit waits for one raw ``generate`` stream of the sample to end, in seconds. Default 60."""
        return 60.0

    @property
    def load_kwargs(self) -> dict[str, Any]:
        """Extra ``anyformer.load`` keywords for the sample (``task``, ``budget``, ``context``, ``options``).

        Default none. ``task``, ``budget`` and ``context`` are also passed to ``anyformer.check``.
        """
        return {}

    @property
    def prompts(self) -> tuple[str, str]:
        """Two different user prompts the streaming tests send."""
        return ("Hello, who are you?", "Name three colours.")

    @property
    def foreign_model(self) -> Mapping[str, Any]:
        """A description in a format this backend does not read; it must refuse it with ``format`` or ``model``."""
        return FOREIGN_MODEL

    @property
    def run_time_limit_s(self) -> float:
        """How long the kit waits for one ``run`` of ``run_sample``, in seconds. Default 120."""
        return 120.0

    @property
    def can_run_time_limit_s(self) -> float:
        """How long one ``can_run`` may take, in seconds: it runs on every ``anyformer check``. Default 5."""
        return 5.0

    @property
    def supports_sampling(self) -> bool:
        """``temperature > 0`` samples, and ``seed`` makes it repeatable. Default True.

        False: the backend decodes greedily only, and ``temperature > 0`` must be ``BAD_REQUEST``
        before any work (a field that would change the output is refused, never ignored).
        """
        return True

    @property
    def extends_with_max_new_tokens(self) -> bool:
        """Greedy text at ``N`` tokens is the start of the text at ``2N``. Default True.

        False only for an engine whose answer depends on the length asked for (a text-diffusion
        model that settles the whole answer at once).
        """
        return True

    @property
    def fits_smaller_offers(self) -> bool:
        """Offered a little less than its own estimate, the backend can still run the model. Default False.

        True for a backend that moves work off the GPU or out of memory to fit (layers to the
        CPU, weights read from disk): a smaller offer may then be accepted with a smaller
        estimate. False: an estimate is what the model needs, and one byte less is refused.
        """
        return False

    @property
    def foreign_extra_files(self) -> tuple[str, ...]:
        """The usual repo files added to the foreign-format probes. Default config.json, tokenizer.json, a safetensors.

        None of them alone is a model this backend runs; leave out only a file your backend
        really runs from (a backend of safetensors weights drops ``model.safetensors``).
        """
        return FOREIGN_EXTRA_FILES

    # ---- fixtures ---------------------------------------------------------------------------------

    # Class-scoped fixtures are classmethods (pytest 9 deprecates instance methods there); they read
    # the properties from a fresh instance, so a property and a plain class attribute both work.

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def _conformance_setup(cls, request: pytest.FixtureRequest) -> None:
        """Fail at once, with the fix, when the kit's plugin is not active or backend_id is missing."""
        if not request.config.pluginmanager.has_plugin(PLUGIN_MODULE):
            pytest.fail(
                f'the conformance kit\'s plugin is not active: add pytest_plugins = ["{PLUGIN_MODULE}"] to your '
                "conftest.py or test module",
                pytrace=False,
            )
        try:
            backend_id = cls().backend_id
        except _MissingBackendId:
            pytest.fail(f"{cls.__name__} must set backend_id = '<your entry point name>'", pytrace=False)
        if not isinstance(backend_id, str) or not backend_id:
            pytest.fail(f"{cls.__name__}.backend_id is {backend_id!r}, expected the entry point's name", pytrace=False)

    @pytest.fixture(scope="class")
    @classmethod
    def backend_plugin(cls) -> Any:
        """The object holding the backend's hookimpls: its installed entry point, loaded (a module, usually)."""
        self = cls()
        entry_point = _entry_point(self.backend_id)
        if entry_point is None:
            group = anyformer.hookspecs.PROJECT
            installed = sorted({ep.name for ep in importlib.metadata.entry_points(group=group)})
            pytest.fail(
                f"no entry point named {self.backend_id!r} in the {group!r} group "
                f"(installed: {', '.join(installed) or 'none'}); "
                f'declare [project.entry-points.{group}] {self.backend_id} = "your_package.plugin" in pyproject.toml '
                "and pip install the plugin (pip install -e . for a checkout), or override the backend_plugin "
                "fixture to return your plugin object",
                pytrace=False,
            )
        try:
            return entry_point.load()
        except (Exception, SystemExit) as exc:
            pytest.fail(
                f"the {self.backend_id!r} entry point {entry_point.value!r} failed to load: {exc!r}", pytrace=False
            )

    @pytest.fixture(scope="class")
    @classmethod
    def plugin_manager(cls, backend_plugin: Any) -> anyformer.PluginManager:
        """A fresh plugin manager holding the backend: from its entry point (as users get it), else registered."""
        self = cls()
        manager = anyformer.PluginManager()
        entry_point = _entry_point(self.backend_id)
        if entry_point is not None and entry_point.load() is backend_plugin:
            manager.load_entry_points([entry_point])
        else:
            manager.register(backend_plugin, self.backend_id)
        info = next((p for p in manager.plugins() if p.name == self.backend_id), None)
        if info is None:
            pytest.fail(
                f"{self.backend_id!r} was not loaded: check ANYFORMER_PLUGINS and ANYFORMER_DISABLE_PLUGINS",
                pytrace=False,
            )
        if not info.ok:
            pytest.fail(f"the {self.backend_id!r} plugin failed to load: {info.error}", pytrace=False)
        return manager

    @pytest.fixture(scope="class")
    @classmethod
    def backend_hooks(cls, backend_plugin: Any) -> BackendHooks:
        """The backend's own hooks, called with nothing of the core in between (its clamps hide bugs)."""
        return BackendHooks(backend_plugin, cls().backend_id)

    @pytest.fixture(scope="class")
    @classmethod
    def caps(cls) -> Caps:
        """The machine the tests ask about: ``anyformer.probe()``."""
        return anyformer.probe()

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls) -> str | Model | None:
        """A model this backend runs: a Hub id, a local path, a dict or a Model. None: no load tests."""
        return None

    @pytest.fixture(scope="class")
    @classmethod
    def described_sample(cls, sample_model: Any) -> Model | None:
        """The sample model's description, or None."""
        return None if sample_model is None else anyformer.describe(sample_model)

    @pytest.fixture(scope="class")
    @classmethod
    def loaded_model(
        cls, described_sample: Model | None, plugin_manager: anyformer.PluginManager, caps: Caps
    ) -> Iterator[anyformer.Loaded]:
        """The sample, loaded once for every streaming test of the class and disposed after them."""
        self = cls()
        if described_sample is None:
            pytest.skip("no sample_model: this backend supplies none that runs here")
        if not self.supports_generate:
            pytest.skip("supports_generate is False")
        loaded = anyformer.load(
            described_sample, backend=self.backend_id, plugins=plugin_manager, caps=caps, **self.load_kwargs
        )
        yield loaded
        loaded.dispose()

    @pytest.fixture(scope="class")
    @classmethod
    def run_sample(cls) -> tuple[Any, dict[str, Any]] | None:
        """An input and options for the sample's ``run`` (a non-generation sample), long enough for two
        units of work (two batches, two windows). None (the default): the ``run`` tests skip."""
        return None

    @pytest.fixture(scope="class")
    @classmethod
    def run_model(
        cls, described_sample: Model | None, plugin_manager: anyformer.PluginManager, caps: Caps, run_sample: Any
    ) -> Iterator[anyformer.Loaded]:
        """The sample loaded for the ``run`` tests (any task), once for the class."""
        self = cls()
        reason = run_tests_skip_reason(described_sample, run_sample)
        if reason is not None:
            pytest.skip(reason)
        assert described_sample is not None  # a missing sample has a skip reason
        loaded = anyformer.load(
            described_sample, backend=self.backend_id, plugins=plugin_manager, caps=caps, **self.load_kwargs
        )
        yield loaded
        loaded.dispose()

    @pytest.fixture
    def empty_anyformer_home(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
        """A fresh, empty folder that ``ANYFORMER_HOME`` points at for the test (and for ``stored_model``)."""
        home = tmp_path / "conformance-anyformer-home"
        home.mkdir()
        monkeypatch.setenv("ANYFORMER_HOME", str(home))
        return home

    @pytest.fixture
    def stored_model(self, empty_anyformer_home: Path) -> str | os.PathLike[str] | None:
        """Runs with ``ANYFORMER_HOME`` at ``empty_anyformer_home``; returns None: nothing was stored."""
        return None

    @pytest.fixture(scope="class")
    @classmethod
    def backend_streams(cls, loaded_model: anyformer.Loaded, backend_hooks: BackendHooks) -> list[BackendStream]:
        """The backend's raw ``generate`` streams, each read to its end: both prompts at the test limit, one at 1."""
        self = cls()
        limit = self.max_new_tokens_for_tests
        streams = []
        for which, max_new_tokens in ((0, limit), (1, limit), (0, 1)):
            where = f"the {self.backend_id} handle.generate({self.prompts[which]!r}, max_new_tokens={max_new_tokens})"
            options = GenerateOptions.build(max_new_tokens=max_new_tokens)
            messages = anyformer.validate_messages(self._messages(which))
            try:
                stream = backend_hooks.generate(loaded_model.handle, messages, options)
            except Exception as exc:
                streams.append(BackendStream(where=where, max_new_tokens=max_new_tokens, error=exc))
                continue
            streams.append(
                read_backend_stream(
                    stream,
                    where=where,
                    max_new_tokens=max_new_tokens,
                    max_chunks=4 * max_new_tokens + 16,
                    time_limit_s=self.generate_time_limit_s,
                )
            )
        return streams

    @pytest.fixture(scope="class")
    @classmethod
    def greedy_texts(cls, loaded_model: anyformer.Loaded) -> tuple[str, str]:
        """The sample's greedy answers to both prompts at ``max_new_tokens_for_tests``, generated once for the class."""
        self = cls()
        return (self._greedy_text(loaded_model, 0), self._greedy_text(loaded_model, 1))

    # ---- helpers ----------------------------------------------------------------------------------

    def _messages(self, which: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.prompts[which]}]

    def _ask(
        self, plugin_manager: anyformer.PluginManager, model: Any, caps: Caps, request: Mapping[str, Any]
    ) -> tuple[anyformer.Verdict, int, str]:
        """The backend's verdict through ``anyformer.check``, the budget it was offered, and a label."""
        described = model if isinstance(model, Model) else anyformer.describe(dict(model))
        label = f"can_run({described.repo!r}, {dict(request)})"
        _, selection = self._watched(
            lambda: anyformer.check(described, backend=self.backend_id, caps=caps, plugins=plugin_manager, **request),
            described,
            label,
        )
        verdicts = [v for v in selection.verdicts if v.backend == self.backend_id]
        assert len(verdicts) == 1, f"check(backend={self.backend_id!r}) gave {len(verdicts)} verdicts of it, expected 1"
        budget = Request.build(budget=request.get("budget")).budget
        offered = budget if budget is not None else (caps.gpu_bytes or 0)
        return verdicts[0], offered, label

    def _watched(self, call: Callable[[], _T], model: Model, where: str) -> _T:
        """``call()`` (a ``can_run``, direct or through the core), timed and watched for file opens and connections.

        Every verdict the kit asks for goes through here: ``can_run`` runs on every ``anyformer
        check``, so it must answer in ``can_run_time_limit_s`` from the description alone,
        opening none of the model's files and reaching no network.
        """
        __tracebackhide__ = True
        spy = IOSpy()
        with spy.watching():
            started = time.monotonic()
            result = call()
            elapsed = time.monotonic() - started
        checks.check_can_run_watch(
            elapsed=elapsed,
            limit_s=self.can_run_time_limit_s,
            opened=spy.opened_of(_model_paths(model)),
            connections=spy.connections,
            where=where,
        )
        return result

    def _check_kwargs(self) -> dict[str, Any]:
        """The ``load_kwargs`` that ``anyformer.check`` also takes (task, budget, context)."""
        return {k: v for k, v in self.load_kwargs.items() if k in ("task", "budget", "context", "prefer")}

    def _refusal_cases(self) -> list[RefusalCase]:
        return [RefusalCase(*case) for case in self.refusal_cases]

    def _stream(self, loaded: anyformer.Loaded, messages: Any, **options: Any) -> list[Chunk]:
        return list(loaded.generate(messages, **options))

    def _greedy_text(self, loaded: anyformer.Loaded, which: int) -> str:
        return loaded.complete(self._messages(which), max_new_tokens=self.max_new_tokens_for_tests).text

    def _error_before_first_chunk(self, loaded: anyformer.Loaded, messages: Any, where: str) -> BaseException | None:
        """The error ``generate`` raises, at the call or at the first ``next``; fails if a chunk comes first."""
        __tracebackhide__ = True
        try:
            stream = loaded.generate(messages, max_new_tokens=self.max_new_tokens_for_tests)
        except Exception as exc:
            return exc
        try:
            chunk = next(stream)
        except StopIteration:
            checks.fail(
                "the stream ended without a chunk and without an error, expected AnyformerError(BAD_REQUEST)", where
            )
        except Exception as exc:
            return exc
        close = getattr(stream, "close", None)
        if close is not None:
            close()
        checks.fail(
            f"got a chunk {chunk!r} before any error, expected AnyformerError(BAD_REQUEST) before any work", where
        )

    # ---- the plugin module -----------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def import_probe(
        cls, backend_plugin: Any, plugin_manager: anyformer.PluginManager
    ) -> tuple[str, fresh_interpreter.ImportProbe]:
        """The plugin's module imported in a fresh interpreter (once for the class), and its name."""
        entry_point = plugin_manager.entry_point(cls().backend_id)
        if entry_point is not None:
            module = entry_point.partition(":")[0]
        elif isinstance(backend_plugin, types.ModuleType):
            module = backend_plugin.__name__
        else:
            module = type(backend_plugin).__module__
        return module, fresh_interpreter.import_plugin_module(module, HEAVY_MODULES)

    def test_plugin_module_imports_no_heavy_engine(
        self, import_probe: tuple[str, fresh_interpreter.ImportProbe]
    ) -> None:
        """Importing the plugin's module in a fresh interpreter imports no engine (torch, onnxruntime, llama_cpp...).

        Every installed plugin is imported on every ``anyformer check``; one heavy import makes
        each command slow for everyone. The module the entry point names (or, registered in
        process, the plugin object's module) is imported in a new Python process and
        ``sys.modules`` is searched for ``HEAVY_MODULES``. Troubleshooting: import the engine
        inside ``load`` (or a module only ``load`` imports), and in ``can_run`` check that it is
        installed with ``importlib.util.find_spec``.
        """
        module, probe = import_probe
        where = f"import {module} in a fresh interpreter"
        if probe.failure is not None:
            checks.fail(probe.failure, where)
        if probe.heavy:
            checks.fail(
                f"importing the plugin module imported {', '.join(probe.heavy)}, expected none of "
                f"{', '.join(HEAVY_MODULES)}: import engines inside load, not at module import",
                where,
            )

    def test_plugin_module_prints_nothing_at_import(
        self, import_probe: tuple[str, fresh_interpreter.ImportProbe]
    ) -> None:
        """Importing the plugin's module in a fresh interpreter writes nothing to stdout.

        ``anyformer check --json`` and ``anyformer ls --json`` print JSON on stdout, and every
        installed plugin is imported first: one line printed at import and that output is no
        longer JSON. Troubleshooting: report through ``logging`` or ``warnings`` (they go to
        stderr), never ``print``; silence an engine that prints when it is imported by
        importing it in ``load``.
        """
        module, probe = import_probe
        where = f"import {module} in a fresh interpreter"
        if probe.failure is not None:
            checks.fail(probe.failure, where)
        if probe.printed:
            checks.fail(
                f"the import wrote {probe.printed[:200]!r} to stdout, expected nothing "
                "(rule: a plugin prints nothing at import; --json output must stay JSON)",
                where,
            )

    # ---- can_run: verdicts ------------------------------------------------------------------------

    def test_sample_verdict_is_ok_and_well_formed(
        self, described_sample: Model | None, plugin_manager: anyformer.PluginManager, caps: Caps
    ) -> None:
        """The backend accepts its own sample model on this machine, with a well-formed estimate.

        Troubleshooting: ``can_run`` must return ``Verdict.accept(backend_id, Estimate(...))`` with
        byte counts as non-negative ints, ``tok_per_sec`` None or a number, and a ``Rank``. If it
        refuses, read the reason in the failure: either the sample is not one this backend runs
        (choose another) or ``can_run`` checks something it should not (it reads only the
        description and ``caps``). A ``runtime`` verdict starting "can_run raised" is an exception
        inside your hook.
        """
        if described_sample is None:
            pytest.skip("no sample_model")
        verdict, _, where = self._ask(plugin_manager, described_sample, caps, self._check_kwargs())
        checks.check_verdict(verdict, self.backend_id, where)
        checks.check_refusal_code(verdict, None, where)

    def load_kwargs_for_check(self) -> dict[str, Any]:
        """The ``load_kwargs`` that ``anyformer.check`` also takes (task, budget, context)."""
        return {k: v for k, v in self.load_kwargs.items() if k in ("task", "budget", "context", "prefer")}

    def test_refusal_cases_give_their_codes(self, plugin_manager: anyformer.PluginManager, caps: Caps) -> None:
        """Each of ``refusal_cases`` is refused with its expected, closed code and a one-line reason.

        Troubleshooting: the failure lists every case that went wrong. Refusal codes are the
        closed ``anyformer.Refusal`` enum; check them in the order format, task, model, gpu, f16,
        subgroups, store, budget, memory so the most basic reason wins, and give a reason with the
        numbers ("needs 6.1 GB, 4.0 GB available"). If a case is wrong rather than the backend, fix
        the case in your subclass.
        """
        cases = self._refusal_cases()
        if not cases:
            pytest.skip("no refusal_cases")
        problems = []
        for case in cases:
            verdict, _, where = self._ask(
                plugin_manager, dict(case.description), caps.replace(**case.caps), case.request
            )
            try:
                checks.check_verdict(verdict, self.backend_id, where)
                checks.check_refusal_code(verdict, case.code, where)
            except AssertionError as exc:
                problems.append(str(exc))
        assert not problems, f"{len(problems)} of {len(cases)} refusal cases failed:\n" + "\n".join(problems)

    def test_need_only_on_budget_and_memory_refusals(
        self, described_sample: Model | None, plugin_manager: anyformer.PluginManager, caps: Caps
    ) -> None:
        """``need`` is set exactly on ``budget`` and ``memory`` refusals, and exceeds what was offered.

        The sample is asked about with no host memory and no accelerator budget; refusal cases as
        given. Troubleshooting: a ``budget`` refusal's ``need`` is the smallest budget that would
        fit (it must be larger than the request's budget); a ``memory`` refusal's ``need`` is the
        host memory it would take (larger than ``caps.ram_bytes``). Every other verdict has
        ``need=None``. Compute the need from the file sizes in the description.
        """
        asked: list[tuple[Any, Caps, Mapping[str, Any]]] = []
        if described_sample is not None:
            for overrides, request in (
                ({"ram_bytes": 0}, {}),
                ({"gpu_bytes": 0}, {"budget": 0}),
                ({"ram_bytes": 0, "gpu_bytes": 0}, {"budget": 0}),
            ):
                asked.append((described_sample, caps.replace(**overrides), {**self._check_kwargs(), **request}))
        for case in self._refusal_cases():
            asked.append((dict(case.description), caps.replace(**case.caps), case.request))
        if not asked:
            pytest.skip("no sample_model and no refusal_cases")
        for model, machine, asking in asked:
            verdict, budget, where = self._ask(plugin_manager, model, machine, asking)
            where += f" with ram_bytes={machine.ram_bytes}, budget={budget}"
            checks.check_verdict(verdict, self.backend_id, where)
            checks.check_need(verdict, budget=budget, ram=machine.ram_bytes, where=where)

    def _raw_verdict(self, backend_hooks: BackendHooks, model: Model, caps: Caps, request: Request, where: str) -> Any:
        """The backend's own ``can_run`` answer, checked to be a well-formed verdict."""
        __tracebackhide__ = True
        try:
            verdict = self._watched(lambda: backend_hooks.can_run(model, caps, request), model, where)
        except AssertionError:
            raise
        except (Exception, SystemExit) as exc:
            checks.fail(f"can_run raised {type(exc).__name__}: {exc}; it must return a Verdict, not raise", where)
        checks.check_verdict(verdict, self.backend_id, where)
        return verdict

    def test_an_accepted_verdict_fits_the_offer(
        self, described_sample: Model | None, backend_hooks: BackendHooks, caps: Caps
    ) -> None:
        """An ok verdict's estimate fits what was offered: ``gpu_bytes <= budget`` and ``ram_bytes <= caps.ram_bytes``.

        The backend's own ``can_run`` (not the core's checked copy) is asked about the sample with
        no budget and no host memory, with each alone, with 1 MiB of each, and with one byte less
        than its own estimate; and about each refusal case with nothing offered. Troubleshooting:
        compare your estimate with ``request.budget_or(caps.gpu_bytes)`` and ``caps.ram_bytes``
        before accepting, counting every byte you put in the estimate (a projector, a KV cache),
        and refuse with ``budget`` or ``memory`` and ``need=`` when it does not fit. A backend
        that can move work off the GPU lowers ``gpu_bytes`` to what fits instead.
        """
        asked: list[tuple[Model, Caps, Request]] = []
        if described_sample is not None:
            kwargs = self._check_kwargs()
            base = Request.build(task=kwargs.get("task"), context=kwargs.get("context"))
            budget = caps.gpu_bytes or 0
            offers = [(0, 0), (caps.ram_bytes, 0), (0, budget), (2**20, 2**20)]
            full = self._raw_verdict(
                backend_hooks, described_sample, caps, dataclasses.replace(base, budget=budget), "can_run(the sample)"
            )
            if full.ok and full.estimate.ram_bytes > 0:
                offers.append((full.estimate.ram_bytes - 1, budget))
            if full.ok and full.estimate.gpu_bytes > 0:
                offers.append((caps.ram_bytes, full.estimate.gpu_bytes - 1))
            for ram, offered in offers:
                machine = caps.replace(ram_bytes=ram, gpu_bytes=min(caps.gpu_bytes or 0, offered))
                asked.append((described_sample, machine, dataclasses.replace(base, budget=offered)))
        for case in self._refusal_cases():
            model = anyformer.describe(dict(case.description))
            request = Request.build(**{k: v for k, v in case.request.items() if k != "budget"}, budget=0)
            asked.append((model, caps.replace(**{**case.caps, "ram_bytes": 0, "gpu_bytes": 0}), request))
        if not asked:
            pytest.skip("no sample_model and no refusal_cases")
        for model, machine, request in asked:
            budget = request.budget or 0
            where = f"can_run({model.ref!r}) with ram_bytes={machine.ram_bytes}, budget={budget}"
            verdict = self._raw_verdict(backend_hooks, model, machine, request, where)
            checks.check_verdict_fits(verdict, budget=budget, ram=machine.ram_bytes, where=where)

    def test_can_run_reads_no_weights_and_opens_no_connection(
        self,
        described_sample: Model | None,
        plugin_manager: anyformer.PluginManager,
        caps: Caps,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """``can_run`` answers from the description alone: quickly, without raising, opening or connecting.

        It is asked about descriptions whose files do not exist (local paths in a missing folder)
        and about a Hub repo that does not exist, with ``HF_HUB_OFFLINE=1`` and every socket
        blocked. Troubleshooting: ``can_run`` must not open model files, read GGUF headers,
        download anything or call the Hub: ``describe`` already put sizes, architecture and header
        metadata into the ``Model``. Check for a runtime with ``importlib.util.find_spec``, not by
        importing it. Move file reading into ``load``.
        """
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        absent = tmp_path / "absent"
        file_sets: list[tuple[ModelFile, ...]] = [_TYPICAL_FILES]
        if described_sample is not None:
            file_sets.insert(0, tuple(ModelFile(f.name, f.size) for f in described_sample.files))
        models = []
        for files in file_sets:
            base = described_sample or Model(repo=_MISSING_REPO, architecture="llama", task="text-generation")
            models.append(
                dataclasses.replace(
                    base,
                    repo=str(absent),
                    source="local",
                    files=tuple(dataclasses.replace(f, path=str(absent / f.name)) for f in files),
                )
            )
            models.append(dataclasses.replace(base, repo=_MISSING_REPO, revision="main", source="hub", files=files))
        request = self._check_kwargs()
        for model in models:
            # _ask watches the call: the time, the files opened, the connections tried.
            verdict, _, where = self._ask(plugin_manager, model, caps, request)
            checks.check_verdict(verdict, self.backend_id, f"{where}, source={model.source!r}")

    def _foreign_probes(self) -> list[tuple[str, dict[str, Any]]]:
        """Descriptions in no format this backend reads: the foreign model, with and without the usual extra files."""
        foreign = dict(self.foreign_model)
        extras = [{"name": name, "size": _EXTRA_FILE_SIZES.get(name, 1000)} for name in self.foreign_extra_files]
        probes = [("the foreign model", foreign)]
        if extras:
            with_extras = {**foreign, "files": [*foreign["files"], *extras]}
            probes.append(("the foreign model and the usual extra files", with_extras))
            probes.append(("the usual extra files alone", {**foreign, "files": extras}))
            probes.extend((f"{extra['name']} alone", {**foreign, "files": [extra]}) for extra in extras)
        return probes

    def test_can_run_refuses_a_foreign_format(self, plugin_manager: anyformer.PluginManager, caps: Caps) -> None:
        """A model whose files are in no format this backend reads is refused with ``format`` or ``model``.

        Asked about ``foreign_model``, alone and with the files most repos hold besides their
        weights (``foreign_extra_files``: config.json, tokenizer.json, a safetensors), and about
        each of those files alone. Troubleshooting: decide from ``model.files`` /
        ``model.formats`` first, before the task, the GPU or memory, and refuse with
        ``Refusal.FORMAT`` ("no GGUF in the repo") when none of the files you run from is there
        (a tokenizer or a config is not a model). If your backend legitimately reads the kit's
        made-up format, override the ``foreign_model`` property; if it runs from one of the extra
        files, leave that one out of ``foreign_extra_files``.
        """
        for label, description in self._foreign_probes():
            verdict, _, where = self._ask(plugin_manager, description, caps, {})
            where += f" ({label})"
            checks.check_verdict(verdict, self.backend_id, where)
            if verdict.ok or verdict.code not in (Refusal.FORMAT, Refusal.MODEL):
                got = _refusal_text(verdict)
                checks.fail(
                    f"got {got}, expected a 'format' or 'model' refusal (rule: a repo without a file of "
                    "your format is refused with format)",
                    where,
                )

    def test_a_foreign_format_is_refused_with_format_before_the_task(
        self, plugin_manager: anyformer.PluginManager, caps: Caps
    ) -> None:
        """The foreign model asked for a task no backend runs is still refused with ``format``.

        The core's install hint (``gguf: pip install anyformer-llamacpp``) comes from ``format``
        refusals: a backend that answers ``task`` first hides the backend the user needs.
        So is a ``model`` answer (a tag or an architecture checked before the files): the core
        names the distributions that read the format only when every backend said ``format``.
        Troubleshooting: check the format before anything else (the order is format, task,
        model, gpu, f16, subgroups, store, budget, memory).
        """
        request = {"task": UNKNOWN_TASK}
        verdict, _, where = self._ask(plugin_manager, dict(self.foreign_model), caps, request)
        checks.check_verdict(verdict, self.backend_id, where)
        if verdict.ok or verdict.code is not Refusal.FORMAT:
            got = _refusal_text(verdict)
            checks.fail(
                f"got {got}, expected 'format' (rule: refusals are checked in order, format before task)", where
            )

    def test_an_unknown_task_is_refused_with_task(
        self, described_sample: Model | None, plugin_manager: anyformer.PluginManager, caps: Caps
    ) -> None:
        """The backend's own sample, asked for a task no backend runs, is refused with ``task``.

        Troubleshooting: compare ``request.task or model.task`` with the tasks your backend
        runs and refuse with ``Refusal.TASK`` ("runs text-generation only, not …") when it is
        not one of them; never assume the task from the format.
        """
        if described_sample is None:
            pytest.skip("no sample_model")
        request = {**self._check_kwargs(), "task": UNKNOWN_TASK}
        verdict, _, where = self._ask(plugin_manager, described_sample, caps, request)
        checks.check_verdict(verdict, self.backend_id, where)
        if verdict.ok or verdict.code is not Refusal.TASK:
            got = _refusal_text(verdict)
            checks.fail(f"got {got}, expected 'task' (rule: a task the backend does not run is refused)", where)

    def test_offering_exactly_the_need_is_accepted(
        self, described_sample: Model | None, backend_hooks: BackendHooks, caps: Caps
    ) -> None:
        """A ``memory`` or ``budget`` refusal's ``need``, offered exactly, is accepted.

        The sample is asked about with no host memory, then with exactly the ``need`` it named;
        the same with no accelerator budget; and each ``memory`` or ``budget`` refusal case with
        its ``need``. Troubleshooting: ``need`` is the smallest offer that fits, computed by the
        same sum as the estimate you accept with (not the offer plus one, not a round number
        above it).
        """
        asked: list[tuple[Model, Caps, Request]] = []
        if described_sample is not None:
            kwargs = self._check_kwargs()
            base = Request.build(task=kwargs.get("task"), context=kwargs.get("context"))
            budget = caps.gpu_bytes or 0
            asked.append((described_sample, caps.replace(ram_bytes=0), dataclasses.replace(base, budget=budget)))
            asked.append((described_sample, caps.replace(gpu_bytes=0), dataclasses.replace(base, budget=0)))
        for case in self._refusal_cases():
            if Refusal(case.code) in checks.NEED_CODES:
                request = Request.build(**case.request)
                if request.budget is None:
                    request = dataclasses.replace(request, budget=caps.replace(**case.caps).gpu_bytes or 0)
                asked.append((anyformer.describe(dict(case.description)), caps.replace(**case.caps), request))
        if not asked:
            pytest.skip("no sample_model and no memory or budget refusal_cases")
        for model, machine, request in asked:
            budget = request.budget or 0
            where = f"can_run({model.ref!r}) with ram_bytes={machine.ram_bytes}, budget={budget}"
            refused = self._raw_verdict(backend_hooks, model, machine, request, where)
            if refused.ok or refused.code not in checks.NEED_CODES or not isinstance(refused.need, int):
                continue
            if refused.code is Refusal.MEMORY:
                machine = machine.replace(ram_bytes=refused.need)
            else:
                machine = machine.replace(gpu_bytes=max(machine.gpu_bytes or 0, refused.need))
                request = dataclasses.replace(request, budget=refused.need)
            again = f"can_run({model.ref!r}) with ram_bytes={machine.ram_bytes}, budget={request.budget}"
            verdict = self._raw_verdict(backend_hooks, model, machine, request, again)
            if not verdict.ok and verdict.code is refused.code:
                checks.fail(
                    f"a {refused.code.value!r} refusal named need={refused.need}, and offering exactly that was "
                    f"refused with {verdict.code.value!r} again (need={verdict.need}): need must be the smallest "
                    "offer that fits (rule: offering exactly the need is accepted)",
                    again,
                )

    def test_offering_exactly_the_estimate_is_accepted_and_less_is_refused(
        self, described_sample: Model | None, backend_hooks: BackendHooks, caps: Caps
    ) -> None:
        """The sample's ok estimate, offered exactly, is accepted; a little less is refused (or fits, see below).

        ``ram_bytes`` and (when above 0) ``gpu_bytes`` of the estimate on this machine are each
        offered exactly, then less by one byte and by 1 %. Troubleshooting: the estimate is what
        the model needs, computed by the same sum as the ``need`` of your refusals: never 0
        for a backend that refuses below some size, never the offer itself. A backend that can
        still run with less (layers off the GPU, weights read from disk) declares
        ``fits_smaller_offers = True``; its smaller offers may be accepted with an estimate
        that fits them.
        """
        if described_sample is None:
            pytest.skip("no sample_model")
        kwargs = self._check_kwargs()
        base = Request.build(task=kwargs.get("task"), context=kwargs.get("context"))
        budget = caps.gpu_bytes or 0
        where = f"can_run({described_sample.ref!r}) with ram_bytes={caps.ram_bytes}, budget={budget}"
        full = self._raw_verdict(backend_hooks, described_sample, caps, dataclasses.replace(base, budget=budget), where)
        if not full.ok:
            pytest.skip(f"the sample is refused on this machine ({full.reason}): test_sample_verdict_* reports it")
        estimate = full.estimate
        offers: list[tuple[str, int, int]] = [("ram_bytes", estimate.ram_bytes, budget)]
        if estimate.gpu_bytes > 0:
            offers.append(("gpu_bytes", caps.ram_bytes, estimate.gpu_bytes))
        for field, ram, offered in offers:
            exact = estimate.ram_bytes if field == "ram_bytes" else estimate.gpu_bytes
            less = sorted({exact - 1, exact - max(exact // 100, 1)}, reverse=True) if exact > 0 else []
            for amount, label in [(exact, "exactly"), *((x, "less") for x in less)]:
                ram_offer, gpu_offer = (amount, offered) if field == "ram_bytes" else (ram, amount)
                machine = caps.replace(ram_bytes=ram_offer, gpu_bytes=min(caps.gpu_bytes or 0, gpu_offer) or None)
                request = dataclasses.replace(base, budget=gpu_offer)
                where = f"can_run({described_sample.ref!r}) with ram_bytes={ram_offer}, budget={gpu_offer}"
                verdict = self._raw_verdict(backend_hooks, described_sample, machine, request, where)
                if label == "exactly" and not verdict.ok:
                    checks.fail(
                        f"the estimate on the full machine has {field}={exact}, and offering exactly that was "
                        f"refused with {_refusal_text(verdict)}: an estimate is what the model needs "
                        "(rule: offering exactly an ok estimate is accepted)",
                        where,
                    )
                if label == "less" and verdict.ok and not self.fits_smaller_offers:
                    checks.fail(
                        f"the estimate on the full machine has {field}={exact}, and {amount} was accepted too "
                        f"(estimate {field}={getattr(verdict.estimate, field)}): an estimate is what the model "
                        "needs, so less must be refused (rule: a little less than an ok estimate is refused; "
                        "declare fits_smaller_offers = True if the backend really fits smaller offers)",
                        where,
                    )

    def test_the_first_can_run_of_a_fresh_interpreter_is_quick_and_reads_nothing(
        self, described_sample: Model | None, backend_plugin: Any, plugin_manager: anyformer.PluginManager, caps: Caps
    ) -> None:
        """The first ``can_run`` in a new Python process answers in time, opening no model file and no connection.

        Every ``anyformer check`` is a fresh process, so a cost paid once per process (a lazy
        import of an engine, a cache filled on the first call, a speed measured) is paid by
        every user on every command. The plugin module is imported first (not timed), then one
        ``can_run`` of the sample (or of the foreign model) is timed and watched.
        Troubleshooting: import engines in ``load``; check for them with
        ``importlib.util.find_spec``; compute from the description and ``caps`` only.
        """
        plugin = _plugin_reference(plugin_manager.entry_point(self.backend_id), backend_plugin)
        if plugin is None:
            pytest.skip("the backend is an in-process object: a fresh interpreter cannot import it")
        model = described_sample or anyformer.describe(dict(self.foreign_model))
        kwargs = self._check_kwargs()
        request = Request.build(
            task=kwargs.get("task"), context=kwargs.get("context"), budget=kwargs.get("budget", caps.gpu_bytes or 0)
        )
        where = f"the first can_run({model.ref!r}) of a fresh interpreter"
        probe = fresh_interpreter.first_can_run(plugin, {"model": model, "caps": caps, "request": request})
        if probe.failure is not None:
            checks.fail(probe.failure, where)
        if probe.error is not None:
            checks.fail(f"can_run raised {probe.error}; it must return a Verdict, not raise", where)
        checks.check_can_run_watch(
            elapsed=probe.seconds,
            limit_s=self.can_run_time_limit_s,
            opened=IOSpy(opened=probe.opened).opened_of(_model_paths(model)),
            connections=probe.connections,
            where=where,
        )

    # ---- generate: the stream ---------------------------------------------------------------------

    def _read_backend_streams(self, backend_streams: list[BackendStream]) -> list[BackendStream]:
        """The raw streams, once each was read without an error or a time-out and holds only Chunks."""
        __tracebackhide__ = True
        for stream in backend_streams:
            if stream.error is not None:
                checks.fail(
                    f"raised {type(stream.error).__name__}: {stream.error}, expected a stream of Chunks", stream.where
                )
            if stream.timed_out:
                checks.fail(
                    f"no end after {self.generate_time_limit_s} s ({len(stream.chunks)} chunks so far): "
                    "the stream must end after max_new_tokens tokens (raise generate_time_limit_s for a slow engine)",
                    stream.where,
                )
            checks.check_backend_chunk_types(stream.chunks, stream.where)
        return backend_streams

    def test_backend_stream_is_well_formed(self, backend_streams: list[BackendStream]) -> None:
        """The handle's own ``generate`` yields Chunks whose ``tokens`` never decrease.

        The core rebuilds text and clamps token counts for callers; this test and the other
        ``test_backend_stream_*`` tests read its raw output to its very end (bounded by a
        chunk count and ``generate_time_limit_s``), so a bug the core would hide still shows.
        Troubleshooting: yield ``Chunk(delta=new_text, tokens=generated_so_far)`` objects;
        ``tokens`` counts every token generated in this call (never reset, never lower than
        before). Raise ``AnyformerError`` for bad input, never another exception.
        """
        for stream in self._read_backend_streams(backend_streams):
            checks.check_backend_chunks(stream.chunks, stream.where)

    def test_backend_stream_stops_at_max_new_tokens(self, backend_streams: list[BackendStream]) -> None:
        """The raw stream never reports more than ``max_new_tokens`` tokens, and ends by itself.

        Asked with ``max_new_tokens_for_tests`` and with 1. Troubleshooting: count the tokens you
        generate and stop (return, or yield the last chunk with ``finish_reason="length"``) once
        the count reaches ``options.max_new_tokens``; the core stops reading there, but a backend
        that keeps going wastes the engine's time and breaks other hosts of the handle.
        """
        for stream in self._read_backend_streams(backend_streams):
            limit = stream.max_new_tokens
            for index, chunk in enumerate(stream.chunks):
                if chunk.tokens > limit:
                    checks.fail(
                        f"chunk {index} reports {chunk.tokens} tokens, but max_new_tokens is {limit} "
                        "(rule: the stream stops at max_new_tokens)",
                        stream.where,
                    )
            if stream.cut_off:
                checks.fail(
                    f"the stream was still going after {len(stream.chunks)} chunks with max_new_tokens={limit} "
                    f"(last tokens={stream.final_tokens}, text so far {stream.text[:60]!r}): "
                    "it must end after max_new_tokens tokens (rule: the stream stops at max_new_tokens)",
                    stream.where,
                )

    def test_backend_stream_finish_reason_only_on_the_last_chunk(self, backend_streams: list[BackendStream]) -> None:
        """In the raw stream, only the last chunk may carry ``finish_reason``: no chunk follows a finish.

        Troubleshooting: once you yield a chunk with ``finish_reason``, return. The core stops
        reading at the first finish_reason, so text you yield after it is lost for callers.
        """
        for stream in self._read_backend_streams(backend_streams):
            for index, chunk in enumerate(stream.chunks[:-1]):
                if chunk.finish_reason is not None:
                    checks.fail(
                        f"chunk {index} of {len(stream.chunks)} has finish_reason {chunk.finish_reason!r}, "
                        f"then {len(stream.chunks) - index - 1} more chunk(s) came "
                        f"({stream.chunks[index + 1].delta!r}, ...): only the last chunk may have a finish_reason",
                        stream.where,
                    )
            last = stream.chunks[-1].finish_reason if stream.chunks else None
            if last is not None and last not in checks.FINISH_REASONS:
                checks.fail(
                    f"the last chunk has finish_reason {last!r}, expected one of {sorted(checks.FINISH_REASONS)}",
                    stream.where,
                )

    def test_backend_stream_tokens_count_the_text(self, backend_streams: list[BackendStream]) -> None:
        """``tokens`` counts the tokens behind the text, in the raw stream.

        The rule: a chunk that brings new text reports more tokens than the chunk before it (only
        the last chunk may flush held-back text, such as an incomplete UTF-8 character, without a
        new token); a stream with text ends with ``tokens >= 1``; and the text is at most
        ``checks.MAX_CHARS_PER_TOKEN`` (64) characters per token. Troubleshooting: set ``tokens``
        to the number of tokens sampled so far in this call, on every chunk; never a constant,
        a chunk count of your own or 0.
        """
        for stream in self._read_backend_streams(backend_streams):
            checks.check_tokens_count_the_text(stream.chunks, stream.where)

    def test_backend_stream_deltas_are_new_text(self, backend_streams: list[BackendStream]) -> None:
        """Each raw chunk's ``delta`` is only the text that chunk adds, never the text so far.

        Troubleshooting: yield ``Chunk(delta=piece)`` with the decoded piece of the new token(s);
        the core joins the deltas into ``text``. Deltas that each start with the delta before and
        are longer (``'T'``, ``'Th'``, ``'The'``) mean the cumulative text is being yielded.
        """
        for stream in self._read_backend_streams(backend_streams):
            checks.check_deltas_are_new_text(stream.chunks, stream.where)

    def test_backend_stream_stops_when_cancelled(
        self, loaded_model: anyformer.Loaded, backend_hooks: BackendHooks
    ) -> None:
        """The raw stream ends within two chunks of ``options.cancel`` being set: before it starts, and after one chunk.

        The core checks ``cancel`` between chunks for callers, which hides a backend that never
        looks at it (and keeps its engine busy until the core's next read). The cancelled stream
        keeps every other rule too (``tokens`` never lower, deltas new text). Troubleshooting:
        check ``options.cancel.is_set()`` before each token; when set, yield
        ``Chunk(tokens=n, finish_reason="cancelled")`` with ``n`` the tokens generated so far
        (never 0 again) and return.
        """
        limit = max(4 * self.max_new_tokens_for_tests, 16)
        messages = anyformer.validate_messages(self._messages(0))
        for when in ("before the call", "after the first chunk"):
            where = f"the {self.backend_id} handle.generate(max_new_tokens={limit}), cancel set {when}"
            cancel = threading.Event()
            if when == "before the call":
                cancel.set()
            try:
                raw = backend_hooks.generate(
                    loaded_model.handle, messages, GenerateOptions.build(max_new_tokens=limit, cancel=cancel)
                )
            except Exception as exc:
                checks.fail(f"raised {type(exc).__name__}: {exc}, expected a stream of Chunks", where)
            stream = read_backend_stream(
                _cancelled_after_first_chunk(raw, cancel),
                where=where,
                max_new_tokens=limit,
                max_chunks=4 * limit + 16,
                time_limit_s=self.generate_time_limit_s,
            )
            self._read_backend_streams([stream])
            # The cancelled stream keeps every rule of a stream that ran to its end.
            checks.check_backend_chunks(stream.chunks, where)
            checks.check_tokens_count_the_text(stream.chunks, where)
            checks.check_deltas_are_new_text(stream.chunks, where)
            for index, chunk in enumerate(stream.chunks[:-1]):
                if chunk.finish_reason is not None:
                    checks.fail(
                        f"chunk {index} of {len(stream.chunks)} has finish_reason {chunk.finish_reason!r}, "
                        "then more chunks came: only the last chunk may have a finish_reason",
                        where,
                    )
            after = len(stream.chunks) - (0 if when == "before the call" else 1)
            if after > 2:
                checks.fail(
                    f"{after} chunks came after cancel was set (tokens={stream.final_tokens}, "
                    f"text {stream.text[:40]!r}), expected at most 2: check options.cancel before each token "
                    "(rule: the backend stops when cancelled)",
                    where,
                )

    def test_sample_answers_long_enough_to_test_the_stream(self, backend_streams: list[BackendStream]) -> None:
        """On one of ``prompts`` the sample generates at least ``max_new_tokens_for_tests`` tokens.

        The stream tests (limits, finish reasons, cancel, close, text) pass without testing
        anything when the sample answers every prompt with a token or two. Troubleshooting: choose
        a sample model (or ``prompts``) that answers at length with greedy decoding, or lower
        ``max_new_tokens_for_tests`` (not below 4).
        """
        limit = self.max_new_tokens_for_tests
        if limit < MIN_TOKENS_FOR_TESTS:
            checks.fail(
                f"max_new_tokens_for_tests is {limit}, expected at least {MIN_TOKENS_FOR_TESTS}: "
                "with fewer tokens the stream tests check next to nothing",
                f"{type(self).__name__}.max_new_tokens_for_tests",
            )
        streams = [s for s in self._read_backend_streams(backend_streams) if s.max_new_tokens == limit]
        longest = max(stream.final_tokens for stream in streams)
        if longest < limit:
            answers = "; ".join(f"{s.where}: {s.final_tokens} token(s), {s.text!r}" for s in streams)
            checks.fail(
                f"the sample is too weak to test the stream: its longest answer is {longest} token(s), but the "
                f"stream tests need at least max_new_tokens_for_tests={limit} tokens on one prompt ({answers}); "
                "choose a sample or prompts that answer at length, or lower max_new_tokens_for_tests",
                "the sample_model fixture",
            )

    def test_text_is_cumulative_and_tokens_never_decrease(self, loaded_model: anyformer.Loaded) -> None:
        """Each chunk's ``text`` is the previous text plus its ``delta``; ``tokens`` never goes down.

        Troubleshooting: yield only the new text in ``delta`` (the core builds ``text``); never
        yield a cumulative string as ``delta``, and count ``tokens`` from the start of this call.
        """
        limit = self.max_new_tokens_for_tests
        chunks = self._stream(loaded_model, self._messages(0), max_new_tokens=limit)
        checks.check_stream(chunks, limit, f"generate(max_new_tokens={limit})")

    def test_max_new_tokens_is_honoured(self, loaded_model: anyformer.Loaded) -> None:
        """At most ``max_new_tokens`` tokens; ``finish_reason`` is ``length`` exactly when the limit ended it.

        Asked with 1 and with ``max_new_tokens_for_tests``. Troubleshooting: stop after
        ``options.max_new_tokens`` tokens with ``finish_reason="length"``; report ``stop`` only
        when the model ended its answer (an end-of-sequence token) or a stop string matched.
        """
        for limit in (1, self.max_new_tokens_for_tests):
            where = f"generate(max_new_tokens={limit})"
            chunks = self._stream(loaded_model, self._messages(0), max_new_tokens=limit)
            checks.check_stream(chunks, limit, where)
            last = chunks[-1]
            if last.tokens < limit and last.finish_reason == "length":
                checks.fail(f"finish_reason is 'length' after {last.tokens} of {limit} tokens", where)
            if last.finish_reason == "cancelled":
                checks.fail("finish_reason is 'cancelled', but nothing cancelled this call", where)

    def test_only_the_last_chunk_has_a_finish_reason(self, loaded_model: anyformer.Loaded) -> None:
        """Exactly the last chunk carries ``finish_reason``, one of ``stop``, ``length``, ``cancelled``.

        Troubleshooting: leave ``finish_reason`` None on every chunk but the last; if your engine
        learns it has finished only after emitting its last text, yield a final
        ``Chunk(tokens=n, finish_reason="stop")`` with an empty delta, or just return and let the
        core add it.
        """
        limit = self.max_new_tokens_for_tests
        for which in (0, 1):
            chunks = self._stream(loaded_model, self._messages(which), max_new_tokens=limit)
            checks.check_stream(chunks, limit, f"generate({self.prompts[which]!r}, max_new_tokens={limit})")

    def test_greedy_is_repeatable(self, loaded_model: anyformer.Loaded) -> None:
        """``temperature=0`` twice on the same messages gives the same text.

        Troubleshooting: at temperature 0 take the arg-max token (break ties deterministically,
        e.g. the lowest id), disable sampling randomness, and reset any cache or KV state that a
        previous call left behind.
        """
        first = self._greedy_text(loaded_model, 0)
        second = self._greedy_text(loaded_model, 0)
        checks.check_same_text(
            second, first, "the second greedy answer", f"generate(temperature=0) twice on {self.prompts[0]!r}"
        )

    def _sampled_text(self, loaded: anyformer.Loaded, seed: int | None, temperature: float) -> str:
        limit = self.max_new_tokens_for_tests
        return loaded.complete(self._messages(0), max_new_tokens=limit, temperature=temperature, seed=seed).text

    def test_seeded_sampling_is_repeatable(self, loaded_model: anyformer.Loaded) -> None:
        """At ``temperature > 0`` the same seed twice gives the same text, for each of two seeds.

        docs/contract.md promises it ("above 0, ``seed`` makes sampling repeatable").
        Troubleshooting: build the engine's random generator from ``options.seed`` at the start
        of every call (never once at load, never from the clock when a seed is given). A
        backend that decodes greedily only declares ``supports_sampling = False``.
        """
        if not self.supports_sampling:
            return self._check_sampling_refused(loaded_model)
        for seed in SAMPLING_SEEDS[:2]:
            where = f"generate(temperature={SAMPLING_TEMPERATURE}, seed={seed}) twice"
            first = self._sampled_text(loaded_model, seed, SAMPLING_TEMPERATURE)
            second = self._sampled_text(loaded_model, seed, SAMPLING_TEMPERATURE)
            if first != second:
                checks.fail(
                    f"the same seed gave {first!r}, then {second!r}: expected the same text "
                    "(rule: at temperature > 0 the seed makes sampling repeatable)",
                    where,
                )

    def test_sampling_is_not_always_greedy(self, loaded_model: anyformer.Loaded, greedy_texts: tuple[str, str]) -> None:
        """At ``temperature > 0`` one of up to eight seeds gives a text other than the greedy one.

        Troubleshooting: pass ``options.temperature`` to the engine's sampler; a backend that
        always takes the arg-max ignores a field that changes the output. If it cannot
        sample, declare ``supports_sampling = False`` and refuse ``temperature > 0`` with
        ``BAD_REQUEST``.
        """
        if not self.supports_sampling:
            return self._check_sampling_refused(loaded_model)
        greedy = greedy_texts[0]
        for seed in SAMPLING_SEEDS:
            if self._sampled_text(loaded_model, seed, SAMPLING_TEMPERATURE) != greedy:
                return  # one seed that samples something else is enough
        checks.fail(
            f"all {len(SAMPLING_SEEDS)} seeds gave the greedy text {greedy!r}: expected sampling to differ for some "
            "(rule: temperature > 0 samples; declare supports_sampling = False for a greedy-only backend)",
            f"generate(temperature={SAMPLING_TEMPERATURE}, seed=1..{len(SAMPLING_SEEDS)})",
        )

    def test_temperature_zero_is_repeatable_whatever_the_seed(
        self, loaded_model: anyformer.Loaded, greedy_texts: tuple[str, str]
    ) -> None:
        """``temperature=0`` with a seed, with another seed and with none gives the same, greedy text.

        Troubleshooting: at temperature 0 take the arg-max and draw nothing; the seed matters
        only when sampling.
        """
        greedy = greedy_texts[0]
        for seed in SAMPLING_SEEDS[:2]:
            text = self._sampled_text(loaded_model, seed, 0.0)
            if text != greedy:
                checks.fail(
                    f"got {text!r}, but with no seed {greedy!r}: expected the greedy text whatever the seed "
                    "(rule: temperature 0 is greedy and repeatable)",
                    f"generate(temperature=0, seed={seed})",
                )

    def _check_sampling_refused(self, loaded: anyformer.Loaded) -> None:
        """``supports_sampling = False``: ``temperature > 0`` is ``BAD_REQUEST`` before any chunk."""
        __tracebackhide__ = True
        where = f"generate(temperature={SAMPLING_TEMPERATURE}, seed=1) with supports_sampling = False"
        try:
            stream = loaded.generate(self._messages(0), max_new_tokens=2, temperature=SAMPLING_TEMPERATURE, seed=1)
            chunk = next(stream)
        except Exception as exc:
            checks.check_error_code(exc, ErrorCode.BAD_REQUEST, where)
            return
        stream.close()
        checks.fail(
            f"got a chunk {chunk!r}, expected AnyformerError(BAD_REQUEST): a greedy-only backend refuses "
            "temperature > 0 (rule: a field that changes the output is honoured or refused, never ignored)",
            where,
        )

    def test_greedy_text_at_n_tokens_is_the_start_of_the_text_at_2n(self, loaded_model: anyformer.Loaded) -> None:
        """The greedy text at ``max_new_tokens=N`` is a prefix of the text at ``2N``, for both prompts.

        Troubleshooting: ``max_new_tokens`` only says when to stop; it must not change what is
        generated before (no length-dependent prompt, no sampling of the last token, no marker
        added at the limit). An engine whose whole answer depends on its length (text
        diffusion) declares ``extends_with_max_new_tokens = False``.
        """
        if not self.extends_with_max_new_tokens:
            pytest.skip("extends_with_max_new_tokens is False")
        limit = self.max_new_tokens_for_tests
        for which in (0, 1):
            short = loaded_model.complete(self._messages(which), max_new_tokens=limit).text
            long = loaded_model.complete(self._messages(which), max_new_tokens=2 * limit).text
            checks.check_prefix(
                short,
                long,
                f"the text at {limit} tokens",
                f"generate({self.prompts[which]!r}, max_new_tokens={limit}) and ({2 * limit})",
            )

    def test_backend_stream_gives_the_greedy_text(
        self, greedy_texts: tuple[str, str], backend_streams: list[BackendStream]
    ) -> None:
        """The raw stream's deltas joined are the greedy text callers get, and the 1-token text starts it.

        Troubleshooting: the core joins your deltas into ``text``; if they differ from what the
        core shows, your stream yields text the core drops or rewrites (a chunk after the
        finish, a delta that repeats text).
        """
        streams = self._read_backend_streams(backend_streams)
        limit = self.max_new_tokens_for_tests
        for which, stream in zip((0, 1), streams[:2], strict=True):
            checks.check_same_text(stream.text, greedy_texts[which], "the raw deltas joined", stream.where)
        if self.extends_with_max_new_tokens:
            checks.check_prefix(
                streams[2].text, streams[0].text, "the raw text at 1 token", f"{streams[2].where} and {limit}"
            )

    def _stop_string(self, text: str) -> tuple[str, str] | None:
        """A stop string taken from ``text`` and the text before it: up to three characters, first found there.

        One whose first character appears earlier is preferred: it catches a backend that stops
        on a stop string's first character rather than the whole string; then one not at the
        very start, so some text comes before it.
        """
        candidates = []
        for start in range(len(text) - 1):
            stop = text[start : start + 3]
            if len(stop) >= 2 and stop.strip() and text.find(stop) == start:
                candidates.append((stop[0] in text[:start], start > 0, -start, stop))
        if not candidates:
            return None
        *_, start, stop = max(candidates)
        start = -start
        return stop, text[:start]

    def test_a_stop_string_from_the_greedy_text_ends_the_text_before_it(
        self, loaded_model: anyformer.Loaded, backend_hooks: BackendHooks, greedy_texts: tuple[str, str]
    ) -> None:
        """A piece of the greedy text used as ``stop`` ends the text just before it with ``finish_reason="stop"``.

        Asked through the core and of the raw hook. The raw stream may leave stop strings to the
        core (then its text goes on through the stop string, as the greedy text does), or apply
        them itself (then its text ends just before the stop string). Troubleshooting: you may
        ignore ``options.stop``; if you apply it, end when the whole stop string has been
        generated, with the text before it and ``finish_reason="stop"``: never on a partial
        match, never cutting the text before it.
        """
        limit = self.max_new_tokens_for_tests
        greedy = greedy_texts[0]
        found = self._stop_string(greedy)
        if found is None:
            pytest.skip(f"the greedy text {greedy!r} holds no stop string to test with")
        stop, before = found
        where = f"generate(max_new_tokens={limit}, stop=[{stop!r}])"
        last = loaded_model.complete(self._messages(0), max_new_tokens=limit, stop=[stop])
        checks.check_stop_cut(last.text, last.finish_reason, before=before, stop=stop, where=where)
        where = f"the {self.backend_id} handle.generate(max_new_tokens={limit}, stop=({stop!r},))"
        options = GenerateOptions.build(max_new_tokens=limit, stop=[stop])
        raw = read_backend_stream(
            backend_hooks.generate(loaded_model.handle, anyformer.validate_messages(self._messages(0)), options),
            where=where,
            max_new_tokens=limit,
            max_chunks=4 * limit + 16,
            time_limit_s=self.generate_time_limit_s,
        )
        self._read_backend_streams([raw])
        checks.check_backend_chunks(raw.chunks, where)
        finish = raw.chunks[-1].finish_reason if raw.chunks else None
        applied = raw.text == before and finish in (None, "stop")
        if not applied and not raw.text.startswith(before + stop):
            checks.fail(
                f"with stop={stop!r} the raw text is {raw.text!r} ending with {finish!r}, expected {before!r} "
                f"ending with 'stop' (a backend that applies stop strings) or the greedy text {greedy!r} "
                "(one that leaves them to the core) (rule: a stop string ends the text just before it)",
                where,
            )

    def test_backend_generate_leaves_the_messages_unchanged(
        self, loaded_model: anyformer.Loaded, backend_hooks: BackendHooks
    ) -> None:
        """The raw ``generate`` hook, read to its end, leaves the caller's ``messages`` list as it was.

        Troubleshooting: build the prompt from a copy (``[*messages, ...]``, ``dict(message)``);
        never append a system message, pop or rewrite content in the list you were given: the
        caller (a server's chat history) reuses it.
        """
        limit = self.max_new_tokens_for_tests
        messages = anyformer.validate_messages(self._messages(0))
        before = copy.deepcopy(messages)
        where = f"the {self.backend_id} handle.generate({self.prompts[0]!r}, max_new_tokens={limit})"
        stream = read_backend_stream(
            backend_hooks.generate(loaded_model.handle, messages, GenerateOptions.build(max_new_tokens=limit)),
            where=where,
            max_new_tokens=limit,
            max_chunks=4 * limit + 16,
            time_limit_s=self.generate_time_limit_s,
        )
        self._read_backend_streams([stream])
        if messages != before:
            checks.fail(
                f"messages went {before!r} -> {messages!r}: expected them unchanged "
                "(rule: generate does not change the caller's messages)",
                where,
            )

    def test_streamed_text_equals_the_final_text(self, loaded_model: anyformer.Loaded) -> None:
        """The deltas joined are the last chunk's text: no text is lost or added at the end.

        Troubleshooting: flush any text your detokenizer holds back (partial UTF-8, a pending
        space) into a delta before you finish, and never put text in a chunk's ``text`` that is
        not also in some ``delta``.
        """
        limit = self.max_new_tokens_for_tests
        where = f"generate(max_new_tokens={limit})"
        chunks = self._stream(loaded_model, self._messages(0), max_new_tokens=limit)
        checks.check_stream(chunks, limit, where)
        checks.check_same_text("".join(c.delta for c in chunks), chunks[-1].text, "the deltas joined", where)
        checks.check_same_text(self._greedy_text(loaded_model, 0), chunks[-1].text, "complete()'s text", where)

    def test_no_text_leaks_into_the_next_call(self, loaded_model: anyformer.Loaded) -> None:
        """Prompt A, then prompt B, then A again: the second A answer equals the first.

        Troubleshooting: a call must start from the messages alone. Clear the KV cache (or
        compare and reuse only a matching prefix), reset the sampler and any pending text buffer
        in a ``finally`` block of your generator.
        """
        first = self._greedy_text(loaded_model, 0)
        self._greedy_text(loaded_model, 1)
        again = self._greedy_text(loaded_model, 0)
        checks.check_same_text(again, first, "prompt A after prompt B", "generate(A), generate(B), generate(A)")

    def test_a_constraint_holds_the_reply_to_its_json_schema(self, loaded_model: anyformer.Loaded) -> None:
        """A backend that honours ``constraint`` answers with JSON that parses and validates against the schema.

        Troubleshooting: mask every token that would leave the language before you sample (compile
        the schema against your tokenizer's vocabulary, e.g. with llguidance), advance the matcher
        with each token you emit, and end the reply once the value is complete. A backend that
        cannot do this must not list ``constraint`` in ``features.honours``: the core then refuses it.
        """
        if "constraint" not in loaded_model.honours:
            pytest.skip("the handle does not honour constraint (the core refuses it)")
        schema = {
            "type": "object",
            "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
            "required": ["answer", "sure"],
            "additionalProperties": False,
        }
        where = "generate(constraint={'type': 'json_schema', ...}, max_new_tokens=48)"
        last = loaded_model.complete(
            self._messages(0), max_new_tokens=48, constraint={"type": "json_schema", "schema": schema}
        )
        try:
            value = json.loads(last.text)
        except ValueError:
            pytest.fail(f"the reply {last.text!r:.200} is not JSON [{where}]")
        valid = (
            isinstance(value, dict)
            and set(value) == {"answer", "sure"}
            and value["answer"] in ("yes", "no")
            and isinstance(value["sure"], bool)
        )
        assert valid, f"the reply {value!r:.200} does not validate against the schema [{where}]"

    def test_cancel_stops_within_two_chunks_and_the_model_stays_usable(self, loaded_model: anyformer.Loaded) -> None:
        """Setting ``cancel`` ends the stream within two chunks with ``cancelled``; the next call works.

        Troubleshooting: check ``options.cancel.is_set()`` before each token and, when set, yield
        ``Chunk(tokens=n, finish_reason="cancelled")`` and return; put the engine back in order in
        a ``finally`` block, since the core closes your iterator. A blocking engine call must
        return after at most one more token.
        """
        limit = max(4 * self.max_new_tokens_for_tests, 16)
        where = f"generate(max_new_tokens={limit}, cancel=event)"
        baseline = self._greedy_text(loaded_model, 0)
        cancel = threading.Event()
        chunks: list[Chunk] = []
        after_cancel = 0
        for chunk in loaded_model.generate(self._messages(0), max_new_tokens=limit, cancel=cancel):
            chunks.append(chunk)
            if cancel.is_set():
                after_cancel += 1
            elif chunk.finish_reason is None:
                cancel.set()
        checks.check_stream(chunks, limit, where)
        if cancel.is_set():
            if after_cancel > 2:
                checks.fail(f"{after_cancel} chunks came after cancel was set, expected at most 2", where)
            if chunks[-1].finish_reason != "cancelled":
                checks.fail(
                    f"the stream ended with {chunks[-1].finish_reason!r} after cancel, expected 'cancelled'", where
                )
        early = threading.Event()
        early.set()
        chunks = self._stream(loaded_model, self._messages(0), max_new_tokens=limit, cancel=early)
        checks.check_stream(chunks, limit, "generate(cancel=an event already set)")
        if len(chunks) > 2 or chunks[-1].finish_reason != "cancelled":
            checks.fail(
                f"{len(chunks)} chunks ending with {chunks[-1].finish_reason!r}, "
                "expected at most 2 ending with 'cancelled'",
                "generate(cancel=an event already set)",
            )
        checks.check_same_text(
            self._greedy_text(loaded_model, 0), baseline, "the answer after a cancelled call", "generate after cancel"
        )

    def test_closing_the_stream_early_frees_the_model(
        self, loaded_model: anyformer.Loaded, backend_hooks: BackendHooks
    ) -> None:
        """``close()`` on a stream after one chunk (or before any) leaves the model ready for the next call.

        The backend's own stream is closed after one chunk first: its generator must end on the
        ``GeneratorExit`` that ``close()`` raises at its ``yield``. Troubleshooting: write
        ``generate`` as a generator with a ``try/finally`` that stops the engine and releases what
        it holds; do not catch ``GeneratorExit`` (nor ``BaseException``) around a ``yield`` and
        keep generating: Python then raises ``RuntimeError: generator ignored GeneratorExit``.
        """
        baseline = self._greedy_text(loaded_model, 0)
        limit = max(4 * self.max_new_tokens_for_tests, 16)
        where = f"the {self.backend_id} handle.generate, 1 chunk read, close()"
        options = GenerateOptions.build(max_new_tokens=limit)
        raw = backend_hooks.generate(loaded_model.handle, anyformer.validate_messages(self._messages(0)), options)
        if raw is None or not callable(getattr(raw, "close", None)):
            checks.fail(f"generate returned {type(raw).__name__}, expected a generator (with close())", where)
        next(raw)
        try:
            raw.close()
        except RuntimeError as exc:
            swallowed: RuntimeError | None = exc
        else:
            swallowed = None
        # A generator that swallows GeneratorExit does it again when collected: let that happen now.
        del raw
        if swallowed is not None:
            checks.fail(
                f"close() raised RuntimeError: {swallowed}: the generator caught GeneratorExit and kept going; "
                "let GeneratorExit through (clean up in a finally block) so the stream stops when closed",
                where,
            )
        for read in (1, 0):
            where = f"generate(...), {read} chunk(s) read, close()"
            stream = loaded_model.generate(self._messages(0), max_new_tokens=limit)
            if not callable(getattr(stream, "close", None)):
                checks.fail(f"generate returned {type(stream).__name__} without close()", where)
            for _ in range(read):
                next(stream)
            try:
                stream.close()  # type: ignore[attr-defined]  # checked callable above
            except Exception as exc:
                checks.fail(f"close() raised {type(exc).__name__}: {exc}, expected the stream to stop quietly", where)
            try:
                text = self._greedy_text(loaded_model, 0)
            except AnyformerError as exc:
                checks.fail(f"the next generate raised {exc}, expected it to run", where)
            checks.check_same_text(text, baseline, "the answer after a closed stream", where)

    def test_a_second_generate_while_streaming_is_busy_or_waits(self, loaded_model: anyformer.Loaded) -> None:
        """While one stream is open, a second ``generate`` raises ``BUSY`` or waits; neither stream is corrupted.

        Troubleshooting: two generations must never share the engine at once. The core's
        ``Loaded`` raises ``BUSY``; if you built your own queueing, the second call must block
        until the first stream ends, then produce the same text it would alone.
        """
        if loaded_model.parallel > 1:
            pytest.skip("the backend serves several streams at once: the parallel tests check it")
        limit = self.max_new_tokens_for_tests
        where = "generate(A) open, then generate(B) from another thread"
        alone = {which: self._greedy_text(loaded_model, which) for which in (0, 1)}
        outcome: dict[str, Any] = {}

        def second() -> None:
            try:
                outcome["chunks"] = self._stream(loaded_model, self._messages(1), max_new_tokens=limit)
            except BaseException as exc:  # reported by the test thread
                outcome["error"] = exc

        first = loaded_model.generate(self._messages(0), max_new_tokens=limit)
        first_chunks = [next(first)]
        worker = threading.Thread(target=second, name="conformance-second-generate", daemon=True)
        worker.start()
        worker.join(timeout=2.0)
        finished_while_open = not worker.is_alive()
        first_chunks.extend(first)
        worker.join(timeout=60.0)
        if worker.is_alive():
            checks.fail("the second generate still waits a minute after the first stream ended", where)
        if "error" in outcome:
            checks.check_error_code(outcome["error"], ErrorCode.BUSY, where)
        else:
            if finished_while_open:
                checks.fail("the second generate streamed to the end while the first was still open", where)
            checks.check_stream(outcome["chunks"], limit, where)
            checks.check_same_text(outcome["chunks"][-1].text, alone[1], "the waiting call's text", where)
        checks.check_stream(first_chunks, limit, where)
        checks.check_same_text(first_chunks[-1].text, alone[0], "the open stream's text", where)

    # ---- several streams at once (a handle that declares parallel > 1) ----------------------------

    def _parallel_model(self, loaded: anyformer.Loaded) -> anyformer.Loaded:
        if loaded.parallel <= 1:
            pytest.skip("the backend serves one stream at a time (parallel is 1)")
        return loaded

    def test_parallel_streams_interleaved_give_the_texts_they_give_alone(self, loaded_model: anyformer.Loaded) -> None:
        """Two streams open at once, read in turns, give each the greedy text it gives alone.

        Troubleshooting: each stream needs its own state (its KV region or cache slot, its
        detokenizer, its token count); nothing one stream does may show in another. An engine
        that batches several sequences in one step must keep each sequence's positions and
        logits apart.
        """
        loaded = self._parallel_model(loaded_model)
        limit = self.max_new_tokens_for_tests
        where = "generate(A) and generate(B) open together, read in turns"
        alone = [self._greedy_text(loaded, which) for which in (0, 1)]
        streams = [loaded.generate(self._messages(which), max_new_tokens=limit) for which in (0, 1)]
        chunks: list[list[Chunk]] = [[], []]
        pending = {0, 1}
        while pending:
            for which in sorted(pending):
                try:
                    chunks[which].append(next(streams[which]))
                except StopIteration:
                    pending.discard(which)
        for which in (0, 1):
            checks.check_stream(chunks[which], limit, where)
            checks.check_same_text(chunks[which][-1].text, alone[which], f"stream {'AB'[which]}'s text", where)

    def test_one_stream_more_than_parallel_is_busy(self, loaded_model: anyformer.Loaded) -> None:
        """With ``parallel`` streams open, one more ``generate`` raises ``BUSY``; once one closes, it runs.

        Troubleshooting: declare as ``parallel`` the number of streams your handle really serves
        at once; the core counts the open ones and refuses the next with ``BUSY``.
        """
        loaded = self._parallel_model(loaded_model)
        where = f"{loaded.parallel} streams open, then one more generate"
        streams = [loaded.generate(self._messages(0), max_new_tokens=10_000) for _ in range(loaded.parallel)]
        try:
            for stream in streams:
                next(stream)
            with pytest.raises(AnyformerError) as caught:
                loaded.generate(self._messages(1), max_new_tokens=2).close()
            checks.check_error_code(caught.value, ErrorCode.BUSY, where)
            streams.pop().close()
            chunks = self._stream(loaded, self._messages(1), max_new_tokens=2)
            checks.check_stream(chunks, 2, "generate after one of the open streams closed")
        finally:
            for stream in streams:
                stream.close()

    def test_cancelling_one_parallel_stream_leaves_the_other_running(self, loaded_model: anyformer.Loaded) -> None:
        """Cancelling one of two open streams ends it with ``cancelled``; the other ends with the text it has alone.

        Troubleshooting: each stream must check its own ``options.cancel`` only; a cancel must
        free that stream's slot and leave the other sequences of a shared batch alone.
        """
        loaded = self._parallel_model(loaded_model)
        limit = self.max_new_tokens_for_tests
        where = "generate(A) and generate(B) open, A cancelled after its first chunk"
        alone = self._greedy_text(loaded, 1)
        cancel = threading.Event()
        stopped = loaded.generate(self._messages(0), max_new_tokens=10_000, cancel=cancel)
        running = loaded.generate(self._messages(1), max_new_tokens=limit)
        first = [next(stopped)]
        kept = [next(running)]
        cancel.set()
        first.extend(stopped)
        kept.extend(running)
        if first[-1].finish_reason != "cancelled":
            checks.fail(f"the cancelled stream ended with {first[-1].finish_reason!r}, expected 'cancelled'", where)
        checks.check_stream(kept, limit, where)
        checks.check_same_text(kept[-1].text, alone, "the stream left running", where)

    def test_dispose_ends_every_open_parallel_stream(
        self,
        described_sample: Model | None,
        plugin_manager: anyformer.PluginManager,
        caps: Caps,
        loaded_model: anyformer.Loaded,
    ) -> None:
        """``dispose()`` with ``parallel`` streams open ends them all and frees the model; the streams stop.

        Troubleshooting: your handle's ``dispose`` must stop every sequence in flight (or wait
        for them) before it frees the engine; the core cancels and closes each open stream first.
        """
        self._parallel_model(loaded_model)
        assert described_sample is not None
        options = {"backend": self.backend_id, "plugins": plugin_manager, "caps": caps, **self.load_kwargs}
        loaded = anyformer.load(described_sample, **options)
        where = f"dispose() with {loaded.parallel} streams open"
        streams = [loaded.generate(self._messages(0), max_new_tokens=10_000) for _ in range(loaded.parallel)]
        for stream in streams:
            next(stream)
        loaded.dispose()
        for index, stream in enumerate(streams):
            rest = list(stream)
            if rest and rest[-1].finish_reason != "cancelled":
                checks.fail(f"stream {index} went on to {rest[-1].finish_reason!r} after dispose", where)
        try:
            self._stream(loaded, self._messages(0), max_new_tokens=2)
        except AnyformerError:
            pass
        else:
            checks.fail("generate on the disposed model streamed, expected an AnyformerError", where)

    @pytest.mark.parametrize("kind", sorted(MALFORMED_MESSAGES))
    def test_malformed_messages_are_bad_request_before_any_chunk(
        self, loaded_model: anyformer.Loaded, kind: str
    ) -> None:
        """Malformed ``messages`` raise ``AnyformerError(BAD_REQUEST)`` before any chunk, and the model stays free.

        Troubleshooting: the core validates messages before calling your hook; if this fails, your
        backend bypasses ``Loaded.generate`` or raises something else. Raise ``BAD_REQUEST`` for
        content your backend cannot take, at the call (not after yielding), and leave nothing
        locked.
        """
        where = f"generate(messages {kind}: {MALFORMED_MESSAGES[kind]!r})"
        error = self._error_before_first_chunk(loaded_model, MALFORMED_MESSAGES[kind], where)
        checks.check_error_code(error, ErrorCode.BAD_REQUEST, where)
        chunks = self._stream(loaded_model, self._messages(0), max_new_tokens=1)
        checks.check_stream(chunks, 1, f"a good generate after {kind}")

    def test_image_blocks_follow_supports_images(self, loaded_model: anyformer.Loaded) -> None:
        """An image block is ``BAD_REQUEST`` before any work when ``supports_images`` is False; else it streams.

        Troubleshooting: a text-only backend must look at every content block in ``generate``
        and raise ``AnyformerError("BAD_REQUEST", "... reads text only")`` for an image before
        yielding; do it in the method itself, not inside the generator, so nothing is locked. If
        your backend reads images, set ``supports_images = True``.
        """
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this picture?"},
                    {"type": "image", "image": _tiny_png()},
                ],
            }
        ]
        where = "generate(a text block and a 1x1 PNG image block)"
        if self.supports_images:
            limit = self.max_new_tokens_for_tests
            checks.check_stream(self._stream(loaded_model, messages, max_new_tokens=limit), limit, where)
            return
        error = self._error_before_first_chunk(loaded_model, messages, where)
        checks.check_error_code(error, ErrorCode.BAD_REQUEST, where)
        chunks = self._stream(loaded_model, self._messages(0), max_new_tokens=1)
        checks.check_stream(chunks, 1, "a good generate after an image was refused")

    def test_raw_prompts_follow_raw_text(self, loaded_model: anyformer.Loaded) -> None:
        """``generate(prompt=...)`` streams a well-formed, repeatable raw completion when the handle
        declares ``Features(raw_text=True)``; otherwise it is ``BAD_REQUEST`` before any work.

        Troubleshooting: declare ``raw_text`` in your handle's ``features`` only if its ``generate`` reads
        ``options.prompt`` (the text to continue as written, no chat template; ``messages`` is then
        empty) and tokenizes it as your engine's own server does, and, with ``options.logprobs``
        set, puts a ``TokenLogprob`` for each token on its chunk.
        """
        prompt = self.prompts[0]
        where = f"generate(prompt={prompt!r})"
        if not loaded_model.raw_text:
            try:
                loaded_model.generate(prompt=prompt, max_new_tokens=1)
            except Exception as exc:
                checks.check_error_code(exc, ErrorCode.BAD_REQUEST, where)
                return
            checks.fail("a raw prompt streamed on a handle without raw_text", where)
        limit = self.max_new_tokens_for_tests
        chunks = list(loaded_model.generate(prompt=prompt, max_new_tokens=limit))
        checks.check_stream(chunks, limit, where)
        again = loaded_model.complete(prompt=prompt, max_new_tokens=limit).text
        checks.check_same_text(again, chunks[-1].text, "the second greedy raw completion", where)
        # Raw completions report log-probabilities: one entry a token, N alternatives, likeliest first.
        where = f"generate(prompt={prompt!r}, logprobs=2)"
        scored = list(loaded_model.generate(prompt=prompt, max_new_tokens=limit, logprobs=2))
        entries = [entry for chunk in scored for entry in chunk.logprobs]
        if len(entries) != scored[-1].tokens:
            checks.fail(f"{len(entries)} logprobs entries for {scored[-1].tokens} tokens, expected one a token", where)
        for entry in entries:
            values = [value for _, value in entry.top]
            if (
                entry.logprob is None
                or not entry.logprob <= 0
                or len(values) < 2
                or values[:2] != sorted(values[:2], reverse=True)
            ):
                checks.fail(
                    f"{entry!r}: a logprob must be ≤ 0, with the 2 likeliest alternatives first, likeliest first",
                    where,
                )

    def test_prompt_logprobs_follow_the_declaration(self, loaded_model: anyformer.Loaded) -> None:
        """``generate(prompt=..., logprobs=2, prompt_logprobs=True)`` scores the prompt's tokens when the
        handle declares ``Features(prompt_logprobs=True)``; otherwise it is ``BAD_REQUEST`` before any work.

        Troubleshooting: declare ``prompt_logprobs`` (with ``raw_text``) in ``features`` only if, with
        ``options.prompt_logprobs`` set, your first chunk's ``prompt_logprobs`` holds a ``TokenLogprob``
        for each token of the prompt, their texts spelling the prompt, the first with ``logprob``
        None, and ``max_new_tokens=0`` ends after it with ``length``.
        """
        prompt = self.prompts[0]
        where = f"generate(prompt={prompt!r}, logprobs=2, prompt_logprobs=True, max_new_tokens=0)"
        if not loaded_model.raw_text:
            return  # raw prompts are refused altogether (test_raw_prompts_follow_raw_text)
        if not loaded_model.prompt_logprobs:
            try:
                loaded_model.generate(prompt=prompt, max_new_tokens=1, logprobs=2, prompt_logprobs=True)
            except Exception as exc:
                checks.check_error_code(exc, ErrorCode.BAD_REQUEST, where)
                return
            checks.fail("prompt logprobs streamed on a handle without prompt_logprobs", where)
        chunks = list(loaded_model.generate(prompt=prompt, max_new_tokens=0, logprobs=2, prompt_logprobs=True))
        entries = chunks[0].prompt_logprobs
        if chunks[-1].finish_reason != "length" or chunks[-1].tokens != 0 or chunks[-1].text:
            checks.fail(f"max_new_tokens=0 must end at once with length and no text, got {chunks[-1]!r}", where)
        if not entries or "".join(e.token for e in entries) != prompt:
            checks.fail(f"the first chunk's prompt_logprobs must spell the prompt, got {entries!r:.300}", where)
        if entries[0].logprob is not None:
            checks.fail(f"the prompt's first token has no logprob (None), got {entries[0]!r}", where)
        for entry in entries[1:]:
            values = [value for _, value in entry.top]
            if entry.logprob is None or not entry.logprob <= 0 or len(values) < 2:
                checks.fail(f"{entry!r}: a logprob must be ≤ 0, with the 2 likeliest alternatives", where)

    def test_the_sample_streams_in_an_isolated_worker(
        self,
        described_sample: Model | None,
        plugin_manager: anyformer.PluginManager,
        caps: Caps,
        loaded_model: anyformer.Loaded,
    ) -> None:
        """``anyformer.load(..., isolate=True)`` loads the sample in a worker process, which streams the same reply.

        Troubleshooting: the worker imports your entry point's module on its own and receives
        the description, request, messages and options as JSON, and sends chunks back: keep your
        handle's state inside the worker (no globals set up by the parent process), make greedy
        decoding depend on the messages alone, and yield plain ``Chunk`` objects.
        """
        if described_sample is None:
            pytest.skip("no sample_model")
        if plugin_manager.entry_point(self.backend_id) is None:
            pytest.skip("the backend is registered in-process: an isolated worker loads backends from entry points")
        limit = self.max_new_tokens_for_tests
        where = f"anyformer.load(isolate=True), generate(max_new_tokens={limit})"
        expected = self._greedy_text(loaded_model, 0)
        options = {"backend": self.backend_id, "plugins": plugin_manager, "caps": caps, **self.load_kwargs}
        try:
            isolated = anyformer.load(described_sample, isolate=True, **options)
        except AnyformerError as exc:
            checks.fail(f"the isolated load raised {exc}, expected the sample to load in a worker", where)
        try:
            chunks = self._stream(isolated, self._messages(0), max_new_tokens=limit)
        except AnyformerError as exc:
            checks.fail(f"raised {exc}, expected a stream from the worker", where)
        finally:
            isolated.dispose()
        checks.check_stream(chunks, limit, where)
        checks.check_same_text(chunks[-1].text, expected, "the isolated worker's greedy text", where)

    # ---- progress and cancel of run ---------------------------------------------------------------

    def test_run_progress_events_are_well_formed(self, run_model: anyformer.Loaded, run_sample: Any) -> None:
        """A handle declaring ``run_progress`` reports well-formed events from its own ``run`` and through the core.

        Troubleshooting: call the ``progress`` the core passes (``run(input, progress=..., **options)``)
        with an ``anyformer.ProgressEvent(stage=..., done=..., total=...)`` after each unit of work
        (a batch, a window): ``done`` never above ``total``, never decreasing, ``total`` the same
        for the whole run. A handle whose ``run`` cannot report leaves ``run_progress`` unset.
        """
        if not run_model.run_progress:
            pytest.skip("the handle does not declare run_progress")
        input, options = run_sample
        raw: list[Any] = []
        where = f"the handle's run(progress=..., **{options!r})"
        try:
            _handle_run(run_model)(input, progress=raw.append, **options)
        except Exception as exc:
            checks.fail(f"raised {type(exc).__name__}: {exc}, expected a result", where)
        checks.check_run_progress(raw, self.backend_id, where)
        events: list[anyformer.ProgressEvent] = []
        started = time.monotonic()
        run_model.run(input, progress=events.append, **options)
        if time.monotonic() - started > self.run_time_limit_s:
            checks.fail(f"the run took over {self.run_time_limit_s:g} s (run_time_limit_s)", "loaded.run")
        checks.check_run_progress(events, self.backend_id, "loaded.run(progress=...)")
        if len(events) < 2:
            checks.fail(
                f"run_sample made {len(events)} event, expected at least 2 (make it two units of work long)",
                "loaded.run(progress=...)",
            )

    def test_run_cancelled_after_the_first_event_raises_and_the_model_stays_usable(
        self, run_model: anyformer.Loaded, run_sample: Any
    ) -> None:
        """A cancel set at the first progress event ends ``run`` with ``CANCELLED`` at once, with no result.

        Troubleshooting: let the ``AnyformerError(CANCELLED)`` that the core's ``progress`` raises
        propagate out of your ``run`` (do not catch it, or wrap it in another error), and free what
        the unfinished work held in ``finally`` blocks, so the next call starts clean.
        """
        if not run_model.run_progress:
            pytest.skip("the handle does not declare run_progress")
        input, options = run_sample
        cancel = threading.Event()
        events: list[anyformer.ProgressEvent] = []

        def stop_at_first(event: anyformer.ProgressEvent) -> None:
            events.append(event)
            cancel.set()

        def raise_at_first(event: Any) -> None:  # what the core's progress does once the caller cancelled
            raise AnyformerError(ErrorCode.CANCELLED, "cancelled by the conformance kit")

        where = "the handle's run(progress=...) whose progress raises CANCELLED at the first event"
        try:
            result = _handle_run(run_model)(input, progress=raise_at_first, **options)
        except AnyformerError as exc:
            checks.check_error_code(exc, ErrorCode.CANCELLED, where)
        else:
            checks.fail(f"returned {result!r:.200}, expected the AnyformerError(CANCELLED) to propagate", where)
        where = "loaded.run(progress=..., cancel=...) with cancel set at the first event"
        try:
            result = run_model.run(input, progress=stop_at_first, cancel=cancel, **options)
        except AnyformerError as exc:
            checks.check_error_code(exc, ErrorCode.CANCELLED, where)
        else:
            checks.fail(f"returned {result!r:.200} after a cancel, expected AnyformerError(CANCELLED)", where)
        if len(events) != 1:
            checks.fail(f"{len(events)} events reached the caller after the cancel, expected 1", where)
        try:
            run_model.run(input, **options)
        except AnyformerError as exc:
            checks.fail(f"the next run raised {exc}, expected the model to stay usable", "loaded.run after a cancel")

    # ---- load and dispose -------------------------------------------------------------------------

    def test_dispose_twice_and_the_with_block(
        self, described_sample: Model | None, plugin_manager: anyformer.PluginManager, caps: Caps
    ) -> None:
        """``with anyformer.load(...)`` disposes at the end; ``dispose()`` twice, on ``Loaded`` or the handle, is fine.

        Troubleshooting: make your handle's ``dispose`` idempotent (set the engine to None and
        return early when it already is), and free device memory there, not in ``__del__``.
        """
        if described_sample is None:
            pytest.skip("no sample_model")
        options = {"backend": self.backend_id, "plugins": plugin_manager, "caps": caps, **self.load_kwargs}
        with anyformer.load(described_sample, **options) as loaded:
            if self.supports_generate:
                chunks = self._stream(loaded, self._messages(0), max_new_tokens=2)
                checks.check_stream(chunks, 2, "generate inside a with block")
        loaded.dispose()
        other = anyformer.load(described_sample, **options)
        try:
            other.handle.dispose()
            other.handle.dispose()
        except Exception as exc:
            checks.fail(f"the handle's second dispose() raised {type(exc).__name__}: {exc}", "handle.dispose() twice")
        finally:
            other.dispose()
        if self.supports_generate:
            try:
                self._stream(loaded, self._messages(0), max_new_tokens=2)
            except AnyformerError:
                pass
            else:
                checks.fail(
                    "generate on a disposed model streamed, expected an AnyformerError", "generate after dispose"
                )

    def test_load_and_dispose_leave_no_thread_or_file_open(
        self, described_sample: Model | None, plugin_manager: anyformer.PluginManager, caps: Caps
    ) -> None:
        """After a load, a short generation and ``dispose()``, the process has the threads and open files it had.

        One load and dispose comes first, so what an engine sets up once per process (a
        thread pool, a log file) is in the baseline; the second must leave nothing behind.
        A thread ending or a file closing within two seconds of ``dispose`` counts as gone.
        Troubleshooting: join the threads your handle started and close the files it keeps
        open (a memory map's file, a log) in ``dispose``; a server loads and disposes models
        for weeks.
        """
        if described_sample is None:
            pytest.skip("no sample_model")
        options = {"backend": self.backend_id, "plugins": plugin_manager, "caps": caps, **self.load_kwargs}

        def load_use_dispose() -> None:
            with anyformer.load(described_sample, **options) as loaded:
                if self.supports_generate:
                    self._stream(loaded, self._messages(0), max_new_tokens=2)

        load_use_dispose()
        left_behind(ProcessResources.now(), settle_s=0.5)  # let the first round's threads end
        before = ProcessResources.now()
        load_use_dispose()
        threads, descriptors = left_behind(before, settle_s=2.0)
        where = "anyformer.load(sample), generate(max_new_tokens=2), dispose()"
        if threads:
            checks.fail(
                f"{len(threads)} thread(s) still running after dispose: {threads}, expected none "
                "(rule: dispose stops what load started)",
                where,
            )
        if descriptors:
            checks.fail(
                f"{len(descriptors)} file descriptor(s) still open after dispose: {descriptors}, expected none "
                "(rule: dispose closes what load opened)",
                where,
            )

    # ---- the store --------------------------------------------------------------------------------

    def _raw_store_list(self, backend_hooks: BackendHooks, where: str) -> list[Any]:
        __tracebackhide__ = True
        try:
            return backend_hooks.store_list()
        except (Exception, SystemExit) as exc:
            checks.fail(f"store_list raised {type(exc).__name__}: {exc}, expected a list (or [])", where)

    def test_store_list_entries_are_well_formed(
        self, backend_hooks: BackendHooks, empty_anyformer_home: Path, stored_model: Any
    ) -> None:
        """``store_list`` returns StoreEntry items of this backend with repo, path and bytes; it never raises.

        ``bytes`` is the size of what ``path`` names: a file's size, or the files of a folder
        added up. Troubleshooting: return ``[StoreEntry(backend=backend_id, repo=..., revision=None or a
        str, path=str(path), bytes=size)]`` for files you keep under ``ANYFORMER_HOME``, or
        ``[]``. Hub cache entries are listed by the core, not by you.
        """
        if not self.supports_store:
            pytest.skip("supports_store is False")
        entries = self._raw_store_list(backend_hooks, "store_list()")
        for index, entry in enumerate(entries):
            checks.check_store_entry(entry, self.backend_id, f"store_list()[{index}]")
            if os.path.exists(entry.path):
                checks.check_store_entry_size(entry, f"store_list()[{index}]")

    def test_store_list_lists_the_stored_model_under_anyformer_home(
        self,
        backend_hooks: BackendHooks,
        empty_anyformer_home: Path,
        stored_model: Any,
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path,
    ) -> None:
        """``store_list`` lists what is under ``ANYFORMER_HOME``, read at each call: the stored model, nothing else.

        ``stored_model`` runs with ``ANYFORMER_HOME`` at a fresh, empty folder
        (``empty_anyformer_home``) and returns the path of what it stored (or None). Every entry
        must lie inside that folder; the stored model must be among them; with nothing stored,
        and again with ``ANYFORMER_HOME`` moved to another empty folder, the list must be empty.
        Troubleshooting: compute your store's root from ``anyformer.plugin.anyformer_home()``
        inside ``store_list`` (never once at import), list only what is there, and store into it
        from ``load``; in your ``stored_model`` fixture, write under ``empty_anyformer_home`` and
        return the path you wrote.
        """
        if not self.supports_store:
            pytest.skip("supports_store is False")
        home = os.environ.get("ANYFORMER_HOME")
        if home != str(empty_anyformer_home):
            checks.fail(
                f"ANYFORMER_HOME is {home!r} after the stored_model fixture, expected the kit's fresh folder "
                f"{str(empty_anyformer_home)!r}: store under the empty_anyformer_home fixture, do not move it",
                "the stored_model fixture",
            )
        entries = [e for e in self._raw_store_list(backend_hooks, "store_list()") if isinstance(e, StoreEntry)]
        listed = [f"{e.repo} at {e.path}" for e in entries]
        for entry in entries:
            if not _is_within(entry.path, empty_anyformer_home):
                checks.fail(
                    f"store_list listed {entry.repo!r} at {entry.path!r}, outside ANYFORMER_HOME={home!r}: "
                    "a backend keeps its store under ANYFORMER_HOME, read at each call",
                    "store_list()",
                )
            if not os.path.exists(entry.path):
                checks.fail(
                    f"store_list listed {entry.repo!r} at {entry.path!r}, which does not exist: "
                    "list only the models that are in the store",
                    "store_list()",
                )
        if stored_model is None:
            if entries:
                checks.fail(
                    f"store_list listed {listed} with ANYFORMER_HOME at a fresh, empty folder and nothing stored, "
                    "expected []: list only what is under ANYFORMER_HOME",
                    "store_list()",
                )
        else:
            stored = os.fspath(stored_model)
            if not _is_within(stored, empty_anyformer_home):
                checks.fail(
                    f"the stored_model fixture stored the model at {stored!r}, outside ANYFORMER_HOME={home!r}: "
                    "store it under empty_anyformer_home, where the backend's store lives",
                    "the stored_model fixture",
                )
            if not any(_same_or_nested(entry.path, stored) for entry in entries):
                checks.fail(
                    f"store_list listed {listed or 'nothing'}, none of them the model stored at {stored!r}: "
                    "list every model kept under ANYFORMER_HOME, with path= where it lies",
                    "store_list() after stored_model",
                )
        elsewhere = tmp_path / "conformance-another-empty-home"
        elsewhere.mkdir()
        monkeypatch.setenv("ANYFORMER_HOME", str(elsewhere))
        again = self._raw_store_list(backend_hooks, "store_list() with ANYFORMER_HOME moved")
        if again:
            checks.fail(
                f"store_list listed {[getattr(e, 'path', e) for e in again]} with ANYFORMER_HOME moved to another "
                "empty folder, expected []: read ANYFORMER_HOME at each call, never once at import",
                "store_list() with ANYFORMER_HOME moved",
            )
