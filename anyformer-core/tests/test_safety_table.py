"""Every row of docs/safety.md's table of hostile inputs has a test that covers it; no test names a missing row.

A test covers a row with ``@pytest.mark.safety("G3")`` (several ids allowed), on the function, in
``pytest.param(..., marks=...)`` or as a module's ``pytestmark``. The marks are found by reading
the source of every test module under anyformer-core/tests and plugins/*/tests, so this test
needs no other test to be collected or run.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SAFETY = REPO / "docs" / "safety.md"
_ROW = re.compile(r"^\|\s*([A-Z]\d+)\s*\|", re.MULTILINE)


def table_rows(text: str) -> list[str]:
    """The row ids of the safety table (``| G1 | ... |``), in order."""
    return _ROW.findall(text)


def safety_marks(source: str) -> list[str]:
    """The row ids of every ``pytest.mark.safety(...)`` / ``mark.safety(...)`` call in a module's source."""
    ids = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "safety"):
            continue
        owner = node.func.value
        if (isinstance(owner, ast.Attribute) and owner.attr == "mark") or (
            isinstance(owner, ast.Name) and owner.id == "mark"
        ):
            ids += [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
    return ids


def scanned_modules() -> list[Path]:
    """Every test module of the core and of each plugin."""
    folders = [REPO / "anyformer-core" / "tests", *sorted((REPO / "plugins").glob("*/tests"))]
    return sorted(p for folder in folders for p in folder.rglob("*.py"))


@functools.lru_cache(maxsize=1)
def marks_by_row() -> dict[str, list[str]]:
    """Row id -> the modules that mark a test with it."""
    found: dict[str, list[str]] = defaultdict(list)
    for module in scanned_modules():
        for row in safety_marks(module.read_text(encoding="utf-8")):
            found[row].append(str(module.relative_to(REPO)))
    return found


@pytest.mark.parametrize("row", table_rows(SAFETY.read_text(encoding="utf-8")))
def test_the_row_has_a_test(row: str) -> None:
    assert row in marks_by_row(), (
        f"docs/safety.md row {row} has no test marked @pytest.mark.safety({row!r}) "
        "under anyformer-core/tests or plugins/*/tests"
    )


def test_the_table_is_there() -> None:
    assert len(table_rows(SAFETY.read_text(encoding="utf-8"))) >= 40, f"{SAFETY} lost its table of hostile inputs"


def test_no_mark_names_a_row_that_does_not_exist() -> None:
    rows = set(table_rows(SAFETY.read_text(encoding="utf-8")))
    unknown = {row: modules for row, modules in marks_by_row().items() if row not in rows}
    assert not unknown, f"marks for rows docs/safety.md does not have: {unknown}"


def test_the_scan_finds_marks_in_every_form() -> None:
    source = """
import pytest
from pytest import mark
pytestmark = pytest.mark.safety("D1")

@pytest.mark.safety("G3", "G4")
def test_a(): ...

@pytest.mark.parametrize("x", [pytest.param(1, marks=pytest.mark.safety("R6")), 2])
def test_b(x): ...

@mark.safety("L2")
def test_c(): ...

@pytest.mark.slow
def test_d(): ...
"""
    assert sorted(safety_marks(source)) == ["D1", "G3", "G4", "L2", "R6"]


def test_the_table_parser_reads_row_ids() -> None:
    text = "| # | fault | result |\n|---|---|---|\n| G1 | empty | BAD_MODEL |\n| R6 | oom | crashed |\n"
    assert table_rows(text) == ["G1", "R6"]


def test_this_suite_scans_the_core_and_the_plugins() -> None:
    modules = {m.name for m in scanned_modules()}
    assert {"test_worker.py", "test_fault_corpus.py", "test_isolation.py"} <= modules
