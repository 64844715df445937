"""Each hookspec exercised through the plugin manager; a guard fails when a hookspec has no test here.

Test names follow ``test_hook_<hookspec>_<behaviour>`` so the guard can find them (as datasette's
``test_plugins.py`` does for its hooks).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from anyformer import (
    AnyformerError,
    Caps,
    Chunk,
    ErrorCode,
    GenerateOptions,
    Model,
    PluginManager,
    ProgressEvent,
    Refusal,
    Request,
    StoreEntry,
    Verdict,
    hookimpl,
    hookspecs,
)
from anyformer._session import start_generation
from anyformer.plugin import BackendModel, Features

MODEL = Model.from_dict({"repo": "org/m", "task": "text-generation", "files": [{"name": "m.gguf", "size": 10}]})


def hookspec_names() -> list[str]:
    marker = f"{hookspecs.PROJECT}_spec"
    return sorted(name for name, value in vars(hookspecs).items() if callable(value) and hasattr(value, marker))


class Handle(BackendModel):
    """A handle that answers with its backend's id, one token."""

    task = "text-generation"

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.generated = 0

    def generate(self, messages: list[Any], options: GenerateOptions) -> Any:
        self.generated += 1
        return iter([Chunk(delta=self.backend, tokens=1)])

    def dispose(self) -> None:
        pass


class Backend:
    """A plugin implementing every hook for one backend id, recording the calls it gets."""

    def __init__(self, name: str, entries: list[StoreEntry] | None = None) -> None:
        self.name = name
        self.entries = entries
        self.calls: list[str] = []

    @hookimpl
    def can_run(self, model: Model, caps: Caps, request: Request) -> Verdict:
        self.calls.append("can_run")
        return Verdict.accept(self.name)

    @hookimpl
    def load(self, model: Model, request: Request, progress: Any) -> Handle:
        # No backend argument and no guard on it: the core calls only the chosen backend's load.
        self.calls.append("load")
        progress(ProgressEvent(stage="load", backend=self.name, done=1, total=1))
        return Handle(self.name)

    @hookimpl
    def store_list(self) -> list[StoreEntry] | None:
        self.calls.append("store_list")
        return self.entries


def manager_with(*plugins: Any) -> PluginManager:
    manager = PluginManager()
    for plugin in plugins:
        manager.register(plugin, plugin.name)
    return manager


# ---- the guard -----------------------------------------------------------------------------------


def _tested_hooks() -> set[str]:
    tests = [name for name in globals() if name.startswith("test_hook_")]
    return {hook for hook in hookspec_names() if any(t.startswith(f"test_hook_{hook}_") for t in tests)}


@pytest.mark.parametrize("hook", hookspec_names())
def test_every_hookspec_has_a_test_here(hook: str) -> None:
    assert hook in _tested_hooks(), f"no test_hook_{hook}_… test in test_hookspecs.py"


# ---- can_run -------------------------------------------------------------------------------------


def test_hook_can_run_is_called_on_every_plugin_each_on_its_own() -> None:
    class Raises:
        name = "b-raises"

        @hookimpl
        def can_run(self) -> Verdict:
            raise ValueError("bad config")

    a, c = Backend("a"), Backend("c")
    verdicts = manager_with(c, Raises(), a).can_run(MODEL, Caps(ram_bytes=16 * 2**30), Request())
    assert [v.backend for v in verdicts] == ["a", "b-raises", "c"]
    assert verdicts[1].code is Refusal.RUNTIME and "ValueError: bad config" in verdicts[1].reason
    assert a.calls == c.calls == ["can_run"]


def test_hook_can_run_implementations_take_any_subset_of_arguments_in_any_order() -> None:
    seen: dict[str, Any] = {}

    class Picky:
        name = "picky"

        @hookimpl
        def can_run(self, request: Request, model: Model) -> Verdict:
            seen.update(request=request, model=model)
            return Verdict.accept("picky")

    class Blind:
        name = "blind"

        @hookimpl
        def can_run(self) -> Verdict:
            return Verdict.refuse("blind", Refusal.GPU, "needs a GPU")

    request = Request(task="text-generation", budget=10)
    verdicts = manager_with(Picky(), Blind()).can_run(MODEL, Caps(ram_bytes=16 * 2**30), request)
    assert [v.ok for v in verdicts] == [False, True]
    assert seen == {"request": request, "model": MODEL}


def test_hook_can_run_returning_none_gives_no_verdict() -> None:
    class StoreOnly:
        name = "store-only"

        @hookimpl
        def can_run(self) -> None:
            return None

    verdicts = manager_with(StoreOnly(), Backend("a")).can_run(MODEL, Caps(ram_bytes=16 * 2**30), Request())
    assert [v.backend for v in verdicts] == ["a"]


def test_hook_can_run_asks_only_the_named_backend() -> None:
    a, b = Backend("a"), Backend("b")
    assert [v.backend for v in manager_with(a, b).can_run(MODEL, Caps(ram_bytes=16 * 2**30), Request(), only="b")] == [
        "b"
    ]
    assert a.calls == []


def test_hook_can_run_raising_anyformer_error_is_a_runtime_refusal() -> None:
    class Strict:
        name = "strict"

        @hookimpl
        def can_run(self) -> Verdict:
            raise AnyformerError(ErrorCode.BAD_MODEL, "header says 10000 blocks")

    [verdict] = manager_with(Strict()).can_run(MODEL, Caps(ram_bytes=16 * 2**30), Request())
    assert verdict.code is Refusal.RUNTIME and "BAD_MODEL: header says 10000 blocks" in verdict.reason


# ---- load ----------------------------------------------------------------------------------------


def test_hook_load_is_called_only_for_the_named_backend() -> None:
    a, b = Backend("a"), Backend("b")
    events: list[ProgressEvent] = []
    handle = manager_with(a, b).load("b", MODEL, Request(), events.append)
    assert handle.backend == "b"
    assert a.calls == [] and b.calls == ["load"]
    assert [e.stage for e in events] == ["load"]


def test_hook_load_of_an_unknown_backend_is_bad_request() -> None:
    with pytest.raises(AnyformerError) as caught:
        manager_with(Backend("a")).load("zz", MODEL, Request(), lambda e: None)
    assert caught.value.code is ErrorCode.BAD_REQUEST


class _DuckHandle:
    """The old duck-typed shape: backend, task and dispose, but no BackendModel base."""

    backend, task = "loader", "text-generation"

    def dispose(self) -> None:
        pass


def _loader(result: Any) -> Any:
    class Loader:
        name = "loader"

        @hookimpl
        def load(self) -> Any:
            if isinstance(result, BaseException):
                raise result
            return result

    return Loader()


@pytest.mark.parametrize(
    ("result", "code"),
    [
        (RuntimeError("CUDA driver too old"), ErrorCode.PLUGIN_ERROR),
        (MemoryError(), ErrorCode.OUT_OF_MEMORY),
        (AnyformerError(ErrorCode.BAD_MODEL, "truncated"), ErrorCode.BAD_MODEL),
        (SystemExit(1), ErrorCode.PLUGIN_ERROR),
        (None, ErrorCode.PLUGIN_ERROR),
        (Handle("someone-else"), ErrorCode.PLUGIN_ERROR),
        (object(), ErrorCode.PLUGIN_ERROR),
        (_DuckHandle(), ErrorCode.PLUGIN_ERROR),
    ],
    ids=["raises", "memory-error", "anyformer-error", "sys-exit", "none", "wrong-backend", "no-dispose", "duck-typed"],
)
def test_hook_load_failures_become_anyformer_errors(result: Any, code: ErrorCode) -> None:
    with pytest.raises(AnyformerError) as caught:
        manager_with(_loader(result)).load("loader", MODEL, Request(), lambda e: None)
    assert caught.value.code is code
    if isinstance(result, Exception) and not isinstance(result, AnyformerError):
        assert caught.value.__cause__ is result


def test_hook_load_missing_from_a_plugin_is_plugin_error() -> None:
    class OnlyCanRun:
        name = "only"

        @hookimpl
        def can_run(self) -> Verdict:
            return Verdict.accept("only")

    with pytest.raises(AnyformerError, match="no load hook") as caught:
        manager_with(OnlyCanRun()).load("only", MODEL, Request(), lambda e: None)
    assert caught.value.code is ErrorCode.PLUGIN_ERROR


def test_hook_load_returning_a_handle_with_wrong_features_is_plugin_error_and_disposes_it() -> None:
    class Confused(Handle):
        features = Features(prompt_logprobs=True)  # scores raw prompts it does not take

        def dispose(self) -> None:
            self.disposed = True

    handle = Confused("loader")
    with pytest.raises(AnyformerError, match="prompt_logprobs needs raw_text") as caught:
        manager_with(_loader(handle)).load("loader", MODEL, Request(), lambda e: None)
    assert caught.value.code is ErrorCode.PLUGIN_ERROR and handle.disposed


# ---- generation: the handle's method, not a hook --------------------------------------------------


def test_generation_is_the_handles_own_method() -> None:
    handle = manager_with(Backend("a"), Backend("b")).load("b", MODEL, Request(), lambda e: None)
    stream = start_generation(handle, [{"role": "user", "content": "hi"}], GenerateOptions())
    assert [c.delta for c in stream] == ["b"]
    assert isinstance(handle, Handle) and handle.generated == 1


def test_generation_returning_none_is_plugin_error() -> None:
    class Silent(Handle):
        def generate(self, messages: list[Any], options: GenerateOptions) -> Any:
            return None

    with pytest.raises(AnyformerError) as caught:
        start_generation(Silent("silent"), [], GenerateOptions())
    assert caught.value.code is ErrorCode.PLUGIN_ERROR


def test_generation_on_a_handle_that_does_not_chat_is_bad_request() -> None:
    class Embedder(BackendModel):
        backend, task = "embedder", "feature-extraction"

        def run(self, input: Any, **options: Any) -> Any:
            return input

        def dispose(self) -> None:
            pass

    with pytest.raises(AnyformerError, match="does not generate text") as caught:
        start_generation(Embedder(), [], GenerateOptions())
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_generation_may_return_any_iterable() -> None:
    class Listy(Handle):
        def generate(self, messages: list[Any], options: GenerateOptions) -> Any:
            return [Chunk(delta="x", tokens=1), Chunk(delta="y", tokens=2)]

    stream = start_generation(Listy("listy"), [], GenerateOptions())
    assert "".join(c.delta for c in stream) == "xy"


# ---- store_list ----------------------------------------------------------------------------------


def _entry(backend: str) -> StoreEntry:
    return StoreEntry(backend=backend, repo=f"org/{backend}", revision="main", path=f"/store/{backend}", bytes=10)


def test_hook_store_list_collects_entries_from_every_plugin() -> None:
    manager = manager_with(Backend("a", [_entry("a")]), Backend("b"), Backend("c", [_entry("c")]))
    entries, problems = manager.store_list()
    assert [e.backend for e in entries] == ["a", "c"] and problems == []


def test_hook_store_list_failures_are_reported_and_the_others_still_listed() -> None:
    class Broken:
        name = "broken"

        @hookimpl
        def store_list(self) -> list[Any]:
            raise OSError("permission denied: /store")

    class Quits:
        name = "quits"

        @hookimpl
        def store_list(self) -> list[Any]:
            sys.exit(2)

    class Wrong:
        name = "wrong"

        @hookimpl
        def store_list(self) -> list[Any]:
            return [{"repo": "org/x"}]

    manager = manager_with(Broken(), Quits(), Wrong(), Backend("ok", [_entry("ok")]))
    entries, problems = manager.store_list()
    assert [e.backend for e in entries] == ["ok"]
    assert len(problems) == 3
    assert any(p.startswith("broken: store_list raised OSError") for p in problems)
    assert any(p.startswith("quits:") for p in problems)
    assert any("wrong: store_list returned dict" in p for p in problems)
