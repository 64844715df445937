"""The kit's "What you supply" table is one table, and it says what the kit really takes.

The table lives in conformance/README.md; docs/plugin-author-guide.md points at it instead of
keeping a copy. Every property of ``BackendConformance`` and every fixture meant to be
overridden must have a row, every row must name something the kit has, and a default written
as a Python literal must be the property's real default.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from _pytest.fixtures import FixtureFunctionDefinition

from anyformer_conformance import BackendConformance

REPO = Path(__file__).resolve().parents[2]
README = REPO / "conformance" / "README.md"
GUIDE = REPO / "docs" / "plugin-author-guide.md"
CONTRACT = REPO / "docs" / "contract.md"
#: Fixtures the kit builds for its own tests: a subclass has no reason to supply them.
KIT_INTERNAL_FIXTURES = frozenset(
    {
        "_conformance_setup",
        "backend_hooks",
        "backend_streams",
        "described_sample",
        "greedy_texts",
        "import_probe",
        "loaded_model",
        "run_model",
    }
)


def supply_table() -> dict[str, tuple[str, str]]:
    """The README's "What you supply" rows: name -> (kind, default), as written."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## What you supply", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`(\w+)`", cells[0]) if line.startswith("|") else None
        if match:
            rows[match.group(1)] = (cells[1], cells[2])
    return rows


class _Defaults(BackendConformance):
    backend_id = "conformance-docs"


def kit_names() -> tuple[set[str], set[str]]:
    """The kit's properties, and the fixtures a subclass may supply."""
    properties = {name for name, value in vars(BackendConformance).items() if isinstance(value, property)}
    fixtures = {
        name
        for name, value in vars(BackendConformance).items()
        if isinstance(value, FixtureFunctionDefinition) and name not in KIT_INTERNAL_FIXTURES
    }
    return properties, fixtures


def test_every_property_and_suppliable_fixture_has_a_row_and_every_row_a_name_of_the_kit() -> None:
    properties, fixtures = kit_names()
    rows = supply_table()
    assert not (properties | fixtures) - set(rows), "names of the kit missing from the README's table"
    assert not set(rows) - (properties | fixtures), "rows of the README's table the kit does not have"
    for name in fixtures:
        assert "fixture" in rows[name][0], f"{name} is a fixture, the table says {rows[name][0]!r}"
    for name in properties:
        assert "property" in rows[name][0], f"{name} is a property, the table says {rows[name][0]!r}"


def _literal(cell: str) -> tuple[bool, Any]:
    match = re.fullmatch(r"`([^`]+)`", cell)
    if not match:
        return False, None
    try:
        return True, ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return False, None


def test_each_default_written_as_a_literal_is_the_kit_s_default() -> None:
    properties, _ = kit_names()
    checked = 0
    for name, (_, default) in supply_table().items():
        is_literal, value = _literal(default)
        if name in properties and is_literal:
            assert getattr(_Defaults(), name) == value, f"the README says {name} defaults to {default}"
            checked += 1
    assert checked >= 10, f"only {checked} defaults were literals to check"


def test_the_guide_points_at_the_table_and_keeps_no_copy() -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    assert "../conformance/README.md#what-you-supply" in guide
    assert "| `backend_id` |" not in guide


def test_contract_lists_what_the_kit_does_not_check() -> None:
    contract = CONTRACT.read_text(encoding="utf-8")
    section = contract.split("## What the kit does not check", 1)[1]
    assert section.count("\n- ") >= 5
