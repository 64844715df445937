"""The public names' lists, checked: ``anyformer/__init__.py`` keeps three (the ``TYPE_CHECKING`` imports type
checkers read, ``_EXPORTS`` that the lazy ``__getattr__`` reads, ``__all__``) and ``anyformer.plugin`` one.

They must agree with each other, every name must import and be the object its home module defines, a
name both modules export must be one object, and every name must be documented in docs/ (the user
guide's and the plugin author guide's tables, or contract.md). On a mismatch the message prints the
``TYPE_CHECKING`` block and ``__all__`` generated from ``_EXPORTS``, to paste in place.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import anyformer
import anyformer.plugin

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_INIT = ROOT / "anyformer-core" / "src" / "anyformer" / "__init__.py"
PLUGIN_MODULE = ROOT / "anyformer-core" / "src" / "anyformer" / "plugin.py"
#: Where a public name is documented: the contract, and the two guides' tables of names.
DOCS = [ROOT / "docs" / name for name in ("contract.md", "user-guide.md", "plugin-author-guide.md")]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def type_checking_imports(tree: ast.Module) -> dict[str, str]:
    """``{name: module}`` of the ``if TYPE_CHECKING:`` block's ``from module import name`` lines."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module, ast.dump(statement)
                for alias in statement.names:
                    found[alias.asname or alias.name] = statement.module
    return found


def literal(tree: ast.Module, name: str) -> object:
    """The value of a module-level ``name = <literal>`` assignment."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"no {name} = ... in the module")


def module_level_imports(tree: ast.Module) -> dict[str, str]:
    """``{bound name: module}`` of a module's top-level ``from module import name [as bound]`` lines."""
    return {
        alias.asname or alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__"
        for alias in node.names
    }


def generated_lists(exports: dict[str, str]) -> str:
    """The ``TYPE_CHECKING`` block and ``__all__`` that ``_EXPORTS`` implies (ruff's isort order)."""
    by_module: dict[str, list[str]] = {}
    for name, module in exports.items():
        by_module.setdefault(module, []).append(name)
    lines = ["if TYPE_CHECKING:"]
    for module in sorted(by_module):
        names = sorted(by_module[module], key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
        lines.append(f"    from {module} import {', '.join(names)}")
    lines.append("\n__all__ = [")
    lines += [f'    "{name}",' for name in sorted([*exports, "__version__"])]
    lines.append("]")
    return "\n".join(lines)


def _documented(name: str, texts: list[str]) -> bool:
    """``name`` stands in a code span (`` `name` ``, `` `name(...)` ``, `` `anyformer.name` ``) of some doc."""
    pattern = re.compile(r"`[^`\n]*(?<![\w.])(?:anyformer\.(?:plugin\.)?)?" + re.escape(name) + r"(?![\w])[^`\n]*`")
    return any(pattern.search(text) for text in texts)


@pytest.fixture(scope="module")
def docs_text() -> list[str]:
    return [path.read_text(encoding="utf-8") for path in DOCS]


def test_the_package_lists_agree() -> None:
    tree = _tree(PACKAGE_INIT)
    exports = literal(tree, "_EXPORTS")
    declared = literal(tree, "__all__")
    assert isinstance(exports, dict) and isinstance(declared, list)
    hint = "\nfrom _EXPORTS, these lists read:\n" + generated_lists(exports)
    assert type_checking_imports(tree) == exports, "the TYPE_CHECKING imports and _EXPORTS differ" + hint
    assert len(declared) == len(set(declared)), "a name twice in __all__"
    assert set(declared) == {*exports, "__version__"}, "__all__ and _EXPORTS differ" + hint
    assert anyformer.__all__ == declared


def test_every_package_name_imports_from_its_home() -> None:
    for name, home in anyformer._EXPORTS.items():
        value = getattr(anyformer, name)
        assert value is getattr(importlib.import_module(home), name), f"anyformer.{name} is not {home}.{name}"
    assert sorted(dir(anyformer)) == sorted(set(dir(anyformer)) | set(anyformer.__all__))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = anyformer.not_a_name


def test_the_plugin_module_exports_exactly_what_it_imports() -> None:
    imported = module_level_imports(_tree(PLUGIN_MODULE))
    names = anyformer.plugin.__all__
    assert len(names) == len(set(names)), "a name twice in anyformer.plugin.__all__"
    assert sorted(names) == sorted(imported), (
        f"imported but not exported: {sorted(set(imported) - set(names))}; "
        f"exported but not imported: {sorted(set(names) - set(imported))}"
    )
    for name in names:
        value = getattr(anyformer.plugin, name)
        assert getattr(importlib.import_module(imported[name]), name, value) is value


def test_a_name_both_modules_export_is_one_object() -> None:
    both = sorted(set(anyformer.__all__) & set(anyformer.plugin.__all__))
    assert "Model" in both and "fetch_files" in both
    assert [n for n in both if getattr(anyformer, n) is not getattr(anyformer.plugin, n)] == []


@pytest.mark.parametrize("module", [anyformer, anyformer.plugin], ids=lambda m: m.__name__)
def test_every_exported_name_is_documented(module: object, docs_text: list[str]) -> None:
    names: list[str] = module.__all__  # type: ignore[attr-defined]
    missing = [name for name in names if not _documented(name, docs_text)]
    where = ", ".join(str(p.relative_to(ROOT)) for p in DOCS)
    assert missing == [], f"document these in {where} (a code span naming each): {missing}"


@pytest.mark.parametrize(
    ("text", "name", "found"),
    [
        ("call `load(model)` first", "load", True),
        ("`anyformer.plugin.fetch_files`", "fetch_files", True),
        ("`files_to_download` only", "fetch_files", False),
        ("load it in plain words", "load", False),
        ("`reload`", "load", False),
    ],
)
def test_a_name_counts_as_documented_only_in_a_code_span(text: str, name: str, found: bool) -> None:
    assert _documented(name, [text]) is found


def test_the_generated_lists_match_the_package_as_it_stands() -> None:
    """The hint a mismatch prints is the file's own text when the lists agree (so pasting it is safe)."""
    source = PACKAGE_INIT.read_text(encoding="utf-8")
    block = generated_lists(anyformer._EXPORTS)
    type_checking, _, all_list = block.partition("\n\n")
    assert type_checking in source and all_list in source
