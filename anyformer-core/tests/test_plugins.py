"""Plugin isolation (SAFETY.md L1–L4): one broken plugin is listed by name, the others keep working.

Most tests install real distributions (``*.dist-info`` with entry points) into a folder on
``sys.path``, so loading goes through ``importlib.metadata`` as it does for pip-installed plugins.
"""

from __future__ import annotations

import importlib.metadata
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer import AnyformerError, Caps, ErrorCode, PluginManager, Refusal, Request, Verdict, hookimpl


def _loaded(manager: PluginManager | None = None) -> PluginManager:
    manager = manager or PluginManager()
    manager.load_entry_points()
    return manager


def _infos(manager: PluginManager) -> dict[str, anyformer.PluginInfo]:
    return {info.name: info for info in manager.plugins()}


def _model() -> anyformer.Model:
    return anyformer.Model.from_dict({"repo": "org/m", "files": [{"name": "m-Q4_0.gguf", "size": 10**8}]})


# ---- real distributions, in process --------------------------------------------------------------


def test_healthy_plugin_loads_with_its_distribution_and_version(broken_set: Any) -> None:
    info = _infos(_loaded())["healthy"]
    assert info.ok and info.error is None
    assert (info.distribution, info.version) == ("aftest-healthy", "1.0.0")
    assert info.to_dict()["backends"] == ["healthy"]


@pytest.mark.safety("L1", "L3", "L4")
@pytest.mark.parametrize(
    ("name", "error_part"),
    [
        ("raises-at-import", "RuntimeError: libengine.so: cannot open shared object file"),
        ("exits-at-import", "sys.exit(7)"),
        ("missing-module", "No module named 'aftest_no_such_module'"),
        ("misspelt-hook", "can_runn"),
    ],
)
def test_broken_plugin_is_listed_with_distribution_version_and_error(
    broken_set: Any, name: str, error_part: str
) -> None:
    manager = _loaded()
    info = _infos(manager)[name]
    assert not info.ok
    assert (info.distribution, info.version) == broken_set.expected[name]
    assert error_part in (info.error or "")
    assert name not in manager.backends()
    assert info.to_dict()["backends"] == []


@pytest.mark.safety("L1")
def test_broken_plugins_do_not_stop_the_healthy_ones_from_loading(broken_set: Any) -> None:
    backends = _loaded().backends()
    assert "healthy" in backends
    assert "raises-in-can-run" in backends  # it imports fine; it fails only when asked


@pytest.mark.safety("L3")
def test_misspelt_hookimpl_is_reported_as_invalid_and_unregistered(broken_set: Any) -> None:
    manager = _loaded()
    error = _infos(manager)["misspelt-hook"].error or ""
    assert error.startswith("invalid plugin")
    verdicts = manager.can_run(_model(), Caps(gpu=True, ram_bytes=16 * 2**30), Request(budget=4 * 10**9))
    assert "misspelt-hook" not in {v.backend for v in verdicts}


@pytest.mark.safety("L4")
def test_sys_exit_at_import_does_not_end_the_process(broken_set: Any) -> None:
    manager = _loaded()  # reaching the next line is the test: SystemExit was caught
    assert "sys.exit" in (_infos(manager)["exits-at-import"].error or "")
    assert "aftest_exit" not in sys.modules


@pytest.mark.safety("L2")
def test_plugin_raising_in_can_run_gets_a_runtime_verdict_and_the_rest_answer(broken_set: Any) -> None:
    manager = _loaded()
    verdicts = {
        v.backend: v for v in manager.can_run(_model(), Caps(gpu=True, ram_bytes=16 * 2**30), Request(budget=4 * 10**9))
    }
    raiser = verdicts["raises-in-can-run"]
    assert not raiser.ok and raiser.code is Refusal.RUNTIME
    assert "RuntimeError" in raiser.reason and "engine exploded" in raiser.reason
    assert verdicts["healthy"].ok


def test_check_chooses_the_healthy_plugin_among_broken_ones(broken_set: Any) -> None:
    _, selection = anyformer.check(
        anyformer.Model.from_dict({"repo": "org/m", "files": [{"name": "m.gguf", "size": 10**8}]}),
        budget="4GB",
        caps=Caps(gpu=True, f16=True, ram_bytes=16 * 10**9),
        plugins=_loaded(),
    )
    assert selection.chosen_backend == "healthy"


# ---- the environment's filters -------------------------------------------------------------------


def test_anyformer_plugins_loads_only_the_named_ones(broken_set: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYFORMER_PLUGINS", " healthy , raises-at-import")
    assert set(_infos(_loaded())) == {"healthy", "raises-at-import"}


def test_anyformer_disable_plugins_skips_the_named_ones(broken_set: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYFORMER_DISABLE_PLUGINS", "exits-at-import,missing-module")
    names = set(_infos(_loaded()))
    assert "exits-at-import" not in names and "missing-module" not in names
    assert {"healthy", "raises-in-can-run", "raises-at-import", "misspelt-hook"} <= names


def test_disable_wins_over_plugins(broken_set: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYFORMER_PLUGINS", "healthy,raises-in-can-run")
    monkeypatch.setenv("ANYFORMER_DISABLE_PLUGINS", "healthy")
    assert set(_infos(_loaded())) == {"raises-in-can-run"}


def test_disabled_plugin_module_is_never_imported(broken_set: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYFORMER_DISABLE_PLUGINS", "raises-in-can-run")
    _loaded()
    assert "aftest_raiser" not in sys.modules


# ---- hand-built entry points (as xarray's tests build them) --------------------------------------


@pytest.fixture
def in_memory_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A plugin module that lives only in ``sys.modules``: a good hookimpl and a broken attribute."""
    module = types.ModuleType("aftest_in_memory")

    @hookimpl
    def can_run(model: Any) -> Verdict:
        return Verdict.accept("handmade")

    module.can_run = can_run  # type: ignore[attr-defined]
    module.plugin = types.SimpleNamespace(can_run=can_run)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "aftest_in_memory", module)
    return module


def _entry_point(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group="anyformer")


def test_hand_built_entry_points_load_without_a_distribution(in_memory_module: types.ModuleType) -> None:
    manager = PluginManager()
    manager.load_entry_points([_entry_point("handmade", "aftest_in_memory")])
    info = _infos(manager)["handmade"]
    assert info.ok and info.distribution is None and info.version is None and info.value == "aftest_in_memory"
    assert [v.backend for v in manager.can_run(_model(), Caps(ram_bytes=16 * 2**30), Request())] == ["handmade"]


@pytest.mark.safety("L1")
def test_an_entry_point_that_raises_does_not_stop_the_next_one(in_memory_module: types.ModuleType) -> None:
    manager = PluginManager()
    manager.load_entry_points(
        [_entry_point("a-broken", "aftest_in_memory:no_such_attribute"), _entry_point("handmade", "aftest_in_memory")]
    )
    infos = _infos(manager)
    assert not infos["a-broken"].ok and "AttributeError" in (infos["a-broken"].error or "")
    assert manager.backends() == ["handmade"]


def test_a_second_entry_point_with_the_same_name_is_listed_and_the_first_kept(
    in_memory_module: types.ModuleType,
) -> None:
    manager = PluginManager()
    manager.load_entry_points(
        [_entry_point("handmade", "aftest_in_memory"), _entry_point("handmade", "aftest_in_memory:plugin")]
    )
    assert manager.backends() == ["handmade"]
    duplicates = [info for info in manager.plugins() if not info.ok]
    assert len(duplicates) == 1 and "a second plugin named 'handmade'" in (duplicates[0].error or "")


def test_hand_built_entry_points_honour_the_environment_filters(
    in_memory_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANYFORMER_DISABLE_PLUGINS", "handmade")
    manager = PluginManager()
    manager.load_entry_points([_entry_point("handmade", "aftest_in_memory")])
    assert manager.plugins() == []


# ---- verdicts that break the hook's contract ------------------------------------------------------


class _Returns:
    def __init__(self, value: Any) -> None:
        self.value = value

    @hookimpl
    def can_run(self) -> Any:
        return self.value() if callable(self.value) else self.value


@pytest.mark.parametrize(
    ("returned", "reason_part"),
    [
        (Verdict.accept("someone-else"), "verdict for 'someone-else'"),
        ({"backend": "liar", "ok": True}, "returned dict, not an anyformer.Verdict"),
        (True, "returned bool"),
        (lambda: Verdict.refuse("liar", Refusal.BUDGET, "too big"), "must carry need"),
        (lambda: Verdict.refuse("liar", Refusal.FORMAT, "no GGUF", need=5), "only budget and memory"),
        (lambda: Verdict.refuse("liar", "too-slow", "no"), "unknown refusal code"),
    ],
    ids=["wrong-backend-id", "dict", "bool", "budget-without-need", "need-on-format", "unknown-code"],
)
def test_a_verdict_that_breaks_the_contract_becomes_a_runtime_refusal(returned: Any, reason_part: str) -> None:
    manager = PluginManager()
    manager.register(_Returns(returned), "liar")
    manager.register(_Returns(Verdict.accept("honest")), "honest")
    verdicts = {v.backend: v for v in manager.can_run(_model(), Caps(ram_bytes=16 * 2**30), Request())}
    assert verdicts["liar"].code is Refusal.RUNTIME and not verdicts["liar"].ok
    assert reason_part in verdicts["liar"].reason
    assert verdicts["honest"].ok


_GiB = 2**30


@pytest.mark.parametrize(
    ("estimate", "caps", "request_", "reason_part"),
    [
        (
            anyformer.Estimate(gpu_bytes=3 * _GiB),
            Caps(gpu=True, ram_bytes=_GiB),
            Request(budget=2 * _GiB),
            f"estimating {3 * _GiB} bytes of accelerator memory, more than the {2 * _GiB} bytes budget",
        ),
        (
            anyformer.Estimate(gpu_bytes=3 * _GiB),
            Caps(gpu=True, gpu_bytes=2 * _GiB, ram_bytes=_GiB),
            Request(),
            f"more than the {2 * _GiB} bytes budget",
        ),
        (
            anyformer.Estimate(ram_bytes=5 * _GiB),
            Caps(ram_bytes=4 * _GiB),
            Request(),
            f"estimating {5 * _GiB} bytes of host memory, more than the {4 * _GiB} bytes available",
        ),
    ],
    ids=["gpu-over-the-budget", "gpu-over-the-probed-memory", "ram-over-ram_bytes"],
)
def test_an_ok_verdict_estimating_more_than_was_offered_becomes_a_runtime_refusal(
    estimate: anyformer.Estimate, caps: Caps, request_: Request, reason_part: str
) -> None:
    manager = PluginManager()
    manager.register(_Returns(Verdict.accept("greedy", estimate)), "greedy")
    manager.register(_Returns(Verdict.accept("modest", anyformer.Estimate(ram_bytes=1))), "modest")
    verdicts = {v.backend: v for v in manager.can_run(_model(), caps, request_)}
    greedy = verdicts["greedy"]
    assert not greedy.ok and greedy.code is Refusal.RUNTIME
    assert greedy.reason.startswith("plugin error: an ok verdict") and reason_part in greedy.reason
    assert verdicts["modest"].ok


@pytest.mark.parametrize(
    ("estimate", "caps", "request_"),
    [
        (
            anyformer.Estimate(gpu_bytes=2 * _GiB, ram_bytes=_GiB),
            Caps(gpu=True, ram_bytes=_GiB),
            Request(budget=2 * _GiB),
        ),
        (anyformer.Estimate(gpu_bytes=10 * _GiB), Caps(gpu=True, ram_bytes=_GiB), Request()),  # no GPU size known
    ],
    ids=["exactly-what-was-offered", "gpu-memory-unknown-and-no-budget"],
)
def test_an_ok_verdict_within_what_was_offered_stands(
    estimate: anyformer.Estimate, caps: Caps, request_: Request
) -> None:
    manager = PluginManager()
    manager.register(_Returns(Verdict.accept("fits", estimate)), "fits")
    [verdict] = manager.can_run(_model(), caps, request_)
    assert verdict.ok and verdict.estimate == estimate


def test_registering_a_taken_name_keeps_the_first_plugin_and_never_asks_the_second() -> None:
    manager = PluginManager()
    first, second = _Returns(Verdict.accept("twin")), _Returns(lambda: pytest.fail("the second 'twin' was asked"))
    manager.register(first, "twin")
    manager.register(second, "twin")
    kept, refused = manager.plugins()
    assert (kept.name, kept.ok, kept.value) == ("twin", True, repr(first))
    assert (refused.name, refused.ok) == ("twin", False) and "a second plugin named 'twin'" in str(refused.error)
    assert manager.backends() == ["twin"]
    [verdict] = manager.can_run(_model(), Caps(ram_bytes=_GiB), Request())
    assert verdict.ok and verdict.backend == "twin"


@pytest.mark.safety("L2")
def test_sys_exit_inside_can_run_is_a_runtime_refusal() -> None:
    def leave() -> None:
        sys.exit(4)

    manager = PluginManager()
    manager.register(_Returns(leave), "quitter")
    [verdict] = manager.can_run(_model(), Caps(ram_bytes=16 * 2**30), Request())
    assert verdict.code is Refusal.RUNTIME and "sys.exit(4)" in verdict.reason


@pytest.mark.safety("L3")
def test_hookimpl_with_an_argument_not_in_the_spec_is_invalid() -> None:
    class Wrong:
        @hookimpl
        def can_run(self, model: Any, gpu_count: int) -> None:
            """``gpu_count`` is no argument of the can_run hookspec."""

    manager = PluginManager()
    manager.register(Wrong(), "wrong")
    [info] = manager.plugins()
    assert not info.ok and "invalid plugin" in (info.error or "") and "gpu_count" in (info.error or "")
    assert manager.backends() == []


# ---- naming a backend ----------------------------------------------------------------------------


def test_require_backend_unknown_name_is_bad_request_listing_the_installed_ones(broken_set: Any) -> None:
    manager = _loaded()
    with pytest.raises(AnyformerError) as caught:
        manager.require_backend("llamacpp-typo")
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert "llamacpp-typo" in caught.value.message
    assert "healthy" in caught.value.message and "raises-in-can-run" in caught.value.message


def test_require_backend_with_nothing_installed_says_none() -> None:
    with pytest.raises(AnyformerError, match="installed: none") as caught:
        PluginManager().require_backend("llamacpp")
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_require_backend_naming_a_broken_plugin_gives_its_load_error(broken_set: Any) -> None:
    with pytest.raises(AnyformerError, match=r"libengine\.so") as caught:
        _loaded().require_backend("raises-at-import")
    assert caught.value.code is ErrorCode.PLUGIN_ERROR


def test_check_with_an_unknown_backend_raises_before_describing(broken_set: Any) -> None:
    with pytest.raises(AnyformerError) as caught:
        anyformer.check("/no/such/model.gguf", backend="nope", caps=Caps(ram_bytes=16 * 2**30), plugins=_loaded())
    assert caught.value.code is ErrorCode.BAD_REQUEST


# ---- the same, through the CLI in a fresh process ------------------------------------------------


def test_cli_plugins_lists_broken_plugins_by_name_without_a_traceback(broken_set: Any, run_cli: Any) -> None:
    result = run_cli("plugins", "--json", path=broken_set.root)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    listed = {entry["name"]: entry for entry in result.json()}
    for name, (distribution, version) in broken_set.expected.items():
        entry = listed[name]
        assert (entry["distribution"], entry["version"]) == (distribution, version)
        broken = name not in ("healthy", "raises-in-can-run")
        assert entry["ok"] is not broken
        assert bool(entry["error"]) is broken
    assert listed["healthy"]["backends"] == ["healthy"]


def test_cli_plugins_table_names_the_broken_plugins(broken_set: Any, run_cli: Any) -> None:
    result = run_cli("plugins", path=broken_set.root, env={"COLUMNS": "400"})
    assert result.returncode == 0 and "Traceback" not in result.stderr
    for name in ("raises-at-import", "exits-at-import", "missing-module", "misspelt-hook"):
        assert name in result.stdout


def test_cli_check_gets_an_answer_from_the_healthy_plugin_among_broken_ones(
    broken_set: Any, run_cli: Any, tmp_path: Path
) -> None:
    (tmp_path / "m.json").write_text('{"repo": "org/m", "files": [{"name": "m-Q4_0.gguf", "size": 100000000}]}')
    result = run_cli(
        "check",
        "--describe",
        "m.json",
        "--caps",
        "gpu,f16",
        "--budget",
        "4GB",
        "--ram",
        "16GB",
        "--json",
        plugins=broken_set,
    )
    assert "Traceback" not in result.stderr + result.stdout
    assert result.returncode == 0, result.stderr
    answer = result.json()
    assert answer["chosen"] == "healthy"
    verdicts = {v["backend"]: v for v in answer["verdicts"]}
    assert verdicts["raises-in-can-run"]["code"] == "runtime"
    assert "engine exploded" in verdicts["raises-in-can-run"]["reason"]
    assert not {"raises-at-import", "exits-at-import", "missing-module", "misspelt-hook"} & set(verdicts)
