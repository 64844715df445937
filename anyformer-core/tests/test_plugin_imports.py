"""Backends use the public plugin API only: no package under plugins/ imports a private core module.

``anyformer.plugin`` (and the top-level ``anyformer``) is what a backend may import; any name with
a leading underscore under ``anyformer`` (``anyformer._plugins``, ``anyformer.store._store``,
``from anyformer import _caps``) moves between releases. Every plugins/*/src is scanned, so a new
backend folder is covered without being named here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


def _private(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "anyformer" and any(part.startswith("_") for part in parts[1:])


def private_imports(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """``(line, what)`` for every import of a private anyformer module in ``source``."""
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _private(alias.name):
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _private(node.module):
                yield node.lineno, f"from {node.module} import ..."
            elif node.module.split(".")[0] == "anyformer":
                for alias in node.names:
                    if alias.name.startswith("_"):
                        yield node.lineno, f"from {node.module} import {alias.name}"


def _plugin_sources() -> list[Path]:
    return sorted(PLUGINS.glob("*/src/**/*.py"))


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import anyformer._plugins", ["import anyformer._plugins"]),
        ("from anyformer.store._store import fetch_files", ["from anyformer.store._store import ..."]),
        ("from anyformer import _caps", ["from anyformer import _caps"]),
        ("from anyformer.store import _paths", ["from anyformer.store import _paths"]),
        ("from anyformer.plugin import fetch_files\nimport anyformer\nfrom anyformer import Verdict", []),
        ("from anyformer_llamacpp import _private_helper", []),
    ],
)
def test_the_scan_finds_private_imports_and_only_those(source: str, found: list[str]) -> None:
    assert [what for _line, what in private_imports(source)] == found


def test_every_plugin_source_is_scanned() -> None:
    folders = {path.relative_to(PLUGINS).parts[0] for path in _plugin_sources()}
    expected = {p.name for p in PLUGINS.iterdir() if (p / "src").is_dir()}
    assert folders == expected and {"_template", "anyformer-llamacpp"} <= folders


def test_no_plugin_imports_a_private_anyformer_module() -> None:
    offences = [
        f"{path.relative_to(PLUGINS.parent)}:{line}: {what}"
        for path in _plugin_sources()
        for line, what in private_imports(path.read_text(encoding="utf-8"), str(path))
    ]
    assert not offences, "import these from anyformer.plugin instead:\n" + "\n".join(offences)


def test_every_name_of_the_public_plugin_api_is_documented() -> None:
    import inspect

    import anyformer.plugin

    names = anyformer.plugin.__all__
    assert len(names) == len(set(names)) and sorted(names) == sorted(n for n in names if hasattr(anyformer.plugin, n))
    undocumented = [
        name
        for name in names
        if (inspect.isclass(getattr(anyformer.plugin, name)) or inspect.isfunction(getattr(anyformer.plugin, name)))
        and not inspect.getdoc(getattr(anyformer.plugin, name))
    ]
    assert undocumented == []
    module_doc = anyformer.plugin.__doc__ or ""
    assert [name for name in names if name not in module_doc] == [], "the module docstring lists every name"
