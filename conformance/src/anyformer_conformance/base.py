"""``BackendConformance``: the standard tests every anyformer backend passes.

Subclass it in a test module whose name pytest collects, name the class ``Test…``, and supply
what the kit cannot guess::

    pytest_plugins = ["anyformer_conformance.plugin"]

    class TestMyBackend(BackendConformance):
        backend_id = "mybackend"              # the entry point's name

        @pytest.fixture(scope="class")
        def sample_model(self, tmp_path_factory):
            return "org/tiny-model"           # a ref or anyformer.Model this backend runs

Capabilities are typed properties with documented defaults; they (never backend names) decide
which tests run. Override a standard test only to mark it ``@pytest.mark.xfail(reason=...)``: the
plugin refuses to collect any other override.

Every test's docstring ends with a *Troubleshooting* part saying what to fix when it fails.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import itertools
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import anyformer
from anyformer import AnyformerError, Caps, Chunk, ErrorCode, GenerateOptions, Model, ModelFile, Refusal, Request
from anyformer_conformance import checks

__all__ = ["BackendConformance", "RefusalCase"]

#: The plugin module that must be active for the kit's fixtures and override guard.
PLUGIN_MODULE = "anyformer_conformance.plugin"


class _MissingBackendId(LookupError):
    """Raised by the default ``backend_id``: a subclass must name the backend it tests."""


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
    "unknown block type": [{"role": "user", "content": [{"type": "audio", "audio": "speech.wav"}]}],
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
    - ``plugin_manager`` (class scope): by default a fresh manager loading this backend's
      installed entry point, exactly as users get it; override it to register in-process.
    - ``caps`` (class scope): the machine, ``anyformer.probe()``; override for a what-if machine.
    - ``stored_model`` (function scope): called with ``ANYFORMER_HOME`` pointing at an empty
      folder; put a model in your store there and return anything but None, and the store test
      requires ``store_list`` to list it.
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
        """The ``max_new_tokens`` the streaming tests ask for: small, since each test generates. Default 8."""
        return 8

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
    def can_run_time_limit_s(self) -> float:
        """How long one ``can_run`` may take, in seconds: it runs on every ``anyformer check``. Default 5."""
        return 5.0

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
    def plugin_manager(cls) -> anyformer.PluginManager:
        """A fresh plugin manager holding the backend under test, loaded from its installed entry point."""
        self = cls()
        group = anyformer.hookspecs.PROJECT
        found = [ep for ep in importlib.metadata.entry_points(group=group) if ep.name == self.backend_id]
        if not found:
            installed = sorted({ep.name for ep in importlib.metadata.entry_points(group=group)})
            pytest.fail(
                f"no entry point named {self.backend_id!r} in the {group!r} group "
                f"(installed: {', '.join(installed) or 'none'}); "
                f'declare [project.entry-points.{group}] {self.backend_id} = "your_package.plugin" in pyproject.toml '
                "and pip install the plugin (pip install -e . for a checkout), or override the plugin_manager fixture",
                pytrace=False,
            )
        manager = anyformer.PluginManager()
        manager.load_entry_points(found)
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

    @pytest.fixture
    def stored_model(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
        """Runs with ``ANYFORMER_HOME`` at an empty folder; returns None: nothing was stored."""
        monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path / "anyformer-home"))
        return None

    # ---- helpers ----------------------------------------------------------------------------------

    def _messages(self, which: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.prompts[which]}]

    def _ask(
        self, plugin_manager: anyformer.PluginManager, model: Any, caps: Caps, request: Mapping[str, Any]
    ) -> tuple[anyformer.Verdict, int, str]:
        """The backend's verdict through ``anyformer.check``, the budget it was offered, and a label."""
        _, selection = anyformer.check(model, backend=self.backend_id, caps=caps, plugins=plugin_manager, **request)
        verdicts = [v for v in selection.verdicts if v.backend == self.backend_id]
        assert len(verdicts) == 1, f"check(backend={self.backend_id!r}) gave {len(verdicts)} verdicts of it, expected 1"
        budget = Request.build(budget=request.get("budget")).budget
        offered = budget if budget is not None else (caps.gpu_bytes or 0)
        return verdicts[0], offered, f"can_run({getattr(model, 'repo', None) or model.get('repo')!r}, {dict(request)})"

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
        for model, machine, request in asked:
            verdict, budget, where = self._ask(plugin_manager, model, machine, request)
            where += f" with ram_bytes={machine.ram_bytes}, budget={budget}"
            checks.check_verdict(verdict, self.backend_id, where)
            checks.check_need(verdict, budget=budget, ram=machine.ram_bytes, where=where)

    def test_can_run_reads_no_weights_and_opens_no_connection(
        self,
        described_sample: Model | None,
        plugin_manager: anyformer.PluginManager,
        caps: Caps,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        anyformer_io_spy: Any,
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
        file_sets = [_TYPICAL_FILES]
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
            where = f"can_run({model.repo!r}, source={model.source!r})"
            with anyformer_io_spy.watching():
                started = time.monotonic()
                verdict, _, _ = self._ask(plugin_manager, model, caps, request)
                elapsed = time.monotonic() - started
            checks.check_verdict(verdict, self.backend_id, where)
            if anyformer_io_spy.connections:
                checks.fail(f"can_run tried to connect to {anyformer_io_spy.connections}, expected no network", where)
            opened = anyformer_io_spy.opened_under(absent)
            if opened:
                checks.fail(f"can_run opened {opened}, expected no model file to be opened", where)
            if elapsed > self.can_run_time_limit_s:
                checks.fail(f"can_run took {elapsed:.1f} s, expected under {self.can_run_time_limit_s} s", where)

    def test_can_run_refuses_a_foreign_format(self, plugin_manager: anyformer.PluginManager, caps: Caps) -> None:
        """A model whose files are in no format this backend reads is refused with ``format`` or ``model``.

        Troubleshooting: decide from ``model.files`` / ``model.formats`` first, before the task,
        the GPU or memory, and refuse with ``Refusal.FORMAT`` ("no GGUF in the repo") when none of
        your files is there. If your backend legitimately reads the kit's made-up format, override
        the ``foreign_model`` property.
        """
        verdict, _, where = self._ask(plugin_manager, dict(self.foreign_model), caps, {})
        checks.check_verdict(verdict, self.backend_id, where)
        if verdict.ok or verdict.code not in (Refusal.FORMAT, Refusal.MODEL):
            got = "ok" if verdict.ok else f"{verdict.code} ({verdict.reason})"
            checks.fail(f"got {got}, expected a 'format' or 'model' refusal", where)

    # ---- generate: the stream ---------------------------------------------------------------------

    def test_backend_stream_is_well_formed(
        self, loaded_model: anyformer.Loaded, plugin_manager: anyformer.PluginManager
    ) -> None:
        """The backend's own ``generate`` hook yields Chunks whose tokens rise to at most ``max_new_tokens``.

        The core rebuilds text and clamps token counts for callers; this test reads the hook's raw
        output, so a bug the core would hide still shows. Troubleshooting: yield
        ``Chunk(delta=new_text, tokens=generated_so_far)``; ``tokens`` counts every token
        generated in this call (never reset, never lower than before, never above
        ``options.max_new_tokens``), and only the last chunk may carry ``finish_reason``.
        """
        limit = self.max_new_tokens_for_tests
        options = GenerateOptions.build(max_new_tokens=limit)
        where = f"the {self.backend_id} generate hook(max_new_tokens={limit})"
        stream = plugin_manager.generate(loaded_model.handle, anyformer.validate_messages(self._messages(0)), options)
        chunks: list[Any] = []
        try:
            # Read as the core does: up to a finish_reason or the token limit (with room for empty chunks).
            for chunk in itertools.islice(stream, 4 * limit + 16):
                chunks.append(chunk)
                if not isinstance(chunk, Chunk) or chunk.finish_reason is not None or chunk.tokens >= limit:
                    break
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        checks.check_backend_chunks(chunks, limit, where)

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

    def test_closing_the_stream_early_frees_the_model(self, loaded_model: anyformer.Loaded) -> None:
        """``close()`` on a stream after one chunk (or before any) leaves the model ready for the next call.

        Troubleshooting: write ``generate`` as a generator with a ``try/finally`` that stops the
        engine and releases what it holds; ``GeneratorExit`` arrives at the ``yield`` when the
        caller closes the stream. Do not swallow it and keep generating.
        """
        baseline = self._greedy_text(loaded_model, 0)
        for read in (1, 0):
            where = f"generate(...), {read} chunk(s) read, close()"
            stream = loaded_model.generate(self._messages(0), max_new_tokens=max(4 * self.max_new_tokens_for_tests, 16))
            if not callable(getattr(stream, "close", None)):
                checks.fail(f"generate returned {type(stream).__name__} without close()", where)
            for _ in range(read):
                next(stream)
            stream.close()
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
        yielding; do it in the hook itself, not inside the generator, so nothing is locked. If
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

    # ---- the store --------------------------------------------------------------------------------

    def test_store_list_entries_are_well_formed(
        self, plugin_manager: anyformer.PluginManager, stored_model: Any
    ) -> None:
        """``store_list`` returns StoreEntry items of this backend with repo, path and bytes; it never raises.

        Troubleshooting: return ``[StoreEntry(backend=backend_id, repo=..., revision=None or a
        str, path=str(path), bytes=size)]`` for files you keep under ``ANYFORMER_HOME`` (read the
        variable each call; tests point it elsewhere), or ``[]``. Hub cache entries are listed by
        the core, not by you. If the ``stored_model`` fixture stored something, it must be listed.
        """
        if not self.supports_store:
            pytest.skip("supports_store is False")
        entries, problems = plugin_manager.store_list()
        if problems:
            checks.fail(f"store_list failed: {problems}", "store_list()")
        for index, entry in enumerate(entries):
            checks.check_store_entry(entry, self.backend_id, f"store_list()[{index}]")
        if stored_model is not None and not any(e.backend == self.backend_id for e in entries):
            checks.fail("the stored_model fixture stored a model, but store_list listed nothing", "store_list()")
