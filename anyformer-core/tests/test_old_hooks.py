"""A backend written for the hooks before the handle owned generation gets one line saying what to change.

The old shape had a ``generate(loaded, messages, options)`` hook and a ``load`` taking ``backend``.
pluggy alone would call such a plugin "unknown hook 'generate'" or list argument names; the host
reports it as written for the old hooks, with the fix, and never asks it anything.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer import AnyformerError, Caps, Chunk, ErrorCode, PluginManager, Request, Verdict, hookimpl
from anyformer._old_hooks import old_hook_problems

#: The old template's shape: a generate hook, and load taking the backend's id with its guard.
OLD_SHAPE = """
from anyformer import Chunk, Estimate, Rank, Verdict, hookimpl

class Handle:
    backend, task = "old-shape", "text-generation"

    def dispose(self):
        pass

@hookimpl
def can_run(model, caps, request):
    return Verdict.accept("old-shape", Estimate(ram_bytes=1, rank=Rank.GENERAL))

@hookimpl
def load(backend, model, request, progress):
    if backend != "old-shape":
        return None
    return Handle()

@hookimpl
def generate(loaded, messages, options):
    return iter([Chunk(delta="hi", tokens=1)])
"""

HEALTHY = """
from anyformer import Estimate, Rank, Verdict, hookimpl

@hookimpl
def can_run(model, caps, request):
    return Verdict.accept("healthy", Estimate(ram_bytes=1, rank=Rank.GENERAL))
"""


class _OldGenerate:
    @hookimpl
    def can_run(self) -> Verdict:
        raise AssertionError("an outdated plugin is never asked")

    @hookimpl
    def generate(self, loaded: Any, messages: Any, options: Any) -> Any:
        return iter([Chunk(delta="hi", tokens=1)])


class _OldLoad:
    @hookimpl
    def load(self, backend: str, model: Any) -> Any:
        return None


def _error_of(plugin: Any, name: str) -> str:
    manager = PluginManager()
    manager.register(plugin, name)
    [info] = manager.plugins()
    assert not info.ok and manager.backends() == []
    return info.error or ""


def test_a_generate_hook_is_reported_with_where_generation_moved() -> None:
    error = _error_of(_OldGenerate(), "old")
    assert error.startswith("written for the old hooks: the generate hook is gone")
    assert "generate(messages, options)" in error and "anyformer.plugin.BackendModel" in error
    assert "load no longer takes backend" not in error
    assert "docs/plugin-author-guide.md" in error and "\n" not in error


def test_a_load_taking_backend_is_reported_with_what_to_drop() -> None:
    error = _error_of(_OldLoad(), "old")
    assert error.startswith("written for the old hooks: load no longer takes backend")
    assert "generate hook" not in error


def test_an_outdated_plugin_is_never_asked_and_naming_it_is_a_plugin_error() -> None:
    manager = PluginManager()
    manager.register(_OldGenerate(), "old")
    assert manager.can_run(anyformer.Model.from_dict({"repo": "org/m"}), Caps(ram_bytes=2**30), Request()) == []
    with pytest.raises(AnyformerError, match="written for the old hooks") as caught:
        manager.require_backend("old")
    assert caught.value.code is ErrorCode.PLUGIN_ERROR


def test_a_plugin_with_a_function_merely_named_generate_is_not_outdated() -> None:
    class Helper:
        def generate(self) -> None:
            """Not a hook implementation: no marker."""

        @hookimpl
        def can_run(self) -> Verdict:
            return Verdict.accept("helper")

    manager = PluginManager()
    manager.register(Helper(), "helper")
    assert manager.backends() == ["helper"]


def _write(distributions: Any) -> None:
    distributions.add("aftest-old-shape", "0.9", {"old-shape": "aftest_old_shape"}, {"aftest_old_shape": OLD_SHAPE})
    distributions.add("aftest-healthy", "1.0", {"healthy": "aftest_healthy"}, {"aftest_healthy": HEALTHY})
    distributions.expected = {"old-shape": ("aftest-old-shape", "0.9"), "healthy": ("aftest-healthy", "1.0")}


def test_cli_plugins_says_in_one_line_what_changed(distributions: Any, run_cli: Any) -> None:
    _write(distributions)
    result = run_cli("plugins", plugins=distributions, env={"COLUMNS": "1000"})
    assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr
    [line] = [line for line in result.stdout.splitlines() if "old-shape" in line]
    assert "written for the old hooks: the generate hook is gone" in line
    assert "load no longer takes backend" in line
    listed = {entry["name"]: entry for entry in run_cli("plugins", "--json", plugins=distributions).json()}
    assert listed["old-shape"]["ok"] is False and listed["healthy"]["ok"] is True


def test_cli_check_answers_and_names_the_outdated_plugin(distributions: Any, run_cli: Any, tmp_path: Path) -> None:
    _write(distributions)
    (tmp_path / "m.json").write_text('{"repo": "org/m", "files": [{"name": "m.gguf", "size": 10}]}')
    result = run_cli("check", "--describe", "m.json", "--ram", "16GB", plugins=distributions)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("not asked old-shape")]
    assert "written for the old hooks" in line and "docs/plugin-author-guide.md" in line
    assert "chosen: healthy" in result.stdout


def test_load_naming_the_outdated_backend_is_a_plugin_error_saying_what_changed(distributions: Any) -> None:
    _write(distributions)
    manager = PluginManager()
    manager.load_entry_points()
    with pytest.raises(AnyformerError, match="the generate hook is gone") as caught:
        anyformer.load({"repo": "org/m"}, backend="old-shape", caps=Caps(ram_bytes=2**30), plugins=manager)
    assert caught.value.code is ErrorCode.PLUGIN_ERROR


# ---- every backend in this repository has the new shape ------------------------------------------

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


def _hookimpls(tree: ast.AST) -> list[ast.FunctionDef]:
    def marked(function: ast.FunctionDef) -> bool:
        return any(
            (isinstance(d, ast.Name) and d.id == "hookimpl") or (isinstance(d, ast.Attribute) and d.attr == "hookimpl")
            for d in function.decorator_list
        )

    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and marked(node)]


def old_shapes(source: str) -> list[str]:
    """What in ``source`` is still the old hook shape: a generate hook, a load taking backend or returning None."""
    found = []
    for function in _hookimpls(ast.parse(source)):
        if function.name == "generate":
            found.append(f"line {function.lineno}: a generate hook")
        if function.name != "load":
            continue
        if "backend" in [a.arg for a in function.args.args + function.args.kwonlyargs]:
            found.append(f"line {function.lineno}: load takes backend")
        for node in ast.walk(function):
            if isinstance(node, ast.Return) and (node.value is None or ast.unparse(node.value) == "None"):
                found.append(f"line {node.lineno}: load returns None")
    return found


def test_the_scan_finds_each_old_shape() -> None:
    found = [what.split(": ", 1)[1] for what in old_shapes(OLD_SHAPE)]
    assert sorted(found) == ["a generate hook", "load returns None", "load takes backend"]
    assert old_shapes(HEALTHY) == []


@pytest.mark.parametrize("source", sorted(PLUGINS.glob("*/src/**/*.py")), ids=lambda p: str(p.relative_to(PLUGINS)))
def test_no_backend_here_keeps_an_old_hook_shape(source: Path) -> None:
    assert old_shapes(source.read_text(encoding="utf-8")) == []


def test_docs_hooks_md_shows_the_line_as_it_is_written() -> None:
    class Both:
        @hookimpl
        def load(self, backend: str) -> Any:
            return None

        @hookimpl
        def generate(self, loaded: Any) -> Any:
            return None

    line = old_hook_problems(Both())
    assert line is not None and "\n" + line + "\n" in (PLUGINS.parent / "docs" / "hooks.md").read_text(encoding="utf-8")
